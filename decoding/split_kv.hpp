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
#include "cpu_tiled/simd.hpp"

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
  std::vector<const float*> q;  // per packed row: its query vector
  // The packed rows kv head by kv head: those of the g-th kv head the rows read are
  // by_head[head_begin[g] .. head_begin[g + 1]).
  std::vector<int64_t> by_head, head_begin;
  int64_t row_tiles = 0;  // sum over kv heads of ceil(rows / 4): the score and value tiles per key step

  void reserve(const QueryRows& rows, const Problem& p) {
    const int64_t count = rows.count();
    scores.resize(static_cast<size_t>(count * kBlockKeys));
    for (auto* pointers : {&k_rows, &v_rows, &next_k_rows, &next_v_rows}) pointers->resize(kBlockKeys);
    q.resize(static_cast<size_t>(count));
    by_head.clear();
    head_begin.clear();
    row_tiles = 0;
    const int64_t kv_first = p.kv_head(rows.head_begin), kv_last = p.kv_head(rows.head_end - 1);
    for (int64_t g = kv_first; g <= kv_last; ++g) {
      head_begin.push_back(static_cast<int64_t>(by_head.size()));
      for (int64_t i = rows.row_begin; i < rows.row_end; ++i)
        for (int64_t h = std::max(rows.head_begin, g * p.group_size());
             h < std::min(rows.head_end, (g + 1) * p.group_size()); ++h)
          by_head.push_back(rows.packed(i, h));
      row_tiles += (static_cast<int64_t>(by_head.size()) - head_begin.back() + 3) / 4;
    }
    head_begin.push_back(static_cast<int64_t>(by_head.size()));
  }
};

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

// Sixteen floats: one AVX-512 register (two AVX2 ones).
typedef float Lanes __attribute__((vector_size(64)));
inline Lanes load_lanes(const float* from) {
  Lanes lanes;
  std::memcpy(&lanes, from, sizeof lanes);
  return lanes;
}
inline void store_lanes(Lanes lanes, float* to) {
  std::memcpy(to, &lanes, sizeof lanes);
}

// Lanes I... of the 32 lanes of a and b side by side (I < 16 from a, I >= 16 from b[I - 16]).
template <int... I>
inline Lanes pick(Lanes a, Lanes b) {
#if defined(__clang__)
  return __builtin_shufflevector(a, b, I...);
#else
  typedef int Indices __attribute__((vector_size(64)));
  return __builtin_shuffle(a, b, Indices{I...});
#endif
}

// The sums of sixteen vectors at once: lane u of the result is the sum of the 16 lanes of v[u]. A tree of
// shuffles and adds that transposes as it reduces: each level adds the two halves of pairs of vectors and
// packs the pair into one vector, so the 16 sums cost 30 shuffles and 15 adds, where reducing each vector on
// its own would cost 64 of each.
inline Lanes sum_each(const Lanes* v) {
  Lanes halves[8], quarters[4], eighths[2];
  for (int n = 0; n < 8; ++n)  // [v(2n) 8 partial sums | v(2n+1) 8 partial sums]
    halves[n] = pick<0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23>(v[2 * n], v[2 * n + 1]) +
                pick<8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31>(v[2 * n], v[2 * n + 1]);
  for (int n = 0; n < 4; ++n)  // 4 partial sums each of v(4n) .. v(4n+3)
    quarters[n] =
        pick<0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27>(halves[2 * n], halves[2 * n + 1]) +
        pick<4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31>(halves[2 * n], halves[2 * n + 1]);
  for (int n = 0; n < 2; ++n)  // 2 partial sums each of v(8n) .. v(8n+7)
    eighths[n] =
        pick<0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29>(quarters[2 * n], quarters[2 * n + 1]) +
        pick<2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31>(quarters[2 * n],
                                                                         quarters[2 * n + 1]);
  return pick<0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30>(eighths[0], eighths[1]) +
         pick<1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31>(eighths[0], eighths[1]);
}

