// decoding/split_kv: Flash-Decoding (Dao, Haziza, Massa, Sizov 2023) on the CPU (docs/07-decoding.md).
//
// One query row (or a few) against a long KV cache leaves nothing to parallelize over queries, so the keys
// are split: each (batch element, chunk) is a work item that runs the online softmax over its chunk for every
// head and yields a partial (O_j, LSE_j); a combine then merges the partials of each row, weighting O_j by
// exp(LSE_j - LSE). The merge is SoftmaxState::merge, the same one the tiled stage uses between tiles.
#include "decoding/split_kv.hpp"

#include <omp.h>

#include <cstdlib>
#include <string>

#include "common/error.hpp"
#include "common/registry.hpp"

namespace flashlab::decoding {

// [[maybe_unused]] out: written only by exercise split-kv-combine's lines; a student's copy without them must
// still compile warning-free.
void split_kv_attention(const Problem& p, const AttentionInputs& in, [[maybe_unused]] AttentionOutputs& out,
                        int64_t requested_chunks) {
  const SplitPlan plan = plan_split(p, requested_chunks, omp_get_max_threads());
  const KVReader kv(p, in);
  const QueryRows all{0, p.heads_q, 0, p.seqlen_q};  // every head and row of a batch element, packed
  const int64_t R = all.count(), d = p.head_dim;
  // Partials: O_j [batch, chunk, R, d] (normalized) and LSE_j [batch, chunk, R].
  std::vector<float> partial_o(static_cast<size_t>(p.batch * plan.chunks * R * d));
  std::vector<float> partial_lse(static_cast<size_t>(p.batch * plan.chunks * R));

#pragma omp parallel
  {
    Workspace workspace;
    std::vector<SoftmaxState<float>> states(static_cast<size_t>(R));
    std::vector<float> acc(static_cast<size_t>(R * d));
    // Split: chunk j of batch element b -> (O_j, LSE_j) for every packed row.
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t chunk = 0; chunk < plan.chunks; ++chunk) {
        std::fill(states.begin(), states.end(), SoftmaxState<float>{});
        std::fill(acc.begin(), acc.end(), 0.0f);
        const int64_t begin = std::min(chunk * plan.chunk_keys, p.seqlen_k);
        const int64_t end = std::min(begin + plan.chunk_keys, p.seqlen_k);
        attend_keys<MaxPolicy::running>(p, in, kv, b, all, begin, end, states.data(), acc.data(), nullptr,
                                        workspace);
        const int64_t first = (b * plan.chunks + chunk) * R;
        for (int64_t r = 0; r < R; ++r) {  // an empty chunk gives O_j = 0, LSE_j = -inf: weight 0 below
          states[r].finalize(acc.data() + r * d, partial_o.data() + (first + r) * d, d);
          partial_lse[first + r] = states[r].lse();
        }
      }
    }
    // Combine: per row, O = sum_j exp(LSE_j - LSE) O_j with LSE = log sum_j exp(LSE_j).
#pragma omp for collapse(3) schedule(static)
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        for (int64_t h = 0; h < p.heads_q; ++h) {
          // EXERCISE BEGIN split-kv-combine
          // teaches: the Flash-Decoding combine: the chunks' normalized partials (O_j, LSE_j) merge exactly
          //   into O = sum_j exp(LSE_j - LSE) O_j with LSE = log sum_j exp(LSE_j)
          // difficulty: 2
          // docs: docs/07-decoding.md#3. Why the merge is exact
          // hint: each chunk left a normalized partial (O_j, LSE_j); they merge exactly into the row's O and
          //   LSE, each weighted by exp(LSE_j - LSE)
          // hint2: find the row's partial in each chunk (its packed row index), merge them with
          //   combine_partials (or from_lse and merge), then write O and the LSE
          // hint3: row (i, h) of batch element b is packed row all.packed(i, h); its partial from chunk j is
          //   at partial_o[((b * plan.chunks + j) * R + packed) * d] and partial_lse[(b * plan.chunks + j) *
          //   R + packed]. Merge the plan.chunks partials (combine_partials in common/softmax_state.hpp, or
          //   SoftmaxState::from_lse and merge into acc), then write O (finalize into out.o_row(p, b, i, h))
          //   and the LSE (out.lse_at(p, b, h, i)). A chunk that saw no key has LSE_j = -inf: weight 0.
          const int64_t first = b * plan.chunks * R + all.packed(i, h);
          const SoftmaxState<float> state = combine_partials(plan.chunks, partial_o.data() + first * d, R * d,
                                                             partial_lse.data() + first, R, acc.data(), d);
          state.finalize(acc.data(), out.o_row(p, b, i, h), d);
          out.lse_at(p, b, h, i) = state.lse();
          // EXERCISE END split-kv-combine
        }
      }
    }
  }
}

