// decoding/cuda_split_kv's registration: ordinary C++, compiled once. The kernels (cuda_split_kv.cuh) and the
// launcher (cuda_split_kv.cu) are built for the GPU and for the emulator, and the registry runs whichever
// this machine can (common/cuda/gpu_stage.hpp).
#include <climits>
#include <string>

#include "common/cuda/device.hpp"
#include "common/cuda/gpu_stage.hpp"
#include "decoding/cuda_core.hpp"
#include "decoding/cuda_split_kv.hpp"
#include "decoding/split_kv.hpp"

namespace flashlab::decoding {

namespace {

std::string supports_as(const Problem& p, const char* name) {
  if (split_kv_tile_width(p.head_dim) == 0)
    return "head_dim (" + std::to_string(p.head_dim) + ") must be a multiple of 8 up to 128";
  if (p.seqlen_q > kSplitKvMaxRows)  // prefill (many query rows) is the tiled stages' work
    return "seqlen_q (" + std::to_string(p.seqlen_q) + ") must be <= " + std::to_string(kSplitKvMaxRows) +
           " (decoding)";
  // Every query row is valid: the kernel knows per-batch KV lengths only.
  for (const int64_t rows : p.seqlens_q)
    if (rows != p.seqlen_q)
      return "seqlens_q: padded query rows are not supported (only per-batch KV lengths, seqlens_k)";
  // A page is found with a shift and a mask (decoding/CUDA.md "The paged cache").
  if (p.page_size > 0 && (p.page_size < 8 || (p.page_size & (p.page_size - 1)) != 0))
    return "page_size (" + std::to_string(p.page_size) + ") must be a power of two >= 8";
  // The grid is (splits, heads_kv x row tiles, batch); SplitKvParams holds lengths and windows as int; the
  // scale is folded into exp2 after the row max of the unscaled scores.
  const int64_t row_tiles = (p.group_size() * p.seqlen_q + kSplitKvMaxRows - 1) / kSplitKvMaxRows;
  for (const std::string& reason : {grid_extent_limit("batch", p.batch),
                                    grid_extent_limit("heads_kv x row tiles", p.heads_kv * row_tiles),
                                    int_lengths_and_positive_scale(p, name)})
    if (!reason.empty()) return reason;
  return "";
}

std::string supports(const Problem& p) {
  return supports_as(p, "decoding/cuda_split_kv");
}

// The split count is the device's (its SM count and the split kernel's occupancy): the GPU's where one runs
// the stage, the emulated device's (an H100's limits) otherwise.
int64_t partial_elements(const Problem& p, bool tensor_cores) {
#if FLASHLAB_LINKS_GPU_BUILDS
  if (cuda::unavailable_reason().empty() && !cuda::emulation_forced())
    return tensor_cores ? gpu::cuda_split_kv_mma_partial_elements(p) : gpu::cuda_split_kv_partial_elements(p);
#endif
  return tensor_cores ? emulated::cuda_split_kv_mma_partial_elements(p)
                      : emulated::cuda_split_kv_partial_elements(p);
}

// The traffic: the partials hold (width + 1) floats per row and split, for the tile width the head dim runs
// in; every split's blocks read Q.
double bytes_moved(const Problem& p, bool tensor_cores) {
  const int64_t partials = partial_elements(p, tensor_cores);
  const int64_t width = split_kv_tile_width(p.head_dim);
  const double splits = partials == 0 ? 1.0 : double(partials) / double(p.lse_elements() * (width + 1));
  return decode_bytes_moved(p, partials, 2.0, splits);  // fp16/bf16 Q, K, V and O
}

constexpr const char* kConstraints =
    "f16, bf16; seqlen_q <= 16; head_dim a multiple of 8 up to 128; every mask, GQA, seqlens_k; contiguous "
    "K/V or pages of a power of two >= 8 tokens";

const Registration cuda_split_kv{gpu_implementation(
    {.name = "decoding/cuda_split_kv",
     .summary = "Flash-Decoding on CUDA: KV split over blocks, partial (O_j, LSE_j), LSE combine kernel",
     .dtypes = {DType::f16, DType::bf16},
     .constraints = kConstraints,
     .supports = supports,  // rounds_p stays false: P is kept in fp32 (CUDA-core products)
     .bytes_moved = [](const Problem& p) { return bytes_moved(p, false); }},
    {FLASHLAB_GPU_BUILD(launch_cuda_split_kv), &emulated::launch_cuda_split_kv,
     FLASHLAB_GPU_BUILD(cuda_split_kv_registry_workspace_bytes),
     &emulated::cuda_split_kv_registry_workspace_bytes})};

// Beside it: the same splits and combine, with the block's 16 query rows on the tensor cores
// (cuda_split_kv_mma.cuh).
const Registration cuda_split_kv_mma{gpu_implementation(
    {.name = "decoding/cuda_split_kv_mma",
     .summary = "Flash-Decoding with the GQA group's query rows on the tensor cores (mma.sync m16n8k16)",
     .dtypes = {DType::f16, DType::bf16},
     .constraints = kConstraints,
     .rounds_p = true,  // P is rounded to the input format: it is the A operand of the P V mma
     .supports = [](const Problem& p) { return supports_as(p, "decoding/cuda_split_kv_mma"); },
     .bytes_moved = [](const Problem& p) { return bytes_moved(p, true); }},
    {FLASHLAB_GPU_BUILD(launch_cuda_split_kv_mma), &emulated::launch_cuda_split_kv_mma,
     FLASHLAB_GPU_BUILD(cuda_split_kv_mma_registry_workspace_bytes),
     &emulated::cuda_split_kv_mma_registry_workspace_bytes})};

// Beside it: the same split kernel, with the combine in two passes, the row's LSE first and then every
// split's O weighted, so that its loads are in flight together (cuda_split_kv.cuh, combine_two_pass_kernel).
const Registration cuda_split_kv_mma_two_pass{gpu_implementation(
    {.name = "decoding/cuda_split_kv_mma_two_pass",
     .summary = "cuda_split_kv_mma with its combine in two passes: the row's LSE, then every O_j weighted",
     .dtypes = {DType::f16, DType::bf16},
     .constraints = kConstraints,
     .rounds_p = true,  // cuda_split_kv_mma's split kernel
     .supports = [](const Problem& p) { return supports_as(p, "decoding/cuda_split_kv_mma_two_pass"); },
     .bytes_moved = [](const Problem& p) { return bytes_moved(p, true); }},
    {FLASHLAB_GPU_BUILD(launch_cuda_split_kv_mma_two_pass), &emulated::launch_cuda_split_kv_mma_two_pass,
     FLASHLAB_GPU_BUILD(cuda_split_kv_mma_registry_workspace_bytes),
     &emulated::cuda_split_kv_mma_registry_workspace_bytes})};

// The core (cuda_core.cu): Flash-Decoding as the method says it, the plain case. The padded query rows and
// pages the full kernel refuses or takes, it refuses by name (the registry refuses the explicit mask).
std::string core_supports(const Problem& p) {
  if (p.head_dim != 64 && p.head_dim != 128)  // the core is compiled for these two, without zero lanes
    return "head_dim (" + std::to_string(p.head_dim) + ") must be 64 or 128 for decoding/cuda_core";
  if (p.page_size > 0)
    return "page_size (" + std::to_string(p.page_size) +
           "): a paged KV cache is decoding/cuda_split_kv's (the core reads contiguous K and V)";
  return supports(p);
}

const Registration cuda_core{gpu_implementation(
    {.name = "decoding/cuda_core",
     .summary =
         "Flash-Decoding on CUDA as the method says it: a partial (O_j, LSE_j) per chunk, then combine",
     .dtypes = {DType::f16},
     .constraints = "the plain case: f16; seqlen_q <= 16; head_dim 64, 128; causal, window, seqlens_k, GQA",
     .explicit_mask = false,
     .supports = core_supports},
    FLASHLAB_DEVICE_BUILDS(launch_cuda_core, cuda_core_workspace_bytes))};

}  // namespace

}  // namespace flashlab::decoding
