// cuda_v2/mma: FlashAttention-2's forward (Dao 2023, Algorithm 1) on tensor cores, written to be read beside
// the paper: the first rung of the tensor-core ladder (docs/04-cuda-v2.md). The plain case only: fp16 in and
// out, fp32 accumulation, head_dim 64 or 128, causal, window and padding masks, GQA, LSE. Every tile product
// is mma.sync m16n8k16, its operands loaded from shared memory element by element, as the fragment maps say
// (emulator/fragments.hpp, checked against CuTe and the PTX ISA). Each later rung adds one idea: ldmatrix and
// a swizzle (cuda_v2/mma_ldmatrix), cp.async double buffering (mma_cp_async), skipping the tiles a mask hides
// (split_q, the full kernel).
//
// Algorithm 1, line by line (the [Ln] marks in the code below; tests/check_cores.py holds this table to
// them):
//   [L1]  Q into blocks of Br = 64 rows, K and V into blocks of Bc = 64 keys          kBlockM, kBlockN
//   [L2]  O and the logsumexp L into blocks of Br rows                                 (the output tensors)
//   [L3]  for each Q block i: one thread block per (i, head, batch), in parallel        the grid
//   [L4]  load Q_i into shared memory
//   [L5]  O~_i = 0, l_i = 0, m_i = -inf, in registers: each warp owns 16 rows of Q_i
//   [L6]  for each K/V block j
//   [L7]  load K_j, V_j into shared memory
//   [L8]  S_ij = Q_i K_j^T on the tensor cores, times the softmax scale
//   [L9]  m_ij = max(m_i, rowmax(S_ij)), P~_ij = exp(S_ij - m_ij), l_ij = e^(m_i - m_ij) l_i + rowsum(P~_ij)
//   [L10] O~_i = diag(e^(m_i - m_ij)) O~_i + P~_ij V_j on the tensor cores
//   [L12] O_i = diag(l_i)^-1 O~_i
//   [L13] L_i = m_i + log(l_i)
//   [L14] write O_i;  [L15] write L_i
// (Lines 11 and 16 close the loops; 17 returns.)
//
// A thread of the mma's fragment layout holds two rows of every accumulator (rows g and g + 8 of its warp's
// 16, g = lane / 4), and the four threads of a quad (same g) hold a whole row between them: a row's max and
// sum are reduced across the quad (quad_max, quad_sum in tensor_core.cuh). A NaN or Inf input in the V row of
// a key some row does not see still meets that row's weight of exactly 0 in P V (0 x NaN = NaN): the exact
// pass after the kernel repairs such rows (common/cuda/exact_rows.hpp, scanning mode), so the kernel stays
// the paper's.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/cuda/check.hpp"
#include "common/cuda/exact_rows.cuh"
#include "common/cuda/launch.cuh"
#include "common/cuda/sequences.hpp"
#include "common/mask.hpp"
#include "cuda_v2/split_q.hpp"
#include "cuda_v2/tensor_core.cuh"
#include "emulator/fragments.hpp"

