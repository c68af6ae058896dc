// cuda_v1/split_k: FlashAttention-1 (Dao et al. 2022), Algorithm 1, in fp32 on CUDA cores: the stage's core,
// written to be read beside the paper. One thread block per (batch, head), as FA1 parallelized (Sec. 3.1);
// inside it, the 4 warps split each K/V block's 128 keys (split-K): warp w owns keys j0 + 32w .. j0 + 32w +
// 31, one per lane, computes its part of S_ij and P~_ij V_j with its own row maxima and sums, and the
// partials meet in shared memory behind a barrier (the inter-warp reduction FA2 removes by splitting Q
// instead).
//
// Algorithm 1, line by line (the [Ln] marks below; tests/check_cores.py holds this table to them):
//   [L1]  block sizes: Bc = 128 keys (a key per thread), Br = 16 rows (8 at d 128)    kBc, q_block_rows
//   [L2]  O = 0, l = 0, m = -inf in global memory (m and l in the launch's workspace)
//   [L3]  Q into blocks Q_i of Br rows, K and V into blocks K_j, V_j of Bc keys;
//   [L4]  O, l and m into blocks of Br rows, like Q                           the row and key strides
//   [L5]  for each K/V block j (the outer loop)
//   [L6]    load K_j, V_j into shared memory
//   [L7]    for each Q block i (the inner loop)
//   [L8]      load Q_i, O_i, l_i, m_i: Q_i into shared memory, l_i and m_i beside it, O_i in [L12]
//   [L9]      S_ij = Q_i K_j^T, times the softmax scale
//   [L10]     m~_ij = rowmax(S_ij), P~_ij = exp(S_ij - m~_ij), l~_ij = rowsum(P~_ij): per warp, then merged
//   [L11]     m_new = max(m_i, m~_ij), l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij
//   [L12]     write O_i = diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j)
//   [L13]     write l_i = l_new, m_i = m_new
//   [L16] return O, and LSE = m + log l for the backward
// (Lines 14 and 15 close the loops.) The masks come from common/mask.hpp (band_key_range,
// explicit_mask_allows), the same functions the CPU stages call; tiles that causal, window and padding hide
// are skipped.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/cuda/check.hpp"
#include "common/cuda/launch.cuh"
#include "common/cuda/warp_reduce.cuh"
#include "common/mask.hpp"
#include "cuda_v1/split_k.hpp"

