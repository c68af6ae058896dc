// decoding/core: Flash-Decoding (Dao, Haziza, Massa, Sizov 2023) on the CPU, written to be read beside the
// method. The plain case only: fp32, one query row or a few (seqlen_q <= 16), causal, window and padding
// masks, GQA, LSE, contiguous K and V. decoding/split_kv is the same method made fast (GQA heads packed into
// one pass over K and V, vectorized, paged KV); this file is the method.
//
// Decoding has one query row per sequence, so FlashAttention's parallelism over query blocks finds nothing to
// split. Flash-Decoding splits the keys instead, in three steps (the [Sn] marks below; tests/check_cores.py
// holds this table to them):
//   [S1]  split the keys of each sequence into chunks                               plan_chunks
//   [S2]  for each (batch, query head, chunk) in parallel: FlashAttention over the chunk's keys, giving its
//         normalized partial output O_j and its log-sum-exp LSE_j                  attend_chunk
//   [S3]  combine the partials of each row: LSE = log sum_j exp(LSE_j) and O = sum_j exp(LSE_j - LSE) O_j
//                                                                                   core_forward
// The online softmax inside a chunk and the combine are both common/softmax_state.hpp (SoftmaxState and
// combine_partials): a chunk's partial (O_j, LSE_j) is the state {m = LSE_j, l = 1} with accumulator O_j, so
// the combine is the same merge that joins the tiles of a prefill. Which keys a row sees is common/mask.hpp.
//
// A hidden (row, key) pair takes no part: its score is not computed and its V row not read, so padding and
// hidden keys may hold anything (docs/conventions.md §4). An empty chunk (every key hidden, or past the
// sequence's length) gives O_j = 0, LSE_j = -inf, which weighs 0 in the combine.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/mask.hpp"
#include "common/registry.hpp"
#include "common/softmax_state.hpp"
#include "decoding/split_kv.hpp"

namespace flashlab::decoding {

namespace {

constexpr int64_t kChunkKeys = 512;  // [S1] keys per chunk: long enough to amortize a partial

// [S1] The chunks of a sequence of seqlen_k keys: [c * kChunkKeys, (c + 1) * kChunkKeys), the last shorter.
int64_t plan_chunks(const Problem& p) {
  return std::max<int64_t>(1, (p.seqlen_k + kChunkKeys - 1) / kChunkKeys);
}

// [S2] Query row i of head h of batch element b over the keys [j0, j1): the online softmax (FA2 Algorithm 1's
// inner loop, one key at a time), then its normalized partial O_j (d values at o_j) and LSE_j.
void attend_chunk(const Problem& p, const Visibility& visibility, const AttentionInputs& in, int64_t b,
                  int64_t h, int64_t i, int64_t j0, int64_t j1, float* o_j, float& lse_j) {
  const int64_t d = p.head_dim, hk = p.kv_head(h);  // GQA: the query head's K/V head
  const float scale = static_cast<float>(p.softmax_scale());
  const float* q = in.q_row(p, b, i, h);
  const KeyRange seen = visibility.key_range(b, i);  // causal, window, padding: one range a row
  SoftmaxState<float> state;
  std::vector<float> acc(static_cast<size_t>(d), 0.0f);  // the unnormalized output O~
  for (int64_t j = std::max(j0, seen.begin); j < std::min(j1, seen.end); ++j) {
    const float* k = in.k_row(p, b, j, hk);
    float dot = 0.0f;
    for (int64_t x = 0; x < d; ++x) dot += q[x] * k[x];
    // m = max(m, s), l and O~ rescaled by exp(m_old - m), then l += exp(s - m), O~ += exp(s - m) v_j.
    state.push(scale * dot, in.v_row(p, b, j, hk), acc.data(), d);
  }
  state.finalize(acc.data(), o_j, d);  // O_j = O~ / l, 0 for an empty chunk
  lse_j = state.lse();                 // m + log l, -inf for an empty chunk
}

void core_forward(const Problem& p, const AttentionInputs& in, AttentionOutputs& out) {
  const Visibility visibility(p);
  const int64_t d = p.head_dim, chunks = plan_chunks(p);  // [S1]
  const int64_t rows = p.batch * p.heads_q * p.seqlen_q;
  // The partials: O_j [rows, chunks, d] and LSE_j [rows, chunks], row = (b * heads_q + h) * seqlen_q + i.
  std::vector<float> partial_o(static_cast<size_t>(rows * chunks * d));
  std::vector<float> partial_lse(static_cast<size_t>(rows * chunks));

  // [S2] Every (row, chunk) is independent: in parallel, the chunks of one row on different threads.
#pragma omp parallel for schedule(dynamic)
  for (int64_t item = 0; item < rows * chunks; ++item) {
    const int64_t chunk = item % chunks, row = item / chunks;
    const int64_t i = row % p.seqlen_q, h = row / p.seqlen_q % p.heads_q, b = row / p.seqlen_q / p.heads_q;
    const int64_t j0 = chunk * kChunkKeys, j1 = std::min(j0 + kChunkKeys, p.seqlen_k);
    attend_chunk(p, visibility, in, b, h, i, j0, j1, partial_o.data() + item * d, partial_lse[item]);
  }

  // [S3] Each row's partials merge by their LSE: O = sum_j exp(LSE_j - LSE) O_j, LSE = log sum_j exp(LSE_j).
#pragma omp parallel for
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t i = row % p.seqlen_q, h = row / p.seqlen_q % p.heads_q, b = row / p.seqlen_q / p.heads_q;
    std::vector<float> acc(static_cast<size_t>(d));
    const SoftmaxState<float> merged = combine_partials(chunks, partial_o.data() + row * chunks * d, d,
                                                        partial_lse.data() + row * chunks, 1, acc.data(), d);
    merged.finalize(acc.data(), out.o_row(p, b, i, h), d);
    out.lse_at(p, b, h, i) = merged.lse();
  }
}

std::string core_supports(const Problem& p) {
  if (std::string reason = decode_supports(p); !reason.empty()) return reason;  // the stage's rule: seqlen_q
  if (p.page_size > 0)
    return "page_size (" + std::to_string(p.page_size) +
           "): a paged KV cache is decoding/split_kv's (the core reads contiguous K and V)";
  return "";
}

const Registration core{{
    .name = "decoding/core",
    .summary = "Flash-Decoding as the method says it: split the keys, a partial (O_j, LSE_j) each, combine",
    .constraints = "the plain case: seqlen_q <= 16, causal, window, padding, GQA; no explicit mask or pages",
    .explicit_mask = false,
    .supports = core_supports,
    .forward = core_forward,
}};

}  // namespace

}  // namespace flashlab::decoding
