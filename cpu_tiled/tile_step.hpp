// The per-tile steps both loop orders share: pack a Q tile transposed, mask a tile the mask cuts, and the
// online softmax on one tile of scores. Tiles are transposed (one query row per lane, see micro_kernel.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/dropout.hpp"
#include "common/mask.hpp"
#include "common/score_mod.hpp"
#include "common/softmax_state.hpp"
#include "cpu_tiled/micro_kernel.hpp"

namespace flashlab::cpu_tiled {

// A Q or O~ tile is stored in micro-columns: the W = micro_width() rows of column c form a d x W block of
// their own, Qt[k][r] of that column at c * d * W + k * W + r, so that the slice a micro-kernel sweeps is
// contiguous and spreads over every L1 set. (Stored as one d x Br block, a 256-row tile puts consecutive k
// 1 KiB apart, on a quarter of L1's sets: the micro-column's 32 KiB of Q^T then no longer fits in a 48 KiB
// L1, and the whole forward ran 5% slower, docs/02-cpu-tiled.md.)
inline int64_t column_index(int64_t r, int64_t k, int64_t d) {
  constexpr int64_t W = micro_width<Vec>();
  return r / W * d * W + k * W + r % W;
}

// Packs `rows` rows of Q (row stride q_stride) transposed into micro-columns: Qt[k][r] = Q[r][k]. The lanes
// past `rows` in the last column are 0, so they compute finite throw-away values.
inline void pack_q_columns(const float* q, int64_t q_stride, int64_t rows, int64_t d, float* qt) {
  constexpr int64_t W = micro_width<Vec>();
  for (int64_t c0 = 0; c0 < rows; c0 += W) {
    const int64_t lanes = std::min(W, rows - c0);
    float* column = qt + c0 * d;
    for (int64_t k = 0; k < d; ++k) std::fill(column + k * W + lanes, column + (k + 1) * W, 0.0f);
    // In blocks of 16 rows: each k writes one cache line of the column, and the block's 16 rows of Q stay
    // in L1.
    for (int64_t r0 = 0; r0 < lanes; r0 += 16) {
      const int64_t r1 = std::min(lanes, r0 + 16);
      for (int64_t k = 0; k < d; ++k)
        for (int64_t r = r0; r < r1; ++r) column[k * W + r] = q[(c0 + r) * q_stride + k];
    }
  }
}

// Row stride for a copied V tile: at least d, a multiple of 16 floats and an odd number of 64-byte lines, so
// that the rows of a tile fall in different L1 sets. (Read in place, the rows of V are heads_kv * d floats
// apart, often a multiple of 4 KiB over a few rows, and output_column's per-row broadcasts then evict each
// other: measured 30% slower at d = 128.)
constexpr int64_t v_tile_stride(int64_t d) {
  const int64_t lines = (d + 15) / 16;
  return 16 * (lines % 2 == 1 ? lines : lines + 1);
}

// V_j copied into a dense buffer with v_tile_stride(d) between rows.
inline void copy_v_tile(const float* v, int64_t v_stride, int64_t nk, int64_t d, float* tile) {
  const int64_t ld = v_tile_stride(d);
  for (int64_t c = 0; c < nk; ++c) std::copy_n(v + c * v_stride, d, tile + c * ld);
}

// Asks for the rows of the next K/V tile to be brought into L2 while this one is computed: the rows of one
// head are strided in BSHD, which the hardware prefetchers follow poorly.
inline void prefetch_rows(const float* rows, int64_t stride, int64_t count, int64_t d) {
  for (int64_t c = 0; c < count; ++c)
    for (int64_t k = 0; k < d; k += 16) __builtin_prefetch(rows + c * stride + k, 0, 2);
}

// The union of the key ranges of rows [i0, i0 + rows): K/V tiles outside it are hidden from the whole Q tile
// and are never visited. Empty when every row is fully masked. [[maybe_unused]]: the parameters are read only
// by exercise causal-skip's lines; a student's copy without them must still compile warning-free.
inline KeyRange tile_key_span([[maybe_unused]] const Visibility& visibility, [[maybe_unused]] int64_t b,
                              [[maybe_unused]] int64_t i0, int64_t rows) {
  KeyRange span{0, 0};
  for (int64_t r = 0; r < rows; ++r) {
    // EXERCISE BEGIN causal-skip
    // teaches: block skipping: the K/V tiles a Q tile must visit are the union of its rows' visible key
    //   ranges (causal, window, padding); tiles outside it are never loaded
    // difficulty: 2
    // docs: docs/02-cpu-tiled.md#4. Block skipping
    // hint: each row of the Q tile sees one contiguous range of keys (or none); the tiles to visit are those
    //   that meet the union of these ranges
    // hint2: ask visibility.key_range(b, row) for each row of the tile and widen span to cover it; a row with
    //   an empty range adds nothing
    // hint3: widen span (keys [span.begin, span.end)) to cover row i0 + r's visible keys,
    //   visibility.key_range(b, i0 + r); a fully masked row (an empty range) adds nothing, and an empty span
    //   takes the first non-empty range as it is. The tile loop in forward.cpp visits only this span.
    const KeyRange range = visibility.key_range(b, i0 + r);
    if (range.empty()) continue;
    if (span.empty()) span = range;
    span.begin = std::min(span.begin, range.begin);
    span.end = std::max(span.end, range.end);
    // EXERCISE END causal-skip
  }
  return span;
}

// On a tile the mask cuts (TileCover::partial): scores of hidden keys become -inf, which weighs 0. A row's
// visible keys from causal, window and padding are one range, so only the keys before and after it are
// written (no test per score); the explicit mask, when there is one, is then tested inside the range.
inline void mask_tile(const Visibility& visibility, int64_t b, int64_t i0, int64_t rows, int64_t j0,
                      int64_t nk, float* st, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    const KeyRange range = visibility.key_range(b, i);
    const int64_t lo = std::clamp<int64_t>(range.begin - j0, 0, nk);
    const int64_t hi = std::clamp<int64_t>(range.end - j0, lo, nk);
    for (int64_t c = 0; c < lo; ++c) st[c * ld + r] = -INFINITY;
    for (int64_t c = hi; c < nk; ++c) st[c * ld + r] = -INFINITY;
    if (!visibility.has_explicit_mask()) continue;
    for (int64_t c = lo; c < hi; ++c)
      if (!visibility.mask_allows(i, j0 + c)) st[c * ld + r] = -INFINITY;
  }
}

