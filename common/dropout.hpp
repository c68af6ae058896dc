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

#include <cstdint>

#include "common/host_device.hpp"
#include "common/problem.hpp"

namespace flashlab {

// Philox's four 32-bit counter words and two key words: plain arrays, so that host and device code share
// them.
struct PhiloxCounter {
  uint32_t v[4];
  FLASHLAB_HOST_DEVICE uint32_t operator[](int i) const { return v[i]; }
  friend bool operator==(const PhiloxCounter& a, const PhiloxCounter& b) {
    return a.v[0] == b.v[0] && a.v[1] == b.v[1] && a.v[2] == b.v[2] && a.v[3] == b.v[3];
  }
};
struct PhiloxKey {
  uint32_t v[2];
};

// Philox4x32 with `rounds` rounds (10 is the standard).
FLASHLAB_HOST_DEVICE inline PhiloxCounter philox4x32(PhiloxCounter ctr, PhiloxKey key, int rounds = 10) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;    // the round multipliers
  constexpr uint32_t kBump0 = 0x9E3779B9u, kBump1 = 0xBB67AE85u;  // the key schedule's Weyl increments
  for (int round = 0; round < rounds; ++round) {
    if (round > 0) {
      key.v[0] += kBump0;
      key.v[1] += kBump1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * ctr.v[0], p1 = static_cast<uint64_t>(kMul1) * ctr.v[2];
    ctr = {{static_cast<uint32_t>(p1 >> 32) ^ ctr.v[1] ^ key.v[0], static_cast<uint32_t>(p1),
            static_cast<uint32_t>(p0 >> 32) ^ ctr.v[3] ^ key.v[1], static_cast<uint32_t>(p0)}};
  }
  return ctr;
}

// Dropout's numbers as plain data, and its decision: host code reads them through Dropout below, the GPU
// kernels through a copy (cuda_v2's SplitQParams::dropout).
struct DropoutParams {
  double p = 0.0;      // the drop probability; 0 = no dropout
  double scale = 1.0;  // 1 / (1 - p)
  uint64_t seed = 0;
  uint64_t threshold = 0;  // ceil(p 2^32): u = x / 2^32 >= p exactly when x >= threshold

  FLASHLAB_HOST_DEVICE bool active() const { return p > 0.0; }

  // The factor weight P_ij is multiplied by: 0 (dropped) or 1 / (1 - p) (kept); 1 without dropout.
  template <typename T>
  FLASHLAB_HOST_DEVICE T factor(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (p <= 0.0) return T(1);
    const PhiloxCounter x = philox4x32({{static_cast<uint32_t>(j), static_cast<uint32_t>(i),
                                         static_cast<uint32_t>(h), static_cast<uint32_t>(b)}},
                                       {{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}});
    return x[0] >= threshold ? static_cast<T>(scale) : T(0);
  }
};

// The problem's dropout (p, seed, and the derived scale and threshold).
DropoutParams dropout_params(const Problem& p);

class Dropout {
 public:
  explicit Dropout(const Problem& p) : d_(dropout_params(p)) {}

  bool active() const { return d_.active(); }

  // The factor weight P_ij is multiplied by: 0 (dropped) or 1 / (1 - p) (kept); 1 without dropout.
  template <typename T>
  T factor(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return d_.factor<T>(b, h, i, j);
  }

 private:
  DropoutParams d_;
};

}  // namespace flashlab
