// What happens to a score between the scaled dot product and the softmax, defined once for every stage that
// supports it (docs/01-softmax.md, "Score modifications"):
//
//   s  = scale * q_i . k_j
//   s' = cap * tanh(s / cap)                       logit soft-capping (Problem::softcap > 0; Gemma 2,
//                                                   FlashAttention's `softcap`), bounding every score by cap
//   s" = s' - slope_h * |i + rows_k - rows_q - j|   ALiBi (Problem::alibi_slopes, one slope per query head),
//   as
//                                                   FlashAttention's `alibi_slopes` defines it: the distance
//                                                   is bottom-right aligned, like the causal mask, with the
//                                                   batch element's own lengths
//
// then the mask (common/mask.hpp) hides what it hides. The modification is applied after the scale and before
// the row max: the online softmax's max, sum and LSE are those of the modified scores. Its derivative for the
// backward: ds"/ds = 1 - tanh^2(s / cap) = 1 - (s' / cap)^2 (ALiBi adds a constant).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/problem.hpp"

namespace flashlab {

class ScoreMod {
 public:
  explicit ScoreMod(const Problem& p) : softcap_(p.softcap), slopes_(p.alibi_slopes), p_(p) {}

  // Whether the problem modifies its scores at all (a stage without support refuses such a problem).
  static bool any(const Problem& p) { return p.softcap > 0.0 || !p.alibi_slopes.empty(); }
  bool active() const { return softcap_ > 0.0 || !slopes_.empty(); }

  // s" from the scaled score s, for query row i and key j of batch element b and query head h.
  template <typename T>
  T apply(T s, int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (softcap_ > 0.0) s = static_cast<T>(softcap_) * std::tanh(s / static_cast<T>(softcap_));
    if (!slopes_.empty()) s -= static_cast<T>(slopes_[h]) * static_cast<T>(distance(b, i, j));
    return s;
  }

  // ds"/ds at the score whose modified value is `modified` (s"): 1 - (s' / cap)^2 with s' = s" + the ALiBi
  // term.
  template <typename T>
  T derivative(T modified, int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (softcap_ <= 0.0) return T(1);
    if (!slopes_.empty()) modified += static_cast<T>(slopes_[h]) * static_cast<T>(distance(b, i, j));
    const T t = modified / static_cast<T>(softcap_);
    return T(1) - t * t;
  }

  // |i + rows_k - rows_q - j|: ALiBi's distance, bottom-right aligned like the causal mask.
  int64_t distance(int64_t b, int64_t i, int64_t j) const {
    const int64_t d = i + p_.rows_k(b) - p_.rows_q(b) - j;
    return d < 0 ? -d : d;
  }

 private:
  double softcap_;
  const std::vector<float>& slopes_;
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
