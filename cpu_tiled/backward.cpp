// cpu_tiled/backward: the FlashAttention-2 backward on the CPU (FA2 paper, Algorithm 2; docs/08-backward.md).
//
// No seqlen_q x seqlen_k matrix exists: P is recomputed tile by tile from the saved LSE. The schedule is
// FA2's column-parallel one:
//   pre-pass    D = rowsum(dO * O)                                          (Alg. 2 line 4)
//   outer loop  K/V tiles, one task per (batch, kv head, kv tile), in parallel (Alg. 2 line 5)
//               dK_j and dV_j live in the task's cache-resident accumulators
//   inner loop  Q tiles of every query head of the kv head's group (Alg. 2 line 7):
//                 S = Q_i K_j^T, P = exp(scale S - LSE_i)            (lines 9-10)
//                 dV_j += P^T dO_i                                   (line 11)
//                 dP = dO_i V_j^T, dS = scale P * (dP - D_i)         (lines 12-13)
//                 dQ_i += dS K_j                                     (line 14: the race, see below)
//                 dK_j += dS^T Q_i                                   (line 15)
// dQ_i receives a contribution from every K/V tile, so two tasks may add to the same rows at once:
//   cpu_tiled/backward          each thread adds into its own dQ partial buffer; the buffers are summed
//                               at the end (FA2 uses atomic adds on the GPU);
//   cpu_tiled/backward_dq_pass  the K/V-outer pass skips dQ, and a second, Q-tile-outer pass recomputes P and
//                               dS for dQ_i = sum_j dS K_j: no buffers, but 7 tile products instead of 5.
// docs/08-backward.md ("The dQ race") has the measurements. Tiles the mask hides are skipped
// (Visibility::tile). The five products are the SIMD micro-kernel product_block (cpu_tiled/micro_kernel.hpp),
// one key (or one head dim, for dQ) per lane: K_j^T, V_j^T and a copy of K_j are packed once per K/V tile and
// serve every Q tile of the group; Q_i and dO_i are read in place, as A or as A^T (dP's
// largest-weight entry of each row again in double: see probabilities_and_score_gradients). The forward that
// saves O and LSE is a plain tiled forward on the same tile grid (tiled_forward, at the end), so that the
// backward recomputes S bit for bit.
#include <omp.h>

#include <Eigen/Dense>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/dropout.hpp"
#include "common/mask.hpp"
#include "common/registry.hpp"
#include "common/score_mod.hpp"
#include "common/softmax_state.hpp"
#include "common/special_values.hpp"
#include "cpu_tiled/micro_kernel.hpp"
#include "cpu_tiled/simd.hpp"
#include "cpu_tiled/tile_step.hpp"
#include "cpu_tiled/tiling.hpp"

