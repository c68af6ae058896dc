// Host-side checks of a cuda_v2 launch: every rule a kernel relies on, written once and refused with the
// field's name, for the launchers (Checks::launch) and for the registry (refusal(), Checks::problem).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <utility>

#include "common/cuda/gpu_stage.hpp"
#include "common/cuda/tile_width.hpp"
#include "common/error.hpp"
#include "cuda_v2/backward.hpp"
#include "cuda_v2/block_mask.cuh"
#include "cuda_v2/split_q.hpp"

namespace flashlab::cuda_v2 {

SplitQParams split_q_params(const Problem& problem) {
  SplitQParams params;
  params.dtype = problem.dtype;
  params.batch = static_cast<int>(problem.batch);
  params.heads_q = static_cast<int>(problem.heads_q);
  params.heads_kv = static_cast<int>(problem.heads_kv);
  params.seqlen_q = static_cast<int>(problem.seqlen_q);
  params.seqlen_k = static_cast<int>(problem.seqlen_k);
  params.head_dim = static_cast<int>(problem.head_dim);
  params.total_q = static_cast<int>(problem.tokens_q());  // the LSE's head stride when packed
  params.total_k = static_cast<int>(problem.tokens_k());
  params.set_dense_strides();
  params.softmax_scale = static_cast<float>(problem.softmax_scale());
  params.causal = problem.causal;
  params.window_left = static_cast<int>(problem.window_left);
  params.window_right = static_cast<int>(problem.window_right);
  // The variants, so that has_variants() is the problem's; their pointers are the problem's host arrays
  // until a launcher puts the device copies in their place.
  params.mod = score_mod_params(problem);
  params.dropout = dropout_params(problem);
  return params;
}

void SplitQParams::set_dense_strides() {
  q_head_stride = o_head_stride = head_dim;
  k_head_stride = v_head_stride = head_dim;
  q_row_stride = o_row_stride = int64_t{heads_q} * head_dim;
  k_row_stride = v_row_stride = int64_t{heads_kv} * head_dim;
  q_batch_stride = o_batch_stride = int64_t{seqlen_q} * q_row_stride;
  k_batch_stride = v_batch_stride = int64_t{seqlen_k} * k_row_stride;
}

namespace {

// Whether Q and O (K and V) hold any token: packed, the total; padded, every batch element has seqlen_q >= 1
// rows and seqlen_k keys.
bool has_query_tokens(const SplitQParams& p) {
  return !p.cu_seqlens_q || p.total_q > 0;
}
bool has_key_tokens(const SplitQParams& p) {
  return p.cu_seqlens_k ? p.total_k > 0 : p.seqlen_k > 0;
}

// Rules every kernel shares. `vector_elements`: how many elements one vectorized load moves (16 bytes), so
// every row start must be a multiple of it and every pointer 16-byte aligned.
void check_common(const SplitQParams& p, int64_t vector_elements, Checks checks) {
  if (p.batch < 1) fail("batch (", p.batch, ") must be at least 1");
  if (p.heads_q < 1) fail("heads_q (", p.heads_q, ") must be at least 1");
  if (p.heads_kv < 1) fail("heads_kv (", p.heads_kv, ") must be at least 1");
  if (p.heads_q % p.heads_kv != 0)
    fail("heads_q (", p.heads_q, ") must be a multiple of heads_kv (", p.heads_kv, ")");
  // The grid is (q-blocks, heads_q, batch); CUDA limits its y and z extents to 65535.
  if (p.heads_q > 65535) fail("heads_q (", p.heads_q, ") must be at most 65535 for cuda_v2's grid");
  if (p.batch > 65535) fail("batch (", p.batch, ") must be at most 65535 for cuda_v2's grid");
  if (p.seqlen_q < 1) fail("seqlen_q (", p.seqlen_q, ") must be at least 1");
  if (p.seqlen_k < 0) fail("seqlen_k (", p.seqlen_k, ") must be at least 0");
  if (p.window_left < -1) fail("window_left (", p.window_left, ") must be -1 (unbounded) or >= 0");
  if (p.window_right < -1) fail("window_right (", p.window_right, ") must be -1 (unbounded) or >= 0");
  if (!(p.softmax_scale > 0.0f)) fail("softmax_scale (", p.softmax_scale, ") must be positive");
  if (checks == Checks::problem) return;  // the rest is about device memory
  // A tensor that holds no token may be null (packed sequences that are all empty; seqlen_k 0): the kernels
  // then read and write none of it.
  if (has_query_tokens(p)) {
    if (p.q == nullptr) fail("q must be a device pointer, not null");
    if (p.o == nullptr) fail("o must be a device pointer, not null");
    if (p.lse == nullptr) fail("lse must be a device pointer, not null");
  }
  if (has_key_tokens(p) && (p.k == nullptr || p.v == nullptr))
    fail("k and v must be device pointers, not null");

  const auto check_vector = [vector_elements](const char* field, int64_t stride) {
    if (stride % vector_elements != 0)
      fail(field, " (", stride, ") must be a multiple of ", vector_elements, " elements (16-byte loads)");
  };
  check_vector("q_batch_stride", p.q_batch_stride);
  check_vector("q_row_stride", p.q_row_stride);
  check_vector("q_head_stride", p.q_head_stride);
  check_vector("k_batch_stride", p.k_batch_stride);
  check_vector("k_row_stride", p.k_row_stride);
  check_vector("k_head_stride", p.k_head_stride);
  check_vector("v_batch_stride", p.v_batch_stride);
  check_vector("v_row_stride", p.v_row_stride);
  check_vector("v_head_stride", p.v_head_stride);
  check_vector("o_batch_stride", p.o_batch_stride);
  check_vector("o_row_stride", p.o_row_stride);
  check_vector("o_head_stride", p.o_head_stride);
  const auto check_aligned = [](const char* field, const void* pointer) {
    if (reinterpret_cast<uintptr_t>(pointer) % 16 != 0) fail(field, " must be 16-byte aligned");
  };
  check_aligned("q", p.q);
  check_aligned("k", p.k);
  check_aligned("v", p.v);
  check_aligned("o", p.o);
}

}  // namespace

std::string refusal(Check check, const Problem& p) {
  // SplitQParams holds sizes as int: what does not fit is refused before it is narrowed.
  if (std::string reason = int_lengths_and_positive_scale(p, "cuda_v2"); !reason.empty()) return reason;
  for (const auto& [field, value] : {std::pair<const char*, int64_t>{"batch", p.batch},
                                     {"heads_q", p.heads_q},
                                     {"heads_kv", p.heads_kv},
                                     {"head_dim", p.head_dim}})
    if (value > INT_MAX) return std::string(field) + " (" + std::to_string(value) + ") must fit an int";
  try {
    check(split_q_params(p), Checks::problem);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

void check_split_q_simt(const SplitQParams& p, Checks checks) {
  if (checks == Checks::launch && p.dtype != DType::f32)
    fail("dtype (", to_string(p.dtype), ") must be f32 for cuda_v2/split_q_simt");
  if (p.cu_seqlens_q || p.cu_seqlens_k)
    fail("cu_seqlens_q/k (packed variable-length batches) are not supported by cuda_v2/split_q_simt");
  if (p.head_dim != 32 && p.head_dim != 64 && p.head_dim != 96 && p.head_dim != 128 && p.head_dim != 256)
    fail("head_dim (", p.head_dim, ") must be 32, 64, 96, 128 or 256 for cuda_v2/split_q_simt");
  check_common(p, 4, checks);
}

void check_split_q(const SplitQParams& p, Checks checks) {
  if (checks == Checks::launch && p.dtype != DType::f16 && p.dtype != DType::bf16)
    fail("dtype (", to_string(p.dtype), ") must be f16 or bf16 for cuda_v2/split_q");
  if (cuda::tile_width(p.head_dim) == 0)
    fail("head_dim (", p.head_dim, ") must be a multiple of 8 up to 256 for cuda_v2/split_q");
  check_common(p, 8, checks);
}

void check_split_q_rung(const SplitQParams& p, Checks checks) {
  if (checks == Checks::launch && p.dtype != DType::f16 && p.dtype != DType::bf16)
    fail("dtype (", to_string(p.dtype), ") must be f16 or bf16 for cuda_v2's tensor-core rungs");
  if (p.head_dim != 64 && p.head_dim != 128)
    fail("head_dim (", p.head_dim, ") must be 64 or 128 for cuda_v2's tensor-core rungs");
  if (p.has_variants())
    fail("cuda_v2's tensor-core rungs take no score modification or dropout (split_q does)");
  check_common(p, 8, checks);
}

namespace {
// The entries beside the ladder built for one tile width of split_q's, in bf16, without the variants: the
// head dims that run in that width (common/cuda/tile_width.hpp), from the one past the narrower width.
void check_one_width(const SplitQParams& p, Checks checks, const char* name, int width) {
  if (checks == Checks::launch && p.dtype != DType::bf16)
    fail("dtype (", to_string(p.dtype), ") must be bf16 for ", name);
  if (cuda::tile_width(p.head_dim) != width) {
    int narrower = 0;
    for (int w : cuda::kTileWidths)
      if (w < width) narrower = w;
    fail("head_dim (", p.head_dim, ") must be a multiple of 8 from ", narrower + 8, " to ", width, " for ",
         name);
  }
  if (p.has_variants()) fail(name, " takes no score modification or dropout (split_q does)");
  check_common(p, 8, checks);
}
}  // namespace

void check_split_q_8warps(const SplitQParams& p, Checks checks) {
  check_one_width(p, checks, "cuda_v2/split_q_8warps", 128);
}

cuda::TileOrder split_q_longest_first_order(const SplitQParams& p, int section) {
  const int block_m = split_q_tile(p.head_dim).block_m;
  return cuda::in_sections_of(cuda::l2_sectioned_order((p.seqlen_q + block_m - 1) / block_m, p.heads_q,
                                                       p.batch, int64_t{4} * p.seqlen_k * p.head_dim),
                              section);
}

namespace {
// A grid numbered in split_q_longest_first_order: its blocks are numbered in an int (cuda::TileOrder), at
// most 2^31 - 1 of them.
void check_longest_first_grid(const SplitQParams& p, const char* name) {
  if (const cuda::TileOrder order = split_q_longest_first_order(p);
      !cuda::numbered_in_an_int(order.blocks, order.heads, order.batches))
    fail("batch x heads_q x query blocks (", int64_t{order.blocks} * order.heads * order.batches,
         ") must be at most ", INT_MAX, " for ", name, "'s grid");
}
}  // namespace

void check_split_q_longest_first(const SplitQParams& p, Checks checks) {
  check_split_q(p, checks);
  // Like the other entries beside the ladder, the plain kernel only: the order is the same with the variants.
  if (p.has_variants())
    fail("cuda_v2/split_q_longest_first takes no score modification or dropout (split_q does)");
  check_longest_first_grid(p, "cuda_v2/split_q_longest_first");
}

void check_split_q_bc64(const SplitQParams& p, Checks checks) {
  check_one_width(p, checks, "cuda_v2/split_q_bc64", 64);
}

void check_mma(const SplitQParams& p, Checks checks) {
  if (checks == Checks::launch && p.dtype != DType::f16)
    fail("dtype (", to_string(p.dtype), ") must be f16 for cuda_v2/mma");
  if (p.head_dim != 64 && p.head_dim != 128)
    fail("head_dim (", p.head_dim, ") must be 64 or 128 for cuda_v2/mma");
  if (p.cu_seqlens_q || p.cu_seqlens_k || p.mask || p.has_variants())
    fail(
        "cuda_v2/mma takes the plain case only: no packed batches, explicit mask, score modification or "
        "dropout");
  check_common(p, 8, checks);
}

namespace {

// The backward's rules: the forward's, and its own tiles and grid.
void check_backward(const SplitQParams& p, Checks checks) {
  check_split_q(p, checks);
  if (p.head_dim != 32 && p.head_dim != 64 && p.head_dim != 96 && p.head_dim != 128)
    fail("head_dim (", p.head_dim, ") must be 32, 64, 96 or 128 for the backward");
  if (p.heads_kv > 65535) fail("heads_kv (", p.heads_kv, ") must be at most 65535 for the backward's grid");
}

// The backward's tiles: 32 query rows a step over 64 keys a block, or over 128; or 64 rows over 128.
void check_tile(int block_m, int block_n) {
  if (block_n != kBackwardBlockN && block_n != kBackwardWideBlockN)
    fail("block_n (", block_n, ") must be ", kBackwardBlockN, " or ", kBackwardWideBlockN);
  if (block_m != kBackwardBlockM && !(block_m == kBackwardWideBlockM && block_n == kBackwardWideBlockN))
    fail("block_m (", block_m, ") must be ", kBackwardBlockM, ", or ", kBackwardWideBlockM, " with block_n ",
         kBackwardWideBlockN);
}

// With 128 keys a block (backward.cu's dispatch_wide), 32 or 64 rows a step: one kernel per head dim, the
// plain case. `entry` names the registered entry in the refusal.
void check_wide_backward(const char* entry, const SplitQParams& p, Checks checks) {
  if (checks == Checks::launch && p.dtype != DType::bf16)
    fail("dtype (", to_string(p.dtype), ") must be bf16 for ", entry, "'s backward");
  if (p.head_dim != 64 && p.head_dim != 128)
    fail("head_dim (", p.head_dim, ") must be 64 or 128 for ", entry, "'s backward");
  if (p.has_variants()) fail(entry, "'s backward takes no score modification or dropout (split_q's does)");
  check_backward(p, checks);
}
void check_bwd128_backward(const SplitQParams& p, Checks checks) {
  check_wide_backward("cuda_v2/split_q_bwd128", p, checks);
}
void check_bwd64x128_backward(const SplitQParams& p, Checks checks) {
  check_wide_backward("cuda_v2/split_q_bwd64x128", p, checks);
}

void check_bwd64x128_tiled_dq_backward(const SplitQParams& p, Checks checks) {
  check_wide_backward("cuda_v2/split_q_bwd64x128_tiled_dq", p, checks);
}

// The 64 x 128 kernel's key tiles in split_q_bwd_longest_first_order, numbered in an int; `entry` names the
// registered entry in the refusal.
void check_longest_first_backward(const char* entry, const SplitQParams& p, Checks checks) {
  check_wide_backward(entry, p, checks);
  if (const cuda::TileOrder order = split_q_bwd_longest_first_order(p);
      !cuda::numbered_in_an_int(order.blocks, order.heads, order.batches))
    fail("batch x heads_kv x key tiles (", int64_t{order.blocks} * order.heads * order.batches,
         ") must be at most ", INT_MAX, " for ", entry, "'s grid");
}
void check_bwd64x128_longest_first_backward(const SplitQParams& p, Checks checks) {
  check_longest_first_backward("cuda_v2/split_q_bwd64x128_longest_first", p, checks);
}
void check_bwd64x128_tiled_dq_longest_first_backward(const SplitQParams& p, Checks checks) {
  check_longest_first_backward("cuda_v2/split_q_bwd64x128_tiled_dq_longest_first", p, checks);
}

}  // namespace

cuda::TileOrder split_q_bwd_longest_first_order(const SplitQParams& f, int section) {
  // Each key tile of a (batch, kv head) pair reads the Q and dO rows of the group's query heads and adds to
  // their fp32 dQ accumulator: 2 + 2 + 4 bytes a row element, LSE and D aside.
  const int64_t group = f.heads_q / std::max(f.heads_kv, 1);
  return cuda::in_sections_of(
      cuda::l2_sectioned_order((f.seqlen_k + kBackwardWideBlockN - 1) / kBackwardWideBlockN, f.heads_kv,
                               f.batch, int64_t{8} * group * f.seqlen_q * f.head_dim),
      section);
}

std::string split_q_backward_supports(const Problem& p) {
  return refusal(check_backward, p);
}
std::string split_q_bwd128_backward_supports(const Problem& p) {
  return refusal(check_bwd128_backward, p);
}
std::string split_q_bwd64x128_backward_supports(const Problem& p) {
  return refusal(check_bwd64x128_backward, p);
}
std::string split_q_bwd64x128_longest_first_backward_supports(const Problem& p) {
  return refusal(check_bwd64x128_longest_first_backward, p);
}
std::string split_q_bwd64x128_tiled_dq_backward_supports(const Problem& p) {
  return refusal(check_bwd64x128_tiled_dq_backward, p);
}
std::string split_q_bwd64x128_tiled_dq_longest_first_backward_supports(const Problem& p) {
  return refusal(check_bwd64x128_tiled_dq_longest_first_backward, p);
}

BackwardTraffic backward_traffic(const Problem& problem, int block_n, int block_m, bool dq_tiled) {
  check_tile(block_m, block_n);
  const SplitQParams f = split_q_params(problem);  // no lengths, no mask: every row and key valid
  const double d = static_cast<double>(f.head_dim), element = 2, heads_q = f.heads_q;
  const double rows = f.seqlen_q;
  BackwardTraffic t;
  // dot_kernel: dO and O read, D written, dQ's accumulator zeroed; dq_kernel: the accumulator read, dQ
  // written.
  const int q_tiles = (f.seqlen_q + block_m - 1) / block_m;
  const double zeroed_rows = dq_tiled ? q_tiles * block_m : rows;  // in the fragments' order, whole tiles
  t.bytes += f.batch * heads_q * (rows * (2 * d * element + 4 + d * 4 + d * element) + zeroed_rows * d * 4);
  for (int b = 0; b < f.batch; ++b)
    for (int j = 0; j < backward_kv_tiles(problem, block_n); ++j) {
      const double keys = std::min(block_n, f.seqlen_k - j * block_n);
      t.bytes += f.heads_kv * keys * d * element * 4;  // K_j and V_j read, dK_j and dV_j written
      for (int i = 0; i < q_tiles; ++i) {
        const int row0 = i * block_m, row_end = row0 + block_m;
        const BlockMask block = block_n == kBackwardBlockN
                                    ? BlockMask::make<kBackwardBlockN>(f, b, row0, row_end)
                                    : BlockMask::make<kBackwardWideBlockN>(f, b, row0, row_end);
        if (j < block.tile_begin || j >= block.tile_end) continue;
        const double tile_rows = std::min(block_m, f.seqlen_q - i * block_m);
        t.bytes += heads_q * tile_rows * (2 * d * element + 2 * 4);  // Q_i, dO_i, LSE_i, D_i
        // dQ_i's share; in the fragments' order a whole tile's, past the rows' end too
        t.atomic_bytes += heads_q * (dq_tiled ? block_m : tile_rows) * d * 4;
      }
    }
  t.bytes +=
      4 + 4 * kExactBlocks * kExactThreads;  // the special-value flag lowered, then read by exact_kernel
  return t;
}

void check_split_q_backward(const SplitQBackwardParams& p) {
  check_tile(p.block_m, p.block_n);
  if (p.block_n == kBackwardWideBlockN && p.deterministic)
    fail("deterministic (true) takes block_n ", kBackwardBlockN, ", not ", p.block_n);
  if (p.longest_first && p.block_m != kBackwardWideBlockM)
    fail("longest_first (true) takes block_m ", kBackwardWideBlockM, ", not ", p.block_m);
  if (p.dq_tiled && p.block_m != kBackwardWideBlockM)
    fail("dq_tiled (true) takes block_m ", kBackwardWideBlockM, ", not ", p.block_m);
  if (p.longest_first) {  // the order first: it is the launcher's, the problem's device memory after it
    const cuda::TileOrder& o = p.order;
    if (o.blocks != (p.forward.seqlen_k + kBackwardWideBlockN - 1) / kBackwardWideBlockN ||
        o.heads != p.forward.heads_kv || o.batches != p.forward.batch || o.section < 1)
      fail("order (", o.blocks, " x ", o.heads, " x ", o.batches, " in sections of ", o.section,
           ") must number the key tiles x heads_kv x batch of the problem, in sections of at least 1");
    if (p.dq_tiled)
      check_bwd64x128_tiled_dq_longest_first_backward(p.forward, Checks::launch);
    else
      check_bwd64x128_longest_first_backward(p.forward, Checks::launch);
  } else if (p.dq_tiled)
    check_bwd64x128_tiled_dq_backward(p.forward, Checks::launch);
  else if (p.block_m == kBackwardWideBlockM)
    check_bwd64x128_backward(p.forward, Checks::launch);
  else if (p.block_n == kBackwardWideBlockN)
    check_bwd128_backward(p.forward, Checks::launch);
  else
    check_backward(p.forward, Checks::launch);
  for (const auto& [field, pointer] : {std::pair<const char*, const void*>{"d_sum", p.d_sum},
                                       {"dq_accum", p.dq_accum},
                                       {"nonfinite", p.nonfinite}})
    if (pointer == nullptr) fail(field, " must be a device pointer, not null");
  if (has_query_tokens(p.forward) && (p.d_out == nullptr || p.dq == nullptr))
    fail("d_out and dq must be device pointers, not null");
  if (has_key_tokens(p.forward) && (p.dk == nullptr || p.dv == nullptr))
    fail("dk and dv must be device pointers, not null");
  if (reinterpret_cast<uintptr_t>(p.d_out) % 16 != 0) fail("d_out must be 16-byte aligned");
  if (reinterpret_cast<uintptr_t>(p.dq_accum) % 8 != 0)
    fail("dq_accum must be 8-byte aligned: its adds are two floats wide or wider");
  if (p.dq_tiled && reinterpret_cast<uintptr_t>(p.dq_accum) % 16 != 0)
    fail("dq_accum must be 16-byte aligned with dq_tiled (true): its adds and zeroing are 16 bytes wide");
}

}  // namespace flashlab::cuda_v2
