// Host tensors in BSHD layout (or packed, common/problem.hpp) and the inputs/outputs every implementation
// takes. The accessors below are the one place that turns (batch, row, head) into an element.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "common/problem.hpp"

namespace flashlab {

// A dense row-major float32 tensor: BSHD for Q/K/V/O and [B, H, S] for LSE, or the packed shapes (Problem::
// q_shape and its siblings).
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

// Offset of element (b, s, h, 0) of a padded BSHD buffer with `heads` heads of `head_dim` each: for a stage's
// own copies laid out that way. The problem's tensors go through Problem::q_offset and kv_offset (packed
// too).
inline int64_t bshd_offset(int64_t b, int64_t s, int64_t h, int64_t seqlen, int64_t heads, int64_t head_dim) {
  return ((b * seqlen + s) * heads + h) * head_dim;
}

struct PagedKV;  // common/paged_kv.hpp

struct AttentionInputs {
  HostTensor
      q;  // Problem::q_shape(): [batch, seqlen_q, heads_q, head_dim], packed [total_q, heads_q, head_dim]
  HostTensor k;  // Problem::kv_shape()
  HostTensor v;  // Problem::kv_shape()
  // The same K and V stored in pages, when problem.page_size > 0 (attach_paged_kv in paged_kv.hpp). Stages
  // that read pages read only these; the others keep using k and v. Made from k and v: edit those, then
  // re-attach.
  std::shared_ptr<const PagedKV> paged;

  const float* q_row(const Problem& p, int64_t b, int64_t i, int64_t h) const {
    return q.ptr() + p.q_offset(b, i, h);
  }
  const float* k_row(const Problem& p, int64_t b, int64_t j, int64_t hk) const {
    return k.ptr() + p.kv_offset(b, j, hk);
  }
  const float* v_row(const Problem& p, int64_t b, int64_t j, int64_t hk) const {
    return v.ptr() + p.kv_offset(b, j, hk);
  }
};

struct AttentionOutputs {
  HostTensor o;  // Problem::q_shape()
  HostTensor
      lse;  // Problem::lse_shape(): [batch, heads_q, seqlen_q], natural log; -inf for a fully masked row

  // Outputs of the right shapes, filled with NaN so that an element an implementation never writes fails the
  // check.
  static AttentionOutputs poisoned(const Problem& p) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    return {HostTensor(p.q_shape(), nan), HostTensor(p.lse_shape(), nan)};
  }
  float* o_row(const Problem& p, int64_t b, int64_t i, int64_t h) { return o.ptr() + p.q_offset(b, i, h); }
  const float* o_row(const Problem& p, int64_t b, int64_t i, int64_t h) const {
    return o.ptr() + p.q_offset(b, i, h);
  }
  float& lse_at(const Problem& p, int64_t b, int64_t h, int64_t i) {
    return lse.data[static_cast<size_t>(p.lse_offset(b, h, i))];
  }
  float lse_at(const Problem& p, int64_t b, int64_t h, int64_t i) const {
    return lse.data[static_cast<size_t>(p.lse_offset(b, h, i))];
  }
};

// Gradients of a loss with respect to Q, K and V, in their layouts.
struct AttentionGradients {
  HostTensor dq;  // Problem::q_shape()
  HostTensor dk;  // Problem::kv_shape()
  HostTensor dv;  // Problem::kv_shape()

  static AttentionGradients poisoned(const Problem& p) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    return {HostTensor(p.q_shape(), nan), HostTensor(p.kv_shape(), nan), HostTensor(p.kv_shape(), nan)};
  }
};

// Allocates zeroed inputs of the problem's shapes.
inline AttentionInputs empty_inputs(const Problem& p) {
  return {HostTensor(p.q_shape()), HostTensor(p.kv_shape()), HostTensor(p.kv_shape()),
          nullptr};  // no paged copy until attach_paged_kv()
}

}  // namespace flashlab
