// cpu_tiled/forward: FlashAttention-2's loop order on the CPU (FA2 paper, Algorithm 1), docs/02-cpu-tiled.md.
//
// Q tiles of Br rows outer, K/V tiles of Bc keys inner: a Q tile's running output O~, max m and sum l stay in
// this thread's cache for the whole sweep over K/V, and O and LSE are written once. Work items are
// (batch, kv head, Q tile), dynamically scheduled over the OpenMP threads (causal tiles have unequal work);
// the query heads of a GQA group share each K/V tile while it is in cache.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "common/mask.hpp"
#include "common/registry.hpp"
#include "common/softmax_state.hpp"
#include "common/special_values.hpp"
#include "cpu_tiled/micro_kernel.hpp"
#include "cpu_tiled/tile_step.hpp"
#include "cpu_tiled/tiling.hpp"
#include "cpu_tiled/traffic.hpp"

namespace flashlab::cpu_tiled {

namespace {

// One thread's tiles: per query head of the item, Q_i^T and O~_i^T (d x Br) and the row states; one
// micro-column of S^T (Bc x W) and one copied V_j tile.
struct Workspace {
  std::vector<float> q_tiles, o_tiles, scores, v_tile, ones, factor, block_max, row_max, block_sum;
  std::vector<SoftmaxState<float>> states;
  std::vector<KeyRange> column_keys;  // per micro-column of the Q tile: the keys any of its rows sees

