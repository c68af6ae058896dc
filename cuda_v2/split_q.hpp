// cuda_v2: FlashAttention-2 (split-Q) launchers, on device pointers. Plain C++: no CUDA header needed to
// include it, so host code (the registry adapter, the self-test) can describe a launch without nvcc.
//
// Two kernels, one schedule (FA2 Algorithm 1; see docs/04-cuda-v2.md):
//   split_q_simt  fp32 on CUDA cores: cuda_v1's arithmetic with only the FA2 schedule changed
//                 (grid over (q-block, head, batch), Q outer loop, warps split Q, deferred normalization).
//   split_q       fp16/bf16 in and out, fp32 accumulation, tensor cores (mma.sync m16n8k16 + ldmatrix),
//                 cp.async double-buffered K/V tiles, causal/window/padding tiles skipped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/cuda/exact_rows.hpp"
#include "common/cuda/int_lengths.hpp"
#include "common/cuda/stream.hpp"
#include "common/cuda/target.hpp"
#include "common/cuda/tile_order.hpp"
#include "common/dropout.hpp"
#include "common/problem.hpp"
#include "common/registry.hpp"
#include "common/score_mod.hpp"

namespace flashlab::cuda_v2 {

// The kernels' tiles: query rows per block and keys per K/V tile. The kernels are built from these
// (split_q.cu, split_q_simt.cu) and the traffic models read them (split_q.cpp).
struct QueryKeyTile {
  int block_m, block_n;
};
// split_q's by head dim, or by the tile width it runs in (common/cuda/tile_width.hpp): the two agree. At the
// 64 width FlashAttention-2's 128 x 128, but 128 x 64 for the kernels with the variants (a score modification
// or dropout, SplitQParams::has_variants), whose registers do not fit beside 128 keys; at the 32 width 128 x
// 64 (the 128-key tile, measured at d 64 only, spills there where this does not).
constexpr QueryKeyTile split_q_tile(int head_dim, bool variants = false) {
  if (head_dim > 128) return {64, 32};
  if (head_dim > 64 || head_dim <= 32 || variants) return {128, 64};
  return {128, 128};
}
constexpr QueryKeyTile split_q_simt_tile() {
  return {32, 32};
}

// Everything a launch needs. Pointers are device pointers. Strides are in elements, BSHD: the head dimension
// is contiguous (stride 1) and every other stride is given, so views into larger tensors work.
struct SplitQParams {
  // Element type of q, k, v and o: f32 for split_q_simt; f16 or bf16 for split_q.
  DType dtype = DType::f32;
  const void* q = nullptr;  // [batch, seqlen_q, heads_q, head_dim] (packed: [total_q, heads_q, head_dim])
  const void* k = nullptr;  // [batch, seqlen_k, heads_kv, head_dim]
  const void* v = nullptr;  // [batch, seqlen_k, heads_kv, head_dim]
  void* o = nullptr;        // [batch, seqlen_q, heads_q, head_dim]
  float* lse = nullptr;  // [batch, heads_q, seqlen_q] (packed: [heads_q, total_q]), natural log, contiguous;
                         // -inf for a fully masked row

  int batch = 1;
  int heads_q = 1;
  int heads_kv = 1;  // heads_q % heads_kv == 0 (GQA/MQA: query head h reads kv head h / (heads_q / heads_kv))
  int seqlen_q = 1;
  int seqlen_k = 0;
  int head_dim = 64;

  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;

  float softmax_scale = 0.0f;  // multiplies Q K^T (1/sqrt(head_dim) by default, set by the caller)
  bool causal = false;         // bottom-right aligned (common/mask.hpp)
  int window_left = -1;        // -1 = unbounded
  int window_right = -1;

  const int* seqlens_q =
      nullptr;  // device [batch] valid query rows per batch element, or null (all seqlen_q)
  const int* seqlens_k = nullptr;  // device [batch] valid keys per batch element, or null (all seqlen_k)
  // Packed variable-length batches (common/problem.hpp): device [batch + 1] cumulative lengths, or null (the
  // padded layout). Batch element b's rows are then the tokens [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of Q
  // and O, its keys those of K and V; the batch strides go unused; seqlen_q and seqlen_k are the longest.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  int total_q = 0;                // packed: the tokens of Q and O (the LSE is [heads_q, total_q])
  int total_k = 0;                // packed: the tokens of K and V
  const uint8_t* mask = nullptr;  // device [seqlen_q, seqlen_k], 1 = visible, shared by all (b, h); or null
  // Soft-capping, ALiBi and an additive bias (common/score_mod.hpp), device pointers; the tensor-core kernel
  // and its backward apply them, split_q_simt refuses them.
  ScoreModParams mod;
  DropoutParams dropout;  // dropout on P (common/dropout.hpp), the same; no pointers
  // Where split_q's epilogue notes that it wrote a NaN or an Inf, so that the exact pass after it repairs
  // those rows (common/cuda/exact_rows.hpp, flagged mode); null: the pass scans every row (split_q_simt).
  unsigned* special_rows = nullptr;
  // The grid: split_q's is (q-block, head, batch), FA2's. With `longest_first`
  // (cuda_v2/split_q_longest_first) it is
  // one-dimensional, block i computing tile i of `order` (common/cuda/tile_order.hpp: under a causal mask the
  // longest first, in L2 sections); the launcher sets both (split_q_longest_first_order).
  bool longest_first = false;
  cuda::TileOrder order;

