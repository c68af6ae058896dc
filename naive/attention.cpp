// The naive stage: attention as it is written before FlashAttention (docs/01-softmax.md).
//
//   naive/three_pass      S = scale QK^T and P = softmax(S) materialized, three-pass safe softmax, O = PV
//   naive/online_softmax  the same, with the online normalizer (two passes over S instead of three)
//   naive/one_pass        no S at all: one pass over the keys per query row, with a running max, sum and O
//   naive/standard_gemm   what a practitioner writes first: Eigen GEMMs for QK^T and PV, S materialized
#include <omp.h>
#include <unistd.h>

#include <Eigen/Dense>
#include <span>
#include <vector>

#include "common/dropout.hpp"
#include "common/flops.hpp"
#include "common/mask.hpp"
#include "common/registry.hpp"
#include "common/score_mod.hpp"
#include "common/softmax_state.hpp"
#include "common/special_values.hpp"
#include "naive/attention.hpp"
#include "naive/softmax.hpp"

namespace flashlab::naive {

namespace {

using RowSoftmax = float (*)(std::span<const float>, std::span<float>);

// Standard attention (FA1 paper, Algorithm 0): S and P are full seqlen_q x seqlen_k matrices per (batch,
// head).
template <RowSoftmax row_softmax>
void materialized_attention(const Problem& p, const AttentionInputs& in, AttentionOutputs& out) {
  const Visibility visibility(p);
  const int64_t sq = p.seqlen_q, sk = p.seqlen_k, d = p.head_dim;
  const float scale = static_cast<float>(p.softmax_scale());
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = p.kv_head(h);
      std::vector<float> S(static_cast<size_t>(sq * sk)), P(static_cast<size_t>(sq * sk));
      for (int64_t i = 0; i < sq; ++i) {  // S = scale * Q K^T, -inf where masked
        const float* q = in.q_row(p, b, i, h);
        for (int64_t j = 0; j < sk; ++j) {
          float dot = 0.0f;
          const float* k = in.k_row(p, b, j, hk);
#pragma omp simd reduction(+ : dot)
          for (int64_t c = 0; c < d; ++c) dot += q[c] * k[c];
          S[i * sk + j] = visibility.visible(b, i, j) ? dot * scale : -INFINITY;
        }
      }
      for (int64_t i = 0; i < sq; ++i) {  // P = softmax(S), row by row
        // Pointer arithmetic, not &S[i * sk]: with seqlen_k == 0 the rows are empty and S has no element.
        out.lse_at(p, b, h, i) =
            row_softmax({S.data() + i * sk, size_t(sk)}, {P.data() + i * sk, size_t(sk)});
      }
      for (int64_t i = 0; i < sq; ++i) {  // O = P V
        float* o = out.o_row(p, b, i, h);
        std::fill(o, o + d, 0.0f);
        for (int64_t j = 0; j < sk; ++j) {
          const float weight = P[i * sk + j];
          if (weight == 0.0f) continue;  // masked key: it takes no part (a NaN in its V must not leak in)
          const float* v = in.v_row(p, b, j, hk);
          for (int64_t c = 0; c < d; ++c) o[c] += weight * v[c];
        }
      }
    }
  }
}

}  // namespace

