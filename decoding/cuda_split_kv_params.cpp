// decoding/cuda_split_kv's host-side parameters and checks: ordinary C++, compiled once (the launcher and
// the kernels are in cuda_split_kv.cu and cuda_split_kv.cuh, built for the GPU and for the emulator).
#include <cstdint>

#include "decoding/cuda_split_kv.hpp"

namespace flashlab::decoding {

namespace {

bool aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

}  // namespace

SplitKvParams split_kv_params(const Problem& problem, bool tensor_cores) {
  SplitKvParams params;
  params.tensor_cores = tensor_cores;
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
  if (split_kv_tile_width(p.head_dim) == 0) return "head_dim must be a multiple of 8 up to 128";
  if (p.batch < 1 || p.batch > 65535) return "batch must be in [1, 65535]";
  if (p.heads_q < 1 || p.heads_kv < 1) return "heads_q and heads_kv must be >= 1";
  if (p.heads_q % p.heads_kv != 0) return "heads_q must be a multiple of heads_kv";
  if (static_cast<int64_t>(p.heads_kv) * split_kv_row_tiles(p) > 65535)
    return "heads_kv x row tiles must be <= 65535";
  if (p.seqlen_q < 1 || p.seqlen_q > 16) return "seqlen_q must be in [1, 16] (decoding)";
  if (p.seqlen_k < 0) return "seqlen_k must be >= 0";
  if (!(p.scale > 0.0f)) return "scale must be > 0";
  if (p.window_left < -1 || p.window_right < -1) return "window_left and window_right must be >= -1";
  if (p.num_splits < 0 || p.num_splits > kSplitKvMaxSplits)
    return "num_splits must be in [0, 128] (0 = heuristic)";
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

}  // namespace flashlab::decoding
