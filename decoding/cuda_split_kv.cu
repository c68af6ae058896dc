// decoding/cuda_split_kv and cuda_split_kv_mma: the launcher (the split heuristic, the two launches) and the
// registry entries' side, built for the GPU and for the emulator (common/cuda/target.hpp). Kernels in
// cuda_split_kv.cuh and cuda_split_kv_mma.cuh; the parameters' checks in cuda_split_kv_params.cpp.
#include "decoding/cuda_split_kv.hpp"

#include <algorithm>
#include <cstdint>

#include "common/cuda/check.hpp"
#include "common/cuda/device.hpp"
#include "common/cuda/int_lengths.hpp"
#include "common/cuda/launch.cuh"
#include "common/error.hpp"
#include "decoding/cuda_split_kv.cuh"
#include "decoding/cuda_split_kv_mma.cuh"

namespace flashlab::decoding {

namespace {

using kernels::kThreads;

bool aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

// The split kernel of each entry: on the CUDA cores (decoding/cuda_split_kv) or with the query rows on the
// tensor cores (decoding/cuda_split_kv_mma), with its dynamic shared memory.
template <typename T, int D, bool kTensorCores>
struct SplitKernel {
  static constexpr auto kernel =
      kTensorCores ? kernels::mma::split_kv_mma_kernel<T, D> : kernels::split_kv_kernel<T, D>;
  static constexpr int kSmemBytes =
      kTensorCores ? kernels::mma::Geometry<D>::kSmemBytes : kernels::Geometry<D>::kSmemBytes;
};

// Resident split-kernel blocks per SM for this head dim (its shared memory decides), cached per device (per
// host thread, so concurrent callers need no lock).
template <typename T, int D, bool kTensorCores>
int blocks_per_sm() {
  using Split = SplitKernel<T, D, kTensorCores>;
  thread_local int cached_device = -1, cached_blocks = 0;
  int device = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&device));
  if (device != cached_device) {
    FLASHLAB_CUDA_CHECK(
        cudaFuncSetAttribute(Split::kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Split::kSmemBytes));
    FLASHLAB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&cached_blocks, Split::kernel, kThreads,
                                                                      Split::kSmemBytes));
    cached_device = device;
  }
  return std::max(cached_blocks, 1);
}

template <bool kTensorCores>
int resident_blocks_per_sm(const SplitKvParams& p) {
  const bool half = p.dtype == SplitKvDType::f16;
  if (split_kv_tile_width(p.head_dim) == 64)
    return half ? blocks_per_sm<__half, 64, kTensorCores>()
                : blocks_per_sm<__nv_bfloat16, 64, kTensorCores>();
  return half ? blocks_per_sm<__half, 128, kTensorCores>()
              : blocks_per_sm<__nv_bfloat16, 128, kTensorCores>();
}

int resident_blocks_per_sm(const SplitKvParams& p) {
  return p.tensor_cores ? resident_blocks_per_sm<true>(p) : resident_blocks_per_sm<false>(p);
}

template <typename T, int D, bool kTensorCores>
void launch_split(const SplitKvParams& p, int num_splits, cudaStream_t stream) {
  using Split = SplitKernel<T, D, kTensorCores>;
  blocks_per_sm<T, D, kTensorCores>();  // sets the kernel's shared-memory limit on this device
  const int tiles = split_kv_row_tiles(p);
  const dim3 grid(num_splits, p.heads_kv * tiles, p.batch);
  cuda::launch_kernel<Split::kernel>(grid, dim3(kThreads), Split::kSmemBytes, stream, p, num_splits, tiles);
}

template <typename T, int D>
void launch(const SplitKvParams& p, int num_splits, cudaStream_t stream) {
  if (p.tensor_cores)
    launch_split<T, D, true>(p, num_splits, stream);
  else
    launch_split<T, D, false>(p, num_splits, stream);
  if (num_splits > 1) {
    const int64_t rows = static_cast<int64_t>(p.batch) * p.heads_q * p.seqlen_q;
    if (p.two_pass_combine)
      cuda::launch_kernel<kernels::combine_two_pass_kernel<T, D>>(dim3(static_cast<unsigned>(rows)), dim3(D),
                                                                  kernels::combine_two_pass_smem_bytes<D>(),
                                                                  stream, p, num_splits);
    else
      cuda::launch_kernel<kernels::combine_kernel<T, D>>(dim3(static_cast<unsigned>(rows)), dim3(D), 0,
                                                         stream, p, num_splits);
  }
}