namespace flashlab::cuda_v2 {
namespace {

namespace fragment = emulator::fragments::m16n8k16;

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kBlockM = 16 * kWarps;  // [L1] Br: 16 query rows a warp
constexpr int kBlockN = 64;           // [L1] Bc

// Rows [row0, row0 + kRows) of a head's rows (stride `row_stride`) into a row-major shared tile, 16 bytes a
// thread at a time; rows at or past `rows_valid` are zeros (padding is never read, docs/conventions.md §3).
template <int kRows, int kHeadDim>
__device__ void load_tile(__half* tile, const __half* rows, int64_t row_stride, int row0, int rows_valid) {
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks a row
  for (int chunk = threadIdx.x; chunk < kRows * kChunks; chunk += kThreads) {
    const int r = chunk / kChunks, col = chunk % kChunks * 8;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (row0 + r < rows_valid) value = *reinterpret_cast<const uint4*>(rows + (row0 + r) * row_stride + col);
    *reinterpret_cast<uint4*>(tile + r * kHeadDim + col) = value;
  }
}

// Two 16-bit elements of a tile, packed into one register (`lo` in the low half), as the mma's operands hold
// them.
__device__ uint32_t pack(__half lo, __half hi) {
  const __half2 pair{lo, hi};
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// The A operand of one 16 x 16 k-step: rows [row0, row0 + 16), columns [k0, k0 + 16) of a row-major tile.
// Both halves of a register are neighbours in a row: one 32-bit load each.
template <int kPitch>
__device__ void load_a(uint32_t (&a)[4], const __half* tile, int row0, int k0, int lane) {
#pragma unroll
  for (int reg = 0; reg < 4; ++reg) {
    const emulator::fragments::Element e = fragment::a(lane, reg, 0);
    a[reg] = *reinterpret_cast<const uint32_t*>(tile + (row0 + e.row) * kPitch + k0 + e.col);
  }
}

// The B operand (k x n = 16 x 8) of S = Q K^T: B = K_j^T, so B[k][n] is row n, column k of the K tile, and a
// register's two halves (k, k + 1) are neighbours in K's row.
template <int kPitch>
__device__ void load_b_from_k(uint32_t (&b)[2], const __half* k_tile, int n0, int k0, int lane) {
#pragma unroll
  for (int reg = 0; reg < 2; ++reg) {
    const emulator::fragments::Element e = fragment::b(lane, reg, 0);
    b[reg] = *reinterpret_cast<const uint32_t*>(k_tile + (n0 + e.col) * kPitch + k0 + e.row);
  }
}

// The B operand of O += P V: B = V_j, so B[k][n] is key k, column n of the V tile, and a register's two
// halves are two keys, a row apart: two 16-bit loads each (the transposing load that ldmatrix.trans does in
// one).
template <int kPitch>
__device__ void load_b_from_v(uint32_t (&b)[2], const __half* v_tile, int k0, int n0, int lane) {
#pragma unroll
  for (int reg = 0; reg < 2; ++reg) {
    const emulator::fragments::Element lo = fragment::b(lane, reg, 0), hi = fragment::b(lane, reg, 1);
    b[reg] = pack(v_tile[(k0 + lo.row) * kPitch + n0 + lo.col], v_tile[(k0 + hi.row) * kPitch + n0 + hi.col]);
  }
}

template <int kHeadDim>
__global__ void __launch_bounds__(kThreads) mma_kernel(const SplitQParams p) {
  constexpr int kNTilesS = kBlockN / 8, kNTilesO = kHeadDim / 8;  // 8-column mma tiles of S and of O
  __half* const sQ = cuda::dynamic_shared_memory<__half>();       // [kBlockM][kHeadDim]
  __half* const sK = sQ + kBlockM * kHeadDim;                     // [kBlockN][kHeadDim]
  __half* const sV = sK + kBlockN * kHeadDim;                     // [kBlockN][kHeadDim]

  // [L3] This block's Q block, query head and batch element; GQA: its K/V head.
  const int q_block = blockIdx.x, head = blockIdx.y, b = blockIdx.z;
  const int head_kv = head / (p.heads_q / p.heads_kv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows_q = cuda::rows_q(p, b), rows_k = cuda::rows_k(p, b);  // the real lengths (padding)
  const int row_begin = q_block * kBlockM, warp_row = warp * 16;
  const __half* const q = static_cast<const __half*>(p.q) + b * p.q_batch_stride + head * p.q_head_stride;
  const __half* const k = static_cast<const __half*>(p.k) + b * p.k_batch_stride + head_kv * p.k_head_stride;
  const __half* const v = static_cast<const __half*>(p.v) + b * p.v_batch_stride + head_kv * p.v_head_stride;

  // [L4] Q_i.
  load_tile<kBlockM, kHeadDim>(sQ, q, p.q_row_stride, row_begin, rows_q);

  // [L5] This thread's two rows (g and g + 8 of its warp's 16): their visible keys, m, l and O~.
  int rows[2];
  KeyRange keys[2];
  float row_max[2], row_sum[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    rows[i] = row_begin + warp_row + lane / 4 + 8 * i;
    keys[i] = band_key_range(rows[i], rows_q, rows_k, p.causal, p.window_left, p.window_right);
    row_max[i] = -INFINITY;
    row_sum[i] = 0.0f;
  }
  float o[kNTilesO][4] =
      {};  // O~_i: register r of n-tile nt is row rows[r / 2], column 8 nt + 2 (lane % 4) + r % 2

  for (int key0 = 0; key0 < rows_k; key0 += kBlockN) {  // [L6]
    // [L7] K_j and V_j, once every warp is done with the previous ones (and Q_i has landed, the first time).
    __syncthreads();
    load_tile<kBlockN, kHeadDim>(sK, k, p.k_row_stride, key0, rows_k);
    load_tile<kBlockN, kHeadDim>(sV, v, p.v_row_stride, key0, rows_k);
    __syncthreads();

    // [L8] S_ij = Q_i K_j^T: for each 16-wide k-step, one A fragment (this warp's rows of Q_i) against each
    // 8-key n-tile of K_j.
    float s[kNTilesS][4] = {};
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[4];
      load_a<kHeadDim>(a, sQ, warp_row, kk * 16, lane);
#pragma unroll
      for (int nt = 0; nt < kNTilesS; ++nt) {
        uint32_t bk[2];
        load_b_from_k<kHeadDim>(bk, sK, nt * 8, kk * 16, lane);
        mma_m16n8k16<__half>(s[nt], a, bk[0], bk[1]);
      }
    }
    // [L8] the softmax scale; a key the row does not see scores -inf (weight 0).
#pragma unroll
    for (int nt = 0; nt < kNTilesS; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = r / 2, key = key0 + nt * 8 + fragment::c(lane, r).col;
        s[nt][r] = key >= keys[i].begin && key < keys[i].end ? s[nt][r] * p.softmax_scale : -INFINITY;
      }

      // [L9] The online softmax, per row: the new max over the quad, the rescale of l and O~, then P~ and l.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kNTilesS; ++nt) tile_max = fmaxf(tile_max, fmaxf(s[nt][2 * i], s[nt][2 * i + 1]));
      const float new_max = fmaxf(row_max[i], quad_max(tile_max));
      // Every key so far hidden (new_max = -inf): subtract 0, since -inf - (-inf) would be NaN.
      const float max_used = new_max == -INFINITY ? 0.0f : new_max;
      const float rescale = expf(row_max[i] - max_used);  // 0 while nothing was seen: O~ and l are 0 anyway
      row_max[i] = new_max;
      row_sum[i] *= rescale;
#pragma unroll
      for (int nt = 0; nt < kNTilesO; ++nt) {  // [L10] diag(e^(m_i - m_ij)) O~_i
        o[nt][2 * i] *= rescale;
        o[nt][2 * i + 1] *= rescale;
      }
#pragma unroll
      for (int nt = 0; nt < kNTilesS; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          s[nt][2 * i + c] = expf(s[nt][2 * i + c] - max_used);  // P~_ij in place of S_ij
          row_sum[i] += s[nt][2 * i + c];  // this thread's columns; the quad's sum at the end
        }
    }

    // [L10] O~_i += P~_ij V_j: the accumulators of S's n-tiles 2kk and 2kk + 1 are the A fragment of k-step
    // kk (fragment::c and fragment::a place the same rows and columns), rounded to fp16 for the tensor cores.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      const uint32_t a[4] = {pack_pair<__half>(s[2 * kk][0], s[2 * kk][1]),
                             pack_pair<__half>(s[2 * kk][2], s[2 * kk][3]),
                             pack_pair<__half>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack_pair<__half>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int nt = 0; nt < kNTilesO; ++nt) {
        uint32_t bv[2];
        load_b_from_v<kHeadDim>(bv, sV, kk * 16, nt * 8, lane);
        mma_m16n8k16<__half>(o[nt], a, bv[0], bv[1]);
      }
    }
  }

