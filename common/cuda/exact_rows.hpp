// The GPU forwards' exact path for special values (docs/08-backward.md, "NaN and Inf"): the parameters of
// exact_rows.cuh's pass, and the bytes it reads when every row of O is finite. Plain C++, for the stages'
// traffic models.
//
// The pass runs after the forward's kernel on the same stream, in one of two modes:
//  - flagged (the full kernels: cuda_v2/split_q, cuda_v3_hopper/ws): the kernel's epilogue raises a flag in
//    device memory when it writes a NaN or an Inf (note_special_rows, exact_rows.cuh), and the pass reads the
//    flag and exits at once when it is down: on finite inputs it costs one launch and one word per block, and
//    nothing waits on the host;
//  - scanning (flag null: the cores, whose kernels stay as the papers write them): the pass reads O and
//    repairs the rows that hold a special value.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dropout.hpp"
#include "common/problem.hpp"
#include "common/score_mod.hpp"

namespace flashlab::cuda {

// One forward's tensors as the pass reads them: Q, K, V of `element` (float, __half or __nv_bfloat16), O
// rewritten where it holds a NaN or Inf, the LSE the forward wrote; strides in elements; the masks of the
// forward (lengths narrowed to int on the device, or null; an explicit [seqlen_q, seqlen_k] mask, or null).
struct ExactRowsParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  const float* lse = nullptr;  // [batch, heads_q, seqlen_q], packed [heads_q, total_q]
  int batch = 1, heads_q = 1, heads_kv = 1, seqlen_q = 1, seqlen_k = 0, head_dim = 64;
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  float softmax_scale = 0.0f;
  bool causal = false;
  int window_left = -1, window_right = -1;
  const int* seqlens_q = nullptr;
  const int* seqlens_k = nullptr;
  const int* cu_seqlens_q = nullptr;  // packed batches (common/cuda/sequences.hpp), or null
  const int* cu_seqlens_k = nullptr;
  int total_q = 0;
  const uint8_t* mask = nullptr;
  ScoreModParams mod;     // soft-capping, ALiBi, a bias (device pointers), when the forward applies them
  DropoutParams dropout;  // and dropout
  // The forward's flag (flagged mode), or null (scanning mode: every row of O is read).
  const unsigned* special_rows = nullptr;
};

// A forward's parameters (cuda_v2's SplitQParams, cuda_v3_hopper's HopperParams: the same field names) as the
// pass reads them.
template <typename Params>
ExactRowsParams exact_rows_params(const Params& p) {
  ExactRowsParams e;
  e.q = p.q;
  e.k = p.k;
  e.v = p.v;
  e.o = p.o;
  e.lse = p.lse;
  e.batch = p.batch;
  e.heads_q = p.heads_q;
  e.heads_kv = p.heads_kv;
  e.seqlen_q = p.seqlen_q;
  e.seqlen_k = p.seqlen_k;
  e.head_dim = p.head_dim;
  e.q_batch_stride = p.q_batch_stride;
  e.q_row_stride = p.q_row_stride;
  e.q_head_stride = p.q_head_stride;
  e.k_batch_stride = p.k_batch_stride;
  e.k_row_stride = p.k_row_stride;
  e.k_head_stride = p.k_head_stride;
  e.v_batch_stride = p.v_batch_stride;
  e.v_row_stride = p.v_row_stride;
  e.v_head_stride = p.v_head_stride;
  e.o_batch_stride = p.o_batch_stride;
  e.o_row_stride = p.o_row_stride;
  e.o_head_stride = p.o_head_stride;
  e.softmax_scale = p.softmax_scale;
  e.causal = p.causal;
  e.window_left = p.window_left;
  e.window_right = p.window_right;
  e.seqlens_q = p.seqlens_q;
  e.seqlens_k = p.seqlens_k;
  if constexpr (requires { p.cu_seqlens_q; }) {  // cuda_v3_hopper/ws takes no packed batches
    e.cu_seqlens_q = p.cu_seqlens_q;
    e.cu_seqlens_k = p.cu_seqlens_k;
    e.total_q = p.total_q;
  }
  if constexpr (requires { p.mask; }) e.mask = p.mask;           // nor an explicit mask
  if constexpr (requires { p.mod; }) e.mod = p.mod;              // nor score modifications
  if constexpr (requires { p.dropout; }) e.dropout = p.dropout;  // nor dropout
  e.special_rows = p.special_rows;
  return e;
}

// The pass's thread blocks (4 warps, a row of O a warp at a time).
inline constexpr int kExactRowsBlocks = 128;

// What the pass reads when every row is finite: in scanning mode each element of O once; flagged, the flag
// once per block.
inline double exact_rows_scan_bytes(const Problem& p, double element_bytes) {
  return static_cast<double>(p.q_elements()) * element_bytes;
}
inline double exact_rows_flag_bytes() {
  return kExactRowsBlocks * 4.0;
}

// The flag's bytes in a launch's workspace (after the int lengths, common/cuda/int_lengths.hpp): a multiple
// of 16, so that what follows stays aligned.
inline constexpr size_t kSpecialRowsFlagBytes = 16;

}  // namespace flashlab::cuda
