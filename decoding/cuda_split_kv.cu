// decoding/cuda_split_kv: the launcher (checks, the split heuristic, the two launches). Kernels in
// cuda_split_kv.cuh.
#include "decoding/cuda_split_kv.hpp"

#include <algorithm>
#include <cstdint>

#include "common/cuda/check.hpp"
#include "common/cuda/device.hpp"
#include "common/cuda/int_lengths.hpp"
#include "common/error.hpp"
#include "decoding/cuda_split_kv.cuh"
#include "decoding/cuda_split_kv_stage.hpp"

namespace flashlab::decoding {

namespace {

using kernels::kBlockN;
using kernels::kMaxRows;
using kernels::kThreads;

// The heuristic's constants (decoding/CUDA.md "The split heuristic").
constexpr int kMinKeysPerSplit = 256;  // 8 tiles: below this the ring never fills and the combine dominates
constexpr int kMaxSplits = 128;

int row_tiles(const SplitKvParams& p) {
  return (p.heads_q / p.heads_kv * p.seqlen_q + kMaxRows - 1) / kMaxRows;
}

bool aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

template <typename T, int D>
int64_t dynamic_smem() {
  return kernels::Geometry<D>::kSmemBytes;
}

// Resident split-kernel blocks per SM for this head dim (its shared memory decides), cached per device (per
// host thread, so concurrent callers need no lock).
template <typename T, int D>
int blocks_per_sm() {
  thread_local int cached_device = -1, cached_blocks = 0;
  int device = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&device));
  if (device != cached_device) {
    const auto kernel = kernels::split_kv_kernel<T, D>;
    FLASHLAB_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic_smem<T, D>()));
    FLASHLAB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&cached_blocks, kernel, kThreads,
                                                                      dynamic_smem<T, D>()));
    cached_device = device;
  }
  return std::max(cached_blocks, 1);
}

int resident_blocks_per_sm(const SplitKvParams& p) {
  const bool half = p.dtype == SplitKvDType::f16;
  if (p.head_dim == 64) return half ? blocks_per_sm<__half, 64>() : blocks_per_sm<__nv_bfloat16, 64>();
  return half ? blocks_per_sm<__half, 128>() : blocks_per_sm<__nv_bfloat16, 128>();
}

int sm_count() {
  thread_local int cached_device = -1, cached_sms = 0;
  int device = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&device));
  if (device != cached_device) {
    FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&cached_sms, cudaDevAttrMultiProcessorCount, device));
    cached_device = device;
  }
  return cached_sms;
}

