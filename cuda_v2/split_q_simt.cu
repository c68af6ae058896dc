// cuda_v2/split_q_simt: the FlashAttention-2 schedule (Dao 2023, Algorithm 1) on CUDA cores, fp32 throughout:
// the stage's first core. The arithmetic is cuda_v1's (fp32 dot products and FMAs on CUDA cores); only the
// schedule changes, so the measured difference to cuda_v1 is the schedule's alone:
//   1. the grid is (q-block, head, batch): one thread block per query block, not per (batch, head);
//   2. Q is the outer loop (a block's Q rows stay on chip), K/V the inner one, and each warp owns its own
//      query rows (split-Q): a row's m, l and O live in one warp, so no inter-warp reduction;
//   3. O stays unnormalized until the last tile: one division per row instead of one per tile.
// Inside a warp: lane j scores key j of the 32-key tile for each of the warp's 8 rows; a row's max is a warp
// shuffle reduction; for O += P V lane c owns output columns c, c + 32, ... and takes P[r][j] from lane j.
//
// Algorithm 1, line by line (the [Ln] marks below; tests/check_cores.py holds this table to them):
//   [L1]  Q into blocks of Br = 32 rows (8 a warp), K and V into blocks of Bc = 32 keys    kBlockM, kBlockN
//   [L2]  O and the logsumexp L into blocks of Br rows                                  (the output tensors)
//   [L3]  for each Q block i: one thread block per (i, head, batch), in parallel         the grid
//   [L4]  load Q_i into shared memory
//   [L5]  O~_i = 0, l_i = 0, m_i = -inf, in registers
//   [L6]  for each K/V block j (those that causal, window and padding leave visible)
//   [L7]  load K_j, V_j into shared memory
//   [L8]  S_ij = Q_i K_j^T
//   [L9]  m_ij = max(m_i, rowmax(S_ij)), P~_ij = exp(S_ij - m_ij), l_ij = e^(m_i - m_ij) l_i + rowsum(P~_ij)
//   [L10] O~_i = diag(e^(m_i - m_ij)) O~_i + P~_ij V_j
//   [L12] O_i = diag(l_i)^-1 O~_i
//   [L13] L_i = m_i + log(l_i)
//   [L14] write O_i;  [L15] write L_i
// (Lines 11 and 16 close the loops; 17 returns.) The exponentials are exp2 of scores scaled by
// scale * log2(e), so m is kept in the log2 domain and L brought back to the natural log at the end.
#include <cuda_runtime.h>

#include <cmath>

#include "common/cuda/check.hpp"
#include "common/cuda/exact_rows.cuh"
#include "common/cuda/launch.cuh"
#include "common/cuda/warp_reduce.cuh"
#include "cuda_v2/block_mask.cuh"
#include "cuda_v2/split_q.hpp"

