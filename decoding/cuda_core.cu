// decoding/cuda_core: Flash-Decoding (Dao, Haziza, Massa, Sizov 2023) on CUDA, written to be read beside the
// method: decoding/core's three steps, on a GPU. The plain case only: fp16 in and out, fp32 arithmetic,
// head_dim 64 or 128, seqlen_q <= 16, causal, window and padding masks, GQA, LSE, contiguous K and V.
// decoding/cuda_split_kv is the same method made fast (a GQA group's heads in one block so K and V are read
// once, a cp.async ring of K/V tiles, one kernel when one split suffices, paged KV, explicit masks); this
// file is the method.
//
// The steps (the [Sn] marks below; tests/check_cores.py holds this table to them):
//   [S1]  split each sequence's keys into num_splits chunks                      cuda_core_splits
//   [S2]  for each (chunk, query head, batch element) in parallel, one thread block: FlashAttention over the
//         chunk's keys for every query row, giving its normalized partial O_j and LSE_j       partials_kernel
//   [S3]  combine each row's partials: LSE = log sum_j exp(LSE_j), O = sum_j exp(LSE_j - LSE) O_j
//                                                                                combine_kernel
// The online softmax of [S2] and the merge of [S3] are common/softmax_state.hpp's SoftmaxState, the same code
// the CPU stages run (host and device functions). A key a row does not see takes no part: its V row is not
// read, so padding and hidden keys may hold anything (docs/conventions.md §4).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "common/cuda/check.hpp"
#include "common/cuda/int_lengths.hpp"
#include "common/cuda/launch.cuh"
#include "common/cuda/warp_reduce.cuh"
#include "common/error.hpp"
#include "common/mask.hpp"
#include "common/softmax_state.hpp"
#include "decoding/cuda_core.hpp"
#include "decoding/cuda_split_kv.hpp"

