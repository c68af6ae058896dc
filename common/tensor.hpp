// Host tensors in BSHD layout and the inputs/outputs every implementation takes.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "common/problem.hpp"

namespace flashlab {

// A dense row-major float32 tensor of rank 3 or 4 (BSHD for Q/K/V/O, [B, H, S] for LSE).
struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;

  HostTensor() = default;
  explicit HostTensor(std::vector<int64_t> dims, float fill = 0.0f) : shape(std::move(dims)) {
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    data.assign(static_cast<size_t>(count), fill);
  }
  int64_t size() const { return static_cast<int64_t>(data.size()); }
  float* ptr() { return data.data(); }
  const float* ptr() const { return data.data(); }
};

// Offset of element (b, s, h, 0) of a BSHD tensor with `heads` heads of `head_dim` each.
inline int64_t bshd_offset(int64_t b, int64_t s, int64_t h, int64_t seqlen, int64_t heads, int64_t head_dim) {
  return ((b * seqlen + s) * heads + h) * head_dim;
}

struct PagedKV;  // common/paged_kv.hpp

struct AttentionInputs {
  HostTensor q;  // [batch, seqlen_q, heads_q, head_dim]
  HostTensor k;  // [batch, seqlen_k, heads_kv, head_dim]
  HostTensor v;  // [batch, seqlen_k, heads_kv, head_dim]
  // The same K and V stored in pages, when problem.page_size > 0 (attach_paged_kv in paged_kv.hpp). Stages
  // that read pages read only these; the others keep using k and v. Made from k and v: edit those, then
  // re-attach.
  std::shared_ptr<const PagedKV> paged;

  const float* q_row(const Problem& p, int64_t b, int64_t i, int64_t h) const {
    return q.ptr() + bshd_offset(b, i, h, p.seqlen_q, p.heads_q, p.head_dim);
  }
  const float* k_row(const Problem& p, int64_t b, int64_t j, int64_t hk) const {
    return k.ptr() + bshd_offset(b, j, hk, p.seqlen_k, p.heads_kv, p.head_dim);
  }
  const float* v_row(const Problem& p, int64_t b, int64_t j, int64_t hk) const {
    return v.ptr() + bshd_offset(b, j, hk, p.seqlen_k, p.heads_kv, p.head_dim);
  }
};

struct AttentionOutputs {
  HostTensor o;    // [batch, seqlen_q, heads_q, head_dim]
  HostTensor lse;  // [batch, heads_q, seqlen_q], natural log; -inf for a fully masked row

  // Outputs of the right shapes, filled with NaN so that an element an implementation never writes fails the
  // check.
  static AttentionOutputs poisoned(const Problem& p) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    return {HostTensor({p.batch, p.seqlen_q, p.heads_q, p.head_dim}, nan),
            HostTensor({p.batch, p.heads_q, p.seqlen_q}, nan)};
  }
  float* o_row(const Problem& p, int64_t b, int64_t i, int64_t h) {
    return o.ptr() + bshd_offset(b, i, h, p.seqlen_q, p.heads_q, p.head_dim);
  }
  float& lse_at(const Problem& p, int64_t b, int64_t h, int64_t i) {
    return lse.data[static_cast<size_t>((b * p.heads_q + h) * p.seqlen_q + i)];
  }
};

// Gradients of a loss with respect to Q, K and V, in their layouts.
struct AttentionGradients {
  HostTensor dq;  // [batch, seqlen_q, heads_q, head_dim]
  HostTensor dk;  // [batch, seqlen_k, heads_kv, head_dim]
  HostTensor dv;  // [batch, seqlen_k, heads_kv, head_dim]

  static AttentionGradients poisoned(const Problem& p) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    return {HostTensor({p.batch, p.seqlen_q, p.heads_q, p.head_dim}, nan),
            HostTensor({p.batch, p.seqlen_k, p.heads_kv, p.head_dim}, nan),
            HostTensor({p.batch, p.seqlen_k, p.heads_kv, p.head_dim}, nan)};
  }
};

// Allocates zeroed inputs of the problem's shapes.
inline AttentionInputs empty_inputs(const Problem& p) {
  return {HostTensor({p.batch, p.seqlen_q, p.heads_q, p.head_dim}),
          HostTensor({p.batch, p.seqlen_k, p.heads_kv, p.head_dim}),
          HostTensor({p.batch, p.seqlen_k, p.heads_kv, p.head_dim}),
          nullptr};  // no paged copy until attach_paged_kv()
}

}  // namespace flashlab