namespace flashlab::cuda_v2 {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRowsPerWarp = 8;
constexpr int kBlockM = kWarps * kRowsPerWarp;  // [L1] 32 query rows per block
constexpr int kBlockN = 32;                     // one key per lane
static_assert(kBlockM == split_q_simt_tile().block_m && kBlockN == split_q_simt_tile().block_n,
              "split_q_simt_tile (split_q.hpp) states the tiles");

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared memory: Q [kBlockM][d], K [kBlockN][d + 1], V [kBlockN][d]. K is read down a column (lane j reads
// row j), so its rows are padded by one float: row j starts in bank j % 32 and the 32 lanes never share a
// bank. Q is read by broadcast (all lanes the same address) and V along a row (consecutive lanes, consecutive
// addresses).
template <int kHeadDim>
constexpr int smem_bytes() {
  return (kBlockM * kHeadDim + kBlockN * (kHeadDim + 1) + kBlockN * kHeadDim) * 4;
}

// Rows [row0, row0 + kRows) of a strided tensor into shared memory (row pitch `smem_pitch` floats), with
// float4 global loads; rows at or past `rows_valid` are written as zeros and never read (ragged tails, padded
// keys).
template <int kRows, int kHeadDim>
__device__ inline void load_tile(float* smem, int smem_pitch, const float* gmem, int64_t row_stride, int row0,
                                 int rows_valid) {
  constexpr int kVectorsPerRow = kHeadDim / 4;
  for (int index = threadIdx.x; index < kRows * kVectorsPerRow; index += kThreads) {
    const int r = index / kVectorsPerRow, col = (index % kVectorsPerRow) * 4;
    float4 value = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row0 + r < rows_valid) value = *reinterpret_cast<const float4*>(gmem + (row0 + r) * row_stride + col);
    float* dst = smem + r * smem_pitch + col;
    if (smem_pitch % 4 == 0) {
      *reinterpret_cast<float4*>(dst) = value;  // one 16-byte store: a quarter-warp fills 128 bytes
    } else {  // K's odd pitch rules out a 16-byte store; its 4-byte stores meet 2- to 4-way bank conflicts
      dst[0] = value.x;
      dst[1] = value.y;
      dst[2] = value.z;
      dst[3] = value.w;
    }
  }
}

template <int kHeadDim>
__global__ void __launch_bounds__(kThreads) split_q_simt_kernel(const SplitQParams p) {
  constexpr int kColsPerLane = kHeadDim / 32;
  constexpr int kPitchK = kHeadDim + 1;
  float* const sQ = cuda::dynamic_shared_memory<float>();  // [kBlockM][kHeadDim]
  float* const sK = sQ + kBlockM * kHeadDim;               // [kBlockN][kHeadDim + 1]
  float* const sV = sK + kBlockN * kPitchK;                // [kBlockN][kHeadDim]

  // Change 1, [L3]: the grid is (q-block, head, batch).
  const int q_block = blockIdx.x, head = blockIdx.y, b = blockIdx.z;
  const int head_kv = head / (p.heads_q / p.heads_kv);  // GQA/MQA by indexing
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_begin = q_block * kBlockM;
  const int warp_row = warp * kRowsPerWarp;  // change 2: this warp's rows, for the whole kernel
  const BlockMask block = BlockMask::make<kBlockN>(p, b, row_begin, row_begin + kBlockM);

  const float* const q = static_cast<const float*>(p.q) + b * p.q_batch_stride + head * p.q_head_stride;
  const float* const k = static_cast<const float*>(p.k) + b * p.k_batch_stride + head_kv * p.k_head_stride;
  const float* const v = static_cast<const float*>(p.v) + b * p.v_batch_stride + head_kv * p.v_head_stride;
  load_tile<kBlockM, kHeadDim>(sQ, kHeadDim, q, p.q_row_stride, row_begin, p.seqlen_q);  // [L4] Q_i once

  const float scale_log2 = p.softmax_scale * kLog2e;  // exp(scale * s) = exp2(scale * log2(e) * s)
  float o_acc[kRowsPerWarp][kColsPerLane] = {};       // [L5] O~ (unnormalized), columns lane + 32 u
  float row_max[kRowsPerWarp];                        // m in the log2 domain, the same in every lane
  float row_sum[kRowsPerWarp] = {};                   // l over this lane's keys; the warp sum is deferred
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) row_max[r] = -INFINITY;