namespace flashlab::cpu_tiled {

namespace {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Tile = Eigen::Map<Matrix>;                                      // a contiguous workspace tile
using ConstView = Eigen::Map<const Matrix, 0, Eigen::OuterStride<>>;  // rows of a BSHD tensor, one head
using View = Eigen::Map<Matrix, 0, Eigen::OuterStride<>>;
using Column = Eigen::Map<const Eigen::ArrayXf>;
using ColumnD = Eigen::Map<const Eigen::ArrayXd>;
using Floats = std::vector<float, Eigen::aligned_allocator<float>>;  // rows start on cache lines

constexpr int64_t kLanes = micro_width<Vec>();  // the width of one micro-column of product_block

// The layout of the micro-kernel's operands: a tile with one key per lane (S, P, dP, dS, K_j^T, V_j^T,
// dK_j^T, dV_j^T) has its key count rounded up to whole micro-columns, and one with one head dim per lane
// (the copy of K_j, the dQ_i product) its head dim; rows are v_tile_stride() apart (an odd number of cache
// lines), so that a micro-column's rows fall in different L1 sets.
struct Lanes {
  int64_t width;   // n rounded up to kLanes
  int64_t stride;  // between rows
  explicit Lanes(int64_t n) : width(blocks(n, kLanes) * kLanes), stride(v_tile_stride(width)) {}
};

// The B_r x B_c tile grid, shared by the backward and the forward that saves its O and LSE. With the products
// on product_block, nothing is packed per product, and the grids from 64 x 64 to 256 x 256 ran within the
// run-to-run spread of each other (docs/08-backward.md, "Measured"); 128 x 128 keeps a thread's workspace
// (about 0.6 MiB at d = 128) inside a 1 MiB L2, and a causal diagonal tile computes a smaller masked half.
struct TileGrid {
  int64_t br = 128;  // query rows per Q tile (B_r)
  int64_t bc = 128;  // keys per K/V tile (B_c)
};
constexpr TileGrid kGrid;

// Per-thread workspace: O(B_r B_c + B_c d), cache resident.
struct Workspace {
  Lanes keys, dims;               // key lanes (B_c), head-dim lanes (d)
  Floats scores, d_scores;        // S then P; dP then dS (B_r x keys)
  Floats kt, vt, k_copy;          // K_j^T, V_j^T (d x keys) and K_j (B_c x dims): packed once per K/V tile
  Floats dkt, dvt;                // dK_j^T, dV_j^T accumulators (d x keys)
  Floats dq_tile;                 // dS K_j (B_r x dims), before it is added to dQ_i
  std::vector<float> derivative;  // ds"/ds of the score modifications, when there are any (B_r x B_c)
  std::vector<float> keep;        // dropout's factors Z (0 or 1 / (1 - p)), when there is dropout
  std::vector<uint8_t> hidden;    // pairs of a partial tile that do not see each other
  Workspace(const TileGrid& grid, int64_t head_dim)
      : keys(grid.bc),
        dims(head_dim),
        scores(grid.br * keys.stride),
        d_scores(grid.br * keys.stride),
        kt(head_dim * keys.stride),
        vt(head_dim * keys.stride),
        k_copy(grid.bc * dims.stride),
        dkt(head_dim * keys.stride),
        dvt(head_dim * keys.stride),
        dq_tile(grid.br * dims.stride),
        derivative(grid.br * grid.bc),
        keep(grid.br * grid.bc),
        hidden(grid.br * grid.bc) {}
  View tile(Floats& buffer, int64_t rows, int64_t cols) const {  // a B_r x B_c tile with key lanes
    return View(buffer.data(), rows, cols, Eigen::OuterStride<>(keys.stride));
  }
};

// K_j^T (or V_j^T): out[k][c] = tile[c][k], keys past tile.rows() zero up to the lanes of a micro-column.
void pack_transposed(const ConstView& tile, int64_t key_lanes, int64_t stride, float* out) {
  for (int64_t k = 0; k < tile.cols(); ++k) {
    float* row = out + k * stride;
    for (int64_t c = 0; c < tile.rows(); ++c) row[c] = tile(c, k);
    std::fill(row + tile.rows(), row + key_lanes, 0.0f);
  }
}

// K_j copied with its head dims zero-padded to whole micro-columns.
void copy_padded(const ConstView& tile, const Lanes& dims, float* out) {
  for (int64_t c = 0; c < tile.rows(); ++c) {
    float* row = out + c * dims.stride;
    for (int64_t k = 0; k < tile.cols(); ++k) row[k] = tile(c, k);
    std::fill(row + tile.cols(), row + dims.width, 0.0f);
  }
}

struct Shapes {
  const Problem& p;
  int64_t q_stride() const { return p.heads_q * p.head_dim; }  // between rows of one head in Q, O, dO, dQ
  int64_t kv_stride() const { return p.heads_kv * p.head_dim; }
  int64_t row_index(int64_t b, int64_t h, int64_t i) const { return p.lse_offset(b, h, i); }
};

// S = scale Q_i K_j^T for one tile, from K_j^T packed by pack_transposed (key_lanes wide, S's row stride).
// The forward and the backward both call this on the same tile grid, so the
// recomputed S is bitwise the forward's: P = exp(S - LSE) then matches the forward's P exactly, where a
// rounding difference in S (about 1e-2 when scores reach 1e4) would scale P by exp(1e-2).
// With the problem's score modifications (soft-capping, ALiBi; common/score_mod.hpp) after the scale: S is
// then the modified scores of rows i0.. and keys j0.. of batch element b, query head h.
void score_tile(const ConstView& Q, const float* kt, int64_t key_lanes, float scale, const ScoreMod& mod,
                int64_t b, int64_t h, int64_t i0, int64_t j0, View& S) {
  tile_product<Vec, false>(Q.data(), Q.outerStride(), 1, Q.rows(), kt, S.outerStride(), key_lanes, Q.cols(),
                           S.data(), S.outerStride(), scale);  // the scale at the store: no pass of its own
  if (!mod.active()) return;
  for (int64_t r = 0; r < S.rows(); ++r)
    for (int64_t c = 0; c < S.cols(); ++c) S(r, c) = mod.apply(S(r, c), b, h, i0 + r, j0 + c);
}

// D_i = dO_i . O_i = rowsum(dO * O) (FA2 Alg. 2 line 4), laid out like the LSE (Problem::lse_offset), in
// double (see probabilities_and_score_gradients).
std::vector<double> row_dot_pre_pass(const Problem& p, const AttentionOutputs& fwd, const HostTensor& d_out) {
  std::vector<double> D(static_cast<size_t>(p.lse_elements()));
  const Shapes shapes{p};
#pragma omp parallel for collapse(3) schedule(static)
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        if (i >= p.stored_rows_q(b)) continue;  // packed: the sequence ends here
        const int64_t offset = p.q_offset(b, i, h);
        double sum = 0.0;
#pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < p.head_dim; ++c)
          sum += static_cast<double>(d_out.data[offset + c]) * static_cast<double>(fwd.o.data[offset + c]);
        D[shapes.row_index(b, h, i)] = sum;
      }
  return D;
}

// What one (Q tile i, K/V tile j) pair reads: views of Q_i, dO_i, K_j, V_j, LSE_i and D_i.
struct TilePair {
  const Problem& p;
  const Visibility& visibility;
  TileCover cover;
  int64_t b, h, i0, j0;
  ConstView Q, dO, K, V;
  Column lse;
  ColumnD row_dot;
};

// K_j^T, V_j^T and K_j packed into the workspace for the micro-kernel (key_lanes: K_j's keys rounded up to
// whole micro-columns).
int64_t pack_kv(const ConstView& K, const ConstView& V, Workspace& ws) {
  const int64_t key_lanes = Lanes(K.rows()).width;
  pack_transposed(K, key_lanes, ws.keys.stride, ws.kt.data());
  pack_transposed(V, key_lanes, ws.keys.stride, ws.vt.data());
  copy_padded(K, ws.dims, ws.k_copy.data());
  return key_lanes;
}

// Alg. 2 lines 9-13 for one pair: P recomputed from the saved LSE, and dS = scale P * (dP - D), into the
// workspace (dS over dP, in place), from K_j and V_j packed by pack_kv. Both dQ schedules call it.
void probabilities_and_score_gradients(const TilePair& t, int64_t key_lanes, Workspace& ws, View& P,
                                       View& dS) {
  const int64_t rows = t.Q.rows(), cols = t.K.rows(), d = t.p.head_dim;
  const float scale = static_cast<float>(t.p.softmax_scale());
  const ScoreMod mod(t.p);
  score_tile(t.Q, ws.kt.data(), key_lanes, scale, mod, t.b, t.h, t.i0, t.j0, P);  // S, modified (line 9)
  Tile derivative(ws.derivative.data(), rows, mod.bends() ? cols : 0);  // ds"/ds of the modifications
  for (int64_t r = 0; r < derivative.rows(); ++r)
    for (int64_t c = 0; c < derivative.cols(); ++c)
      derivative(r, c) = mod.derivative(P(r, c), t.b, t.h, t.i0 + r, t.j0 + c);
  // P = exp(S - LSE_i) (line 10): the forward's P, recomputed from its saved log-sum-exp.
  // exp_weights gives a -inf score the weight 0 whatever the row's max (the forward's masked scores), but a
  // row whose LSE is NaN (a NaN or Inf reached its scores) has exp(s - LSE) = NaN for every pair, as in the
  // reference.
  for (int64_t r = 0; r < rows; ++r) {
    exp_weights<Vec>(&P(r, 0), cols, t.lse[r]);
    if (std::isnan(t.lse[r])) P.row(r).setConstant(std::numeric_limits<float>::quiet_NaN());
  }
  // Pairs that do not see each other (the mask; a -inf bias) weigh exactly 0. This also clears every entry of
  // a row that sees no key, whose LSE = -inf made exp() above give inf or NaN.
  const bool some_hidden = t.cover == TileCover::partial || mod.can_hide();
  uint8_t* const hidden = ws.hidden.data();
  if (some_hidden) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = t.i0 + r;
      const KeyRange keys = t.visibility.key_range(t.b, i);
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t j = t.j0 + c;
        hidden[r * cols + c] =
            j < keys.begin || j >= keys.end || !t.visibility.mask_allows(i, j) || mod.hides(t.b, t.h, i, j);
        if (hidden[r * cols + c]) P(r, c) = 0.0f;
      }
    }
  }
  View& dP = dS;  // dP = dO_i V_j^T (line 12), turned into dS in place below
  tile_product<Vec, false>(t.dO.data(), t.dO.outerStride(), 1, rows, ws.vt.data(), dP.outerStride(),
                           key_lanes, d, dP.data(), dP.outerStride());
  // Dropout (common/dropout.hpp): O = (P Z) V, so dP is Z dO V^T, and dV below takes P Z; the mask Z is
  // recomputed from the seed, never stored.
  const Dropout dropout(t.p);
  Tile keep(ws.keep.data(), rows, dropout.active() ? cols : 0);
  for (int64_t r = 0; r < keep.rows(); ++r)
    for (int64_t c = 0; c < keep.cols(); ++c) {
      keep(r, c) = dropout.factor<float>(t.b, t.h, t.i0 + r, t.j0 + c);
      dP(r, c) *= keep(r, c);
    }
  // dS = scale P * (dP - D_i) (line 13), the scale of S = scale Q K^T folded in once for dQ and dK; dP - D_i
  // in double. Where a row's weights are nearly one-hot, O_i is the v_j of its largest weight, and dP_ij -
  // D_i is the difference of two equal dot products: their float rounding errors (~1e-6; the GEMM and the
  // pre-pass sum in different orders) would not cancel, and dQ = dS K multiplies them by |K| (scores of 1e4).
  // So an entry whose weight exceeds 1/2 (a row's weights sum to 1: at most one) is computed again in double
  // like D_i (d multiply-adds a row, against the GEMM's d a pair); the others carry the float product's
  // error, weighed by their P, as the same-precision baseline's do.
  for (int64_t r = 0; r < rows; ++r) {
    const double row_dot = t.row_dot[r];
    const float* p_row = &P(r, 0);
    const float* dp_row = &dP(r, 0);
    float* ds_row = &dS(r, 0);
    for (int64_t c = 0; c < cols; ++c)
      ds_row[c] = scale * p_row[c] * static_cast<float>(static_cast<double>(dp_row[c]) - row_dot);
    if (!(largest_value<Vec>(p_row, cols) > 0.5f)) continue;  // a vector scan first: such rows are rare
    for (int64_t c = 0; c < cols; ++c) {
      if (!(p_row[c] > 0.5f)) continue;
      double exact = 0.0;
      for (int64_t k = 0; k < d; ++k)
        exact += static_cast<double>(t.dO(r, k)) * static_cast<double>(t.V(c, k));
      if (dropout.active()) exact *= keep(r, c);
      ds_row[c] = scale * p_row[c] * static_cast<float>(exact - row_dot);
    }
  }
  if (mod.bends()) dS.array() *= derivative.array();  // the gradient of the scaled score
  if (some_hidden)  // a hidden pair takes no part, even when its V holds a NaN (0 * NaN)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        if (hidden[r * cols + c]) dS(r, c) = 0.0f;
  if (dropout.active()) P.array() *= keep.array();  // P Z, what dV = (P Z)^T dO takes
}

