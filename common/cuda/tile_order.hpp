// The order in which a forward kernel's tiles (a block of query rows of one (batch, head)) are handed out,
// when not in the grid's own order: one definition for the kernels that take it, cuda_v3_hopper's persistent
// kernel (ws_persistent, which walks it) and cuda_v2/split_q_longest_first (whose one-dimensional grid is
// numbered in it).
// cuda_v2/split_q_bwd64x128_longest_first numbers its backward's key tiles of one (batch, kv head) in it too,
// mirrored: there the first key tile is the longest (cuda_v2/backward.hpp). Plain C++, host and device.
//
// The (batch, head) pairs are cut into sections of `section` pairs whose K and V fit in L2 together. A
// section's tiles come before the next section's, row block by row block from the last to the first, and at
// each row block every pair of the section. So the blocks that run at one time read the K and V of a few
// heads, which stay in L2; and under a causal mask, where the last row block of a pair sees the most keys,
// the long tiles start first and the short ones fill the end of the last wave (longest processing time
// first, the rule FlashAttention-3's scheduler follows). In the grid's own order, (row block, head, batch)
// with the row block fastest, the last head's long tiles are among the last to start, and the GPU waits on
// them (tools/wave_model.py puts numbers on both).
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>

#include "common/host_device.hpp"

namespace flashlab::cuda {

// A tile: row block `block` of query head `head` of batch element `batch`.
struct Tile {
  int block, head, batch;
};

struct TileOrder {
  int blocks = 1;   // row blocks per (batch, head)
  int heads = 1;    // heads_q
  int batches = 1;  // batch
  int section = 1;  // (batch, head) pairs per section, >= 1

  FLASHLAB_HOST_DEVICE int tiles() const { return blocks * heads * batches; }
  // Tile number `tile` (0 <= tile < tiles()) of the order.
  FLASHLAB_HOST_DEVICE Tile operator()(int tile) const {
    const int pairs = heads * batches;
    const int section_tiles = section * blocks;  // tiles of a full section
    const int first_pair = tile / section_tiles * section;
    const int pairs_here =
        pairs - first_pair < section ? pairs - first_pair : section;  // the last may be short
    const int local = tile % section_tiles;
    const int pair = first_pair + local % pairs_here;
    return Tile{blocks - 1 - local / pairs_here, pair % heads, pair / heads};
  }
  // The same with the row block mirrored, block blocks - 1 - b: the first block of a pair first. The backward
  // of cuda_v2/split_q_bwd64x128_longest_first numbers its key tiles so, since under a causal mask its first
  // key tile is the longest.
  FLASHLAB_HOST_DEVICE Tile mirrored(int tile) const {
    Tile t = (*this)(tile);
    t.block = blocks - 1 - t.block;
    return t;
  }
};

// Whether `blocks` x `heads` x `batches` tiles (each at least 1) can be numbered in an int, as TileOrder
// numbers them: every launcher of an order checks it.
constexpr bool numbered_in_an_int(int64_t blocks, int64_t heads, int64_t batches) {
  return blocks <= INT32_MAX / heads / batches;
}

// The L2 that a section's K and V may fill: H100 and H200 have 50 MB; the rest is left to Q, O and the other
// sections' last tiles.
inline constexpr int64_t kL2SectionBytes = int64_t{32} << 20;

// The order for `blocks` row blocks of `heads` x `batches` pairs whose K and V take `kv_bytes` each (2 x
// seqlen_k x head_dim 16-bit elements: a GQA group's heads share theirs, which only makes the sections
// smaller than they could be). Host code (the launchers), for a tile count numbered_in_an_int.
inline TileOrder l2_sectioned_order(int blocks, int heads, int batches, int64_t kv_bytes,
                                    int64_t l2_bytes = kL2SectionBytes) {
  TileOrder order;
  order.blocks = blocks;
  order.heads = heads;
  order.batches = batches;
  order.section = static_cast<int>(std::clamp<int64_t>(l2_bytes / std::max<int64_t>(kv_bytes, 1), 1,
                                                       std::max<int64_t>(int64_t{heads} * batches, 1)));
  return order;
}

// `order` in sections of `section` pairs instead (at most every pair); a section of 0 leaves it as it is. The
// launchers' tests take sections of a chosen size through it.
inline TileOrder in_sections_of(TileOrder order, int section) {
  if (section > 0)
    order.section = static_cast<int>(std::min<int64_t>(section, int64_t{order.heads} * order.batches));
  return order;
}

}  // namespace flashlab::cuda