template <typename T, int D>
void launch(const SplitKvParams& p, int num_splits, cudaStream_t stream) {
  blocks_per_sm<T, D>();  // sets the kernel's shared-memory limit on this device
  const int tiles = row_tiles(p);
  const dim3 grid(num_splits, p.heads_kv * tiles, p.batch);
  kernels::split_kv_kernel<T, D><<<grid, kThreads, dynamic_smem<T, D>(), stream>>>(p, num_splits, tiles);
  FLASHLAB_CUDA_CHECK_LAUNCH();
  if (num_splits > 1) {
    const int64_t rows = static_cast<int64_t>(p.batch) * p.heads_q * p.seqlen_q;
    kernels::combine_kernel<T, D><<<static_cast<unsigned>(rows), D, 0, stream>>>(p, num_splits);
    FLASHLAB_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

SplitKvParams split_kv_params(const Problem& problem) {
  SplitKvParams params;
  params.dtype = problem.dtype == DType::bf16 ? SplitKvDType::bf16 : SplitKvDType::f16;
  params.batch = static_cast<int>(problem.batch);
  params.heads_q = static_cast<int>(problem.heads_q);
  params.heads_kv = static_cast<int>(problem.heads_kv);
  params.seqlen_q = static_cast<int>(problem.seqlen_q);
  params.seqlen_k = static_cast<int>(problem.seqlen_k);
  params.head_dim = static_cast<int>(problem.head_dim);
  set_packed_strides(params);
  params.scale = static_cast<float>(problem.softmax_scale());
  params.causal = problem.causal;
  params.window_left = static_cast<int>(problem.window_left);
  params.window_right = static_cast<int>(problem.window_right);
  return params;
}

void set_packed_strides(SplitKvParams& p) {
  const int64_t d = p.head_dim;
  p.q_stride_head = p.o_stride_head = d;
  p.q_stride_seq = p.o_stride_seq = p.heads_q * d;
  p.q_stride_batch = p.o_stride_batch = static_cast<int64_t>(p.seqlen_q) * p.heads_q * d;
  p.k_stride_head = p.v_stride_head = d;
  p.k_stride_seq = p.v_stride_seq = p.heads_kv * d;
  p.k_stride_batch = p.v_stride_batch = static_cast<int64_t>(p.seqlen_k) * p.heads_kv * d;
  p.k_stride_page = p.v_stride_page = static_cast<int64_t>(p.page_size) * p.heads_kv * d;
}

const char* cuda_split_kv_unsupported(const SplitKvParams& p) {
  if (p.dtype != SplitKvDType::f16 && p.dtype != SplitKvDType::bf16) return "dtype must be f16 or bf16";
  if (p.head_dim != 64 && p.head_dim != 128) return "head_dim must be 64 or 128";
  if (p.batch < 1 || p.batch > 65535) return "batch must be in [1, 65535]";
  if (p.heads_q < 1 || p.heads_kv < 1) return "heads_q and heads_kv must be >= 1";
  if (p.heads_q % p.heads_kv != 0) return "heads_q must be a multiple of heads_kv";
  if (static_cast<int64_t>(p.heads_kv) * row_tiles(p) > 65535) return "heads_kv x row tiles must be <= 65535";
  if (p.seqlen_q < 1 || p.seqlen_q > 16) return "seqlen_q must be in [1, 16] (decoding)";
  if (p.seqlen_k < 0) return "seqlen_k must be >= 0";
  if (!(p.scale > 0.0f)) return "scale must be > 0";
  if (p.window_left < -1 || p.window_right < -1) return "window_left and window_right must be >= -1";
  if (p.num_splits < 0 || p.num_splits > kMaxSplits) return "num_splits must be in [0, 128] (0 = heuristic)";
  if (p.q == nullptr || p.o == nullptr || p.lse == nullptr) return "q, o and lse must be device pointers";
  if (p.seqlen_k > 0 && (p.k == nullptr || p.v == nullptr)) return "k and v must be device pointers";
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) || !aligned16(p.o))
    return "q, k, v and o must be 16-byte aligned (16-byte vector loads)";
  for (const int64_t stride :
       {p.q_stride_batch, p.q_stride_seq, p.q_stride_head, p.k_stride_batch, p.k_stride_seq, p.k_stride_head,
        p.v_stride_batch, p.v_stride_seq, p.v_stride_head, p.o_stride_batch, p.o_stride_seq, p.o_stride_head,
        p.k_stride_page, p.v_stride_page})
    if (stride % 8 != 0) return "strides must be multiples of 8 elements (16-byte vector loads)";
  if (p.block_table != nullptr) {
    if (p.page_size < 8 || (p.page_size & (p.page_size - 1)) != 0)
      return "page_size must be a power of two >= 8 with a block table";
    if (static_cast<int64_t>(p.block_table_stride) * p.page_size < p.seqlen_k)
      return "block_table_stride x page_size must cover seqlen_k";
  }
  return nullptr;
}

namespace {

// The split count for valid parameters (the pointers are not looked at).
int resolve_splits(const SplitKvParams& p) {
  if (p.num_splits > 0) return p.num_splits;
  // Fill one wave: as many blocks as the SMs hold at once (2 per SM at d = 128, from the shared memory).
  const int64_t blocks = static_cast<int64_t>(p.batch) * p.heads_kv * row_tiles(p);
  const int64_t wave = static_cast<int64_t>(sm_count()) * resident_blocks_per_sm(p);
  int64_t splits = (wave + blocks - 1) / blocks;
  // ... but give each split at least kMinKeysPerSplit keys of the longest sequence.
  splits = std::min<int64_t>(splits, (p.seqlen_k + kMinKeysPerSplit - 1) / kMinKeysPerSplit);
  return static_cast<int>(std::clamp<int64_t>(splits, 1, kMaxSplits));
}

// Elements of the partials (O_j and LSE_j, float) for `splits` splits; none when unsplit.
int64_t partial_elements(const SplitKvParams& p, int splits) {
  if (splits == 1) return 0;
  return static_cast<int64_t>(p.batch) * p.heads_q * p.seqlen_q * splits * (p.head_dim + 1);
}

}  // namespace

