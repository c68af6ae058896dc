// naive/backward: the backward pass as it is written before FlashAttention (docs/08-backward.md). P is
// recomputed in full and materialized, with dS, as seqlen_q x seqlen_k matrices per head:
//   P  = softmax(scale Q K^T)        (0 where masked; the three-pass softmax of naive/softmax.hpp)
//   dV = P^T dO
//   dP = dO V^T,  D = rowsum(dO * O),  dS = P * (dP - D)
//   dQ = scale dS K,  dK = scale dS^T Q
// The forward is naive/one_pass's. Loops with vectorized dot products and axpys, no GEMM library.
//
// P is recomputed from S by the full softmax, not as exp(S - LSE) from the forward's LSE: this backward's dot
// products need not round like the forward's, and with scores ~1e4 a rounding difference of 1e-2 in S would
// scale P by exp(1e-2). A tiled backward recomputing from LSE computes S exactly as its forward did
// (cpu_tiled/backward.cpp).
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/mask.hpp"
#include "common/registry.hpp"
#include "common/score_mod.hpp"
#include "naive/attention.hpp"
#include "naive/softmax.hpp"

namespace flashlab::naive {

namespace {

float dot(const float* x, const float* y, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < n; ++c) sum += x[c] * y[c];
  return sum;
}

// y += a x
void axpy(float a, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) y[c] += a * x[c];
}

