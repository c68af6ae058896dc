// What cuda_v2's backward kernels share (backward.cu, backward_64x128.cu): the two element formulas of
// FlashAttention-2's Algorithm 2 that every kernel of the backward evaluates the same way, the rows of the
// backward's own buffers, and the launch of a main kernel with the shared memory it asks for.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "common/cuda/check.hpp"
#include "common/cuda/launch.cuh"
#include "common/cuda/ptx.cuh"
#include "common/cuda/sequences.hpp"
#include "common/error.hpp"
#include "cuda_v2/backward.hpp"

namespace flashlab::cuda_v2 {

inline constexpr float kLog2e = 1.4426950408889634f;

// Row (b, head, row) of the backward's own buffers (D, dQ's accumulator): [batch, heads_q, seqlen_q] in
// either layout of the problem (packed, seqlen_q is the longest sequence).
__device__ inline int64_t row_index(const SplitQParams& f, int b, int head, int row) {
  return (static_cast<int64_t>(b) * f.heads_q + head) * f.seqlen_q + row;
}
// The forward's LSE of that row, in the problem's layout (common/cuda/sequences.hpp).
__device__ inline float lse_of(const SplitQParams& f, int b, int head, int row) {
  return f.lse[cuda::lse_begin(f, b, head) + row];
}

// P_ij = exp(S_ij scale - LSE_i) (Algorithm 2 line 10), recomputed from the forward's LSE. S scale is rounded
// once (never fused with the subtraction), as split_q rounded its max for the LSE (split_q.cu), and only the
// difference goes to the log2 domain: where one key dominates a row with scores ~1e4 (LSE ~4e4, a float ulp
// of 0.004) its P is then exactly 1, where taking S or the LSE to the log2 domain first cost P 0.5% (the case
// matrix's large-magnitude cases found it). With kFlushSubnormals, ex2 flushes subnormal results to zero
// (.ftz, as FlashAttention's kernels, built with fast math, do): a P below 2^-126 weighs nothing in a
// gradient rounded to bf16 or f16, and without .ftz each element costs 3 instructions more (the sm_90a SASS:
// a test, a scaling, a multiply). backward_64x128.cu's kernel flushes; backward.cu's keep the code the H200
// measured (with .ftz, ptxas spills 36 bytes at d 128 where it spilled 20).
template <bool kFlushSubnormals = false>
__device__ inline float recomputed_probability(float s, float scale, float lse) {
  return ptx::ex2_approx<kFlushSubnormals>((__fmul_rn(s, scale) - lse) * kLog2e);
}

// dS_ij = P_ij (dP_ij - D_i) scale (line 13), evaluated left to right in every kernel, so that the exact pass
// (backward.cu's exact_kernel) forms the tensor-core kernels' value.
__device__ inline float score_gradient(float p, float dp, float d, float scale) {
  return p * (dp - d) * scale;
}

namespace FLASHLAB_CUDA_TARGET {

// Launches a main kernel of the backward (one block per key tile) with `smem` bytes of dynamic shared memory.
// 128 keys at d 128 take 106.5 KiB with 32 query rows a step and 161 KiB with 64: A100 and Hopper offer a
// block up to 163 and 227 KiB, GPUs of compute capability 8.6 and 8.9 only 99. Where the attribute is
// refused, the device's limit is read and named with the tile.
template <auto Kernel, typename... Args>
void launch_backward_tile(dim3 grid, int threads, int smem, int block_m, int block_n, int head_dim,
                          cudaStream_t stream, Args&&... args) {
  if (const cudaError_t status =
          cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      status != cudaSuccess) {
    (void)cudaGetLastError();  // the refusal, reported below
    int device = 0, offered = 0;
    FLASHLAB_CUDA_CHECK(cudaGetDevice(&device));
    FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&offered, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (smem > offered)
      fail("the backward's ", block_m, " x ", block_n, " tile at head_dim ", head_dim, " needs ", smem,
           " bytes of shared memory a block; this GPU offers ", offered);
    FLASHLAB_CUDA_CHECK(status);
  }
  cuda::launch_kernel<Kernel>(grid, dim3(threads), smem, stream, std::forward<Args>(args)...);
}

// The main kernel with 64 query rows a step over 128 keys in FlashAttention-2's warp layout
// (backward_64x128.cu): bf16, head_dim 64 or 128.
void launch_backward_64x128_kernel(dim3 grid, const SplitQBackwardParams& p, cudaStream_t stream);

}  // namespace FLASHLAB_CUDA_TARGET

using namespace FLASHLAB_CUDA_TARGET;

}  // namespace flashlab::cuda_v2