// dQ_i += dS K_j (Alg. 2 line 14), one head dim per lane: straight into the rows of dQ_i when the head dim is
// whole micro-columns, else into the workspace and then added.
void add_query_gradient(const View& dS, Workspace& ws, View dQ) {
  const int64_t ld = ws.dims.stride;
  if (ws.dims.width == dQ.cols()) {
    tile_product<Vec, true>(dS.data(), dS.outerStride(), 1, dS.rows(), ws.k_copy.data(), ld, ws.dims.width,
                            dS.cols(), dQ.data(), dQ.outerStride());
    return;
  }
  tile_product<Vec, false>(dS.data(), dS.outerStride(), 1, dS.rows(), ws.k_copy.data(), ld, ws.dims.width,
                           dS.cols(), ws.dq_tile.data(), ld);
  dQ += Tile(ws.dq_tile.data(), dS.rows(), ld).leftCols(dQ.cols());
}

// How dQ is accumulated without a race (see the file header).
enum class DqSchedule {
  partials,  // each thread adds dS K_j into its own dQ buffer; the buffers are summed at the end
  separate,  // the K/V-outer pass skips dQ; a Q-tile-outer pass recomputes P and dS and owns its dQ rows
};

// One K/V tile [j0, j1) of kv head hk (Alg. 2 lines 6-16): every Q tile of the group's query heads that sees
// it adds its share to dK_j and dV_j (kept here) and, with DqSchedule::partials, to the thread's dQ buffer.
template <DqSchedule schedule>
void kv_tile_backward(const Problem& p, const Visibility& visibility, const AttentionInputs& in,
                      const AttentionOutputs& fwd, const HostTensor& d_out, const std::vector<double>& D,
                      int64_t b, int64_t hk, int64_t j0, int64_t j1, float* dq_partial, Workspace& ws,
                      AttentionGradients& grad) {
  const Shapes shapes{p};
  const int64_t br = kGrid.br;
  // The tile's real keys only: padding past rows_k(b) may hold anything (a zero weight times a NaN there is
  // NaN), and its gradients are zero.
  const int64_t d = p.head_dim, cols = std::max<int64_t>(std::min(j1, p.rows_k(b)) - j0, 0);
  const ConstView K(in.k_row(p, b, j0, hk), cols, d, Eigen::OuterStride<>(shapes.kv_stride()));
  const ConstView V(in.v_row(p, b, j0, hk), cols, d, Eigen::OuterStride<>(shapes.kv_stride()));
  const int64_t key_lanes = pack_kv(K, V, ws);  // once for every Q tile of the group
  // dK_j^T and dV_j^T, one key per lane: dV_j^T += dO_i^T P is product_block with dO_i read in place as A^T.
  std::fill(ws.dkt.begin(), ws.dkt.end(), 0.0f);
  std::fill(ws.dvt.begin(), ws.dvt.end(), 0.0f);
  const int64_t ld = ws.keys.stride;

  for (int64_t h = hk * p.group_size(); h < (hk + 1) * p.group_size() && cols > 0; ++h) {
    for (int64_t i0 = 0; i0 < p.rows_q(b); i0 += br) {  // the real rows only, likewise
      const int64_t i1 = std::min(i0 + br, p.rows_q(b)), rows = i1 - i0;
      const TileCover cover = visibility.tile(b, i0, i1, j0, j0 + cols);
      if (cover == TileCover::hidden) continue;  // no row sees any of these keys: P = 0, nothing to add
      const int64_t q_offset = p.q_offset(b, i0, h);
      const TilePair pair{p,
                          visibility,
                          cover,
                          b,
                          h,
                          i0,
                          j0,
                          ConstView(in.q.ptr() + q_offset, rows, d, Eigen::OuterStride<>(shapes.q_stride())),
                          ConstView(d_out.ptr() + q_offset, rows, d, Eigen::OuterStride<>(shapes.q_stride())),
                          K,
                          V,
                          Column(fwd.lse.ptr() + shapes.row_index(b, h, i0), rows),
                          ColumnD(D.data() + shapes.row_index(b, h, i0), rows)};
      View P = ws.tile(ws.scores, rows, cols), dS = ws.tile(ws.d_scores, rows, cols);
      probabilities_and_score_gradients(pair, key_lanes, ws, P, dS);
      // dV_j^T += dO_i^T P (line 11)
      tile_product<Vec, true>(pair.dO.data(), 1, pair.dO.outerStride(), d, P.data(), ld, key_lanes, rows,
                              ws.dvt.data(), ld);
      if constexpr (schedule == DqSchedule::partials)  // dQ_i += dS K_j (line 14), into this thread's partial
        add_query_gradient(dS, ws,
                           View(dq_partial + q_offset, rows, d, Eigen::OuterStride<>(shapes.q_stride())));
      // dK_j^T += Q_i^T dS (line 15)
      tile_product<Vec, true>(pair.Q.data(), 1, pair.Q.outerStride(), d, dS.data(), ld, key_lanes, rows,
                              ws.dkt.data(), ld);
    }
  }
  // Line 16: write dK_j, dV_j once. Tiles no row sees (windows) write their zeros here, padding keys zeros.
  auto write = [&](float* gradient, const Floats& transposed) {
    View all(gradient + p.kv_offset(b, j0, hk), j1 - j0, d, Eigen::OuterStride<>(shapes.kv_stride()));
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t k = 0; k < d; ++k) all(c, k) = transposed[k * ld + c];
    all.bottomRows(j1 - j0 - cols).setZero();
  };
  write(grad.dk.ptr(), ws.dkt);
  write(grad.dv.ptr(), ws.dvt);
}