// [[maybe_unused]] fwd and dout: read only by exercise backward-ds's lines; a student's copy without them
// must still compile warning-free.
void materialized_backward(const Problem& p, const AttentionInputs& in,
                           [[maybe_unused]] const AttentionOutputs& fwd, const HostTensor& d_out,
                           AttentionGradients& grad) {
  const Visibility visibility(p);
  const int64_t sq = p.seqlen_q, sk = p.seqlen_k, d = p.head_dim;
  const float scale = static_cast<float>(p.softmax_scale());
  const ScoreMod mod(p);
  auto d_out_row = [&](int64_t b, int64_t i, int64_t h) { return d_out.ptr() + p.q_offset(b, i, h); };
  auto dq_row = [&](int64_t b, int64_t i, int64_t h) { return grad.dq.ptr() + p.q_offset(b, i, h); };
  auto dk_row = [&](int64_t b, int64_t j, int64_t hk) { return grad.dk.ptr() + p.kv_offset(b, j, hk); };
  auto dv_row = [&](int64_t b, int64_t j, int64_t hk) { return grad.dv.ptr() + p.kv_offset(b, j, hk); };

  // One task per (batch, kv head): it owns that head's dK and dV, which every query head of its group adds
  // to.
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      std::vector<float> P(static_cast<size_t>(sq * sk)), dS(static_cast<size_t>(sq * sk));
      // Which pairs see each other (the mask, and a -inf bias). Only they take part in any gradient: a hidden
      // pair's P is 0, but 0 times a NaN or Inf in dO, Q or K would still be NaN (docs/08, "NaN and Inf").
      std::vector<uint8_t> seen(static_cast<size_t>(sq * sk));
      // The score modifications' derivative ds"/ds per (i, j) (common/score_mod.hpp), when there are any.
      std::vector<float> derivative(mod.bends() ? static_cast<size_t>(sq * sk) : 0);
      for (int64_t j = 0; j < sk; ++j) {
        std::fill(dk_row(b, j, hk), dk_row(b, j, hk) + d, 0.0f);
        std::fill(dv_row(b, j, hk), dv_row(b, j, hk) + d, 0.0f);
      }
      for (int64_t h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h) {
        for (int64_t i = 0; i < sq; ++i) {  // P = softmax(scale q_i K^T), recomputed in full
          float* row = P.data() + i * sk;   // not &P[i * sk]: with seqlen_k == 0 there is no element
          for (int64_t j = 0; j < sk; ++j) {
            seen[i * sk + j] = visibility.visible(b, i, j) && !mod.hides(b, h, i, j);
            if (!seen[i * sk + j]) {
              row[j] = -INFINITY;
              continue;
            }
            row[j] = mod.apply(scale * dot(in.q_row(p, b, i, h), in.k_row(p, b, j, hk), d), b, h, i, j);
            if (mod.bends()) derivative[i * sk + j] = mod.derivative(row[j], b, h, i, j);
          }
          softmax_three_pass({row, size_t(sk)}, {row, size_t(sk)});
        }
        for (int64_t i = 0; i < sq; ++i)  // dV = P^T dO
          for (int64_t j = 0; j < sk; ++j)
            if (seen[i * sk + j]) axpy(P[i * sk + j], d_out_row(b, i, h), dv_row(b, j, hk), d);
        for (int64_t i = 0; i < sq; ++i) {  // dS = P * (dO V^T - D), D_i = dO_i . O_i
          [[maybe_unused]] const float* dout = d_out_row(b, i, h);
          // EXERCISE BEGIN backward-ds
          // teaches: the softmax's backward: D_i = rowsum(dO * O) = dO_i . O_i replaces the sum over j of
          //   P_ij dP_ij, and dS = P * (dP - D) with dP = dO V^T
          // difficulty: 2
          // docs: docs/08-backward.md#The gradient, step by step
          // hint: the softmax's Jacobian collapses to one number per row, D_i = dO_i . O_i; dS is P times how
          //   far dP_ij lies above it, and a pair the mask hides takes no part
          // hint2: D comes from dout and the forward's output row fwd.o (dot(), p.q_offset); dP_ij is dout
          //   against key j's V row (in.v_row). Write 0 for a hidden pair: never multiply 0 by something that
          //   may be NaN
          // hint3: for row i: D = dot(dout, row i of the forward output fwd.o, d) (p.q_offset(b, i, h) is its
          //   offset); then for every key j, dP_ij = dot(dout, in.v_row(p, b, j, hk), d) and dS[i * sk + j] =
          //   P[i * sk + j] * (dP_ij - D). Write 0 where the pair is hidden (seen[i * sk + j] is 0), not 0 *
          //   (dP - D), which is NaN when that key's V holds a NaN.
          const float D = dot(dout, fwd.o.ptr() + p.q_offset(b, i, h), d);
          for (int64_t j = 0; j < sk; ++j) {
            // A hidden key takes no part: 0, not 0 * (dP - D), which is NaN when its V holds a NaN.
            dS[i * sk + j] =
                seen[i * sk + j] ? P[i * sk + j] * (dot(dout, in.v_row(p, b, j, hk), d) - D) : 0.0f;
          }
          // EXERCISE END backward-ds
          if (mod.bends())  // the gradient of the scaled score: through the soft-capping
            for (int64_t j = 0; j < sk; ++j) dS[i * sk + j] *= derivative[i * sk + j];
        }
        for (int64_t i = 0; i < sq; ++i) {  // dQ = scale dS K
          float* dq = dq_row(b, i, h);
          std::fill(dq, dq + d, 0.0f);
          for (int64_t j = 0; j < sk; ++j)
            if (seen[i * sk + j]) axpy(scale * dS[i * sk + j], in.k_row(p, b, j, hk), dq, d);
        }
        for (int64_t i = 0; i < sq; ++i)  // dK = scale dS^T Q
          for (int64_t j = 0; j < sk; ++j)
            if (seen[i * sk + j]) axpy(scale * dS[i * sk + j], in.q_row(p, b, i, h), dk_row(b, j, hk), d);
      }
    }
  }
}

const Registration backward{{
    .name = "naive/backward",
    .summary = "materialized backward: P recomputed in full, dV = P^T dO, dS = P * (dP - D), dQ, dK",
    .constraints =
        "any shape, every mask, softcap, ALiBi, bias; forward naive/one_pass; backward O(seqlen_q x "
        "seqlen_k) per kv "
        "head",
    .score_mods = true,
    .forward = one_pass_attention,
    .supports_backward = [](const Problem& p) { return fits_in_memory(p, 2); },
    .backward = materialized_backward,
}};

}  // namespace

}  // namespace flashlab::naive
