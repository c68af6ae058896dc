// decoding/unified_max: FlashDecoding++'s asynchronized softmax with a unified max value (Hong et al. 2024,
// Sec. 3), on top of decoding/split_kv (docs/07-decoding.md).
#pragma once

#include <cstdint>

#include "common/problem.hpp"
#include "common/tensor.hpp"

namespace flashlab::decoding {

// phi, the max value every chunk shares: the state's max stays here, P = exp(s - phi), and partials add
// without rescaling. FlashDecoding++ picks phi per model from the statistics of its scores; scale * q.k of
// inputs centred on 0 is centred on 0, so phi = 0.
constexpr float kUnifiedMax = 0.0f;
// The range [phi + a, phi + b] in which a row's largest score must lie for exp(s - phi) to be safe in fp32.
// b: every weight is at most e^b, so the sums over n keys stay below n e^b (e^40 = 2.4e17; 2^31 keys give
// 5e26, far below FLT_MAX = 3.4e38, with room for |v| up to 1e11). a: when even the largest score is below
// phi + a, every weight is below e^a and the small ones underflow; with a = -60 (e^-60 = 8.8e-27) the weights
// down to 1e-11 of the largest are still normal floats, below that they do not change an fp32 sum.
constexpr float kSafeBelowMax = -60.0f;  // a
constexpr float kSafeAboveMax = 40.0f;   // b

struct UnifiedMaxStats {
  int64_t rows = 0;           // (batch, query row, head) rows that see at least one key
  int64_t fallback_rows = 0;  // rows whose largest score left [phi + a, phi + b]: recomputed exactly
};

// decoding/unified_max; requested_chunks as in plan_split (split_kv.hpp).
UnifiedMaxStats unified_max_attention(const Problem& p, const AttentionInputs& in, AttentionOutputs& out,
                                      int64_t requested_chunks = 0);

}  // namespace flashlab::decoding
