// The attention problem: shapes, scale, masks and dtype, with validate() that names the field and rule
// broken.
//
// Layout (docs/conventions.md §1): row-major BSHD. Q and O are [batch, seqlen_q, heads_q, head_dim], K and V
// are [batch, seqlen_k, heads_kv, head_dim], LSE is [batch, heads_q, seqlen_q] (natural log).
//
// Packed variable-length batches (FlashAttention's varlen form, cu_seqlens_q/k set): the sequences lie one
// after another with no padding, Q and O [total_q, heads_q, head_dim], K and V [total_k, heads_kv, head_dim],
// LSE [heads_q, total_q]; sequence b holds tokens [cu_seqlens[b], cu_seqlens[b + 1]). seqlen_q and seqlen_k
// are then the longest sequences (the extent of an explicit mask or bias). Code reaches elements through
// q_offset, kv_offset and lse_offset and visits rows [0, stored_rows_q(b)), which covers both layouts.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashlab {

// Number formats an implementation computes in. Host tensors are always float32; an implementation running in
// a narrower format rounds its inputs (see number_format.hpp) and its outputs hold values of that format.
enum class DType { f32, f16, bf16, e4m3 };

std::string_view to_string(DType dtype);
DType parse_dtype(std::string_view text);  // throws Error naming "dtype"

struct Problem {
  int64_t batch = 1;
  int64_t heads_q = 1;
  int64_t heads_kv = 1;
  int64_t seqlen_q = 1;
  int64_t seqlen_k = 1;
  int64_t head_dim = 64;
  std::optional<double> scale;  // softmax scale; 1/sqrt(head_dim) when unset
  bool causal = false;          // bottom-right aligned: row i sees key j iff j <= i + (sk - sq)
  int64_t window_left = -1;     // sliding window; -1 = unbounded on that side
  int64_t window_right = -1;
  std::vector<int64_t> seqlens_q;  // per-batch valid lengths (padding); empty = all seqlen_q
  std::vector<int64_t> seqlens_k;  // empty = all seqlen_k
  // Packed variable-length batches: cumulative lengths [batch + 1], from 0 to the token count (empty = the
  // padded layout). Given together, and never with seqlens_q/k.
  std::vector<int64_t> cu_seqlens_q;
  std::vector<int64_t> cu_seqlens_k;
  // Explicit boolean mask [seqlen_q, seqlen_k], 1 = visible, shared by every batch element and head.
  std::shared_ptr<const std::vector<uint8_t>> mask;
  int64_t page_size = 0;  // > 0: K/V are stored in pages of this many tokens (decoding stages)
  // Score modifications (common/score_mod.hpp): logit soft-capping s -> softcap * tanh(s / softcap) after the
  // scale (0 = off), and ALiBi's per-query-head slopes (empty = off).
  double softcap = 0.0;
  std::vector<float> alibi_slopes;
  // An additive score bias (common/score_mod.hpp), broadcast over batch and heads: [bias_batch, bias_heads,
  // seqlen_q, seqlen_k] with bias_batch 1 or batch and bias_heads 1 or heads_q; null = none. -inf entries
  // hide their (row, key) like a mask.
  std::shared_ptr<const std::vector<float>> bias;
  int64_t bias_batch = 1, bias_heads = 1;
  // Dropout on the attention weights (common/dropout.hpp): probability p in [0, 1) (0 = off) and the seed of
  // its counter-based generator.
  double dropout_p = 0.0;
  uint64_t dropout_seed = 0;
  DType dtype = DType::f32;

  // Throws Error naming the first field that breaks a rule.
  void validate() const;

  double softmax_scale() const;
  int64_t group_size() const { return heads_q / heads_kv; }  // query heads per kv head (GQA)
  int64_t kv_head(int64_t head_q) const { return head_q / group_size(); }
  // Packed when cu_seqlens_q is given; validate() requires cu_seqlens_k with it. The K-side accessors below
  // test cu_seqlens_k itself, so that nothing reads past it before validate() has run.
  bool packed() const { return !cu_seqlens_q.empty(); }
  // Batch element b's real lengths (its query rows and keys).
  int64_t rows_q(int64_t b) const {
    if (packed()) return cu_seqlens_q[b + 1] - cu_seqlens_q[b];
    return seqlens_q.empty() ? seqlen_q : seqlens_q[b];
  }
  int64_t rows_k(int64_t b) const {
    if (!cu_seqlens_k.empty()) return cu_seqlens_k[b + 1] - cu_seqlens_k[b];
    return seqlens_k.empty() ? seqlen_k : seqlens_k[b];
  }
  // The rows of batch element b that Q/O (K/V) hold: every seqlen_q (seqlen_k) in the padded layout, the real
  // ones packed. Stages write O and LSE for exactly these rows and read no key past them.
  int64_t stored_rows_q(int64_t b) const { return packed() ? rows_q(b) : seqlen_q; }
  int64_t stored_rows_k(int64_t b) const { return cu_seqlens_k.empty() ? seqlen_k : rows_k(b); }

  // Tokens in Q and O (K and V): batch * seqlen, or the packed total.
  int64_t tokens_q() const { return packed() ? cu_seqlens_q.back() : batch * seqlen_q; }
  int64_t tokens_k() const { return cu_seqlens_k.empty() ? batch * seqlen_k : cu_seqlens_k.back(); }
  // The token of row i (key j) of batch element b: the first index of Q/O (K/V) in either layout.
  int64_t q_token(int64_t b, int64_t i) const { return (packed() ? cu_seqlens_q[b] : b * seqlen_q) + i; }
  int64_t k_token(int64_t b, int64_t j) const {
    return (cu_seqlens_k.empty() ? b * seqlen_k : cu_seqlens_k[b]) + j;
  }
  // Offsets of element (b, i, h, 0) of Q/O, (b, j, hk, 0) of K/V, and of LSE (b, h, i).
  int64_t q_offset(int64_t b, int64_t i, int64_t h) const { return (q_token(b, i) * heads_q + h) * head_dim; }
  int64_t kv_offset(int64_t b, int64_t j, int64_t hk) const {
    return (k_token(b, j) * heads_kv + hk) * head_dim;
  }
  int64_t lse_offset(int64_t b, int64_t h, int64_t i) const {
    return packed() ? h * tokens_q() + q_token(b, i) : (b * heads_q + h) * seqlen_q + i;
  }

  int64_t q_elements() const { return tokens_q() * heads_q * head_dim; }
  int64_t kv_elements() const { return tokens_k() * heads_kv * head_dim; }
  int64_t lse_elements() const { return heads_q * tokens_q(); }
  // The tensors' shapes in this problem's layout.
  std::vector<int64_t> q_shape() const;
  std::vector<int64_t> kv_shape() const;
  std::vector<int64_t> lse_shape() const;

  // One line, e.g. "b=1 h=8/8 sq=1024 sk=1024 d=64 causal f32".
  std::string describe() const;
};

// Parses "3,5,0" into lengths; throws Error naming `field`.
std::vector<int64_t> parse_lengths(std::string_view text, std::string_view field);
// Parses "0.5,0.25" into finite numbers; throws Error naming `field`.
std::vector<double> parse_numbers(std::string_view text, std::string_view field);

// A problem of these sizes, every other field at its default (no mask, the default scale): where test cases
// and benchmark shapes start.
inline Problem problem_shape(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seqlen_q,
                             int64_t seqlen_k, int64_t head_dim, DType dtype = DType::f32) {
  Problem p;
  p.batch = batch;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.head_dim = head_dim;
  p.dtype = dtype;
  return p;
}

}  // namespace flashlab
