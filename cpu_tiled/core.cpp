// cpu_tiled/core: FlashAttention-2's forward (Dao 2023, Algorithm 1) on the CPU, written to be read beside
// the paper. The plain case only: fp32, causal, window and padding masks, GQA, LSE. cpu_tiled/forward is the
// same algorithm made fast (a SIMD micro-kernel, packed tiles, skipped tiles, the variants); this file is the
// algorithm.
//
// Algorithm 1, line by line (the [Ln] marks in the code below; tests/check_cores.py holds this table to
// them):
//   [L1]  Q into Tr blocks of Br rows, K and V into Tc blocks of Bc keys            kBr, kBc
//   [L2]  O into Tr blocks, the logsumexp L into Tr blocks                         (the output tensors)
//   [L3]  for each Q block i (in parallel: one per (batch, query head, i))       core_forward
//   [L4]  load Q_i                                                                 attend_q_block
//   [L5]  O~_i = 0, l_i = 0, m_i = -inf                                            SoftmaxState per row
//   [L6]  for each K/V block j
//   [L7]  load K_j, V_j
//   [L8]  S_ij = Q_i K_j^T (times the softmax scale)
//   [L9]  m_ij = max(m_i, rowmax(S_ij)), P~_ij = exp(S_ij - m_ij), l_ij = e^(m_i - m_ij) l_i + rowsum(P~_ij)
//   [L10] O~_i = diag(e^(m_i - m_ij)) O~_i + P~_ij V_j
//   [L12] O_i = diag(l_i)^-1 O~_i
//   [L13] L_i = m_i + log(l_i)
//   [L14] write O_i;  [L15] write L_i
// (Lines 11 and 16 close the loops; 17 returns.) The running statistics m and l are common/softmax_state.hpp,
// the one softmax state every stage shares; which keys a row sees is common/mask.hpp.
//
// A hidden (row, key) pair takes no part at all: its score is not computed and its V row not read. So a NaN
// or Inf stored in a key this row does not see, or in padding past the real lengths, never reaches the row,
// and a NaN it does see turns the row NaN, as in the reference (docs/conventions.md §4).
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "common/mask.hpp"
#include "common/registry.hpp"
#include "common/softmax_state.hpp"

namespace flashlab::cpu_tiled {

namespace {

constexpr int64_t kBr = 64;  // [L1] query rows per Q block
constexpr int64_t kBc = 64;  // [L1] keys per K/V block

// One Q block of one (batch, query head): Algorithm 1 lines 4-15.
void attend_q_block(const Problem& p, const Visibility& visibility, const AttentionInputs& in,
                    AttentionOutputs& out, int64_t b, int64_t h, int64_t i0) {
  const int64_t d = p.head_dim, rows = std::min(kBr, p.seqlen_q - i0);
  const int64_t hk = p.kv_head(h);  // GQA: this query head's K/V head
  const float scale = static_cast<float>(p.softmax_scale());

  // [L4] Q_i, rows i0 .. i0 + rows - 1 (read in place: BSHD rows are contiguous in the head dim).
  std::array<const float*, kBr> q_i{};
  for (int64_t r = 0; r < rows; ++r) q_i[r] = in.q_row(p, b, i0 + r, h);

  // [L5] O~_i = 0, and m_i = -inf, l_i = 0 in each row's state.
  std::vector<float> o_i(static_cast<size_t>(kBr * d), 0.0f);
  std::array<SoftmaxState<float>, kBr> state{};

  std::array<float, kBr * kBc> s{};             // S_ij, then P~_ij in place
  const int64_t keys = p.rows_k(b);             // keys past the batch's length are padding: never loaded
  for (int64_t j0 = 0; j0 < keys; j0 += kBc) {  // [L6]
    const int64_t cols = std::min(kBc, keys - j0);
    for (int64_t r = 0; r < rows; ++r) {
      const KeyRange seen = visibility.key_range(b, i0 + r);  // causal, window, padding: one range a row
      // [L7] + [L8] S_ij = scale Q_i K_j^T, over the keys this row sees; the others are -inf (weight 0).
      float block_max = SoftmaxState<float>::neg_inf;
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t j = j0 + c;
        float score = SoftmaxState<float>::neg_inf;
        if (j >= seen.begin && j < seen.end) {
          const float* k_j = in.k_row(p, b, j, hk);
          float dot = 0.0f;
          for (int64_t x = 0; x < d; ++x) dot += q_i[r][x] * k_j[x];
          score = scale * dot;
        }
        s[r * kBc + c] = score;
        block_max = score != score ? score : std::max(block_max, score);  // a NaN score poisons the row
      }
      // [L9] m_ij = max(m_i, rowmax(S_ij)); l and O~ are rescaled by e^(m_i - m_ij) ...
      const float rescale = state[r].raise_max(block_max);
      float* o_row = o_i.data() + r * d;
      for (int64_t x = 0; x < d; ++x) o_row[x] *= rescale;  // [L10] diag(e^(m_i - m_ij)) O~_i
      // ... P~_ij = exp(S_ij - m_ij), l_ij += rowsum(P~_ij); [L10] O~_i += P~_ij V_j, visible keys only.
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t j = j0 + c;
        if (j < seen.begin || j >= seen.end) continue;  // hidden: its V row is not read
        const float weight = state[r].weight(s[r * kBc + c]);
        state[r].add(weight);
        const float* v_j = in.v_row(p, b, j, hk);
        for (int64_t x = 0; x < d; ++x) o_row[x] += weight * v_j[x];
      }
    }
  }

  for (int64_t r = 0; r < rows; ++r) {
    // [L12] O_i = O~_i / l_i and [L14] write it; a row that saw no key writes 0 (normalizer() is then 0).
    state[r].finalize(o_i.data() + r * d, out.o_row(p, b, i0 + r, h), d);
    // [L13] L_i = m_i + log(l_i), -inf for a row that saw no key; [L15] write it.
    out.lse_at(p, b, h, i0 + r) = state[r].lse();
  }
}

// [L3] The loop over Q blocks, for every batch element and query head: independent, so in parallel. [L2] O
// and L are the caller's tensors, each Q block writing its own rows of them.
void core_forward(const Problem& p, const AttentionInputs& in, AttentionOutputs& out) {
  const Visibility visibility(p);
  const int64_t q_blocks = (p.seqlen_q + kBr - 1) / kBr;
  const int64_t items = p.batch * p.heads_q * q_blocks;
#pragma omp parallel for schedule(dynamic)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t i_block = item % q_blocks, h = item / q_blocks % p.heads_q, b = item / q_blocks / p.heads_q;
    attend_q_block(p, visibility, in, out, b, h, i_block * kBr);
  }
}

const Registration core{{
    .name = "cpu_tiled/core",
    .summary = "FA2 Algorithm 1 as the paper writes it: Q blocks outer, K/V blocks inner, plain loops",
    .constraints = "the plain case: causal, window, padding, GQA, any head_dim; no explicit mask",
    .explicit_mask = false,
    .forward = core_forward,
}};

}  // namespace

}  // namespace flashlab::cpu_tiled
