// decoding/cuda_split_kv: Flash-Decoding on CUDA (fp16/bf16), on device pointers.
//
// Decoding has 1 to 16 query rows per sequence and a long KV cache: a FlashAttention-2 grid (one block per
// query tile and head) leaves most SMs idle at batch 1. Flash-Decoding splits the KV sequence into
// num_splits chunks, computes a partial result (O_j normalized, LSE_j) per (batch, kv head, split) on its own
// block, and merges the partials by their log-sum-exp in a second kernel (SoftmaxState::merge, the same
// math as every other stage). All query heads of a GQA group share one block, so K and V are read once.
//
// Supported: head_dim a multiple of 8 up to 128 (run in the tile widths 64 and 128, zero lanes past it:
// common/cuda/tile_width.hpp); seqlen_q 1 to 16 (decode and speculative decode); causal (bottom-right) and
// sliding window; per-batch KV lengths (0 included); an explicit [seqlen_q, seqlen_k] mask (tree masks); a
// paged KV cache (block table, any power-of-two page size >= 8). See decoding/CUDA.md.
//
// Plain C++ (no CUDA header): the registration and the tests include it in every build. The launcher and what
// depends on the device (the split count) exist in each build of cuda_split_kv.cu (common/cuda/target.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/cuda/stream.hpp"
#include "common/cuda/target.hpp"
#include "common/cuda/tile_width.hpp"
#include "common/problem.hpp"
#include "common/registry.hpp"

