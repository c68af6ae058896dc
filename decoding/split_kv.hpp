// Flash-Decoding on the CPU (docs/07-decoding.md): the pieces decoding/split_kv and decoding/unified_max
// share.
//
//   plan_split        how many chunks the KV sequence of each batch element is cut into
//   KVReader          where token j's K and V are: the paged cache's block table, or the contiguous BSHD
//   tensors attend_keys       one work item: every query row and head of one batch element against one chunk
//   of keys,
//                     online softmax within the chunk (the shared SoftmaxState), all heads at once so that
//                     each K/V byte is read from memory once
//   split_kv_attention  the whole of decoding/split_kv: partials (O_j, LSE_j) per chunk, then the LSE combine
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/mask.hpp"
#include "common/paged_kv.hpp"
#include "common/problem.hpp"
#include "common/softmax_state.hpp"
#include "common/tensor.hpp"

namespace flashlab::decoding {

constexpr int64_t kMaxQueryRows = 16;  // decoding stages take seqlen_q <= 16: one row, or a speculative draft
constexpr int64_t kBlockKeys = 32;     // Bc: keys scored, exponentiated and accumulated together
constexpr int64_t kMinChunkKeys = 512;  // a chunk must be long enough to amortize its partial (O_j, LSE_j)

// "" when a decoding stage can run the problem, else the reason naming the field.
std::string decode_supports(const Problem& p);

// The split of each batch element's keys [0, seqlen_k) into `chunks` chunks of `chunk_keys` keys (the last
// one shorter). Per-batch lengths shorter than seqlen_k leave trailing chunks empty: they merge with weight
// 0.
struct SplitPlan {
  int64_t chunks = 1;
  int64_t chunk_keys = 0;
};
// requested_chunks > 0 fixes the count (tests, the chunk-count study); 0 picks enough chunks that
// batch x chunks gives each of `threads` cores several work items, each at least kMinChunkKeys long.
SplitPlan plan_split(const Problem& p, int64_t requested_chunks, int threads);

// The chunk count from FLASHLAB_DECODE_CHUNKS (0 = automatic when unset): the knob for studying the split.
int64_t chunks_from_environment();

// Reads K and V rows from the inputs' paged cache when they carry one (only from there), else from the
// contiguous BSHD tensors.
class KVReader {
 public:
  KVReader(const Problem& p, const AttentionInputs& in) : p_(p), in_(in), paged_(in.paged.get()) {}

  // k_rows[t] and v_rows[t] = token j_begin + t of batch element b, kv head 0, for t < j_end - j_begin. The
  // block table is followed page by page: one division per call, not per token.
  void gather(int64_t b, int64_t j_begin, int64_t j_end, const float** k_rows, const float** v_rows) const {
    if (paged_ == nullptr) {
      for (int64_t j = j_begin; j < j_end; ++j) {
        k_rows[j - j_begin] = in_.k_row(p_, b, j, 0);
        v_rows[j - j_begin] = in_.v_row(p_, b, j, 0);
      }
      return;
    }
    const std::vector<int64_t>& table = paged_->block_table[b];
    int64_t page = j_begin / paged_->page_size, slot = j_begin % paged_->page_size;
    for (int64_t j = j_begin; j < j_end; ++j, ++slot) {
      if (slot == paged_->page_size) ++page, slot = 0;  // next logical page: look it up in the block table
      const int64_t offset = table[page] * paged_->page_elements() + slot * paged_->token_elements;
      k_rows[j - j_begin] = paged_->k_pages.data() + offset;
      v_rows[j - j_begin] = paged_->v_pages.data() + offset;
    }
  }

