// The mask as one thread block of cuda_v2 sees it: which key tiles it visits, which of those need an element
// mask, and whether one (row, key) pair is visible. Every rule comes from common/mask.hpp (band_key_range);
// this file only turns it into tile decisions. Host and device: the self-test checks every decision on the
// host against common/mask.hpp's Visibility (with host pointers in the lengths and mask fields).
#pragma once

#include <cstdint>

#include "common/cuda/sequences.hpp"
#include "common/mask.hpp"
#include "cuda_v2/split_q.hpp"

namespace flashlab::cuda_v2 {

// The query rows [row_begin, row_end) of one (q-block, head, batch) and the keys they may read.
struct BlockMask {
  int rows_q = 0;  // valid query rows of this batch element (common/cuda/sequences.hpp)
  int rows_k = 0;  // valid keys of this batch element; keys at or past it are never loaded
  // Key tiles [tile_begin, tile_end) of width kBlockN hold every key any valid row of the block sees; the
  // others are hidden (causal, window, padding) and skipped: FA2's causal block skipping.
  int tile_begin = 0, tile_end = 0;
  // Keys [full_begin, full_end) are visible to every row of the block: a tile inside it needs no element
  // mask.
  int full_begin = 0, full_end = 0;

  template <int kBlockN>
  FLASHLAB_HOST_DEVICE static BlockMask make(const SplitQParams& p, int b, int row_begin, int row_end) {
    BlockMask m;
    m.rows_q = cuda::rows_q(p, b);
    m.rows_k = cuda::rows_k(p, b);
    const int last_row = (row_end < m.rows_q ? row_end : m.rows_q) - 1;
    if (row_begin > last_row) return m;  // every row of the block is padding: no tile at all
    // Band ranges grow monotonically with the row (begin and end both move right by one per row), so the
    // first row bounds the block's keys from the left and the last valid row from the right.
    const KeyRange first = band(p, m, row_begin), last = band(p, m, last_row);
    // EXERCISE BEGIN cuda-block-skip
    // teaches: FA2's block skipping on the GPU: the key tiles a Q block visits under causal, window and
    //   padding are those that hold a key any of its valid rows sees; the kernel loads no other tile
    // difficulty: 2
    // docs: docs/04-cuda-v2.md#4.5 Causal (and window, and padding) block skipping
    // checks: forward, traffic
    // grades: cuda_v2/split_q(_simt)?$
    // hint: the visible key ranges move with the row: the block's first row starts earliest, its last valid
    //   row ends latest; the key tiles to visit are those between, and only those
    // hint2: turn the keys [key_begin, key_end) into key tiles [tile_begin, tile_end) of kBlockN keys: which
    //   tile holds the first key, and which is the first tile past the last one? A tile that holds no visible
    //   key must not be visited
    // hint3: first and last are the visible key ranges [begin, end) of the block's first row and of its last
    //   valid row (first.begin may be negative: clamp it at 0). Every row's range lies between them. Set
    //   m.tile_begin and m.tile_end (key tiles of kBlockN keys, [tile_begin, tile_end)); leave both 0 when no
    //   key is visible. A tile no row sees must not be visited: the element mask would hide its keys, but
    //   loading it is wasted time, and the check compares the bytes the kernel moves with its model.
    const int key_begin = first.begin > 0 ? static_cast<int>(first.begin) : 0;
    const int key_end = static_cast<int>(last.end);
    if (key_end <= key_begin) return m;
    m.tile_begin = key_begin / kBlockN;
    m.tile_end = (key_end + kBlockN - 1) / kBlockN;
    // EXERCISE END cuda-block-skip
    // Seen by all rows: from the last valid row's begin to the first row's end. Padded rows (row >= rows_q)
    // do not count: the epilogue writes them as fully masked whatever they accumulated. An explicit mask can
    // hide any element, so with one every tile is partial.
    if (p.mask == nullptr) {
      m.full_begin = static_cast<int>(last.begin > 0 ? last.begin : 0);
      m.full_end = static_cast<int>(first.end);
    }
    return m;
  }