std::string decode_supports(const Problem& p) {
  if (p.seqlen_q > kMaxQueryRows)  // prefill (many query rows) is the tiled stages' work
    return "seqlen_q (" + std::to_string(p.seqlen_q) + ") must be <= " + std::to_string(kMaxQueryRows) +
           " (decoding: one query row or a small draft)";
  return "";
}

SplitPlan plan_split(const Problem& p, int64_t requested_chunks, int threads) {
  SplitPlan plan;
  if (p.seqlen_k == 0) return {1, 0};
  if (requested_chunks > 0) {
    plan.chunks = requested_chunks;
  } else {
    // Several work items per core (8): dynamic scheduling then evens out chunks of unequal work (ragged
    // lengths, causal rows) and a core that another process slows down.
    const int64_t wanted = 8 * static_cast<int64_t>(threads);
    plan.chunks = std::max<int64_t>(1, (wanted + p.batch - 1) / p.batch);
    plan.chunks = std::min(plan.chunks, std::max<int64_t>(1, p.seqlen_k / kMinChunkKeys));
  }
  plan.chunk_keys = (p.seqlen_k + plan.chunks - 1) / plan.chunks;
  plan.chunks = (p.seqlen_k + plan.chunk_keys - 1) / plan.chunk_keys;  // no chunk entirely past seqlen_k
  return plan;
}

int64_t chunks_from_environment() {
  const char* text = std::getenv("FLASHLAB_DECODE_CHUNKS");
  if (text == nullptr || *text == '\0') return 0;
  char* rest = nullptr;
  const long long chunks = std::strtoll(text, &rest, 10);
  if (*rest != '\0' || chunks < 0) fail("FLASHLAB_DECODE_CHUNKS ('", text, "') must be an integer >= 0");
  return chunks;
}

double decode_bytes_moved(const Problem& p, int64_t partial_elements, double element_bytes, double q_reads) {
  const Visibility visibility(p);
  double kv_tokens = 0;  // the union of the rows' bands: what attend_keys reads
  for (int64_t b = 0; b < p.batch; ++b) {
    int64_t lo = p.seqlen_k, hi = 0;
    for (int64_t i = 0; i < p.seqlen_q; ++i) {
      const KeyRange range = visibility.key_range(b, i);
      if (!range.empty()) lo = std::min(lo, range.begin), hi = std::max(hi, range.end);
    }
    kv_tokens += static_cast<double>(std::max<int64_t>(0, hi - lo));
  }
  const double kv_bytes = 2.0 * element_bytes * kv_tokens * static_cast<double>(p.heads_kv * p.head_dim);
  const double q_o_lse = element_bytes * (q_reads + 1.0) * static_cast<double>(p.q_elements()) +
                         4.0 * static_cast<double>(p.lse_elements());
  return kv_bytes + q_o_lse + 2.0 * 4.0 * static_cast<double>(partial_elements);
}

namespace {

const Registration split_kv{{
    .name = "decoding/split_kv",
    .summary = "Flash-Decoding: KV split into chunks, partial (O_j, LSE_j) per chunk, exact LSE combine",
    .constraints = "seqlen_q <= 16, every mask, GQA heads packed; reads the paged KV cache with --page-size",
    .supports = decode_supports,
    .forward = [](const Problem& p, const AttentionInputs& in,
                  AttentionOutputs& out) { split_kv_attention(p, in, out, chunks_from_environment()); },
    .bytes_moved =
        [](const Problem& p) {
          const SplitPlan plan = plan_split(p, chunks_from_environment(), omp_get_max_threads());
          return decode_bytes_moved(p, p.batch * plan.chunks * p.heads_q * p.seqlen_q * (p.head_dim + 1));
        },
}};

}  // namespace

}  // namespace flashlab::decoding
