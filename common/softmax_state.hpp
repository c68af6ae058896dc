// The online-softmax state of one query row, and the merge of two: the math every stage runs.
//
// After seeing keys 1..n with scores s_j, the state holds
//   m = max_j s_j                       (row_max; FA2 Algorithm 1 "m_i")
//   l = sum_j exp(s_j - m)              (row_sum; "l_i")
// and the caller keeps the unnormalized accumulator  acc = sum_j exp(s_j - m) v_j  ("O~_i").
// Whenever m grows to m', both l and acc are multiplied by exp(m - m') so they stay relative to the current
// max. The exact softmax output is acc / l and the log-sum-exp is m + log(l) (Milakov & Gimelshein 2018; FA1
// Sec. 3.1).
//
// Two states over disjoint key sets merge exactly (merge): this is how tiles, split-KV chunks
// (Flash-Decoding) and partial results combine. A partial result given as (O_j normalized, LSE_j) is the
// state {m = LSE_j, l = 1} with acc = O_j (from_lse), so the decoding combine is this same merge.
// The member functions are host and device functions. The CPU stages and the CUDA decoding kernels run this
// code; the CUDA attention kernels keep m and l where their schedules put them: in global memory and warp
// partials in cuda_v1 (FA1's Algorithm 1), in register fragments in cuda_v2 and cuda_v3_hopper (two rows a
// thread, a row over a quad, in the log2 domain with the scale folded in), where a state object per row would
// cost registers and shuffles. The same recurrence, held to this one by the harness (docs/conventions.md
// §7, §8).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/host_device.hpp"

namespace flashlab {

template <typename T>
struct SoftmaxState {
  static constexpr T neg_inf = -std::numeric_limits<T>::infinity();

  T row_max = neg_inf;  // m: the largest score seen so far (-inf while nothing is visible)
  T row_sum = 0;        // l: sum of exp(s_j - m) over the keys seen

  // The state of a finished partial result with log-sum-exp `lse`, whose normalized output is the
  // accumulator.
  FLASHLAB_HOST_DEVICE static SoftmaxState from_lse(T lse) {
    if (lse == neg_inf) return {};  // an empty partial: weight 0 in any merge
    return {lse, T(1)};
  }

  // Raises the running max to include `block_max` and rescales row_sum. Returns the factor exp(m_old - m_new)
  // by which the caller must scale its accumulator (FA2 Algorithm 1 line 9: "diag(exp(m_old - m_new)) O~").
  FLASHLAB_HOST_DEVICE T raise_max(T block_max) {
    // A NaN score poisons the row, as in the reference; std::max(row_max, NaN) would silently drop it.
    const T new_max = block_max != block_max ? block_max : std::max(row_max, block_max);
    // Nothing visible yet (both -inf): keep the factor at 1, since exp(-inf - (-inf)) would be NaN.
    if (new_max == neg_inf) return T(1);
    const T factor =
        std::exp(row_max - new_max);  // 0 when row_max was -inf: the empty accumulator is dropped
    row_sum *= factor;
    row_max = new_max;
    return factor;
  }

  // P = exp(s - m) for a score already covered by raise_max. A masked score (-inf) weighs exactly 0, also
  // while row_max is still -inf, where exp(-inf - (-inf)) would be NaN.
  FLASHLAB_HOST_DEVICE T weight(T score) const { return score == neg_inf ? T(0) : std::exp(score - row_max); }

  // Adds one key's weight to the running sum (the caller adds weight * v to its accumulator).
  FLASHLAB_HOST_DEVICE void add(T weight_value) { row_sum += weight_value; }

  // One key at a time: the one-pass recurrence, acc = acc * exp(m - m') + exp(s - m') v.
  template <typename V>
  FLASHLAB_HOST_DEVICE void push(T score, const V* value, T* acc, int64_t head_dim) {
    const T factor = raise_max(score);
    const T p = weight(score);
    row_sum += p;
    for (int64_t c = 0; c < head_dim; ++c) acc[c] = acc[c] * factor + p * static_cast<T>(value[c]);
  }

  // Merges a state over a disjoint set of keys into this one: both are brought to the common max and added.
  template <typename A>
  FLASHLAB_HOST_DEVICE void merge(const SoftmaxState& other, const A* other_acc, T* acc, int64_t head_dim) {
    if (other.row_sum == T(0) && other.row_max == neg_inf) return;  // other saw nothing: weight 0
    const T factor_self = raise_max(other.row_max);
    const T factor_other = std::exp(other.row_max - row_max);
    row_sum += other.row_sum * factor_other;
    for (int64_t c = 0; c < head_dim; ++c)
      acc[c] = acc[c] * factor_self + static_cast<T>(other_acc[c]) * factor_other;
  }

  // 1 / l, the factor finalize() applies: 0 for a row that saw no key, rather than 1/0. For kernels that
  // normalize in their own layout (SIMD lanes, FA1's per-tile normalization of O).
  FLASHLAB_HOST_DEVICE T normalizer() const { return row_sum == T(0) ? T(0) : T(1) / row_sum; }

  // log(sum_j exp(s_j)) = m + log(l); -inf for a row that saw no key (the log of an empty sum).
  FLASHLAB_HOST_DEVICE T lse() const { return row_sum == T(0) ? neg_inf : row_max + std::log(row_sum); }

  // Writes the normalized output acc / l (FA2 Algorithm 1 line 12, deferred to the end). A row that saw no
  // key writes 0 rather than 0/0.
  template <typename Out>
  FLASHLAB_HOST_DEVICE void finalize(const T* acc, Out* out, int64_t head_dim) const {
    const T inverse = normalizer();
    for (int64_t c = 0; c < head_dim; ++c) out[c] = static_cast<Out>(acc[c] * inverse);
  }
};

// Flash-Decoding's combine: merges `count` partial results of disjoint key sets, partial j given as its
// normalized output O_j (head_dim values at partial_o + j * o_stride) and its log-sum-exp LSE_j
// (partial_lse[j * lse_stride]). Each partial is the state from_lse(LSE_j) with acc = O_j, so this is merge,
// and the result weights O_j by exp(LSE_j - LSE). Writes the unnormalized output to acc (head_dim) and
// returns the merged state: finalize(acc, out) gives O, lse() gives LSE. Empty partials (LSE_j = -inf) weigh
// 0, and with no non-empty partial at all the result is O = 0, LSE = -inf.
template <typename T, typename Partial>
SoftmaxState<T> combine_partials(int64_t count, const Partial* partial_o, int64_t o_stride,
                                 const Partial* partial_lse, int64_t lse_stride, T* acc, int64_t head_dim) {
  SoftmaxState<T> state;
  std::fill(acc, acc + head_dim, T(0));
  for (int64_t j = 0; j < count; ++j)
    state.merge(SoftmaxState<T>::from_lse(static_cast<T>(partial_lse[j * lse_stride])),
                partial_o + j * o_stride, acc, head_dim);
  return state;
}

}  // namespace flashlab