  // The tensor-core ladder's rungs before block skipping (split_q.cu, Rung): every key tile up to the batch
  // element's last key, whatever the rows see; the element mask hides what they do not.
  template <int kBlockN>
  FLASHLAB_HOST_DEVICE void visit_every_tile() {
    tile_begin = 0;
    tile_end = (rows_k + kBlockN - 1) / kBlockN;
  }

  // True when the tile of keys [key0, key0 + kBlockN) needs no element mask: every row sees every key of it.
  template <int kBlockN>
  FLASHLAB_HOST_DEVICE bool tile_is_full(int key0) const {
    return key0 >= full_begin && key0 + kBlockN <= full_end;
  }

  FLASHLAB_HOST_DEVICE static KeyRange band(const SplitQParams& p, const BlockMask& m, int row) {
    return band_key_range(row, m.rows_q, m.rows_k, p.causal, p.window_left, p.window_right);
  }
};

// The same decisions seen from one key tile, as the backward takes them (one thread block per key tile): the
// query tiles of kBlockM rows that visit key tile `tile` of kBlockN keys, [begin, end), and those among them
// for which it is full, [full_begin, full_end) (empty with an explicit mask). FlashAttention-2's backward
// forms the same bounds, m_block_min and m_block_max, once per key block.
struct QueryTileRun {  // no initializers: a kernel keeps one in shared memory
  int begin, end;
  int full_begin, full_end;
};

// Found by binary search, with BlockMask::make's own decisions. A valid row's band only moves right as the
// row grows (common/mask.hpp: band_key_range), and a band is empty only where its end is at or before key 0,
// on the first rows. So along the query tiles each of make's four bounds (tile_begin, tile_end, full_begin,
// full_end) grows, each test below turns from false to true once, and each run is contiguous: about
// 4 log2(tiles) masks a key tile, where asking every query tile costs one a step. Query tiles past the
// batch's rows visit nothing.
template <int kBlockM, int kBlockN>
FLASHLAB_HOST_DEVICE QueryTileRun query_tiles_of(const SplitQParams& p, int b, int tile) {
  const int valid_tiles = (cuda::rows_q(p, b) + kBlockM - 1) / kBlockM;
  // The first query tile in [0, valid_tiles) whose mask passes `test`, valid_tiles when none does.
  const auto first_tile = [&](auto test) {
    int lo = 0, hi = valid_tiles;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (test(BlockMask::make<kBlockN>(p, b, mid * kBlockM, (mid + 1) * kBlockM)))
        hi = mid;
      else
        lo = mid + 1;
    }
    return lo;
  };
  const int key0 = tile * kBlockN;
  QueryTileRun run{};
  run.begin = first_tile([&](const BlockMask& m) { return m.tile_end > tile; });
  run.end = first_tile([&](const BlockMask& m) { return m.tile_begin > tile; });
  if (run.end < run.begin) run.end = run.begin;
  run.full_begin = first_tile([&](const BlockMask& m) { return m.full_end >= key0 + kBlockN; });
  run.full_end = first_tile([&](const BlockMask& m) { return m.full_begin > key0; });
  if (run.full_end < run.full_begin) run.full_end = run.full_begin;
  return run;
}

// Visibility of one element of a partial tile: the row's band (precomputed by the caller with
// BlockMask::band) and the explicit mask. Out-of-range keys (>= rows_k) fall outside every band.
FLASHLAB_HOST_DEVICE inline bool element_visible(const SplitQParams& p, const KeyRange& row_keys, int row,
                                                 int key) {
  if (key < row_keys.begin || key >= row_keys.end) return false;
  return p.mask == nullptr || p.mask[static_cast<int64_t>(row) * p.seqlen_k + key] != 0;
}

}  // namespace flashlab::cuda_v2