  Workspace(const TileShape& shape, int64_t d)
      : q_tiles(static_cast<size_t>(shape.heads_per_item * d * shape.br)),
        o_tiles(q_tiles.size()),
        scores(static_cast<size_t>(shape.bc * micro_width<Vec>())),
        v_tile(static_cast<size_t>(shape.bc * v_tile_stride(d))),
        ones(static_cast<size_t>(micro_width<Vec>()), 1.0f),
        factor(ones.size()),
        block_max(ones.size()),
        row_max(ones.size()),
        block_sum(ones.size()),
        states(static_cast<size_t>(shape.heads_per_item * shape.br)),
        column_keys(static_cast<size_t>(blocks(shape.br, micro_width<Vec>()))) {}
};

struct QTile {
  int64_t b, kv_head, first_head, heads, i0, rows;
};

// FA2 Algorithm 1, lines 4-15, for one Q tile of `tile.heads` query heads sharing one K/V head.
void attend_q_tile(const Problem& p, const Visibility& visibility, const TileShape& shape, const QTile& tile,
                   const AttentionInputs& in, AttentionOutputs& out, Workspace& ws) {
  constexpr int64_t W = micro_width<Vec>();
  const int64_t d = p.head_dim, br = shape.br, tile_floats = d * br, columns = blocks(tile.rows, W);
  const float scale = static_cast<float>(p.softmax_scale());
  const ScoreMod mod(p);
  const Dropout dropout(p);
  const int64_t q_stride = p.heads_q * d, kv_stride = p.heads_kv * d;

  for (int64_t g = 0; g < tile.heads; ++g) {  // lines 4-5: load Q_i; O~_i = 0, l_i = 0, m_i = -inf
    pack_q_columns(in.q_row(p, tile.b, tile.i0, tile.first_head + g), q_stride, tile.rows, d,
                   &ws.q_tiles[g * tile_floats]);
    std::fill_n(&ws.o_tiles[g * tile_floats], tile_floats, 0.0f);
    std::fill_n(&ws.states[g * br], br, SoftmaxState<float>{});
  }
  // K/V tiles that no row of this Q tile sees (causal, window, padding) are never visited; within a tile, a
  // micro-column computes only the keys its own rows see (on a causal diagonal, a prefix of the tile).
  const KeyRange span = tile_key_span(visibility, tile.b, tile.i0, tile.rows);
  for (int64_t col = 0; col < columns; ++col)
    ws.column_keys[col] =
        tile_key_span(visibility, tile.b, tile.i0 + col * W, std::min(W, tile.rows - col * W));
  for (int64_t j0 = span.begin; j0 < span.end; j0 += shape.bc) {  // line 6
    const int64_t nk = std::min(shape.bc, span.end - j0);
    if (visibility.tile(tile.b, tile.i0, tile.i0 + tile.rows, j0, j0 + nk) == TileCover::hidden) continue;
    // line 7: K_j read in place, V_j copied (see v_tile_stride); the next tile's rows requested meanwhile
    const float* k_j = in.k_row(p, tile.b, j0, tile.kv_head);
    copy_v_tile(in.v_row(p, tile.b, j0, tile.kv_head), kv_stride, nk, d, ws.v_tile.data());
    const int64_t next = std::min(shape.bc, span.end - j0 - nk);
    prefetch_rows(k_j + nk * kv_stride, kv_stride, next, d);
    prefetch_rows(in.v_row(p, tile.b, j0, tile.kv_head) + nk * kv_stride, kv_stride, next, d);
    for (int64_t g = 0; g < tile.heads; ++g) {       // every query head of the group while K_j, V_j are hot
      for (int64_t col = 0; col < columns; ++col) {  // one micro-column of W rows at a time, S^T in L1
        const int64_t lane0 = col * W, i0 = tile.i0 + lane0, rows = std::min(W, tile.rows - lane0);
        // The keys [c0, c0 + nc) of the tile that some row of the micro-column sees.
        const int64_t c0 = std::max(j0, ws.column_keys[col].begin);
        const int64_t nc = std::min(j0 + nk, ws.column_keys[col].end) - c0;
        if (nc <= 0) continue;
        const TileCover cover = visibility.tile(tile.b, i0, i0 + rows, c0, c0 + nc);
        if (cover == TileCover::hidden) continue;
        SoftmaxState<float>* state = &ws.states[g * br + lane0];
        float* o_tile = &ws.o_tiles[g * tile_floats + lane0 * d];
        // line 8: S = Q_i K_j^T (scaled), then the mask, only where it cuts this tile
        scores_column<Vec>(&ws.q_tiles[g * tile_floats + lane0 * d], W, k_j + (c0 - j0) * kv_stride,
                           kv_stride, nc, d, scale, ws.scores.data());
        if (mod.active())
          modify_scores(mod, tile.b, tile.first_head + g, i0, rows, c0, nc, ws.scores.data(), W);
        if (cover == TileCover::partial) mask_tile(visibility, tile.b, i0, rows, c0, nc, ws.scores.data(), W);
        // line 9: m_new = max(m, rowmax S), P~ = exp(S - m_new), l = exp(m - m_new) l + rowsum P~
        online_softmax_tile<Vec>(ws.scores.data(), W, nc, W, state, ws.factor.data(),
                                 {ws.block_max.data(), ws.row_max.data(), ws.block_sum.data()});
        if (dropout.active())  // after the row sums: dropout leaves l and the LSE alone
          drop_weights(dropout, tile.b, tile.first_head + g, i0, rows, c0, nc, ws.scores.data(), W);
        // line 10: O~ = diag(exp(m - m_new)) O~ + P~ V_j, the rescale fused into the product's store
        output_column<Vec>(ws.scores.data(), ws.v_tile.data() + (c0 - j0) * v_tile_stride(d),
                           v_tile_stride(d), nc, d, ws.factor.data(), ws.ones.data(), o_tile, W);
      }
    }
  }
  // lines 12-15: O_i = diag(l)^-1 O~_i, L_i = m + log l, written once. Micro-column by micro-column: lane r
  // of column c is row c * W + r, its d values W floats apart in the column (in L1), written as one row of O.
  for (int64_t g = 0; g < tile.heads; ++g) {
    const SoftmaxState<float>* state = &ws.states[g * br];
    const int64_t h = tile.first_head + g;
    for (int64_t lane0 = 0; lane0 < tile.rows; lane0 += W) {
      const float* column = &ws.o_tiles[g * tile_floats + lane0 * d];
      for (int64_t r = 0; r < std::min(W, tile.rows - lane0); ++r) {
        const int64_t i = tile.i0 + lane0 + r;
        const float inverse = state[lane0 + r].normalizer();
        out.lse_at(p, tile.b, h, i) = state[lane0 + r].lse();
        float* o = out.o_row(p, tile.b, i, h);
        for (int64_t k = 0; k < d; ++k) o[k] = column[k * W + r] * inverse;
      }
    }
  }
}

void forward(const Problem& p, const AttentionInputs& in, AttentionOutputs& out) {
  const TileShape shape = tile_shape(p);
  const Visibility visibility(p);
  const int64_t q_tiles = blocks(p.seqlen_q, shape.br);
  const int64_t head_chunks = blocks(p.group_size(), shape.heads_per_item);
  const int64_t items = work_items(p, shape);
#pragma omp parallel
  {
    Workspace ws(shape, p.head_dim);
#pragma omp for schedule(dynamic)
    for (int64_t item = 0; item < items; ++item) {
      // Last Q tiles first: under a causal mask they see the most keys, and starting them early balances.
      const int64_t i_tile = q_tiles - 1 - item % q_tiles;
      const int64_t chunk = item / q_tiles % head_chunks;
      const int64_t kv_head = item / (q_tiles * head_chunks) % p.heads_kv;
      const int64_t b = item / (q_tiles * head_chunks * p.heads_kv);
      const int64_t first_head = kv_head * p.group_size() + chunk * shape.heads_per_item;
      const int64_t rows = std::min(shape.br, p.stored_rows_q(b) - i_tile * shape.br);
      if (rows <= 0) continue;  // packed: past this sequence's rows
      const QTile tile{b,
                       kv_head,
                       first_head,
                       std::min(shape.heads_per_item, (kv_head + 1) * p.group_size() - first_head),
                       i_tile * shape.br,
                       rows};
      attend_q_tile(p, visibility, shape, tile, in, out, ws);
    }
  }
  repair_special_rows(p, in, out);  // a NaN or Inf in V reaches only the rows that see it (docs/08)
}

const Registration registration{{
    .name = "cpu_tiled/forward",
    .summary = "FlashAttention-2 loop order on the CPU: Q tiles outer, SIMD tile products, OpenMP",
    .constraints =
        std::string("any shape, every mask, softcap, ALiBi, bias, dropout, packed varlen; O(N d) memory; ") +
        Vec::name + " micro-kernel",
    .score_mods = true,
    .dropout = true,
    .packed = true,
    .forward = forward,
    .bytes_moved = fa2_order_bytes,
}};

}  // namespace

}  // namespace flashlab::cpu_tiled
