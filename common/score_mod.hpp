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

#include "common/host_device.hpp"
#include "common/problem.hpp"

namespace flashlab {

// The modification's numbers as plain data, and its math: host code reads them through ScoreMod below, the
// GPU kernels through a copy whose pointers are device pointers (cuda_v2's SplitQParams::mod). `rows_q` and
// `rows_k` are the batch element's own lengths (ALiBi's distance is bottom-right aligned like the mask).
struct ScoreModParams {
  double softcap = 0.0;           // > 0: soft-capping
  const float* slopes = nullptr;  // ALiBi: one slope per query head, or null
  const float* bias = nullptr;    // [bias_batch, bias_heads, seqlen_q, seqlen_k], or null
  int64_t bias_batch = 1, bias_heads = 1, seqlen_q = 0, seqlen_k = 0;

  FLASHLAB_HOST_DEVICE bool active() const { return softcap > 0.0 || slopes != nullptr || bias != nullptr; }

  // s" from the scaled score s, for query row i and key j of batch element b and query head h.
  template <typename T>
  FLASHLAB_HOST_DEVICE T apply(T s, int64_t b, int64_t h, int64_t i, int64_t j, int64_t rows_q,
                               int64_t rows_k) const {
    if (softcap > 0.0) s = static_cast<T>(softcap) * tanh_of(s / static_cast<T>(softcap));
    if (slopes != nullptr) s -= static_cast<T>(slopes[h]) * static_cast<T>(distance(i, j, rows_q, rows_k));
    if (bias != nullptr) s += static_cast<T>(bias_at(b, h, i, j));
    return s;
  }

  // ds"/ds at the score whose modified value is `modified` (s"): 1 - (s' / cap)^2 with s' = s" + the ALiBi
  // term - the bias.
  template <typename T>
  FLASHLAB_HOST_DEVICE T derivative(T modified, int64_t b, int64_t h, int64_t i, int64_t j, int64_t rows_q,
                                    int64_t rows_k) const {
    if (softcap <= 0.0) return T(1);
    if (hides(b, h, i, j)) return T(0);  // a -inf bias: the weight is 0 whatever the derivative
    if (slopes != nullptr)
      modified += static_cast<T>(slopes[h]) * static_cast<T>(distance(i, j, rows_q, rows_k));
    if (bias != nullptr) modified -= static_cast<T>(bias_at(b, h, i, j));
    const T t = modified / static_cast<T>(softcap);
    return T(1) - t * t;
  }

  // The bias entry of (b, h, i, j), broadcast over batch and heads.
  FLASHLAB_HOST_DEVICE float bias_at(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const int64_t bb = bias_batch == 1 ? 0 : b, hh = bias_heads == 1 ? 0 : h;
    return bias[((bb * bias_heads + hh) * seqlen_q + i) * seqlen_k + j];
  }
  // Whether the bias hides (row i, key j) with -inf, as a mask would: such a key takes no part.
  FLASHLAB_HOST_DEVICE bool hides(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return bias != nullptr && bias_at(b, h, i, j) == -INFINITY;
  }

  // |i + rows_k - rows_q - j|: ALiBi's distance, bottom-right aligned like the causal mask.
  FLASHLAB_HOST_DEVICE static int64_t distance(int64_t i, int64_t j, int64_t rows_q, int64_t rows_k) {
    const int64_t d = i + rows_k - rows_q - j;
    return d < 0 ? -d : d;
  }

 private:
  template <typename T>
  FLASHLAB_HOST_DEVICE static T tanh_of(T x) {
#if defined(__CUDA_ARCH__)
    return tanh(x);  // CUDA's float and double overloads
#else
    return std::tanh(x);
#endif
  }
};

// The problem's modification, for host code (the host pointers of the Problem's slopes and bias).
ScoreModParams score_mod_params(const Problem& p);

class ScoreMod {
 public:
  explicit ScoreMod(const Problem& p) : m_(score_mod_params(p)), p_(p) {}

  // Whether the problem modifies its scores at all.
  bool active() const { return m_.active(); }
  // Whether hides() can be true anywhere (there is a bias).
  bool can_hide() const { return m_.bias != nullptr; }
  // Whether derivative() can differ from 1 (soft-capping; ALiBi and the bias only add constants): a backward
  // multiplies dS by it only then.
  bool bends() const { return m_.softcap > 0.0; }

  // s" from the scaled score s, for query row i and key j of batch element b and query head h.
  template <typename T>
  T apply(T s, int64_t b, int64_t h, int64_t i, int64_t j) const {
    return m_.apply(s, b, h, i, j, p_.rows_q(b), p_.rows_k(b));
  }
  // ds"/ds at the score whose modified value is `modified` (s").
  template <typename T>
  T derivative(T modified, int64_t b, int64_t h, int64_t i, int64_t j) const {
    return m_.derivative(modified, b, h, i, j, p_.rows_q(b), p_.rows_k(b));
  }
  float bias(int64_t b, int64_t h, int64_t i, int64_t j) const { return m_.bias_at(b, h, i, j); }
  bool hides(int64_t b, int64_t h, int64_t i, int64_t j) const { return m_.hides(b, h, i, j); }
  int64_t distance(int64_t b, int64_t i, int64_t j) const {
    return ScoreModParams::distance(i, j, p_.rows_q(b), p_.rows_k(b));
  }

 private:
  ScoreModParams m_;
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