int cuda_split_kv_num_splits(const SplitKvParams& p) {
  if (const char* reason = cuda_split_kv_unsupported(p)) fail("cuda_split_kv: ", reason);
  return resolve_splits(p);
}

size_t cuda_split_kv_workspace_bytes(const SplitKvParams& p) {
  // O_j [.., D] then LSE_j
  return static_cast<size_t>(partial_elements(p, cuda_split_kv_num_splits(p))) * sizeof(float);
}

void cuda_split_kv_forward(const SplitKvParams& p, cudaStream_t stream) {
  const int splits = cuda_split_kv_num_splits(p);  // validates
  if (splits > 1) {
    if (p.workspace == nullptr || !aligned16(p.workspace))
      fail("cuda_split_kv: workspace must be a 16-byte aligned device pointer (", splits, " splits)");
    if (p.workspace_bytes < cuda_split_kv_workspace_bytes(p))
      fail("cuda_split_kv: workspace_bytes (", p.workspace_bytes,
           ") must be >= ", cuda_split_kv_workspace_bytes(p), " for ", splits, " splits");
  }
  const bool half = p.dtype == SplitKvDType::f16;
  if (p.head_dim == 64) {
    half ? launch<__half, 64>(p, splits, stream) : launch<__nv_bfloat16, 64>(p, splits, stream);
  } else {
    half ? launch<__half, 128>(p, splits, stream) : launch<__nv_bfloat16, 128>(p, splits, stream);
  }
}

// ---- The registry entry's side (cuda_split_kv_stage.hpp) ----

namespace {

// The workspace: the partials first (16-byte aligned, where the buffer starts), then the int lengths.
size_t aligned16_bytes(size_t bytes) {
  return (bytes + 15) / 16 * 16;
}

}  // namespace

size_t cuda_split_kv_registry_workspace_bytes(const Problem& problem) {
  const SplitKvParams p = split_kv_params(problem);
  return aligned16_bytes(static_cast<size_t>(partial_elements(p, resolve_splits(p))) * sizeof(float)) +
         cuda::int_lengths_bytes(problem);
}

int64_t cuda_split_kv_partial_elements(const Problem& problem) {
  // The split count is the device's (SM count, occupancy); where no device can say, count one split.
  const SplitKvParams p = split_kv_params(problem);
  return partial_elements(p, cuda::unavailable_reason().empty() ? resolve_splits(p) : 1);
}

void launch_cuda_split_kv(const Problem& problem, const DeviceTensors& tensors) {
  if (problem.page_size > 0)
    fail("decoding/cuda_split_kv: page_size (", problem.page_size,
         "): the registry's device tensors hold contiguous K/V");
  if (!problem.seqlens_q.empty())
    for (const int64_t rows : problem.seqlens_q)
      if (rows != problem.seqlen_q)
        fail("decoding/cuda_split_kv: seqlens_q (padded query rows) is not supported");
  SplitKvParams params = split_kv_params(problem);
  params.q = tensors.q;
  params.k = tensors.k;
  params.v = tensors.v;
  params.o = tensors.o;
  params.lse = tensors.lse;
  params.mask = tensors.mask;
  params.workspace_bytes = cuda_split_kv_workspace_bytes(params);  // validates the parameters
  auto* workspace = static_cast<unsigned char*>(tensors.workspace);
  params.workspace = params.workspace_bytes > 0 ? workspace : nullptr;
  params.seqlens_k =
      cuda::narrow_lengths(problem, tensors, workspace + aligned16_bytes(params.workspace_bytes)).seqlens_k;
  cuda_split_kv_forward(params, nullptr);
}

}  // namespace flashlab::decoding