// DqSchedule::separate: the rows [i0, i1) of query head h own their dQ rows, so no two tasks write the same
// element. P and dS are recomputed (S, dP: two products again) for the one product dQ_i = sum_j dS K_j.
void q_tile_dq(const Problem& p, const Visibility& visibility, const AttentionInputs& in,
               const AttentionOutputs& fwd, const HostTensor& d_out, const std::vector<double>& D, int64_t b,
               int64_t h, int64_t i0, int64_t i1, Workspace& ws, AttentionGradients& grad) {
  const Shapes shapes{p};
  const int64_t d = p.head_dim, hk = p.kv_head(h);
  const int64_t q_offset = p.q_offset(b, i0, h);
  View dQ_all(grad.dq.ptr() + q_offset, i1 - i0, d, Eigen::OuterStride<>(shapes.q_stride()));
  dQ_all.setZero();  // padding rows past rows_q(b) keep these zeros
  const int64_t real_end = std::min(i1, p.rows_q(b)), rows = std::max<int64_t>(real_end - i0, 0);
  const View dQ(dQ_all.data(), rows, d, Eigen::OuterStride<>(shapes.q_stride()));
  const int64_t bc = kGrid.bc;
  for (int64_t j0 = 0; j0 < p.rows_k(b) && rows > 0; j0 += bc) {  // real keys only (see kv_tile_backward)
    const int64_t j1 = std::min(j0 + bc, p.rows_k(b)), cols = j1 - j0;
    const TileCover cover = visibility.tile(b, i0, real_end, j0, j1);
    if (cover == TileCover::hidden) continue;
    const ConstView K(in.k_row(p, b, j0, hk), cols, d, Eigen::OuterStride<>(shapes.kv_stride()));
    const ConstView V(in.v_row(p, b, j0, hk), cols, d, Eigen::OuterStride<>(shapes.kv_stride()));
    const int64_t key_lanes = pack_kv(K, V, ws);
    const TilePair pair{p,
                        visibility,
                        cover,
                        b,
                        h,
                        i0,
                        j0,
                        ConstView(in.q.ptr() + q_offset, rows, d, Eigen::OuterStride<>(shapes.q_stride())),
                        ConstView(d_out.ptr() + q_offset, rows, d, Eigen::OuterStride<>(shapes.q_stride())),
                        K,
                        V,
                        Column(fwd.lse.ptr() + shapes.row_index(b, h, i0), rows),
                        ColumnD(D.data() + shapes.row_index(b, h, i0), rows)};
    View P = ws.tile(ws.scores, rows, cols), dS = ws.tile(ws.d_scores, rows, cols);
    probabilities_and_score_gradients(pair, key_lanes, ws, P, dS);
    add_query_gradient(dS, ws, dQ);  // dQ_i += dS K_j (line 14), rows this task owns
  }
}