  // Fills the strides for dense BSHD tensors of the sizes above (packed: the row and head strides).
  void set_dense_strides();

  // Batch element b in either layout (rows, stored rows, where its rows begin): common/cuda/sequences.hpp.
  // Whether the kernels with the variants run it (a score modification or dropout; docs/04 section 4.6).
  bool has_variants() const { return mod.active() || dropout.active(); }
};

// The rules of each launch, written once (split_q_params.cpp). A check throws flashlab::Error naming the
// field when a kernel cannot run the parameters: with Checks::problem the problem's rules (head_dim, sizes,
// grid extents, what the kernel takes; the dtype is the registry's, Implementation::dtypes), with
// Checks::launch those, the dtype and the device memory's (pointers, strides, alignment). Every launcher
// calls its check first; the registry asks the same check through refusal() before any device memory exists.
enum class Checks { problem, launch };
void check_split_q_simt(const SplitQParams& params, Checks checks = Checks::launch);
void check_split_q(const SplitQParams& params, Checks checks = Checks::launch);
void check_mma(const SplitQParams& params, Checks checks = Checks::launch);
void check_split_q_rung(const SplitQParams& params, Checks checks = Checks::launch);
void check_split_q_8warps(const SplitQParams& params, Checks checks = Checks::launch);
void check_split_q_bc64(const SplitQParams& params, Checks checks = Checks::launch);
void check_split_q_longest_first(const SplitQParams& params, Checks checks = Checks::launch);
using Check = void (*)(const SplitQParams&, Checks);

// An implementation's supports(): "" when `check` passes the problem's parameters, else its reason.
std::string refusal(Check check, const Problem& problem);

// A problem's launch parameters: dtype, sizes, dense BSHD strides, scale, causal, window and the variants
// (score modification and dropout; their tensors the problem's host arrays). The device pointers (tensors,
// lengths, mask, the variants' tensors) are the caller's to set.
SplitQParams split_q_params(const Problem& problem);

// split_q_longest_first's order of split_q's tiles (split_q_tile) for these parameters: sections of the
// (batch, head) pairs whose K and V fit cuda::kL2SectionBytes, or `section` pairs when it is given.
cuda::TileOrder split_q_longest_first_order(const SplitQParams& params, int section = 0);

// Scratch the registry launchers need: the int copies of the per-batch lengths, then split_q's flag of
// special values (common/cuda/exact_rows.hpp).
inline size_t workspace_bytes(const Problem& problem) {
  return cuda::int_lengths_bytes(problem) + cuda::kSpecialRowsFlagBytes;
}

// Each build of the kernels (common/cuda/target.hpp: the GPU's and the emulator's) has:
FLASHLAB_FOR_EACH_TARGET(
    // The forward pass enqueued on `stream` (asynchronous; launch errors are checked and thrown).
    void split_q_simt_forward(const SplitQParams& params, cudaStream_t stream);
    void split_q_forward(const SplitQParams& params, cudaStream_t stream);
    // split_q_params(problem) with the pointers of the registry's device tensors; the int64 per-batch
    // lengths are narrowed to int into tensors.workspace (workspace_bytes(problem) bytes), on the default
    // stream.
    SplitQParams split_q_params(const Problem& problem, const DeviceTensors& tensors);
    // The launchers of the registry entries cuda_v2/split_q_simt and cuda_v2/split_q
    // (common/cuda/gpu_stage.hpp): the problem on the registry's device tensors, on the default stream.
    void launch_split_q_simt(const Problem& problem, const DeviceTensors& tensors);
    void launch_split_q(const Problem& problem, const DeviceTensors& tensors);
    // The tensor-core ladder's rungs below split_q (docs/04-cuda-v2.md): mma.sync with plain shared-memory
    // loads (mma.cu), then split_q's kernel with ldmatrix and the swizzle, then with cp.async as well.
    void launch_mma(const Problem& problem, const DeviceTensors& tensors);
    void launch_mma_ldmatrix(const Problem& problem, const DeviceTensors& tensors);
    void launch_mma_cp_async(const Problem& problem, const DeviceTensors& tensors);
    // Beside the ladder: split_q with its earlier warp layout at the 128 tile width, 8 warps of one row
    // tile, as its variants keep (bf16).
    void launch_split_q_8warps(const Problem& problem, const DeviceTensors& tensors);
    // Beside the ladder: split_q with its earlier key tile at the 64 tile width, 64 keys a tile, as its
    // variants keep (bf16).
    void launch_split_q_bc64(const Problem& problem, const DeviceTensors& tensors);
    // Beside the ladder: split_q with its grid's tiles handed out longest first, in L2 sections; or in
    // sections of `section` (batch, head) pairs, so that a small problem has several.
    void launch_split_q_longest_first(const Problem& problem, const DeviceTensors& tensors);
    void launch_split_q_longest_first_sections(const Problem& problem, const DeviceTensors& tensors,
                                               int section);)

}  // namespace flashlab::cuda_v2