 private:
  const Problem& p_;
  const AttentionInputs& in_;
  const PagedKV* paged_;
};

// The query rows a work item handles: heads [head_begin, head_end) x rows [row_begin, row_end) of one batch
// element. Packed row r = (i - row_begin) * heads() + (h - head_begin): the query heads of a GQA group are
// neighbours and share every K/V row they read.
struct QueryRows {
  int64_t head_begin = 0, head_end = 0, row_begin = 0, row_end = 0;
  int64_t heads() const { return head_end - head_begin; }
  int64_t count() const { return heads() * (row_end - row_begin); }
  int64_t packed(int64_t i, int64_t h) const { return (i - row_begin) * heads() + (h - head_begin); }
};

// How a chunk's softmax treats the max.
enum class MaxPolicy {
  running,  // FA2 online softmax: the state's max grows block by block and acc is rescaled by exp(m_old -
            // m_new)
  unified,  // FlashDecoding++: the state's max stays at the shared phi it starts with; no rescaling. The
            // largest score of each row goes to seen_max, for the caller's range check.
};

// Scratch for attend_keys, reused across work items of one thread.
struct Workspace {
  std::vector<float> scores;  // S, then P, for one block: [rows][kBlockKeys]
  std::vector<const float*> k_rows, v_rows, next_k_rows, next_v_rows;
  std::vector<const float*> q;     // per packed row: its query vector
  std::vector<int64_t> kv_offset;  // per packed row: where its kv head starts in a token's K/V row
  void reserve(int64_t rows) {
    scores.resize(static_cast<size_t>(rows * kBlockKeys));
    q.resize(static_cast<size_t>(rows));
    kv_offset.resize(static_cast<size_t>(rows));
    for (auto* pointers : {&k_rows, &v_rows, &next_k_rows, &next_v_rows}) pointers->resize(kBlockKeys);
  }
};

// Sixteen floats: one AVX-512 register (two AVX2 ones). The dot product keeps 16 partial sums and reduces
// them once at the end; a scalar running sum would serialize on the add's latency.
typedef float Lanes __attribute__((vector_size(64)));
inline Lanes load_lanes(const float* from) {
  Lanes lanes;
  std::memcpy(&lanes, from, sizeof lanes);
  return lanes;
}
// The sum of the 16 lanes by a shuffle-and-add tree (4 steps, not 15 serial adds), all in registers: taking
// the accumulator's address instead (memcpy, an array) makes the compiler keep it in memory, and every FMA of
// the dot product then waits for a store and a reload.
inline float reduce_lanes(Lanes v) {
#if defined(__clang__)
  v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  v += __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
#else
  typedef int Indices __attribute__((vector_size(64)));
  v += __builtin_shuffle(v, Indices{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
  v += __builtin_shuffle(v, Indices{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
  v += __builtin_shuffle(v, Indices{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
  v += __builtin_shuffle(v, Indices{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
#endif
  return v[0];
}
inline float dot(const float* q, const float* k, int64_t d) {
  Lanes partial = {};
  int64_t c = 0;
  for (; c + 16 <= d; c += 16) partial += load_lanes(q + c) * load_lanes(k + c);
  float sum = reduce_lanes(partial);
  for (; c < d; ++c) sum += q[c] * k[c];
  return sum;
}

// Asks for the cache lines of token rows ahead of their use, a few at a time between pieces of arithmetic:
// one burst of requests (64 for a 4 KiB row: 8 kv heads x 128 dims) would fill the core's miss buffers and
// stall it, while spread out they overlap with the work. Software prefetch is needed because the hardware
// prefetcher stops at every 4 KiB memory page, here at every token. Into L2 (locality 2): L1 is too small for
// a block.
class Prefetch {
 public:
  // Rows rows[0..count), `floats` floats each from `offset`, asked for over `steps` calls of step().
  Prefetch(const float* const* rows, int64_t count, int64_t offset, int64_t floats, int64_t steps)
      : rows_(rows),
        count_(count),
        offset_(offset),
        lines_((floats + 15) / 16),
        per_step_((count * lines_ + steps - 1) / std::max<int64_t>(steps, 1)) {}
  void step() {
    for (int64_t n = 0; n < per_step_ && row_ < count_; ++n) {
      __builtin_prefetch(rows_[row_] + offset_ + 16 * line_, 0, 2);
      if (++line_ == lines_) line_ = 0, ++row_;
    }
  }

 private:
  const float* const* rows_;
  int64_t count_, offset_, lines_, per_step_;
  int64_t row_ = 0, line_ = 0;
};

// The keys [begin, end) of batch element b against `rows`, continuing each row's state (m, l) in states[r]
// and its unnormalized output in acc[r * head_dim ...]: FA2 Algorithm 1's inner loop over key blocks, lines
// 8-10, for every head of the batch element at once. Hidden keys (common/mask.hpp) take no part.
template <MaxPolicy policy>
void attend_keys(const Problem& p, const AttentionInputs& in, const KVReader& kv, int64_t b,
                 const QueryRows& rows, int64_t begin, int64_t end, SoftmaxState<float>* states, float* acc,
                 float* seen_max, Workspace& workspace) {
  const Visibility visibility(p);
  const int64_t d = p.head_dim, row_count = rows.count();
  const float scale = static_cast<float>(p.softmax_scale());
  workspace.reserve(row_count);
  float* S = workspace.scores.data();
  // The kv heads these rows read, [kv_first, kv_first + kv_count): what a token's prefetch must bring.
  const int64_t kv_first = p.kv_head(rows.head_begin), kv_count = p.kv_head(rows.head_end - 1) - kv_first + 1;
  // Per packed row, its query vector and its kv head's offset in a token row, looked up once: an integer
  // division per (key, head) would cost more than the key's arithmetic.
  for (int64_t i = rows.row_begin; i < rows.row_end; ++i)
    for (int64_t h = rows.head_begin; h < rows.head_end; ++h) {
      workspace.q[rows.packed(i, h)] = in.q_row(p, b, i, h);
      workspace.kv_offset[rows.packed(i, h)] = p.kv_head(h) * d;
    }
  const float* const* Q = workspace.q.data();
  const int64_t* kv_offset = workspace.kv_offset.data();
  // Each query row's visible band within [begin, end); the block loop covers their union.
  KeyRange band[kMaxQueryRows];
  int64_t lo = end, hi = begin;
  for (int64_t i = rows.row_begin; i < rows.row_end; ++i) {
    const KeyRange range = visibility.key_range(b, i);
    band[i - rows.row_begin] = {std::max(range.begin, begin), std::min(range.end, end)};
    if (!band[i - rows.row_begin].empty()) {
      lo = std::min(lo, band[i - rows.row_begin].begin);
      hi = std::max(hi, band[i - rows.row_begin].end);
    }
  }
  if (lo < hi)
    kv.gather(b, lo, std::min(lo + kBlockKeys, hi), workspace.next_k_rows.data(),
              workspace.next_v_rows.data());
  for (int64_t j0 = lo; j0 < hi; j0 += kBlockKeys) {
    const int64_t j1 = std::min(j0 + kBlockKeys, hi), n = j1 - j0;
    std::swap(workspace.k_rows, workspace.next_k_rows);
    std::swap(workspace.v_rows, workspace.next_v_rows);
    const float** K = workspace.k_rows.data();
    const float** V = workspace.v_rows.data();
    const int64_t next_n = std::min(j1 + kBlockKeys, hi) - j1;
    if (next_n > 0) kv.gather(b, j1, j1 + next_n, workspace.next_k_rows.data(), workspace.next_v_rows.data());
    // S = scale * Q K^T for the block (line 8), -inf where the key is hidden from the row. Token by token,
    // every head: one token's K for all kv heads is one contiguous row of memory. Meanwhile this block's V is
    // fetched.
    Prefetch v_ahead(V, n, kv_first * d, kv_count * d, n * row_count);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t j = j0 + t;
      for (int64_t i = rows.row_begin; i < rows.row_end; ++i) {
        const KeyRange& range = band[i - rows.row_begin];
        const bool visible = j >= range.begin && j < range.end && visibility.mask_allows(i, j);
        const int64_t first = rows.packed(i, rows.head_begin), last = first + rows.heads();
        for (int64_t r = first; r < last; ++r) {
          v_ahead.step();
          S[r * kBlockKeys + t] =
              visible ? dot(Q[r], K[t] + kv_offset[r], d) * scale : SoftmaxState<float>::neg_inf;
        }
      }
    }
    // P = exp(S - m) (line 9), in place of S, with the row's state.
    for (int64_t r = 0; r < row_count; ++r) {
      float* s = S + r * kBlockKeys;
      float block_max = SoftmaxState<float>::neg_inf;
      for (int64_t t = 0; t < n; ++t) block_max = std::max(block_max, s[t]);
      if constexpr (policy == MaxPolicy::running) {
        const float factor = states[r].raise_max(block_max);
        if (factor != 1.0f) {  // line 10: diag(exp(m_old - m_new)) O~, skipped once the max has settled
          float* o = acc + r * d;
          for (int64_t c = 0; c < d; ++c) o[c] *= factor;
        }
      } else {
        seen_max[r] = std::max(seen_max[r], block_max);
      }
      float block_sum = 0.0f;
      for (int64_t t = 0; t < n; ++t) {
        s[t] = states[r].weight(s[t]);
        block_sum += s[t];
      }
      states[r].add(block_sum);
    }
    // O~ += P V (line 10), token by token: each V row is read once for every head that uses it (the
    // accumulators, heads_q x seqlen_q x head_dim floats, stay in L1). Meanwhile the next block's K is
    // fetched.
    Prefetch k_ahead(workspace.next_k_rows.data(), next_n, kv_first * d, kv_count * d, n * row_count);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t r = 0; r < row_count; ++r) {
        k_ahead.step();
        const float weight = S[r * kBlockKeys + t];
        if (weight == 0.0f) continue;  // a hidden key takes no part: a NaN in its V must not leak in
        const float* v = V[t] + kv_offset[r];
        float* o = acc + r * d;
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) o[c] += weight * v[c];
      }
    }
  }
}

// decoding/split_kv: every (batch element, chunk) yields partials (O_j, LSE_j) for all its rows and heads;
// the combine merges them per row with combine_partials (common/softmax_state.hpp). requested_chunks as in
// plan_split.
void split_kv_attention(const Problem& p, const AttentionInputs& in, AttentionOutputs& out,
                        int64_t requested_chunks = 0);

// Bytes a decoding stage moves: K/V of the keys some row sees, read once; Q, O and LSE; the partials written
// and read back. Q, K, V and O are stored in `element_bytes` per element (4 on the CPU, 2 for the fp16/bf16
// kernel); LSE and the partials are float32.
double decode_bytes_moved(const Problem& p, int64_t partial_elements, double element_bytes = 4.0);

}  // namespace flashlab::decoding