template <DqSchedule schedule>
void flash_backward(const Problem& p, const AttentionInputs& in, const AttentionOutputs& fwd,
                    const HostTensor& d_out, AttentionGradients& grad) {
  const Visibility visibility(p);
  const std::vector<double> D = row_dot_pre_pass(p, fwd, d_out);
  const TileGrid& grid = kGrid;
  const int64_t kv_tiles = blocks(p.seqlen_k, grid.bc), q_tiles = blocks(p.seqlen_q, grid.br);
  const int threads = omp_get_max_threads();
  const int64_t q_elements = p.q_elements();
  // DqSchedule::partials: one dQ buffer per thread, O(threads x N d) memory, zeroed, summed at the end.
  std::vector<float> dq_partials(schedule == DqSchedule::partials ? static_cast<size_t>(threads * q_elements)
                                                                  : 0);

#pragma omp parallel num_threads(threads)
  {
    Workspace ws(grid, p.head_dim);
    float* dq_partial =
        schedule == DqSchedule::partials ? dq_partials.data() + omp_get_thread_num() * q_elements : nullptr;
    // The tasks (batch, kv head, K/V tile) dealt out in rounds of one per thread, every other round in
    // reverse thread order: balanced when a causal mask makes each K/V tile cheaper than the one before
    // (dealt in plain round-robin, thread 0 got the most expensive tile of every round: 12% more work at 16
    // tiles a head), and reproducible: each thread always gets the same tiles in the same order, so the
    // partials sum in the same order every run.
    const int64_t thread = omp_get_thread_num(), team = omp_get_num_threads();
    for (int64_t task = 0; task < p.batch * p.heads_kv * kv_tiles; ++task) {
      const int64_t seat = task % team, dealt_to = (task / team) % 2 == 0 ? seat : team - 1 - seat;
      if (dealt_to != thread) continue;
      const int64_t b = task / (p.heads_kv * kv_tiles), hk = task / kv_tiles % p.heads_kv;
      const int64_t j0 = task % kv_tiles * grid.bc, j1 = std::min(j0 + grid.bc, p.stored_rows_k(b));
      if (j0 >= j1) continue;  // packed: past this sequence's keys
      kv_tile_backward<schedule>(p, visibility, in, fwd, d_out, D, b, hk, j0, j1, dq_partial, ws, grad);
    }
    if constexpr (schedule == DqSchedule::separate) {
#pragma omp for collapse(3) schedule(dynamic)
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t h = 0; h < p.heads_q; ++h)
          for (int64_t tile = 0; tile < q_tiles; ++tile) {
            const int64_t i0 = tile * grid.br, i1 = std::min(i0 + grid.br, p.stored_rows_q(b));
            if (i0 >= i1) continue;  // packed: past this sequence's rows
            q_tile_dq(p, visibility, in, fwd, d_out, D, b, h, i0, i1, ws, grad);
          }
    }
  }
  if constexpr (schedule == DqSchedule::partials) {
    // dQ = the sum of the threads' partials (every element written, 0 for rows that see no key).
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < q_elements; ++e) {
      float sum = 0.0f;
      for (int t = 0; t < threads; ++t) sum += dq_partials[t * q_elements + e];
      grad.dq.data[e] = sum;
    }
  }
  repair_special_gradients(p, in, fwd, d_out, D, grad);  // NaN and Inf as the reference (docs/08)
}

