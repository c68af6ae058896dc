// Dropout on the attention weights, fused as FlashAttention fuses it: after the softmax's normalizer is
// accumulated (so the LSE is that of the undropped weights), each weight P_ij is kept with probability 1 - p
// and scaled by 1 / (1 - p), or dropped (0). The keep decision is a pure function of (seed, batch, head, row,
// key), so the backward recomputes the same mask instead of storing it, and every stage that supports dropout
// drops the same weights (docs/01-softmax.md, "Dropout").
//
// The generator is Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), the
// counter-based generator the GPU libraries use; tests/test_score_mod.cpp checks it against the published
// known-answer vectors. Counter (key j, row i, head h, batch b), key (seed's low and high words); the first
// output word x gives u = x / 2^32 in [0, 1), and the weight is kept when u >= p. (FlashAttention's own
// counter layout differs; this one is flashlab's.)
#pragma once

#include <array>
#include <cstdint>

#include "common/host_device.hpp"
#include "common/problem.hpp"

namespace flashlab {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// Philox4x32 with `rounds` rounds (10 is the standard).
FLASHLAB_HOST_DEVICE inline PhiloxCounter philox4x32(PhiloxCounter ctr, PhiloxKey key, int rounds = 10) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;    // the round multipliers
  constexpr uint32_t kBump0 = 0x9E3779B9u, kBump1 = 0xBB67AE85u;  // the key schedule's Weyl increments
  for (int round = 0; round < rounds; ++round) {
    if (round > 0) {
      key[0] += kBump0;
      key[1] += kBump1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * ctr[0], p1 = static_cast<uint64_t>(kMul1) * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<uint32_t>(p0)};
  }
  return ctr;
}

class Dropout {
 public:
  explicit Dropout(const Problem& p)
      : p_(p.dropout_p), scale_(p.dropout_p > 0.0 ? 1.0 / (1.0 - p.dropout_p) : 1.0), seed_(p.dropout_seed) {}

  bool active() const { return p_ > 0.0; }

  // The factor weight P_ij is multiplied by: 0 (dropped) or 1 / (1 - p) (kept); 1 without dropout.
  template <typename T>
  T factor(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (p_ <= 0.0) return T(1);
    const PhiloxCounter x = philox4x32({static_cast<uint32_t>(j), static_cast<uint32_t>(i),
                                        static_cast<uint32_t>(h), static_cast<uint32_t>(b)},
                                       {static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)});
    const double u = static_cast<double>(x[0]) * 0x1p-32;
    return u >= p_ ? static_cast<T>(scale_) : T(0);
  }

 private:
  double p_, scale_;
  uint64_t seed_;
};

}  // namespace flashlab