// The dot products of 4 query rows with 4 key rows (d floats each): scores[4 r + u] = q[r] . k[u]. Each
// step of 16 dims loads 4 key and 4 query vectors for 16 FMAs, the 16 partial-sum vectors stay in
// registers, and one sum_each reduces them all (docs/07-decoding.md, "The arithmetic of a block").
inline void score_tile(const float* const* q, const float* const* k, int64_t d, float* scores,
                       Prefetch& ahead) {
  Lanes acc[16] = {};
  int64_t c = 0;
  for (; c + 16 <= d; c += 16) {
    ahead.step();
    Lanes key[4];
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) key[u] = load_lanes(k[u] + c);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const Lanes query = load_lanes(q[r] + c);
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) acc[4 * r + u] += query * key[u];
    }
  }
  store_lanes(sum_each(acc), scores);
  for (; c < d; ++c)  // a head dim that is not a multiple of 16: the last dims one by one
    for (int r = 0; r < 4; ++r)
      for (int u = 0; u < 4; ++u) scores[4 * r + u] += q[r][c] * k[u][c];
}

// acc[r] += sum_t P[r][t] V[t] over dims [c, c + 16 NV) for NR rows that read the same kv head: the NR x NV
// accumulator vectors stay in registers over the block's keys, each V vector loaded once for the NR rows.
// P[r] points at row r's weights (n of them); v_rows[t] at token t's V for the kv head. A key whose weight is
// 0 for some row (hidden from it) is added row by row, skipping that row: 0 x NaN must not leak a hidden
// key's V into the output.
template <int NR, int NV>
void value_tile(const float* const* P, const float* const* v_rows, int64_t n, int64_t c, float* const* acc,
                Prefetch& ahead) {
  Lanes sum[NR][NV] = {};
  for (int64_t t = 0; t < n; ++t) {
    ahead.step();
    float weight[NR];
    bool all_visible = true;
    for (int r = 0; r < NR; ++r) weight[r] = P[r][t], all_visible = all_visible && weight[r] != 0.0f;
    Lanes value[NV];
    for (int v = 0; v < NV; ++v) value[v] = load_lanes(v_rows[t] + c + 16 * v);
    if (all_visible) {
      for (int r = 0; r < NR; ++r)
        for (int v = 0; v < NV; ++v) sum[r][v] += weight[r] * value[v];
    } else {
      for (int r = 0; r < NR; ++r)
        if (weight[r] != 0.0f)
          for (int v = 0; v < NV; ++v) sum[r][v] += weight[r] * value[v];
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < NV; ++v)
      store_lanes(load_lanes(acc[r] + c + 16 * v) + sum[r][v], acc[r] + c + 16 * v);
}

// value_tile for NR = 1..4 rows and NV = 1..4 vectors of dims.
template <int NR>
void value_tile_rows(int nv, const float* const* P, const float* const* v_rows, int64_t n, int64_t c,
                     float* const* acc, Prefetch& ahead) {
  switch (nv) {
    case 1:
      return value_tile<NR, 1>(P, v_rows, n, c, acc, ahead);
    case 2:
      return value_tile<NR, 2>(P, v_rows, n, c, acc, ahead);
    case 3:
      return value_tile<NR, 3>(P, v_rows, n, c, acc, ahead);
    default:
      return value_tile<NR, 4>(P, v_rows, n, c, acc, ahead);
  }
}
inline void add_values(int nr, int nv, const float* const* P, const float* const* v_rows, int64_t n,
                       int64_t c, float* const* acc, Prefetch& ahead) {
  switch (nr) {
    case 1:
      return value_tile_rows<1>(nv, P, v_rows, n, c, acc, ahead);
    case 2:
      return value_tile_rows<2>(nv, P, v_rows, n, c, acc, ahead);
    case 3:
      return value_tile_rows<3>(nv, P, v_rows, n, c, acc, ahead);
    default:
      return value_tile_rows<4>(nv, P, v_rows, n, c, acc, ahead);
  }
}

// The keys [begin, end) of batch element b against `rows`, continuing each row's state (m, l) in states[r]
// and its unnormalized output in acc[r * head_dim ...]: FA2 Algorithm 1's inner loop over key blocks, lines
// 8-10, for every head of the batch element at once. Hidden keys (common/mask.hpp) take no part.
//
// The rows are taken kv head by kv head, in fours (score_tile, value_tile): the query heads of a GQA group
// (and the draft rows of a speculative step) read the same K and V vectors, loaded once for up to four rows.
template <MaxPolicy policy>
void attend_keys(const Problem& p, const AttentionInputs& in, const KVReader& kv, int64_t b,
                 const QueryRows& rows, int64_t begin, int64_t end, SoftmaxState<float>* states, float* acc,
                 float* seen_max, Workspace& workspace) {
  using Vec = cpu_tiled::Vec;
  const Visibility visibility(p);
  const int64_t d = p.head_dim, row_count = rows.count();
  const float scale = static_cast<float>(p.softmax_scale());
  workspace.reserve(rows, p);
  for (int64_t i = rows.row_begin; i < rows.row_end; ++i)
    for (int64_t h = rows.head_begin; h < rows.head_end; ++h)
      workspace.q[rows.packed(i, h)] = in.q_row(p, b, i, h);
  float* S = workspace.scores.data();
  // The kv heads these rows read, [kv_first, kv_first + kv_count): what a token's prefetch must bring.
  const int64_t kv_first = p.kv_head(rows.head_begin), kv_count = p.kv_head(rows.head_end - 1) - kv_first + 1;
  const float* const* Q = workspace.q.data();
  const int64_t* by_head = workspace.by_head.data();  // packed rows, kv head by kv head
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
  const float* k_tile[4];
  const float* v_tile[kBlockKeys];
  const float* q_tile[4];
  const float* p_tile[4];
  float* acc_tile[4];
  float scores[16];
  for (int64_t j0 = lo; j0 < hi; j0 += kBlockKeys) {
    const int64_t j1 = std::min(j0 + kBlockKeys, hi), n = j1 - j0;
    std::swap(workspace.k_rows, workspace.next_k_rows);
    std::swap(workspace.v_rows, workspace.next_v_rows);
    const float** K = workspace.k_rows.data();
    const float** V = workspace.v_rows.data();
    const int64_t next_n = std::min(j1 + kBlockKeys, hi) - j1;
    if (next_n > 0) kv.gather(b, j1, j1 + next_n, workspace.next_k_rows.data(), workspace.next_v_rows.data());
    const int64_t row_tiles = workspace.row_tiles, key_tiles = (n + 3) / 4;
    // S = scale * Q K^T for the block (line 8), 4 rows x 4 keys at a time; meanwhile the next block's K is
    // fetched, a few lines per step of 16 dims.
    Prefetch k_ahead(workspace.next_k_rows.data(), next_n, kv_first * d, kv_count * d,
                     row_tiles * key_tiles * (d / 16));
    for (int64_t g = 0; g < kv_count; ++g) {
      const int64_t first = workspace.head_begin[g], last = workspace.head_begin[g + 1];
      const int64_t offset = (kv_first + g) * d;
      for (int64_t r0 = first; r0 < last; r0 += 4) {
        const int nr = static_cast<int>(std::min<int64_t>(4, last - r0));
        for (int r = 0; r < 4; ++r) q_tile[r] = Q[by_head[r0 + std::min(r, nr - 1)]];
        for (int64_t t0 = 0; t0 < n; t0 += 4) {
          const int nt = static_cast<int>(std::min<int64_t>(4, n - t0));
          for (int u = 0; u < 4; ++u) k_tile[u] = K[t0 + std::min(u, nt - 1)] + offset;
          score_tile(q_tile, k_tile, d, scores, k_ahead);
          for (int r = 0; r < nr; ++r)
            for (int u = 0; u < nt; ++u) S[by_head[r0 + r] * kBlockKeys + t0 + u] = scores[4 * r + u] * scale;
        }
      }
    }
    // -inf where a key is hidden from the row, and past the block's n keys (the vector steps below cover
    // all kBlockKeys).
    for (int64_t r = 0; r < row_count; ++r) {
      const int64_t i = rows.row_begin + r / rows.heads();
      const KeyRange& range = band[i - rows.row_begin];
      float* s = S + r * kBlockKeys;
      if (j0 < range.begin || j1 > range.end || visibility.has_explicit_mask())
        for (int64_t t = 0; t < n; ++t)
          if (j0 + t < range.begin || j0 + t >= range.end || !visibility.mask_allows(i, j0 + t))
            s[t] = SoftmaxState<float>::neg_inf;
      std::fill(s + n, s + kBlockKeys, SoftmaxState<float>::neg_inf);
    }
    // P = exp(S - m) (line 9), in place of S, with the row's state; the rowmax and exponentials in vectors.
    for (int64_t r = 0; r < row_count; ++r) {
      float* s = S + r * kBlockKeys;
      Vec lanes_max = Vec::splat(SoftmaxState<float>::neg_inf);
      for (int64_t t = 0; t < kBlockKeys; t += Vec::lanes)
        lanes_max = max_keep_nan(lanes_max, Vec::load(s + t));
      float lane[Vec::lanes];
      lanes_max.store(lane);
      float block_max = lane[0];
      for (int l = 1; l < Vec::lanes; ++l)
        block_max = lane[l] != lane[l] ? lane[l] : std::max(block_max, lane[l]);
      if constexpr (policy == MaxPolicy::running) {
        const float factor = states[r].raise_max(block_max);
        if (factor != 1.0f) {  // line 10: diag(exp(m_old - m_new)) O~, skipped once the max has settled
          float* o = acc + r * d;
          for (int64_t c = 0; c < d; ++c) o[c] *= factor;
        }
      } else {
        seen_max[r] = std::max(seen_max[r], block_max);
      }
      const Vec row_max = Vec::splat(states[r].row_max);
      Vec lanes_sum = Vec::zero();
      for (int64_t t = 0; t < kBlockKeys; t += Vec::lanes) {
        const Vec weight = Vec::exp_weight(Vec::load(s + t), row_max);
        weight.store(s + t);
        lanes_sum = lanes_sum + weight;
      }
      lanes_sum.store(lane);
      float block_sum = 0.0f;
      for (int l = 0; l < Vec::lanes; ++l) block_sum += lane[l];
      states[r].add(block_sum);
    }
    // O~ += P V (line 10), 4 rows x 64 dims at a time over the block's keys; meanwhile the next block's V is
    // fetched, a few lines per key.
    const int64_t full = d / 16 * 16;  // dims in whole vectors; the rest one by one
    Prefetch v_ahead(workspace.next_v_rows.data(), next_n, kv_first * d, kv_count * d,
                     row_tiles * ((full + 63) / 64) * n);
    for (int64_t g = 0; g < kv_count; ++g) {
      const int64_t first = workspace.head_begin[g], last = workspace.head_begin[g + 1];
      const int64_t offset = (kv_first + g) * d;
      for (int64_t t = 0; t < n; ++t) v_tile[t] = V[t] + offset;
      for (int64_t r0 = first; r0 < last; r0 += 4) {
        const int nr = static_cast<int>(std::min<int64_t>(4, last - r0));
        for (int r = 0; r < nr; ++r) {
          p_tile[r] = S + by_head[r0 + r] * kBlockKeys;
          acc_tile[r] = acc + by_head[r0 + r] * d;
        }
        for (int64_t c = 0; c < full; c += 64) {
          add_values(nr, static_cast<int>(std::min<int64_t>(4, (full - c) / 16)), p_tile, v_tile, n, c,
                     acc_tile, v_ahead);
        }
        for (int r = 0; r < nr; ++r)
          for (int64_t t = 0; t < n; ++t)
            if (p_tile[r][t] != 0.0f)  // a hidden key takes no part: a NaN in its V must not leak in
              for (int64_t c = full; c < d; ++c) acc_tile[r][c] += p_tile[r][t] * v_tile[t][c];
      }
    }
  }
}

// decoding/split_kv: every (batch element, chunk) yields partials (O_j, LSE_j) for all its rows and heads;
// the combine merges them per row with combine_partials (common/softmax_state.hpp). requested_chunks as in
// plan_split.
void split_kv_attention(const Problem& p, const AttentionInputs& in, AttentionOutputs& out,
                        int64_t requested_chunks = 0);

// Bytes a decoding stage moves: K/V of the keys some row sees, read once; Q read `q_reads` times (the CUDA
// kernel's blocks of every split read their rows' Q; on the CPU the chunks find it in cache: 1); O and LSE;
// the partials written and read back. Q, K, V and O are stored in `element_bytes` per element (4 on the CPU,
// 2 for the fp16/bf16 kernel); LSE and the partials are float32.
double decode_bytes_moved(const Problem& p, int64_t partial_elements, double element_bytes = 4.0,
                          double q_reads = 1.0);

}  // namespace flashlab::decoding
