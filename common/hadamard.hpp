// Incoherent processing (FlashAttention-3 Sec. 3.3): a random orthogonal transform of the head dimension,
//   M = H diag(s) / sqrt(d),  H the d x d Walsh-Hadamard matrix (entries +-1), s random signs,
// applied to every row x of Q and K as x -> x M. M is orthogonal (M M^T = H H^T / d = I), so
// (Q M)(K M)^T = Q M M^T K^T = Q K^T: attention is unchanged, but each output coordinate is a +-1 mix of all
// d input coordinates, which spreads one large entry (an outlier) over the whole row before fp8 quantization.
// The fast Walsh-Hadamard transform does it in d log2(d) additions instead of d^2 multiply-adds; it needs d
// to be a power of two (Sylvester's construction H_2d = [[H_d, H_d], [H_d, -H_d]]).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/inputs.hpp"

namespace flashlab {

class RandomHadamard {
 public:
  // "" when a transform of this dimension exists, else why not (naming the field).
  static std::string why_unsupported(int64_t dim) {
    if (dim < 1 || (dim & (dim - 1)) != 0)
      return "head_dim (" + std::to_string(dim) +
             ") must be a power of two for the Walsh-Hadamard transform (Sylvester's construction)";
    return "";
  }

  RandomHadamard(int64_t dim, uint64_t seed)
      : dim_(dim), normalizer_(1.0f / std::sqrt(static_cast<float>(dim))) {
    if (const std::string reason = why_unsupported(dim); !reason.empty()) fail(reason);
    Random random(seed);
    signs_.resize(static_cast<size_t>(dim));
    for (float& sign : signs_) sign = (random.next() >> 63) ? -1.0f : 1.0f;
  }

  int64_t dim() const { return dim_; }
  // The factor apply() multiplies coordinate c by after the butterflies: s_c / sqrt(d), rounded to float as
  // apply() rounds it (a kernel that applies the same transform takes these factors).
  float output_factor(int64_t c) const { return signs_[static_cast<size_t>(c)] * normalizer_; }

  // x <- x M = (x H) diag(s) / sqrt(d), in place (H is symmetric, so x H is the transform of x).
  void apply(float* x) const {
    walsh_hadamard(x);
    for (int64_t c = 0; c < dim_; ++c) x[c] *= signs_[c] * normalizer_;
  }

  // x <- x M^T = (x diag(s)) H / sqrt(d): the inverse of apply().
  void apply_transpose(float* x) const {
    for (int64_t c = 0; c < dim_; ++c) x[c] *= signs_[c];
    walsh_hadamard(x);
    for (int64_t c = 0; c < dim_; ++c) x[c] *= normalizer_;
  }

 private:
  // x <- x H, unnormalized: log2(d) butterfly rounds, each pairing entries `half` apart (a, b) -> (a + b, a -
  // b).
  void walsh_hadamard(float* x) const {
    for (int64_t half = 1; half < dim_; half *= 2)
      for (int64_t block = 0; block < dim_; block += 2 * half)
        for (int64_t c = block; c < block + half; ++c) {
          const float a = x[c], b = x[c + half];
          x[c] = a + b;
          x[c + half] = a - b;
        }
  }

  int64_t dim_;
  float normalizer_;
  std::vector<float> signs_;
};

}  // namespace flashlab