// The forward the backward needs for O and LSE: FA2 Algorithm 1 on the same B_r x B_c grid, one task per
// (batch, head, Q tile), the online softmax per row in the shared SoftmaxState, Eigen tile products. Its S
// tiles come from score_tile(), as the backward's do.
void tiled_forward(const Problem& p, const AttentionInputs& in, AttentionOutputs& out) {
  const Visibility visibility(p);
  const Shapes shapes{p};
  const int64_t d = p.head_dim;
  const float scale = static_cast<float>(p.softmax_scale());
  const ScoreMod mod(p);
  const Dropout dropout(p);
  const TileGrid& grid = kGrid;
  const int64_t q_tiles = blocks(p.seqlen_q, grid.br);
#pragma omp parallel
  {
    // Aligned to a cache line: Eigen's vectorized row sums peel a number of leading elements that depends on
    // the buffer's alignment, which would make l (and the LSE) differ in its last bits from run to run.
    const Lanes key_layout(grid.bc);
    Floats scores(grid.br * key_layout.stride), kt(d * key_layout.stride), accumulator(grid.br * d);
    std::vector<SoftmaxState<float>> states(grid.br);
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t tile = 0; tile < q_tiles; ++tile) {
          const int64_t i0 = tile * grid.br, i1 = std::min(i0 + grid.br, p.stored_rows_q(b)), rows = i1 - i0;
          if (rows <= 0) continue;  // packed: past this sequence's rows
          const int64_t hk = p.kv_head(h);
          const ConstView Q(in.q_row(p, b, i0, h), rows, d, Eigen::OuterStride<>(shapes.q_stride()));
          Tile acc(accumulator.data(), rows, d);  // O~_i, unnormalized
          acc.setZero();
          std::fill(states.begin(), states.end(), SoftmaxState<float>{});
          // The batch element's real keys only: padding past them may hold anything, and a masked (zero)
          // weight times a NaN there would still be NaN.
          for (int64_t j0 = 0; j0 < p.rows_k(b); j0 += grid.bc) {
            const int64_t j1 = std::min(j0 + grid.bc, p.rows_k(b)), cols = j1 - j0;
            const TileCover cover = visibility.tile(b, i0, i1, j0, j1);
            if (cover == TileCover::hidden) continue;
            const ConstView K(in.k_row(p, b, j0, hk), cols, d, Eigen::OuterStride<>(shapes.kv_stride()));
            const ConstView V(in.v_row(p, b, j0, hk), cols, d, Eigen::OuterStride<>(shapes.kv_stride()));
            View S(scores.data(), rows, cols, Eigen::OuterStride<>(key_layout.stride));
            const int64_t key_lanes = Lanes(cols).width;
            pack_transposed(K, key_lanes, key_layout.stride, kt.data());
            score_tile(Q, kt.data(), key_lanes, scale, mod, b, h, i0, j0, S);  // Alg. 1 line 8
            for (int64_t r = 0; r < rows; ++r) {
              const int64_t i = i0 + r;
              if (cover == TileCover::partial) {
                const KeyRange keys = visibility.key_range(b, i);
                for (int64_t c = 0; c < cols; ++c)
                  if (j0 + c < keys.begin || j0 + c >= keys.end || !visibility.mask_allows(i, j0 + c))
                    S(r, c) = -INFINITY;
              }
              // Alg. 1 lines 9-10: m_new = max(m, rowmax(S)); rescale l and O~ by exp(m - m_new).
              acc.row(r) *= states[r].raise_max(S.row(r).maxCoeff<Eigen::PropagateNaN>());
              if (states[r].row_max == SoftmaxState<float>::neg_inf) {
                // Nothing visible yet: every weight is 0 (exp(-inf - (-inf)) would be NaN).
                S.row(r).setZero();
                continue;
              }
              exp_weights<Vec>(&S(r, 0), cols, states[r].row_max);  // P~ = exp(S - m_new)
              states[r].add(S.row(r).sum());                        // l += rowsum(P~)
              if (dropout.active())  // after the normalizer: dropout leaves l and the LSE alone
                for (int64_t c = 0; c < cols; ++c) S(r, c) *= dropout.factor<float>(b, h, i, j0 + c);
            }
            acc.noalias() += S * V;  // O~ += P~ V_j
          }
          for (int64_t r = 0; r < rows; ++r) {  // Alg. 1 lines 12-13: O = O~ / l, LSE = m + log l
            states[r].finalize(&acc(r, 0), out.o_row(p, b, i0 + r, h), d);
            out.lse_at(p, b, h, i0 + r) = states[r].lse();
          }
        }
  }
  repair_special_rows(p, in, out);  // a NaN or Inf in V reaches only the rows that see it (docs/08)
}

const Registration backward{{
    .name = "cpu_tiled/backward",
    .summary = "FlashAttention-2 backward: K/V tiles outer in parallel, P recomputed from LSE, dQ partials",
    .constraints = "any shape, every mask, softcap, ALiBi, bias, dropout, packed varlen; O(N d) memory",
    .score_mods = true,
    .dropout = true,
    .packed = true,
    .forward = tiled_forward,
    .backward = flash_backward<DqSchedule::partials>,
}};

// The alternative to per-thread partials, kept to measure the choice (docs/08-backward.md, "The dQ race").
const Registration backward_dq_pass{{
    .name = "cpu_tiled/backward_dq_pass",
    .summary =
        "the same with a separate Q-tile-outer dQ pass: no partial buffers, 7 tile products instead of 5",
    .constraints = "any shape, every mask, softcap, ALiBi, bias, dropout, packed varlen; O(N d) memory",
    .score_mods = true,
    .dropout = true,
    .packed = true,
    .forward = tiled_forward,
    .backward = flash_backward<DqSchedule::separate>,
}};

}  // namespace

}  // namespace flashlab::cpu_tiled
