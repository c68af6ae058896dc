// Softmax on a vector, two ways (docs/01-softmax.md). Both return the log-sum-exp log(sum_j exp(x_j)) and
// write y = softmax(x); an all -inf input (every key masked) gives y = 0 and returns -inf.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>

#include "common/softmax_state.hpp"

namespace flashlab::naive {

// Three-pass safe softmax: (1) m = max_j x_j, (2) l = sum_j exp(x_j - m), (3) y_j = exp(x_j - m) / l.
// Subtracting m keeps every exponent <= 0, so exp never overflows (docs/01-softmax.md, "Why the max").
inline float softmax_three_pass(std::span<const float> x, std::span<float> y) {
  float m = -std::numeric_limits<float>::infinity();
  for (float value : x) m = std::isnan(value) ? value : std::max(m, value);  // pass 1: a NaN poisons the row
  if (m == -std::numeric_limits<float>::infinity()) {  // every entry masked: an empty sum, not 0/0
    for (float& out : y) out = 0.0f;
    return m;
  }
  float l = 0.0f;
  for (float value : x) l += std::exp(value - m);  // pass 2
  const float inverse = 1.0f / l;
  for (size_t j = 0; j < x.size(); ++j) y[j] = std::exp(x[j] - m) * inverse;  // pass 3
  return m + std::log(l);
}

// Online normalizer (Milakov & Gimelshein 2018): one pass keeps the running max m and the running sum l,
// rescaling l by exp(m_old - m_new) whenever the max grows (the shared SoftmaxState), then one pass
// normalizes.
inline float softmax_online(std::span<const float> x, std::span<float> y) {
  SoftmaxState<float> state;
  // EXERCISE BEGIN online-softmax
  // teaches: the online normalizer: the running max m and the running sum l in one pass over the row
  // difficulty: 1
  // docs: docs/01-softmax.md#3. The online normalizer: passes 1 and 2 in one
  // hint: one pass can keep both the max and the sum, if the sum is rescaled whenever the max grows
  // hint2: for each value, first raise the running max (SoftmaxState::raise_max rescales row_sum), then add
  //   the value's weight relative to the new max
  // hint3: pass 1 must leave state.row_max = max_j x_j and state.row_sum = sum_j exp(x_j - row_max). For each
  //   value: raise the running max to include it (state.raise_max rescales row_sum by exp(m_old - m_new)),
  //   then add its weight exp(value - row_max) (state.weight gives it, state.add adds it).
  for (float value : x) {  // pass 1: m and l together
    state.raise_max(value);
    state.add(state.weight(value));
  }
  // EXERCISE END online-softmax
  const float inverse = state.row_sum == 0.0f ? 0.0f : 1.0f / state.row_sum;
  for (size_t j = 0; j < x.size(); ++j) y[j] = state.weight(x[j]) * inverse;  // pass 2
  return state.lse();
}

}  // namespace flashlab::naive
