// cpu_tiled/fa1_order: FlashAttention-1's loop order on the CPU (FA1 paper, Algorithm 1),
// docs/02-cpu-tiled.md.
//
// K/V tiles outer, Q tiles inner, with O, l and m kept in memory and read and rewritten at every K/V tile, O
// normalized each time (line 13). Same tiles, micro-kernels and softmax state as cpu_tiled/forward: the only
// difference is the loop order, so the measured gap between the two is what the order costs. Like a CUDA
// thread block of FlashAttention-1, each thread runs Algorithm 1 over its own share of the Q tiles (tile t
// goes to thread t mod T, which balances causal rows), with no synchronization inside the K/V loop.
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

// Algorithm 1's "HBM" for one kv head and the query heads of its group: every Q tile transposed, O
// (normalized) and the row states (l, m).
struct Memory {
  std::vector<float> q_tiles, o_tiles;
  std::vector<SoftmaxState<float>> states;
};

// One thread's on-chip scratch: a micro-column of S^T, a copied V_j tile and per-lane factors.
struct Scratch {
  std::vector<float> scores, v_tile, factor, l_old, pre, post, block_max, row_max, block_sum;
  Scratch(const TileShape& shape, int64_t d)
      : scores(static_cast<size_t>(shape.bc * micro_width<Vec>())),
        v_tile(static_cast<size_t>(shape.bc * v_tile_stride(d))),
        factor(static_cast<size_t>(micro_width<Vec>())),
        l_old(factor.size()),
        pre(factor.size()),
        post(factor.size()),
        block_max(factor.size()),
        row_max(factor.size()),
        block_sum(factor.size()) {}
};

void fa1_order(const Problem& p, const AttentionInputs& in, AttentionOutputs& out) {
  constexpr int64_t W = micro_width<Vec>();
  const TileShape shape = tile_shape(p);
  const Visibility visibility(p);
  const int64_t d = p.head_dim, br = shape.br, group = p.group_size();
  const int64_t q_tiles = blocks(p.seqlen_q, br), tile_floats = d * br, items = group * q_tiles;
  const float scale = static_cast<float>(p.softmax_scale());
  const int64_t q_stride = p.heads_q * d, kv_stride = p.heads_kv * d;
  Memory memory{std::vector<float>(static_cast<size_t>(items * tile_floats)),
                std::vector<float>(static_cast<size_t>(items * tile_floats)),
                std::vector<SoftmaxState<float>>(static_cast<size_t>(items * br))};
  auto rows_of = [&](int64_t i_tile) { return std::min(br, p.seqlen_q - i_tile * br); };

#pragma omp parallel
  {
    Scratch scratch(shape, d);
    const int64_t thread = omp_get_thread_num(), threads = omp_get_num_threads();
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t kv_head = 0; kv_head < p.heads_kv; ++kv_head) {
        // lines 1-5: Q in tiles; O = 0, l = 0, m = -inf in memory
        for (int64_t item = thread; item < items; item += threads) {
          const int64_t g = item / q_tiles, i_tile = item % q_tiles, rows = rows_of(i_tile);
          pack_q_columns(in.q_row(p, b, i_tile * br, kv_head * group + g), q_stride, rows, d,
                         &memory.q_tiles[item * tile_floats]);
          std::fill_n(&memory.o_tiles[item * tile_floats], tile_floats, 0.0f);
          std::fill_n(&memory.states[item * br], br, SoftmaxState<float>{});
        }
        for (int64_t j0 = 0; j0 < p.rows_k(b); j0 += shape.bc) {  // line 6
          const int64_t nk = std::min(shape.bc, p.rows_k(b) - j0);
          // line 7: K_j read in place, V_j copied by every thread (see v_tile_stride)
          const float* k_j = in.k_row(p, b, j0, kv_head);
          copy_v_tile(in.v_row(p, b, j0, kv_head), kv_stride, nk, d, scratch.v_tile.data());
          for (int64_t item = thread; item < items; item += threads) {  // line 8
            const int64_t i_tile = item % q_tiles, rows_i = rows_of(i_tile);
            for (int64_t lane0 = 0; lane0 < rows_i; lane0 += W) {  // one micro-column of W rows at a time
              const int64_t i0 = i_tile * br + lane0, rows = std::min(W, rows_i - lane0);
              const TileCover cover = visibility.tile(b, i0, i0 + rows, j0, j0 + nk);
              if (cover == TileCover::hidden) continue;
              // line 9: Q_i, O_i, l_i, m_i from memory
              const float* q_i = &memory.q_tiles[item * tile_floats + lane0 * d];
              float* o_i = &memory.o_tiles[item * tile_floats + lane0 * d];
              SoftmaxState<float>* state = &memory.states[item * br + lane0];
              // line 10: S = Q_i K_j^T (scaled), masked where the mask cuts the tile
              scores_column<Vec>(q_i, W, k_j, kv_stride, nk, d, scale, scratch.scores.data());
              if (cover == TileCover::partial)
                mask_tile(visibility, b, i0, rows, j0, nk, scratch.scores.data(), W);
              // lines 11-12: m_new = max(m_i, rowmax S), P = exp(S - m_new), l_new = e^(m_i - m_new) l_i +
              // rowsum P. P is taken against m_new directly, which folds Algorithm 1's e^(m~_ij - m_new) into
              // P.
              for (int64_t r = 0; r < W; ++r) scratch.l_old[r] = state[r].row_sum;
              online_softmax_tile<Vec>(
                  scratch.scores.data(), W, nk, W, state, scratch.factor.data(),
                  {scratch.block_max.data(), scratch.row_max.data(), scratch.block_sum.data()});
              // line 13: O_i = diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + P V_j), written back to
              // memory; line 14: l_i, m_i were updated in memory by the state.
              for (int64_t r = 0; r < W; ++r) {
                scratch.post[r] = state[r].normalizer();
                scratch.pre[r] = scratch.l_old[r] * scratch.factor[r] * scratch.post[r];
              }
              output_column<Vec>(scratch.scores.data(), scratch.v_tile.data(), v_tile_stride(d), nk, d,
                                 scratch.pre.data(), scratch.post.data(), o_i, W);
            }
          }
        }
        // line 17: O (already normalized) and LSE = m + log l to the outputs
        for (int64_t item = thread; item < items; item += threads) {
          const int64_t g = item / q_tiles, i_tile = item % q_tiles, rows = rows_of(i_tile);
          const float* o_i = &memory.o_tiles[item * tile_floats];
          const SoftmaxState<float>* state = &memory.states[item * br];
          const int64_t h = kv_head * group + g;
          for (int64_t r = 0; r < rows; ++r) {
            float* o = out.o_row(p, b, i_tile * br + r, h);
            for (int64_t k = 0; k < d; ++k) o[k] = o_i[column_index(r, k, d)];
            out.lse_at(p, b, h, i_tile * br + r) = state[r].lse();
          }
        }
      }
    }
  }
  repair_special_rows(p, in, out);  // a NaN or Inf in V reaches only the rows that see it (docs/08)
}

const Registration registration{{
    .name = "cpu_tiled/fa1_order",
    .summary =
        "FlashAttention-1 loop order on the CPU: K/V tiles outer, O, l, m re-read and rewritten per tile",
    .constraints =
        std::string("any shape, every mask; O(N d) memory per kv head; ") + Vec::name + " micro-kernel",
    .forward = fa1_order,
    .bytes_moved = fa1_order_bytes,
}};

}  // namespace

}  // namespace flashlab::cpu_tiled