namespace flashlab::cuda_v1 {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBc = 32 * kWarps;  // [L1] K/V block: one key per lane of the block (split-K over the warps)

// Br, the rows of a Q block: 16, or 8 at head_dim 128 so that the shared tiles fit an A100's 163 KiB as well.
template <int kHeadDim>
constexpr int q_block_rows() {
  return kHeadDim <= 64 ? 16 : 8;
}

// Shared memory of one block (dynamic, opted in: up to 153 KiB at head_dim 128).
template <int kHeadDim>
struct SharedTiles {
  static constexpr int Br = q_block_rows<kHeadDim>();
  // K_j transposed, rows padded by one: lane c reads k_t[d][c] (consecutive banks), and the load's
  // transposing store k_t[d][c] for consecutive d also lands in distinct banks.
  float k_t[kHeadDim][kBc + 1];
  float v[kBc][kHeadDim];              // V_j; lane d reads v[c][d]
  alignas(16) float q[Br][kHeadDim];   // Q_i, read as float4 broadcasts
  float p[Br][kBc];                    // P~_ij; each warp writes and reads only its own 32 columns
  float o_part[kWarps][Br][kHeadDim];  // each warp's P~ V over its columns (split-K partials)
  float m_part[kWarps][Br];            // each warp's row maxima over its columns
  float l_part[kWarps][Br];            // each warp's row sums
  float m_old[Br];                     // m_i as read from global memory ([L8])
  float l_old[Br];                     // l_i
};

using cuda::warp_max;  // NaN-propagating, so that a NaN score turns its row NaN like the reference
using cuda::warp_sum;

// One block = one (batch, head): the whole of Algorithm 1 for that head.
template <int kHeadDim>
__global__ void __launch_bounds__(kThreads, 1) split_k_kernel(const SplitKParams p) {
  using Tiles = SharedTiles<kHeadDim>;
  constexpr int Br = Tiles::Br;
  constexpr int kDimsPerLane = kHeadDim / 32;    // output columns per lane in P~ V
  constexpr int kThreadsPerRow = kThreads / Br;  // threads per row of O_i in the update
  static_assert(kThreads % Br == 0 && kHeadDim % 32 == 0);
  constexpr float neg_inf = -INFINITY;
  Tiles& t = *cuda::dynamic_shared_memory<Tiles>();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.x / p.heads_q, h = blockIdx.x % p.heads_q;
  const int64_t hk = h / (p.heads_q / p.heads_kv);  // GQA: the kv head this query head reads
  const int64_t rows_q = p.seqlens_q ? p.seqlens_q[b] : p.seqlen_q;
  const int64_t rows_k = p.seqlens_k ? p.seqlens_k[b] : p.seqlen_k;
  const int d = p.head_dim;
  // Row i of this head's Q/O starts at q_head + i * q_stride; key j's K/V row at k_head + j * kv_stride.
  const int64_t q_stride = p.heads_q * d, kv_stride = p.heads_kv * d;  // [L3] [L4] the blocks' rows
  const float* q_head = p.q + (b * p.seqlen_q * p.heads_q + h) * d;
  float* o_head = p.o + (b * p.seqlen_q * p.heads_q + h) * d;
  const float* k_head = p.k + (b * p.seqlen_k * p.heads_kv + hk) * d;
  const float* v_head = p.v + (b * p.seqlen_k * p.heads_kv + hk) * d;
  const int64_t row0 = (b * p.heads_q + h) * p.seqlen_q;  // this head's rows in m, l and LSE
  float* m_head = p.row_max + row0;
  float* l_head = p.row_sum + row0;

  // [L2] O = 0, l = 0, m = -inf in global memory. Padded rows (i >= rows_q) keep these: O = 0, LSE = -inf.
  for (int64_t e = threadIdx.x; e < p.seqlen_q * d; e += kThreads) o_head[(e / d) * q_stride + e % d] = 0.0f;
  for (int64_t i = threadIdx.x; i < p.seqlen_q; i += kThreads) {
    m_head[i] = neg_inf;
    l_head[i] = 0.0f;
  }  // (the first barrier below makes these writes visible to the whole block)

  // [L5] K/V blocks outer. Keys at j >= rows_k are padding: no block past them is loaded.
  for (int64_t j0 = 0; j0 < rows_k; j0 += kBc) {
    __syncthreads();  // every warp is done with K_{j-1}, V_{j-1} before they are overwritten
    // [L6] load K_j (transposed) and V_j into shared memory, zeros past the last key and the head dim.
    for (int e = threadIdx.x; e < kBc * kHeadDim; e += kThreads) {
      const int c = e / kHeadDim, dim = e % kHeadDim;
      const int64_t j = j0 + c;
      const bool inside = j < rows_k && dim < d;
      t.k_t[dim][c] = inside ? k_head[j * kv_stride + dim] : 0.0f;
      t.v[c][dim] = inside ? v_head[j * kv_stride + dim] : 0.0f;
    }

    // [L7] Q blocks inner, over the valid rows only (padded rows see nothing).
    for (int64_t i0 = 0; i0 < rows_q; i0 += Br) {
      // [L8] load Q_i.
      for (int e = threadIdx.x; e < Br * kHeadDim; e += kThreads) {
        const int r = e / kHeadDim, dim = e % kHeadDim;
        const int64_t i = i0 + r;
        t.q[r][dim] = i < rows_q && dim < d ? q_head[i * q_stride + dim] : 0.0f;
      }
      // Does any row of Q_i see any key of K_j (causal, window, padding)? A hidden tile is skipped,
      // block-wide; the same barrier publishes Q_i (and K_j, V_j). The explicit mask is left to the element
      // test below.
      bool sees_block = false;
      if (threadIdx.x < Br) {
        const KeyRange keys =
            band_key_range(i0 + threadIdx.x, rows_q, rows_k, p.causal, p.window_left, p.window_right);
        sees_block = !keys.empty() && keys.begin < j0 + kBc && keys.end > j0;
      }
      if (!__syncthreads_or(sees_block)) continue;

      // [L8] (cont.) m_i and l_i from global memory. Written after the barrier above: by then every thread
      // has finished the previous Q block's update, the last reader of m_old and l_old.
      if (threadIdx.x < Br) {
        const int64_t i = i0 + threadIdx.x;
        t.m_old[threadIdx.x] = i < rows_q ? m_head[i] : neg_inf;
        t.l_old[threadIdx.x] = i < rows_q ? l_head[i] : 0.0f;
      }

      // [L9]-[L10], this warp's share of the columns (split-K): lane owns key j = j0 + 32 * warp + lane.
      const int c = warp * 32 + lane;
      const int64_t j = j0 + c;
      // [L9] S_ij = scale * Q_i K_j^T, Br scores per lane.
      float s[Br];
#pragma unroll
      for (int r = 0; r < Br; ++r) s[r] = 0.0f;
#pragma unroll 8
      for (int dim = 0; dim < kHeadDim; dim += 4) {
        const float k0 = t.k_t[dim][c], k1 = t.k_t[dim + 1][c], k2 = t.k_t[dim + 2][c],
                    k3 = t.k_t[dim + 3][c];
#pragma unroll
        for (int r = 0; r < Br; ++r) {
          const float4 q4 = *reinterpret_cast<const float4*>(&t.q[r][dim]);
          s[r] = fmaf(q4.x, k0, fmaf(q4.y, k1, fmaf(q4.z, k2, fmaf(q4.w, k3, s[r]))));
        }
      }
      // [L10] within the warp: partial row max m_w, P~ = exp(S - m_w), partial row sum l_w.
#pragma unroll
      for (int r = 0; r < Br; ++r) {
        const int64_t i = i0 + r;
        const KeyRange keys = band_key_range(i, rows_q, rows_k, p.causal, p.window_left, p.window_right);
        const bool visible =
            j >= keys.begin && j < keys.end && explicit_mask_allows(p.mask, p.seqlen_k, i, j);
        // A select, not a product: a NaN in a hidden key's K must not reach the score.
        const float score = visible ? s[r] * p.scale : neg_inf;
        const float m_w = warp_max(score);
        // A score of -inf (hidden, or an infinite input) weighs exactly 0, also when this warp has no other
        // score for the row (m_w = -inf), where exp(-inf - (-inf)) would be NaN. (A row whose visible scores
        // are all -inf is turned NaN at the end, as the reference has it.)
        const float p_ij = score == neg_inf ? 0.0f : expf(score - m_w);
        const float l_w = warp_sum(p_ij);
        t.p[r][c] = p_ij;
        if (lane == 0) {
          t.m_part[warp][r] = m_w;
          t.l_part[warp][r] = l_w;
        }
      }
      __syncwarp();  // this warp's P~ columns are written before its lanes read them across

      // This warp's part of P~_ij V_j: lane owns output columns lane, lane + 32, ...
      float pv[Br][kDimsPerLane];
#pragma unroll
      for (int r = 0; r < Br; ++r) {
#pragma unroll
        for (int u = 0; u < kDimsPerLane; ++u) pv[r][u] = 0.0f;
      }
      for (int cc = warp * 32; cc < warp * 32 + 32; ++cc) {
        float v_row[kDimsPerLane];
#pragma unroll
        for (int u = 0; u < kDimsPerLane; ++u) v_row[u] = t.v[cc][lane + 32 * u];
#pragma unroll
        for (int r = 0; r < Br; ++r) {
          const float weight = t.p[r][cc];  // the same for every lane: a uniform branch
          // A key with weight 0 takes no part, so a NaN in a masked key's V cannot leak into the row.
          if (weight != 0.0f) {
#pragma unroll
            for (int u = 0; u < kDimsPerLane; ++u) pv[r][u] = fmaf(weight, v_row[u], pv[r][u]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < Br; ++r) {
#pragma unroll
        for (int u = 0; u < kDimsPerLane; ++u) t.o_part[warp][r][lane + 32 * u] = pv[r][u];
      }

      // The split-K reduction: every warp's partials are in shared memory before any thread combines them.
      __syncthreads();

      // [L10]-[L13]: kThreadsPerRow threads per row of O_i. The block-wide m~_ij, l~_ij and P~_ij V_j merge
      // the warps' partials, each rescaled from its own max to the common one (the merge of
      // common/softmax_state.hpp); then O_i, l_i, m_i are updated in global memory. Each thread works out
      // its row's factors once and applies them to every kThreadsPerRow-th column, from dim = lane_in_row.
      const int r = threadIdx.x / kThreadsPerRow, lane_in_row = threadIdx.x % kThreadsPerRow;
      const int64_t i = i0 + r;
      float m_tilde = neg_inf;     // m~_ij = rowmax(S_ij) over all the block's columns
      float l_tilde = 0.0f;        // l~_ij = rowsum(P~_ij)
      float rescale[kWarps] = {};  // e^(m_w - m~_ij): 0 for a warp that saw no key of the row

      // EXERCISE BEGIN split-k-combine
      // teaches: FA1's split-K reduction: four warps each hold a partial row max m_w, sum l_w and P~ V over
      //   their 32 keys of the block; merged by rescaling each from its own max to the common one
      // difficulty: 2
      // docs: docs/03-cuda-v1.md#Algorithm 1 on blocks, warps and shared memory
      // hint: bring each warp's partial state (relative to its own max) to one common max
      // hint2: the common max is the largest m_w (a NaN let through); rescale[w] = exp(m_w - it); l sums them
      // hint3: m_w = t.m_part[w][r], l_w = t.l_part[w][r]; m_tilde = max over w ((m_w > m_tilde || m_w !=
      //   m_w)); unless m_tilde is -inf: rescale[w] = expf(m_w - m_tilde), l_tilde += rescale[w] * l_w.
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float m_w = t.m_part[w][r];
        m_tilde = (m_w > m_tilde || m_w != m_w) ? m_w : m_tilde;  // NaN-propagating, as in warp_max
      }
      if (m_tilde != neg_inf) {
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          rescale[w] = expf(t.m_part[w][r] - m_tilde);
          l_tilde += rescale[w] * t.l_part[w][r];
        }
      }
      // EXERCISE END split-k-combine
      // A row past the last query, or one with no score above -inf in K_j, keeps its O_i, l_i and m_i.
      if (i < rows_q && m_tilde != neg_inf) {
        // [L11] m_new = max(m_i, m~_ij), l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij.
        const float m_old = t.m_old[r], l_old = t.l_old[r];
        const float m_new = m_old > m_tilde ? m_old : m_tilde;  // m~_ij is finite or NaN here, never -inf
        const float old_scale = expf(m_old - m_new);            // 0 while m_i is still -inf (nothing seen)
        const float new_scale = expf(m_tilde - m_new);
        const float l_new = old_scale * l_old + new_scale * l_tilde;  // >= e^0 = 1 (the row max's own term)
        // [L12] O_i = diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j).
        const float o_weight = l_old * old_scale / l_new, pv_weight = new_scale / l_new;
        for (int dim = lane_in_row; dim < d; dim += kThreadsPerRow) {
          float pv_tilde = 0.0f;  // the block's P~_ij V_j: the warps' partials, brought to m~_ij
#pragma unroll
          for (int w = 0; w < kWarps; ++w) pv_tilde = fmaf(rescale[w], t.o_part[w][r][dim], pv_tilde);
          float* o = o_head + i * q_stride + dim;
          *o = o_weight * *o + pv_weight * pv_tilde;
        }
        // [L13] l_i = l_new, m_i = m_new, once per row. Nobody reads them again in this Q block (every
        // thread took m_i, l_i from m_old, l_old).
        if (lane_in_row == 0) {
          m_head[i] = m_new;
          l_head[i] = l_new;
        }
      }
    }
  }

  // [L16] O is final (FA1 normalizes at every step); LSE = m + log(l), -inf for a row that saw no
  // key.
  __syncthreads();  // the last Q block's m and l are written
  float* lse_head = p.lse + row0;
  for (int64_t i = threadIdx.x; i < p.seqlen_q; i += kThreads) {
    const float l = l_head[i];
    lse_head[i] = l == 0.0f ? neg_inf : m_head[i] + logf(l);  // the log of an empty sum is -inf
    // l = 0 with a visible key: every visible score was -inf (infinite inputs). The reference's
    // exp(-inf - (-inf)) makes that row NaN; so does this stage (a fully masked row keeps O = 0, LSE = -inf).
    const KeyRange band = band_key_range(i, rows_q, rows_k, p.causal, p.window_left, p.window_right);
    if (l == 0.0f && row_sees_a_key(band, p.mask, p.seqlen_k, i)) {
      lse_head[i] = NAN;
      for (int dim = 0; dim < d; ++dim) o_head[i * q_stride + dim] = NAN;
    }
  }
}

template <int kHeadDim>
void launch(const SplitKParams& params, cudaStream_t stream) {
  const size_t bytes = sizeof(SharedTiles<kHeadDim>);  // above 48 KiB a kernel must opt in
  FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(
      split_k_kernel<kHeadDim>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  const dim3 grid(static_cast<unsigned>(params.batch * params.heads_q));  // one block per (batch, head)
  cuda::launch_kernel<split_k_kernel<kHeadDim>>(grid, dim3(kThreads), bytes, stream, params);
}

}  // namespace

namespace FLASHLAB_CUDA_TARGET {

void split_k_forward(const SplitKParams& params, cudaStream_t stream) {
  // Only the head-dim tiles that are needed are compiled: 32, 64 and 128 (smaller dims are zero-padded).
  if (params.head_dim <= 32)
    launch<32>(params, stream);
  else if (params.head_dim <= 64)
    launch<64>(params, stream);
  else
    launch<128>(params, stream);
}

void launch_split_k(const Problem& problem, const DeviceTensors& tensors) {
  split_k_forward(split_k_params(problem, tensors), tensors.stream);
}

}  // namespace FLASHLAB_CUDA_TARGET

}  // namespace flashlab::cuda_v1