  // [L12]-[L15] O_i = O~_i / l_i and L_i = m_i + log(l_i), written from registers into this block's rows of O
  // and L ([L2]: the caller's tensors). A row that saw no key (a padded row, or one every mask hides) has
  // l = 0: it writes O = 0 and LSE = -inf (docs/conventions.md §4).
  __half* const out = static_cast<__half*>(p.o) + b * p.o_batch_stride + head * p.o_head_stride;
  float* const lse = p.lse + (static_cast<int64_t>(b) * p.heads_q + head) * p.seqlen_q;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float l = quad_sum(row_sum[i]);
    if (rows[i] >= p.seqlen_q) continue;  // the last Q block's rows past the tensor do not exist
    const float inverse = l == 0.0f ? 0.0f : 1.0f / l;  // [L12]
#pragma unroll
    for (int nt = 0; nt < kNTilesO; ++nt)  // [L14]
      *reinterpret_cast<uint32_t*>(out + rows[i] * p.o_row_stride + nt * 8 + fragment::c(lane, 2 * i).col) =
          pack_pair<__half>(o[nt][2 * i] * inverse, o[nt][2 * i + 1] * inverse);
    if (lane % 4 == 0) lse[rows[i]] = l == 0.0f ? -INFINITY : row_max[i] + logf(l);  // [L13], [L15]
  }
}

template <int kHeadDim>
void launch(const SplitQParams& p, cudaStream_t stream) {
  constexpr int kSharedBytes = (kBlockM + 2 * kBlockN) * kHeadDim * 2;
  FLASHLAB_CUDA_CHECK(
      cudaFuncSetAttribute(mma_kernel<kHeadDim>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes));
  const dim3 grid((p.seqlen_q + kBlockM - 1) / kBlockM, p.heads_q, p.batch);
  cuda::launch_kernel<mma_kernel<kHeadDim>>(grid, dim3(kThreads), kSharedBytes, stream, p);
}

}  // namespace

namespace FLASHLAB_CUDA_TARGET {

void launch_mma(const Problem& problem, const DeviceTensors& tensors) {
  const SplitQParams params = split_q_params(problem, tensors);
  check_mma(params);
  if (params.head_dim == 64)
    launch<64>(params, tensors.stream);
  else
    launch<128>(params, tensors.stream);
  cuda::exact_rows<__half>(cuda::exact_rows_params(params), tensors.stream);  // NaN and Inf as the reference
}

}  // namespace FLASHLAB_CUDA_TARGET

}  // namespace flashlab::cuda_v2
