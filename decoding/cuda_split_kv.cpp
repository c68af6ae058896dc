// decoding/cuda_split_kv's registration: ordinary C++, compiled in every build, so the stage is listed (and
// its tests skipped with the reason) where there is no CUDA. The kernels are in cuda_split_kv.cuh, the
// launcher in cuda_split_kv.cu.
#include <climits>
#include <string>

#include "common/cuda/gpu_stage.hpp"
#include "decoding/cuda_split_kv_stage.hpp"
#include "decoding/split_kv.hpp"

namespace flashlab::decoding {

namespace {

constexpr int64_t kMaxQueryRows = 16;  // rows of one block's tile: decode and speculative decode

std::string supports(const Problem& p) {
  if (p.head_dim != 64 && p.head_dim != 128)
    return "head_dim (" + std::to_string(p.head_dim) + ") must be 64 or 128 (the compiled tiles)";
  if (p.seqlen_q > kMaxQueryRows)  // prefill (many query rows) is the tiled stages' work
    return "seqlen_q (" + std::to_string(p.seqlen_q) + ") must be <= " + std::to_string(kMaxQueryRows) +
           " (decoding)";
  // Every query row is valid: the kernel knows per-batch KV lengths only.
  for (const int64_t rows : p.seqlens_q)
    if (rows != p.seqlen_q)
      return "seqlens_q: padded query rows are not supported (only per-batch KV lengths, seqlens_k)";
  // The kernel reads a paged cache, but the registry's device tensors hold contiguous K/V; the paged path is
  // checked by decoding_cuda_selftest.
  if (p.page_size > 0)
    return "page_size (" + std::to_string(p.page_size) +
           "): the registry adapter passes contiguous K/V only (decoding_cuda_selftest runs the paged cache)";
  // The grid is (splits, heads_kv x row tiles, batch); SplitKvParams holds lengths and windows as int; the
  // scale is folded into exp2 after the row max of the unscaled scores.
  const int64_t row_tiles = (p.group_size() * p.seqlen_q + kMaxQueryRows - 1) / kMaxQueryRows;
  for (const std::string& reason : {grid_extent_limit("batch", p.batch),
                                    grid_extent_limit("heads_kv x row tiles", p.heads_kv * row_tiles),
                                    int_lengths_and_positive_scale(p, "decoding/cuda_split_kv")})
    if (!reason.empty()) return reason;
  return "";
}

Implementation entry() {
  Implementation impl{
      .name = "decoding/cuda_split_kv",
      .summary = "Flash-Decoding on CUDA: KV split over blocks, partial (O_j, LSE_j), LSE combine kernel",
      .dtypes = {DType::f16, DType::bf16},
      .constraints =
          "f16, bf16; seqlen_q <= 16; head_dim 64, 128; every mask, GQA, seqlens_k; contiguous K/V",
      .supports = supports};  // rounds_p stays false: P is kept in fp32 (CUDA-core products)
#if FLASHLAB_HAVE_CUDA
  // Both depend on the device's split count, so they exist only where the launcher does.
  impl.bytes_moved = [](const Problem& p) {
    return decode_bytes_moved(p, cuda_split_kv_partial_elements(p), 2.0);  // fp16/bf16 Q, K, V and O
  };
  impl.device_workspace_bytes = cuda_split_kv_registry_workspace_bytes;
#endif
  return impl;
}

const Registration cuda_split_kv{gpu_implementation(entry(), FLASHLAB_CUDA_LAUNCHER(launch_cuda_split_kv))};

}  // namespace

}  // namespace flashlab::decoding