// The score modifications (soft-capping, ALiBi; common/score_mod.hpp) on a tile of S^T (nk keys from j0 x
// `rows` query rows from i0 of head h), after the scale and before the mask.
inline void modify_scores(const ScoreMod& mod, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t j0,
                          int64_t nk, float* st, int64_t ld) {
  for (int64_t c = 0; c < nk; ++c)
    for (int64_t r = 0; r < rows; ++r) st[c * ld + r] = mod.apply(st[c * ld + r], b, h, i0 + r, j0 + c);
}

// Dropout (common/dropout.hpp) on a tile of P^T, after the softmax has added it to the row sums: each weight
// times its factor Z (0, or 1 / (1 - p)), before the output product.
inline void drop_weights(const Dropout& dropout, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t j0,
                         int64_t nk, float* pt, int64_t ld) {
  for (int64_t c = 0; c < nk; ++c)
    for (int64_t r = 0; r < rows; ++r) pt[c * ld + r] *= dropout.factor<float>(b, h, i0 + r, j0 + c);
}

// Scratch for online_softmax_tile, one float per lane each.
struct LaneScratch {
  float* block_max;
  float* row_max;
  float* block_sum;
};

// FA2 Alg. 1 line 9 on one tile, S^T (nk keys x `lanes` rows) turned into P^T in place:
//   m_new = max(m_old, rowmax(S)),  P = exp(S - m_new),  l_new = exp(m_old - m_new) l_old + rowsum(P).
// The per-row state is SoftmaxState (raise_max, add); the row maxima and sums over the tile and the
// exponentials are vector operations down the lanes. factor[r] = exp(m_old - m_new), for rescaling O.
// [[maybe_unused]] factor: written only by exercise tiled-rescale's lines; a student's copy without them must
// still compile warning-free.
template <class V>
void online_softmax_tile(float* st, int64_t ld, int64_t nk, int64_t lanes, SoftmaxState<float>* state,
                         [[maybe_unused]] float* factor, LaneScratch scratch) {
  constexpr int L = V::lanes;
  for (int64_t lane = 0; lane < lanes; lane += L) {  // rowmax(S), a NaN score kept
    V block_max = V::splat(-INFINITY);
    for (int64_t c = 0; c < nk; ++c) block_max = max_keep_nan(block_max, V::load(st + c * ld + lane));
    block_max.store(scratch.block_max + lane);
  }
  for (int64_t r = 0; r < lanes; ++r) {
    // EXERCISE BEGIN tiled-rescale
    // teaches: the tile-level online softmax: raise the running max by a whole tile's rowmax, rescale the
    //   running sum l and the output accumulator O~ by exp(m_old - m_new) (FA2 Algorithm 1 lines 9-10)
    // difficulty: 2
    // docs: docs/02-cpu-tiled.md#2. The softmax state and its merge, per tile
    // hint: when a tile raises a row's max, the running sum and the output accumulated so far are both scaled
    //   by exp(m_old - m_new) before the tile's own terms are added
    // hint2: SoftmaxState::raise_max rescales l and returns the factor; the exponentials below read the new
    //   max from scratch.row_max. In output_block the old output takes that factor (pre) before the tile's
    //   part (post * acc) is added
    // hint3: here, for lane r: raise state[r]'s max to scratch.block_max[r] (SoftmaxState::raise_max rescales
    //   l and returns exp(m_old - m_new)); keep that in factor[r] and the new max in scratch.row_max[r] (the
    //   exponentials below read it). In micro_kernel.hpp's output_block, store out = post * acc + pre * out
    //   (pre is that factor: fma(a, b, c) = a * b + c, V::load, .store(out)).
    factor[r] = state[r].raise_max(scratch.block_max[r]);
    scratch.row_max[r] = state[r].row_max;
    // EXERCISE END tiled-rescale
  }
  for (int64_t lane = 0; lane < lanes; lane += L) {  // P = exp(S - m_new) and rowsum(P)
    const V row_max = V::load(scratch.row_max + lane);
    V block_sum = V::zero();
    for (int64_t c = 0; c < nk; ++c) {
      const V weight = V::exp_weight(V::load(st + c * ld + lane), row_max);
      weight.store(st + c * ld + lane);
      block_sum = block_sum + weight;
    }
    block_sum.store(scratch.block_sum + lane);
  }
  for (int64_t r = 0; r < lanes; ++r) state[r].add(scratch.block_sum[r]);
}

}  // namespace flashlab::cpu_tiled