  for (int tile = block.tile_begin; tile < block.tile_end; ++tile) {  // [L6]
    const int key0 = tile * kBlockN;
    __syncthreads();  // the previous tile is consumed (and, the first time, nothing is pending)
    load_tile<kBlockN, kHeadDim>(sK, kPitchK, k, p.k_row_stride, key0, block.rows_k);
    load_tile<kBlockN, kHeadDim>(sV, kHeadDim, v, p.v_row_stride, key0, block.rows_k);
    __syncthreads();  // [L7] K_j and V_j are in shared memory

    // [L8] S = Q_i K_j^T: lane j scores key key0 + j against each of the warp's rows.
    float s[kRowsPerWarp] = {};
    for (int c = 0; c < kHeadDim; c += 4) {
      const float k0 = sK[lane * kPitchK + c], k1 = sK[lane * kPitchK + c + 1];
      const float k2 = sK[lane * kPitchK + c + 2], k3 = sK[lane * kPitchK + c + 3];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const float4 qv = *reinterpret_cast<const float4*>(sQ + (warp_row + r) * kHeadDim + c);
        s[r] += qv.x * k0 + qv.y * k1 + qv.z * k2 + qv.w * k3;
      }
    }
    if (!block.tile_is_full<kBlockN>(key0)) {  // mask only a tile the mask cuts
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const int row = row_begin + warp_row + r;
        if (!element_visible(p, BlockMask::band(p, block, row), row, key0 + lane)) s[r] = -INFINITY;
      }
    }

    // [L9] the online softmax; the rescaling of O~ in [L10].
    float weight[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const float new_max = fmaxf(row_max[r], cuda::warp_fmax(s[r]) * scale_log2);
      // Every key so far masked: subtract 0, since -inf - (-inf) would be NaN; exp2(-inf) = 0 keeps l = 0.
      const float max_used = new_max == -INFINITY ? 0.0f : new_max;
      const float rescale = exp2f(row_max[r] - max_used);  // 0 when row_max was -inf
      row_max[r] = new_max;
      weight[r] = exp2f(fmaf(s[r], scale_log2, -max_used));
      row_sum[r] = row_sum[r] * rescale + weight[r];
#pragma unroll
      for (int u = 0; u < kColsPerLane; ++u) o_acc[r][u] *= rescale;
    }

    // [L10] O~ += P V_j: P[r][j] comes from lane j.
    for (int j = 0; j < kBlockN; ++j) {
      float vj[kColsPerLane];
#pragma unroll
      for (int u = 0; u < kColsPerLane; ++u) vj[u] = sV[j * kHeadDim + lane + 32 * u];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const float pj = __shfl_sync(0xffffffffu, weight[r], j);
#pragma unroll
        for (int u = 0; u < kColsPerLane; ++u) o_acc[r][u] = fmaf(pj, vj[u], o_acc[r][u]);
      }
    }
  }

  // Change 3, [L12]-[L13]: normalize once; LSE = m + log l, back to natural log.
  // [L2] this block's rows of O and L:
  float* const o = static_cast<float*>(p.o) + b * p.o_batch_stride + head * p.o_head_stride;
  float* const lse_row = p.lse + (static_cast<int64_t>(b) * p.heads_q + head) * p.seqlen_q;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int row = row_begin + warp_row + r;
    const float l = cuda::warp_sum(row_sum[r]);
    if (row >= p.seqlen_q) continue;  // the last q-block's rows past seqlen_q do not exist
    // A padded row, or one whose every key is masked, is fully masked: O = 0 and LSE = -inf by definition;
    // its accumulator is not used (a padded row may have accumulated anything), so no 0/0 and no NaN.
    const bool empty = row >= block.rows_q || l == 0.0f;
    const float inv_l = empty ? 0.0f : 1.0f / l;
#pragma unroll
    for (int u = 0; u < kColsPerLane; ++u)  // [L14]
      o[row * p.o_row_stride + lane + 32 * u] = empty ? 0.0f : o_acc[r][u] * inv_l;
    if (lane == 0) lse_row[row] = empty ? -INFINITY : (row_max[r] + log2f(l)) * kLn2;  // [L15]
  }
}

template <int kHeadDim>
void launch(const SplitQParams& p, cudaStream_t stream) {
  const auto kernel = split_q_simt_kernel<kHeadDim>;
  constexpr int kSmemBytes = smem_bytes<kHeadDim>();
  // Above 48 KiB a kernel must opt in to dynamic shared memory (per device, so on every launch; it is cheap).
  FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  const dim3 grid((p.seqlen_q + kBlockM - 1) / kBlockM, p.heads_q, p.batch);
  cuda::launch_kernel<split_q_simt_kernel<kHeadDim>>(grid, dim3(kThreads), kSmemBytes, stream, p);
}

}  // namespace

namespace FLASHLAB_CUDA_TARGET {

void split_q_simt_forward(const SplitQParams& params, cudaStream_t stream) {
  check_split_q_simt(params);
  switch (params.head_dim) {  // any multiple of 32 (kColsPerLane columns a lane); the ones models use
    case 32:
      launch<32>(params, stream);
      break;
    case 64:
      launch<64>(params, stream);
      break;
    case 96:
      launch<96>(params, stream);
      break;
    case 128:
      launch<128>(params, stream);
      break;
    case 256:
      launch<256>(params, stream);
      break;
  }
  cuda::exact_rows<float>(cuda::exact_rows_params(params), stream);  // NaN and Inf as the reference (docs/08)
}

void launch_split_q_simt(const Problem& problem, const DeviceTensors& tensors) {
  split_q_simt_forward(split_q_params(problem, tensors), tensors.stream);
}

}  // namespace FLASHLAB_CUDA_TARGET

}  // namespace flashlab::cuda_v2