// The split count for valid parameters (the pointers are not looked at).
int resolve_splits(const SplitKvParams& p) {
  if (p.num_splits > 0) return p.num_splits;
  // Fill one wave (5 blocks per SM at d = 128), rounded down: never a tail wave of a few blocks.
  const int64_t blocks = static_cast<int64_t>(p.batch) * p.heads_kv * split_kv_row_tiles(p);
  const int64_t wave = static_cast<int64_t>(cuda::sm_count()) * resident_blocks_per_sm(p);
  int64_t splits = std::max<int64_t>(1, wave / blocks);
  // ... but give each split at least kMinKeysPerSplit keys of the longest sequence.
  splits = std::min<int64_t>(splits, (p.seqlen_k + kMinKeysPerSplit - 1) / kMinKeysPerSplit);
  return static_cast<int>(std::clamp<int64_t>(splits, 1, kSplitKvMaxSplits));
}

// Elements of the partials (O_j, tile-width rows, and LSE_j, float) for `splits` splits; none when unsplit.
int64_t partial_elements(const SplitKvParams& p, int splits) {
  if (splits == 1) return 0;
  return static_cast<int64_t>(p.batch) * p.heads_q * p.seqlen_q * splits *
         (split_kv_tile_width(p.head_dim) + 1);
}

// The registry's workspace: the partials first (16-byte aligned, where the buffer starts), then the int
// lengths.
size_t aligned16_bytes(size_t bytes) {
  return (bytes + 15) / 16 * 16;
}

}  // namespace

namespace FLASHLAB_CUDA_TARGET {

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
  if (split_kv_tile_width(p.head_dim) == 64) {
    half ? launch<__half, 64>(p, splits, stream) : launch<__nv_bfloat16, 64>(p, splits, stream);
  } else {
    half ? launch<__half, 128>(p, splits, stream) : launch<__nv_bfloat16, 128>(p, splits, stream);
  }
}

namespace {

size_t registry_workspace_bytes(const Problem& problem, bool tensor_cores) {
  const SplitKvParams p = split_kv_params(problem, tensor_cores);
  return aligned16_bytes(static_cast<size_t>(partial_elements(p, resolve_splits(p))) * sizeof(float)) +
         cuda::int_lengths_bytes(problem);
}

int64_t registry_partial_elements(const Problem& problem, bool tensor_cores) {
  const SplitKvParams p = split_kv_params(problem, tensor_cores);
  return partial_elements(p, resolve_splits(p));
}

void launch_registry(const Problem& problem, const DeviceTensors& tensors, bool tensor_cores,
                     bool two_pass_combine = false) {
  const char* const name = two_pass_combine ? "decoding/cuda_split_kv_mma_two_pass"
                           : tensor_cores   ? "decoding/cuda_split_kv_mma"
                                            : "decoding/cuda_split_kv";
  if (!problem.seqlens_q.empty())
    for (const int64_t rows : problem.seqlens_q)
      if (rows != problem.seqlen_q) fail(name, ": seqlens_q (padded query rows) is not supported");
  SplitKvParams params = split_kv_params(problem, tensor_cores);
  params.two_pass_combine = two_pass_combine;
  params.q = tensors.q;
  params.k = tensors.k;
  params.v = tensors.v;
  params.o = tensors.o;
  params.lse = tensors.lse;
  params.mask = tensors.mask;
  if (problem.page_size > 0) {  // K and V from the paged cache (common/paged_kv.hpp)
    if (tensors.block_table == nullptr) fail(name, ": page_size > 0 but no paged K/V");
    params.page_size = static_cast<int>(problem.page_size);
    set_packed_strides(params);
    params.k = tensors.k_pages;
    params.v = tensors.v_pages;
    params.block_table = tensors.block_table;
    params.block_table_stride = static_cast<int>(tensors.block_table_stride);
  }
  params.workspace_bytes = cuda_split_kv_workspace_bytes(params);  // validates the parameters
  auto* workspace = static_cast<unsigned char*>(tensors.workspace);
  params.workspace = params.workspace_bytes > 0 ? workspace : nullptr;
  params.seqlens_k =
      cuda::narrow_lengths(problem, tensors, workspace + aligned16_bytes(params.workspace_bytes)).seqlens_k;
  cuda_split_kv_forward(params, tensors.stream);
}

}  // namespace

size_t cuda_split_kv_registry_workspace_bytes(const Problem& problem) {
  return registry_workspace_bytes(problem, false);
}
int64_t cuda_split_kv_partial_elements(const Problem& problem) {
  return registry_partial_elements(problem, false);
}
void launch_cuda_split_kv(const Problem& problem, const DeviceTensors& tensors) {
  launch_registry(problem, tensors, false);
}
size_t cuda_split_kv_mma_registry_workspace_bytes(const Problem& problem) {
  return registry_workspace_bytes(problem, true);
}
int64_t cuda_split_kv_mma_partial_elements(const Problem& problem) {
  return registry_partial_elements(problem, true);
}
void launch_cuda_split_kv_mma(const Problem& problem, const DeviceTensors& tensors) {
  launch_registry(problem, tensors, true);
}
void launch_cuda_split_kv_mma_two_pass(const Problem& problem, const DeviceTensors& tensors) {
  launch_registry(problem, tensors, true, true);
}

}  // namespace FLASHLAB_CUDA_TARGET

}  // namespace flashlab::decoding