namespace flashlab::decoding {
namespace FLASHLAB_CUDA_TARGET {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps, kMaxRows = 16, kBlockN = 32;  // a key per lane

// [S2] The partials of chunk blockIdx.x for query head blockIdx.y of batch element blockIdx.z: warp w takes
// the rows w, w + 4, ...; lane l scores key 32 t + l of each 32-key tile t, and owns the output columns
// l, l + 32, ... of the rows.
template <int kHeadDim>
__global__ void __launch_bounds__(kThreads)
    partials_kernel(const SplitKvParams p, int splits, float* partial_o, float* partial_lse) {
  constexpr int kColumns = kHeadDim / 32;
  __shared__ float q_rows[kMaxRows][kHeadDim];  // the block's query rows, times the softmax scale
  const int split = blockIdx.x, head = blockIdx.y, b = blockIdx.z;
  const int head_kv = head / (p.heads_q / p.heads_kv);  // GQA: the query head's K/V head
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows_k = p.seqlens_k ? p.seqlens_k[b] : p.seqlen_k;  // keys past it are padding
  const int chunk = (p.seqlen_k + splits - 1) / splits, j0 = split * chunk;
  const int j1 = min(j0 + chunk, rows_k);  // this chunk's keys that exist

  const __half* q = static_cast<const __half*>(p.q) + b * p.q_stride_batch + head * p.q_stride_head;
  for (int e = threadIdx.x; e < p.seqlen_q * kHeadDim; e += kThreads)
    q_rows[e / kHeadDim][e % kHeadDim] =
        __half2float(q[e / kHeadDim * p.q_stride_seq + e % kHeadDim]) * p.scale;
  __syncthreads();

  const __half* k = static_cast<const __half*>(p.k) + b * p.k_stride_batch + head_kv * p.k_stride_head;
  const __half* v = static_cast<const __half*>(p.v) + b * p.v_stride_batch + head_kv * p.v_stride_head;
  for (int i = warp; i < p.seqlen_q; i += kWarps) {
    const KeyRange seen = band_key_range(i, p.seqlen_q, rows_k, p.causal, p.window_left, p.window_right);
    SoftmaxState<float> state;  // m and l of row i over this chunk (every lane holds the same)
    float acc[kColumns] = {};   // its unnormalized output, columns lane + 32 u
    for (int t = j0; t < j1; t += kBlockN) {
      const int j = t + lane;  // this lane's key
      const bool visible = j < j1 && j >= seen.begin && j < seen.end;
      float score = -INFINITY;
      if (visible) {
        score = 0.0f;
        for (int x = 0; x < kHeadDim; ++x) score += q_rows[i][x] * __half2float(k[j * p.k_stride_seq + x]);
      }
      // m = max(m, tile max) rescales l and the accumulator; then P = exp(s - m), l += rowsum(P).
      const float rescale = state.raise_max(cuda::warp_max(score));
      const float weight = state.weight(score);
      state.add(cuda::warp_sum(weight));
#pragma unroll
      for (int u = 0; u < kColumns; ++u) acc[u] *= rescale;
      for (int e = 0; e < kBlockN && t + e < j1; ++e) {  // O += P V_tile, key by key (lane e's weight)
        const float w = __shfl_sync(0xffffffffu, weight, e);
        if (!__shfl_sync(0xffffffffu, static_cast<int>(visible), e))
          continue;  // a hidden key's V row is not read
#pragma unroll
        for (int u = 0; u < kColumns; ++u)
          acc[u] += w * __half2float(v[(t + e) * p.v_stride_seq + lane + 32 * u]);
      }
    }
    // The chunk's partial: O_j = acc / l (0 when it saw no key) and LSE_j = m + log l (-inf then).
    const int64_t row = ((static_cast<int64_t>(b) * p.heads_q + head) * p.seqlen_q + i) * splits + split;
    const float inverse = state.normalizer();
#pragma unroll
    for (int u = 0; u < kColumns; ++u) partial_o[row * kHeadDim + lane + 32 * u] = acc[u] * inverse;
    if (lane == 0) partial_lse[row] = state.lse();
  }
}

// [S3] Row blockIdx.x (= (b * heads_q + head) * seqlen_q + i): thread c merges column c of the partials by
// their LSE, the merge every split-KV and tile combine uses.
template <int kHeadDim>
__global__ void __launch_bounds__(kHeadDim)
    combine_kernel(const SplitKvParams p, int splits, const float* partial_o, const float* partial_lse) {
  const int64_t row = blockIdx.x;
  const int c = threadIdx.x, i = static_cast<int>(row % p.seqlen_q);
  const int head = static_cast<int>(row / p.seqlen_q % p.heads_q),
            b = static_cast<int>(row / p.seqlen_q / p.heads_q);
  SoftmaxState<float> merged;
  float acc = 0.0f;
  for (int j = 0; j < splits; ++j)  // a partial (O_j, LSE_j) is the state {m = LSE_j, l = 1}, accumulator O_j
    merged.merge(SoftmaxState<float>::from_lse(partial_lse[row * splits + j]),
                 partial_o + (row * splits + j) * kHeadDim + c, &acc, 1);
  __half* o = static_cast<__half*>(p.o) + b * p.o_stride_batch + i * p.o_stride_seq + head * p.o_stride_head;
  o[c] = __float2half_rn(acc * merged.normalizer());  // O = 0 for a row that saw no key
  if (c == 0)
    p.lse[(static_cast<int64_t>(b) * p.heads_q + head) * p.seqlen_q + i] = merged.lse();  // -inf then
}

// The partials after the int lengths in the registry's workspace: O_j [rows, splits, d], then LSE_j.
float* partials_at(void* workspace, const Problem& p) {
  return reinterpret_cast<float*>(static_cast<std::byte*>(workspace) + cuda::int_lengths_bytes(p));
}

}  // namespace

void launch_cuda_core(const Problem& problem, const DeviceTensors& tensors) {
  SplitKvParams p = split_kv_params(problem);
  if (p.dtype != SplitKvDType::f16 || (p.head_dim != 64 && p.head_dim != 128) || p.seqlen_q > kMaxRows)
    fail("decoding/cuda_core takes f16, head_dim 64 or 128 and seqlen_q <= ", kMaxRows);
  p.q = tensors.q, p.k = tensors.k, p.v = tensors.v, p.o = tensors.o, p.lse = tensors.lse;
  p.seqlens_k = cuda::narrow_lengths(problem, tensors, tensors.workspace).seqlens_k;
  const int splits = cuda_core_splits(problem);  // [S1]
  float* const partial_o = partials_at(tensors.workspace, problem);
  float* const partial_lse =
      partial_o + problem.batch * problem.heads_q * problem.seqlen_q * splits * p.head_dim;
  const dim3 grid(splits, p.heads_q, p.batch);
  const int rows = p.batch * p.heads_q * p.seqlen_q;
  if (p.head_dim == 64) {
    cuda::launch_kernel<partials_kernel<64>>(grid, dim3(kThreads), 0, tensors.stream, p, splits, partial_o,
                                             partial_lse);
    cuda::launch_kernel<combine_kernel<64>>(dim3(rows), dim3(64), 0, tensors.stream, p, splits, partial_o,
                                            partial_lse);
  } else {
    cuda::launch_kernel<partials_kernel<128>>(grid, dim3(kThreads), 0, tensors.stream, p, splits, partial_o,
                                              partial_lse);
    cuda::launch_kernel<combine_kernel<128>>(dim3(rows), dim3(128), 0, tensors.stream, p, splits, partial_o,
                                             partial_lse);
  }
}

}  // namespace FLASHLAB_CUDA_TARGET

}  // namespace flashlab::decoding
