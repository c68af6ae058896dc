// decoding/unified_max: split_kv with FlashDecoding++'s unified max (docs/07-decoding.md).
//
// split_kv's chunks each keep their own running max, so every block may rescale acc and every partial must be
// rescaled by exp(LSE_j - LSE) in the combine. Here every chunk's state starts, and stays, at one shared max
// phi: P = exp(s - phi) needs no max of the block first and nothing is ever rescaled; merging states whose
// maxes are all phi is a plain sum of l_j and acc_j. The price: phi is a guess. A row whose largest score
// leaves [phi + a, phi + b] may have overflowed (or underflowed) and falls back to the exact running-max
// path.
#include "decoding/unified_max.hpp"

#include <omp.h>

#include "common/registry.hpp"
#include "decoding/split_kv.hpp"

namespace flashlab::decoding {

UnifiedMaxStats unified_max_attention(const Problem& p, const AttentionInputs& in, AttentionOutputs& out,
                                      int64_t requested_chunks) {
  const SplitPlan plan = plan_split(p, requested_chunks, omp_get_max_threads());
  const KVReader kv(p, in);
  const QueryRows all{0, p.heads_q, 0, p.seqlen_q};
  const int64_t R = all.count(), d = p.head_dim;
  const SoftmaxState<float> pinned{kUnifiedMax, 0.0f};  // max phi, nothing summed yet
  // Partials: unnormalized acc_j [batch, chunk, R, d], l_j and the largest score seen, [batch, chunk, R].
  std::vector<float> partial_acc(static_cast<size_t>(p.batch * plan.chunks * R * d));
  std::vector<float> partial_sum(static_cast<size_t>(p.batch * plan.chunks * R));
  std::vector<float> partial_max(partial_sum.size());
  std::vector<uint8_t> fallback(static_cast<size_t>(p.batch * R), 0);  // [batch, R]
  int64_t rows_seen = 0, rows_fallen_back = 0;  // UnifiedMaxStats, as reduction variables

#pragma omp parallel
  {
    Workspace workspace;
    std::vector<SoftmaxState<float>> states(static_cast<size_t>(R));
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t chunk = 0; chunk < plan.chunks; ++chunk) {
        const int64_t first = (b * plan.chunks + chunk) * R;
        std::fill(states.begin(), states.end(), pinned);
        float* acc = partial_acc.data() + first * d;  // zero from the vector's construction
        float* seen_max = partial_max.data() + first;
        std::fill(seen_max, seen_max + R, SoftmaxState<float>::neg_inf);
        const int64_t begin = std::min(chunk * plan.chunk_keys, p.seqlen_k);
        const int64_t end = std::min(begin + plan.chunk_keys, p.seqlen_k);
        attend_keys<MaxPolicy::unified>(p, in, kv, b, all, begin, end, states.data(), acc, seen_max,
                                        workspace);
        for (int64_t r = 0; r < R; ++r) partial_sum[first + r] = states[r].row_sum;
      }
    }
    // Combine: states that share the max phi merge by plain addition (merge's factors are both exp(0) = 1).
    std::vector<float> acc(static_cast<size_t>(d));
#pragma omp for collapse(3) schedule(static) reduction(+ : rows_seen, rows_fallen_back)
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        for (int64_t h = 0; h < p.heads_q; ++h) {
          SoftmaxState<float> state;
          std::fill(acc.begin(), acc.end(), 0.0f);
          float row_max = SoftmaxState<float>::neg_inf;
          for (int64_t chunk = 0; chunk < plan.chunks; ++chunk) {
            const int64_t at = (b * plan.chunks + chunk) * R + all.packed(i, h);
            row_max = std::max(row_max, partial_max[at]);
            // A chunk that summed nothing is the empty state: weight 0.
            const SoftmaxState<float> partial = partial_sum[at] == 0.0f
                                                    ? SoftmaxState<float>{}
                                                    : SoftmaxState<float>{kUnifiedMax, partial_sum[at]};
            state.merge(partial, partial_acc.data() + at * d, acc.data(), d);
          }
          if (row_max == SoftmaxState<float>::neg_inf) {  // the row sees no key: O = 0, LSE = -inf
            state.finalize(acc.data(), out.o_row(p, b, i, h), d);
            out.lse_at(p, b, h, i) = state.lse();
            continue;
          }
          ++rows_seen;
          if (row_max > kUnifiedMax + kSafeAboveMax || row_max < kUnifiedMax + kSafeBelowMax) {
            fallback[b * R + all.packed(i, h)] = 1;  // exp(s - phi) may have overflowed or underflowed
            ++rows_fallen_back;
            continue;
          }
          state.finalize(acc.data(), out.o_row(p, b, i, h), d);
          out.lse_at(p, b, h, i) = state.lse();
        }
      }
    }
    // Fallback: the rows outside the safe range, again with the exact running max over all their keys.
    std::vector<float> row_acc(static_cast<size_t>(d));
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        for (int64_t h = 0; h < p.heads_q; ++h) {
          if (!fallback[b * R + all.packed(i, h)]) continue;
          SoftmaxState<float> state;
          std::fill(row_acc.begin(), row_acc.end(), 0.0f);
          attend_keys<MaxPolicy::running>(p, in, kv, b, {h, h + 1, i, i + 1}, 0, p.seqlen_k, &state,
                                          row_acc.data(), nullptr, workspace);
          state.finalize(row_acc.data(), out.o_row(p, b, i, h), d);
          out.lse_at(p, b, h, i) = state.lse();
        }
      }
    }
  }
  return {rows_seen, rows_fallen_back};
}

namespace {

const Registration unified_max{{
    .name = "decoding/unified_max",
    .summary = "FlashDecoding++: one shared max phi for every chunk, partials add unrescaled, exact fallback",
    .constraints = "seqlen_q <= 16, every mask, GQA heads packed; reads the paged KV cache with --page-size",
    .supports = decode_supports,
    .forward = [](const Problem& p, const AttentionInputs& in,
                  AttentionOutputs& out) { unified_max_attention(p, in, out, chunks_from_environment()); },
    .bytes_moved =
        [](const Problem& p) {
          const SplitPlan plan = plan_split(p, chunks_from_environment(), omp_get_max_threads());
          return decode_bytes_moved(p, p.batch * plan.chunks * p.heads_q * p.seqlen_q * (p.head_dim + 2));
        },
}};

}  // namespace

}  // namespace flashlab::decoding