// One pass per query row (the recurrence FlashAttention tiles): for each visible key j,
//   m' = max(m, s_j),  l' = l exp(m - m') + exp(s_j - m'),  acc' = acc exp(m - m') + exp(s_j - m') v_j,
// then O = acc / l and LSE = m + log l. State: O(head_dim) per row, no S.
void one_pass_attention(const Problem& p, const AttentionInputs& in, AttentionOutputs& out) {
  const Visibility visibility(p);
  const int64_t d = p.head_dim;
  const float scale = static_cast<float>(p.softmax_scale());
  const ScoreMod mod(p);  // soft-capping and ALiBi (common/score_mod.hpp)
#pragma omp parallel for collapse(3) schedule(dynamic, 16)
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads_q; ++h) {
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        if (i >= p.stored_rows_q(b)) continue;  // packed: the sequence ends here
        const int64_t hk = p.kv_head(h);
        const float* q = in.q_row(p, b, i, h);
        std::vector<float> acc(static_cast<size_t>(d), 0.0f);
        SoftmaxState<float> state;
        const KeyRange keys = visibility.key_range(b, i);
        for (int64_t j = keys.begin; j < keys.end; ++j) {
          if (!visibility.mask_allows(i, j)) continue;
          const float* k = in.k_row(p, b, j, hk);
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t c = 0; c < d; ++c) dot += q[c] * k[c];
          // [[maybe_unused]]: read only by exercise one-pass's lines; a student's copy without them must
          // still compile warning-free.
          [[maybe_unused]] const float score = mod.apply(dot * scale, b, h, i, j);
          [[maybe_unused]] const float* v = in.v_row(p, b, j, hk);
          // EXERCISE BEGIN one-pass
          // teaches: the one-pass output recurrence that removes S: acc' = acc exp(m - m') + exp(s - m') v
          // difficulty: 2
          // docs: docs/01-softmax.md#4. One pass: the output recurrence that removes S
          // hint: carry the running max, the running sum and the output accumulator together; when the max
          //   grows, everything accumulated so far is rescaled
          // hint2: SoftmaxState's raise_max returns the rescale factor, weight gives the key's weight, add
          //   adds it; the accumulator takes the same factor, then the key's weight times its value row
          // hint3: with the key's score and its value row v: raise the running max to include the score
          //   (factor = state.raise_max(score) is exp(m_old - m_new)), get p = state.weight(score), add p to
          //   the running sum (state.add), and update every acc[c] to acc[c] * factor + p * v[c].
          const float factor = state.raise_max(score);
          const float weight = state.weight(score);
          state.add(weight);
          for (int64_t c = 0; c < d; ++c) acc[c] = acc[c] * factor + weight * v[c];
          // EXERCISE END one-pass
        }
        state.finalize(acc.data(), out.o_row(p, b, i, h), d);
        out.lse_at(p, b, h, i) = state.lse();
      }
    }
  }
}

namespace {

// Eigen GEMMs over strided views of the BSHD tensors: S = scale Q K^T, its modifications, mask, row softmax,
// O = P V. The products run over a batch element's real keys only: what lies past them is padding that may
// hold anything, and a masked (zero) weight times a NaN there would still be NaN.
void standard_gemm_attention(const Problem& p, const AttentionInputs& in, AttentionOutputs& out) {
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using ConstView = Eigen::Map<const Matrix, 0, Eigen::OuterStride<>>;
  using View = Eigen::Map<Matrix, 0, Eigen::OuterStride<>>;
  const Visibility visibility(p);
  const int64_t d = p.head_dim;
  const float scale = static_cast<float>(p.softmax_scale());
  const ScoreMod mod(p);  // soft-capping and ALiBi, after the scale and before the mask
  const Dropout dropout(p);
  // Parallel over (batch, head) when there are enough of them; otherwise Eigen parallelizes each GEMM itself.
  const bool outer_parallel = p.batch * p.heads_q >= omp_get_max_threads();
#pragma omp parallel for collapse(2) schedule(dynamic) if (outer_parallel)
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = p.kv_head(h), sq = p.stored_rows_q(b), sk = p.rows_k(b);
      const ConstView Q(in.q_row(p, b, 0, h), sq, d, Eigen::OuterStride<>(p.heads_q * d));
      const ConstView K(in.k_row(p, b, 0, hk), sk, d, Eigen::OuterStride<>(p.heads_kv * d));
      const ConstView V(in.v_row(p, b, 0, hk), sk, d, Eigen::OuterStride<>(p.heads_kv * d));
      View O(out.o_row(p, b, 0, h), sq, d, Eigen::OuterStride<>(p.heads_q * d));
      Matrix S = scale * (Q * K.transpose());
      for (int64_t i = 0; i < sq; ++i) {
        for (int64_t j = 0; j < sk; ++j)
          S(i, j) = visibility.visible(b, i, j) ? (mod.active() ? mod.apply(S(i, j), b, h, i, j) : S(i, j))
                                                : -INFINITY;
        float* row = S.data() + i * sk;  // not &S(i, 0): with seqlen_k == 0 there is no element (i, 0)
        out.lse_at(p, b, h, i) = softmax_three_pass({row, size_t(sk)}, {row, size_t(sk)});
        if (dropout.active())  // on P, after its normalizer: the LSE is that of the undropped weights
          for (int64_t j = 0; j < sk; ++j) row[j] *= dropout.factor<float>(b, h, i, j);
      }
      O.noalias() = S * V;
    }
  }
  repair_special_rows(p, in, out);  // a NaN or Inf in V reaches only the rows that see it (docs/08)
}

}  // namespace

