// What happens to a score between the scaled dot product and the softmax, defined once for every stage that
// supports it (docs/01-softmax.md, section 5):
//
//   s  = scale * q_i . k_j
//   s' = cap * tanh(s / cap)           logit soft-capping (Problem::softcap > 0; Gemma 2, FlashAttention's
//                                      `softcap`): every score bounded by cap
//   s" = s' - slope_h * |i + rows_k - rows_q - j| + bias[b, h, i, j]
//                                      ALiBi (Problem::alibi_slopes, one slope per query head), as
//                                      FlashAttention's `alibi_slopes` defines it: the distance is
//                                      bottom-right aligned, like the causal mask, with the batch element's
//                                      own lengths; and an additive bias (Problem::bias, broadcast over batch
//                                      and heads), whose -inf entries hide their keys like a mask
//
// then the mask (common/mask.hpp) hides what it hides. The modification is applied after the scale and before
// the row max: the online softmax's max, sum and LSE are those of the modified scores. Its derivative for the
// backward: ds"/ds = 1 - tanh^2(s / cap) = 1 - (s' / cap)^2 (ALiBi and the bias add constants).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/problem.hpp"

namespace flashlab {

class ScoreMod {
 public:
  explicit ScoreMod(const Problem& p)
      : softcap_(p.softcap), slopes_(p.alibi_slopes), bias_(p.bias ? p.bias->data() : nullptr), p_(p) {}

  // Whether the problem modifies its scores at all.
  bool active() const { return softcap_ > 0.0 || !slopes_.empty() || bias_ != nullptr; }
  // Whether hides() can be true anywhere (there is a bias).
  bool can_hide() const { return bias_ != nullptr; }
  // Whether derivative() can differ from 1 (soft-capping; ALiBi and the bias only add constants): a backward
  // multiplies dS by it only then.
  bool bends() const { return softcap_ > 0.0; }

  // s" from the scaled score s, for query row i and key j of batch element b and query head h.
  template <typename T>
  T apply(T s, int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (softcap_ > 0.0) s = static_cast<T>(softcap_) * std::tanh(s / static_cast<T>(softcap_));
    if (!slopes_.empty()) s -= static_cast<T>(slopes_[h]) * static_cast<T>(distance(b, i, j));
    if (bias_ != nullptr) s += static_cast<T>(bias(b, h, i, j));
    return s;
  }

  // ds"/ds at the score whose modified value is `modified` (s"): 1 - (s' / cap)^2 with s' = s" + the ALiBi
  // term.
  template <typename T>
  T derivative(T modified, int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (softcap_ <= 0.0) return T(1);
    if (hides(b, h, i, j)) return T(0);  // a -inf bias: the weight is 0 whatever the derivative
    if (!slopes_.empty()) modified += static_cast<T>(slopes_[h]) * static_cast<T>(distance(b, i, j));
    if (bias_ != nullptr) modified -= static_cast<T>(bias(b, h, i, j));
    const T t = modified / static_cast<T>(softcap_);
    return T(1) - t * t;
  }

  // The bias entry of (b, h, i, j), broadcast over batch and heads.
  float bias(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const int64_t bb = p_.bias_batch == 1 ? 0 : b, hh = p_.bias_heads == 1 ? 0 : h;
    return bias_[((bb * p_.bias_heads + hh) * p_.seqlen_q + i) * p_.seqlen_k + j];
  }
  // Whether the bias hides (row i, key j) with -inf, as a mask would: such a key takes no part.
  bool hides(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return bias_ != nullptr && bias(b, h, i, j) == -std::numeric_limits<float>::infinity();
  }

  // |i + rows_k - rows_q - j|: ALiBi's distance, bottom-right aligned like the causal mask.
  int64_t distance(int64_t b, int64_t i, int64_t j) const {
    const int64_t d = i + p_.rows_k(b) - p_.rows_q(b) - j;
    return d < 0 ? -d : d;
  }

 private:
  double softcap_;
  const std::vector<float>& slopes_;
  const float* bias_;
  const Problem& p_;
};

// The ALiBi paper's slopes for `heads` heads (Press et al., 2022, as its reference code and FlashAttention's
// tests compute them): 2^(-8 k / n) for k = 1..n when n is a power of two; otherwise those of the largest
// power of two below n, then every other slope of twice that.
std::vector<float> alibi_slopes(int64_t heads);

// "" when implementation `name` may run `problem`'s score modifications, given whether it supports them;
// else the reason, naming the field: "softcap (30) is not supported by naive/three_pass".
std::string score_mod_refusal(const Problem& problem, bool supported, const std::string& name);
// The same for dropout: "dropout_p (0.1) is not supported by naive/one_pass".
std::string dropout_refusal(const Problem& problem, bool supported, const std::string& name);

}  // namespace flashlab
