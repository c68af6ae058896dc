// Batch element b of a GPU kernel's launch parameters, in either layout of common/problem.hpp: the padded
// one (batch strides, per-batch lengths seqlens_q/k) or packed variable-length batches (cumulative lengths
// cu_seqlens_q/k, the sequences one after another). One definition for every kernel that takes packed
// batches: cuda_v2's SplitQParams and exact_rows' ExactRowsParams (the same field names). Host and device.
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace flashlab::cuda {

// The real lengths of batch element b: its query rows and its keys.
template <class Params>
FLASHLAB_HOST_DEVICE inline int rows_q(const Params& p, int b) {
  if (p.cu_seqlens_q) return p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
  return p.seqlens_q ? p.seqlens_q[b] : p.seqlen_q;
}
template <class Params>
FLASHLAB_HOST_DEVICE inline int rows_k(const Params& p, int b) {
  if (p.cu_seqlens_k) return p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
  return p.seqlens_k ? p.seqlens_k[b] : p.seqlen_k;
}

// The rows Q and O (K and V) hold for batch element b: seqlen_q (seqlen_k) padded, its real length packed.
// Rows past them do not exist: a kernel writes nothing there and reads nothing there.
template <class Params>
FLASHLAB_HOST_DEVICE inline int stored_rows_q(const Params& p, int b) {
  return p.cu_seqlens_q ? rows_q(p, b) : p.seqlen_q;
}
template <class Params>
FLASHLAB_HOST_DEVICE inline int stored_rows_k(const Params& p, int b) {
  return p.cu_seqlens_k ? rows_k(p, b) : p.seqlen_k;
}

// Where batch element b's rows begin in a tensor with these strides (elements): b times the batch stride, or
// packed, its first token's row; and so in Q, O, K and V.
FLASHLAB_HOST_DEVICE inline int64_t rows_begin(const int* cu_seqlens, int b, int64_t row_stride,
                                               int64_t batch_stride) {
  return cu_seqlens ? cu_seqlens[b] * row_stride : b * batch_stride;
}
template <class Params>
FLASHLAB_HOST_DEVICE inline int64_t q_begin(const Params& p, int b) {
  return rows_begin(p.cu_seqlens_q, b, p.q_row_stride, p.q_batch_stride);
}
template <class Params>
FLASHLAB_HOST_DEVICE inline int64_t o_begin(const Params& p, int b) {
  return rows_begin(p.cu_seqlens_q, b, p.o_row_stride, p.o_batch_stride);
}
template <class Params>
FLASHLAB_HOST_DEVICE inline int64_t k_begin(const Params& p, int b) {
  return rows_begin(p.cu_seqlens_k, b, p.k_row_stride, p.k_batch_stride);
}
template <class Params>
FLASHLAB_HOST_DEVICE inline int64_t v_begin(const Params& p, int b) {
  return rows_begin(p.cu_seqlens_k, b, p.v_row_stride, p.v_batch_stride);
}

// Where the LSE row of (b, head) begins: [batch, heads_q, seqlen_q], or packed [heads_q, total_q].
template <class Params>
FLASHLAB_HOST_DEVICE inline int64_t lse_begin(const Params& p, int b, int head) {
  if (p.cu_seqlens_q) return static_cast<int64_t>(head) * p.total_q + p.cu_seqlens_q[b];
  return (static_cast<int64_t>(b) * p.heads_q + head) * p.seqlen_q;
}

// The tokens of Q and O: batch x seqlen_q, or packed total_q.
template <class Params>
FLASHLAB_HOST_DEVICE inline int64_t tokens_q(const Params& p) {
  return p.cu_seqlens_q ? p.total_q : static_cast<int64_t>(p.batch) * p.seqlen_q;
}

// Where token t of O begins (elements, before the head's offset), without finding its batch element.
template <class Params>
FLASHLAB_HOST_DEVICE inline int64_t o_token_begin(const Params& p, int64_t t) {
  if (p.cu_seqlens_q) return t * p.o_row_stride;
  return t / p.seqlen_q * p.o_batch_stride + t % p.seqlen_q * p.o_row_stride;
}

// Token t of Q and O (t < tokens_q) as batch element b and its row i. Packed, a binary search over the
// cumulative lengths for the last b with cu_seqlens_q[b] <= t (an empty sequence holds no token).
template <class Params>
FLASHLAB_HOST_DEVICE inline void token_position(const Params& p, int64_t t, int& b, int& i) {
  if (!p.cu_seqlens_q) {
    b = static_cast<int>(t / p.seqlen_q);
    i = static_cast<int>(t % p.seqlen_q);
    return;
  }
  int lo = 0, hi = p.batch;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (p.cu_seqlens_q[mid] <= t)
      lo = mid;
    else
      hi = mid;
  }
  b = lo;
  i = static_cast<int>(t - p.cu_seqlens_q[lo]);
}

}  // namespace flashlab::cuda