namespace flashlab::decoding {

enum class SplitKvDType { f16, bf16 };

constexpr int kSplitKvMaxRows = 16;     // query rows of one block: decode and speculative decode
constexpr int kSplitKvMaxSplits = 128;  // the most KV splits the launcher takes
constexpr int kMinKeysPerSplit = 256;   // the heuristic's floor: 8 tiles a split, so start-up stays small

struct SplitKvParams {
  SplitKvDType dtype = SplitKvDType::bf16;
  // Device pointers of `dtype`, head_dim contiguous, 16-byte aligned, strides multiples of 8 elements.
  //  q, o: BSHD [batch, seqlen_q, heads_q, head_dim].
  //  k, v: contiguous BSHD [batch, seqlen_k, heads_kv, head_dim], or, with a block table, page pools
  //        [num_pages, page_size, heads_kv, head_dim].
  // lse: float [batch, heads_q, seqlen_q], natural log; -inf for a row that sees no key.
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  int batch = 1;
  int heads_q = 1;
  int heads_kv = 1;  // GQA/MQA: query head h reads kv head h / (heads_q / heads_kv)
  int seqlen_q = 1;  // 1 to 16
  int seqlen_k = 0;  // the longest KV length (and the column count of `mask`)
  int head_dim = 128;
  // Strides in elements. Contiguous K/V use *_stride_batch; paged K/V use *_stride_page instead (the step
  // from one page of the pool to the next; a packed pool has page_size * heads_kv * head_dim).
  int64_t q_stride_batch = 0, q_stride_seq = 0, q_stride_head = 0;
  int64_t k_stride_batch = 0, k_stride_seq = 0, k_stride_head = 0;
  int64_t v_stride_batch = 0, v_stride_seq = 0, v_stride_head = 0;
  int64_t o_stride_batch = 0, o_stride_seq = 0, o_stride_head = 0;
  int64_t k_stride_page = 0, v_stride_page = 0;
  float scale = 0.0f;   // softmax scale (> 0), usually 1/sqrt(head_dim)
  bool causal = false;  // bottom-right aligned against each batch element's KV length
  int window_left = -1;
  int window_right = -1;
  // Per-batch KV lengths (device int [batch], each in [0, seqlen_k]), or null for seqlen_k everywhere.
  const int* seqlens_k = nullptr;
  // Paged KV cache: device int32 [batch, block_table_stride]; token j of batch b lives in row j % page_size
  // of page block_table[b * block_table_stride + j / page_size]. Null for contiguous K/V.
  const int* block_table = nullptr;
  int block_table_stride = 0;  // pages per sequence in the table, >= ceil(seqlen_k / page_size)
  int page_size = 0;           // a power of two >= 8
  // Explicit mask, device uint8 [seqlen_q, seqlen_k] (1 = visible), shared by every batch and head; or null.
  const uint8_t* mask = nullptr;
  // Number of KV splits: 0 picks it from the SM count, batch, heads and KV length (cuda_split_kv_num_splits).
  int num_splits = 0;
  // The split kernel: S and P V on the CUDA cores (split_kv_kernel, decoding/cuda_split_kv), or with the
  // block's 16 query rows on the tensor cores (split_kv_mma_kernel, decoding/cuda_split_kv_mma).
  bool tensor_cores = false;
  // The combine: each split merged in turn (combine_kernel, the course's exercise), or in two passes, the
  // row's LSE first and then every split's O weighted (combine_two_pass_kernel,
  // decoding/cuda_split_kv_mma_two_pass).
  bool two_pass_combine = false;
  // Device workspace for the partials (O_j and LSE_j, float), cuda_split_kv_workspace_bytes() bytes, 16-byte
  // aligned. Unused (may be null) when the resolved num_splits is 1.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Fills the strides of packed BSHD tensors (and packed page pools when page_size > 0) from the sizes.
void set_packed_strides(SplitKvParams& params);

// A problem's parameters: dtype (bf16, or f16 for any other), sizes, packed contiguous strides, scale, causal
// and window, the heuristic's split count, the split kernel. The pointers (tensors, lengths, mask,
// workspace) and the paged cache are the caller's to set.
SplitKvParams split_kv_params(const Problem& problem, bool tensor_cores = false);

// Why the launcher cannot run these parameters (naming the field), or null when it can.
const char* cuda_split_kv_unsupported(const SplitKvParams& params);

// The kernels' compiled head-dim tile widths: a head dim runs in the narrower that holds it.
inline constexpr int kSplitKvTileWidths[] = {64, 128};
constexpr int split_kv_tile_width(int64_t head_dim) {
  return cuda::tile_width(head_dim, kSplitKvTileWidths);
}

// Row tiles of kSplitKvMaxRows per kv head: a GQA group's heads times the query positions.
inline int split_kv_row_tiles(const SplitKvParams& p) {
  return (p.heads_q / p.heads_kv * p.seqlen_q + kSplitKvMaxRows - 1) / kSplitKvMaxRows;
}

// Each build of the kernels (common/cuda/target.hpp: the GPU's and the emulator's) has:
FLASHLAB_FOR_EACH_TARGET(
    // The number of splits the launcher will use: params.num_splits when > 0, else the heuristic for the
    // build's device (decoding/CUDA.md "The split heuristic").
    int cuda_split_kv_num_splits(const SplitKvParams& params);
    // Bytes of workspace the launcher needs for these parameters (0 when it runs unsplit).
    size_t cuda_split_kv_workspace_bytes(const SplitKvParams& params);
    // Launches the split kernel and, when split, the combine kernel on `stream`. Throws flashlab::Error
    // naming the field for unsupported or invalid parameters, and on any CUDA failure.
    void cuda_split_kv_forward(const SplitKvParams& params, cudaStream_t stream);

    // The registry entry's side (cuda_split_kv.cpp): the scratch its launcher needs (the partials O_j, LSE_j
    // at the split count the heuristic picks on the build's device, then the int copies of the per-batch
    // lengths); the partials' element count (0 when unsplit); and the launcher on the registry's device
    // tensors, contiguous or paged K/V, enqueued on the default stream.
    size_t cuda_split_kv_registry_workspace_bytes(const Problem& problem);
    int64_t cuda_split_kv_partial_elements(const Problem& problem);
    void launch_cuda_split_kv(const Problem& problem, const DeviceTensors& tensors);
    // The same for decoding/cuda_split_kv_mma (tensor_cores), whose workspace and partials
    // decoding/cuda_split_kv_mma_two_pass shares (its launcher: the combine in two passes).
    size_t cuda_split_kv_mma_registry_workspace_bytes(const Problem& problem);
    int64_t cuda_split_kv_mma_partial_elements(const Problem& problem);
    void launch_cuda_split_kv_mma(const Problem& problem, const DeviceTensors& tensors);
    void launch_cuda_split_kv_mma_two_pass(const Problem& problem, const DeviceTensors& tensors);)

}  // namespace flashlab::decoding