// The materialized stages hold S (and P) for one (batch, head) per thread: refuse sizes that would not fit in
// memory.
std::string fits_in_memory(const Problem& p, int matrices) {
  const double bytes = 4.0 * matrices * static_cast<double>(p.seqlen_q) * static_cast<double>(p.seqlen_k) *
                       std::min<int64_t>(omp_get_max_threads(), p.batch * p.heads_q);
  const double physical =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (bytes <= 0.5 * physical) return "";
  return "seqlen_q x seqlen_k (" + std::to_string(p.seqlen_q) + " x " + std::to_string(p.seqlen_k) +
         ") materialized per thread needs " + std::to_string(static_cast<int64_t>(bytes / (1 << 20))) +
         " MiB, more than half this machine's memory";
}

namespace {

// The memory-traffic model of the materialized stages: the inputs read once and the outputs written once
// (K and V of one head are assumed to stay in cache across query rows), plus every full pass over an
// seqlen_q x seqlen_k float32 matrix (S or P) per (batch, head). Masked entries are still written and read.
double materialized_bytes(const Problem& p, int matrix_passes) {
  const double matrix = 4.0 * static_cast<double>(p.seqlen_q) * static_cast<double>(p.seqlen_k);
  return forward_min_bytes(p, 4) + matrix_passes * matrix * static_cast<double>(p.batch * p.heads_q);
}

// S written, softmax passes 1-3 read S and pass 3 writes P, O = PV reads P: 6 passes.
constexpr int kThreePassMatrixPasses = 6;
// S written, pass 1 (m and l together) and pass 2 read S, pass 2 writes P, O = PV reads P: 5 passes.
constexpr int kOnlineMatrixPasses = 5;
// The GEMM writes S, the in-place three-pass softmax reads it three times and writes P over it once, the
// second GEMM reads P: 6 passes.
constexpr int kGemmMatrixPasses = 6;

const Registration three_pass{{
    .name = "naive/three_pass",
    .summary = "standard attention: S and P materialized, three-pass safe softmax",
    .constraints = "any shape, every mask; O(seqlen_q x seqlen_k) memory per head",
    .supports = [](const Problem& p) { return fits_in_memory(p, 2); },
    .forward = materialized_attention<softmax_three_pass>,
    .bytes_moved = [](const Problem& p) { return materialized_bytes(p, kThreePassMatrixPasses); },
}};

const Registration online_softmax{{
    .name = "naive/online_softmax",
    .summary = "S materialized, online-normalizer softmax (two passes instead of three)",
    .constraints = "any shape, every mask; O(seqlen_q x seqlen_k) memory per head",
    .supports = [](const Problem& p) { return fits_in_memory(p, 2); },
    .forward = materialized_attention<softmax_online>,
    .bytes_moved = [](const Problem& p) { return materialized_bytes(p, kOnlineMatrixPasses); },
}};

const Registration one_pass{{
    .name = "naive/one_pass",
    .summary = "no S: one pass over the keys per row with running max, sum and output",
    .constraints = "any shape, every mask, softcap, ALiBi, bias, packed varlen; O(head_dim) state per row",
    .score_mods = true,
    .packed = true,
    .forward = one_pass_attention,
    // No S: the inputs read once and the outputs written once, K and V of one head staying in cache across
    // query rows (when they do not fit, every row re-reads them: the traffic tiling removes).
    .bytes_moved = [](const Problem& p) { return forward_min_bytes(p, 4); },
}};

const Registration standard_gemm{{
    .name = "naive/standard_gemm",
    .summary = "Eigen GEMMs for QK^T and PV around a row softmax: the practitioner's baseline",
    .constraints =
        "any shape, every mask, softcap, ALiBi, bias, dropout, packed varlen; O(seqlen_q x seqlen_k) "
        "memory per head",
    .score_mods = true,
    .dropout = true,
    .packed = true,
    .supports = [](const Problem& p) { return fits_in_memory(p, 1); },
    .forward = standard_gemm_attention,
    .bytes_moved = [](const Problem& p) { return materialized_bytes(p, kGemmMatrixPasses); },
}};

}  // namespace

}  // namespace flashlab::naive
