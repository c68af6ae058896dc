// The two tile products of FlashAttention, as register-blocked SIMD micro-kernels (docs/02-cpu-tiled.md,
// "The micro-kernel").
//
// Every tile is kept transposed, one query row per SIMD lane, so that per-row softmax statistics are plain
// vertical vector operations and neither K nor V needs repacking:
//   S^T = K_j Q_i^T           scores_column():  St[c][r] = scale sum_k K[c][k] Qt[k][r]   (FA2 Alg. 1 line 8)
//   O^T = a O^T + b V_j^T P^T  output_column():  Ot[k][r] = pre[r] Ot[k][r] + post[r] sum_c V[c][k] Pt[c][r]
//                                                                                          (FA2 Alg. 1 line
//                                                                                          10)
// Qt (d x Br) is packed once per Q tile and reused for every K/V tile; K rows are read in place from the BSHD
// tensor and V rows from a copy of the tile, one scalar broadcast per element. A micro-kernel keeps an
// MR x NV block of vectors in registers (MR keys or head dims by NV vectors of query rows) and streams the
// shared dimension through it: per step NV vector loads and MR broadcasts feed MR * NV FMAs. The tile
// functions below work on one micro-column (NV vectors = micro_width() query rows), whose S^T/P^T slice
// (Bc x micro_width floats) stays in L1 from the score product through the softmax to the output product.
// The score block is product_block, the general register block that tile_product also uses for the
// backward's five products (cpu_tiled/backward.cpp); the output block fuses the online softmax's rescale into
// its store.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu_tiled/simd.hpp"

namespace flashlab::cpu_tiled {

// Register blocking per backend: MR * NV accumulators + NV loaded vectors (+1 broadcast on AVX2, which has no
// broadcasting FMA) fit in the register file (32 zmm, 16 ymm).
template <class V>
struct Blocking;
#if defined(__AVX512F__)
template <>
struct Blocking<VecAvx512> {
  static constexpr int nv = 4, mr = 6;  // 24 accumulators + 4 loads of 32 registers
};
#endif
#if defined(__AVX2__) && defined(__FMA__)
template <>
struct Blocking<VecAvx2> {
  static constexpr int nv = 2, mr = 6;  // 12 accumulators + 2 loads + 1 broadcast of 16 registers
};
#endif
template <>
struct Blocking<VecPortable> {
  static constexpr int nv = 2, mr = 4;
};

// Query rows in one micro-column: the width every Q tile is padded to.
template <class V>
constexpr int micro_width() {
  return Blocking<V>::nv * V::lanes;
}

// The register block every tile product here is built on. For MR rows m of C and one micro-column of
// W = micro_width() lanes n:
//   C[m][n] = scale sum_k A(m, k) B[k][n]   (kAccumulate: C[m][n] += ...)
// A(m, k) = a[m * a_m + k * a_k] is read in place and broadcast, so that a tile serves as A and as A^T
// without a copy; B's rows are b + k * ld_b, W contiguous floats each; C's rows are c + m * ld_c. Per step of
// k, NV vector loads and MR broadcasts feed MR * NV FMAs. Rows m >= rows repeat the last (the block needs no
// tail variant) and are not stored. The sum runs over k in order, one FMA a step, so an entry's value does
// not depend on which block computed it. Kept out of line: inlined into the tile loops, GCC spills
// accumulators and folds the loads into the FMAs.
template <class V, bool kAccumulate>
[[gnu::noinline]] void product_block(const float* a, int64_t a_m, int64_t a_k, int rows, const float* b,
                                     int64_t ld_b, int64_t depth, float* c, int64_t ld_c,
                                     float scale = 1.0f) {
  constexpr int NV = Blocking<V>::nv, MR = Blocking<V>::mr, L = V::lanes;
  const float* a_row[MR];
  for (int m = 0; m < MR; ++m) a_row[m] = a + std::min(m, rows - 1) * a_m;
  V acc[MR][NV];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v) acc[m][v] = V::zero();
  for (int64_t k = 0; k < depth; ++k) {
    V b_k[NV];
    for (int v = 0; v < NV; ++v) b_k[v] = V::load(b + k * ld_b + v * L);
    const int64_t offset = k * a_k;
    for (int m = 0; m < MR; ++m) {
      const V a_mk = V::splat(a_row[m][offset]);
      for (int v = 0; v < NV; ++v) acc[m][v] = fma(a_mk, b_k[v], acc[m][v]);
    }
  }
  const V scale_v = V::splat(scale);  // after the sum, as the reference applies the softmax scale
  for (int m = 0; m < rows && m < MR; ++m)
    for (int v = 0; v < NV; ++v) {
      float* out = c + m * ld_c + v * L;
      if constexpr (kAccumulate)
        (acc[m][v] * scale_v + V::load(out)).store(out);
      else
        (acc[m][v] * scale_v).store(out);
    }
}

// S^T rows c0 .. c0+MR-1 (clamped to nk) of one micro-column: St[c][r] = scale * K[c] . Qt[:, r], the keys
// broadcast from their rows in place (A = K, read as A), Qt's micro-column the vectors.
template <class V>
void score_block(const float* qt, int64_t ld_q, const float* k, int64_t k_stride, int64_t c0, int64_t nk,
                 int64_t d, float scale, float* st) {
  constexpr int MR = Blocking<V>::mr, W = micro_width<V>();
  const int rows = static_cast<int>(std::min<int64_t>(MR, nk - c0));
  product_block<V, false>(k + c0 * k_stride, k_stride, 1, rows, qt, ld_q, d, st + c0 * W, W, scale);
}

// S^T (nk x micro_width, dense) of one micro-column against nk keys. The micro-column's slice of Qt
// (d x micro_width floats, row stride ld_q) stays in L1 while the keys stream past it.
template <class V>
void scores_column(const float* qt, int64_t ld_q, const float* k, int64_t k_stride, int64_t nk, int64_t d,
                   float scale, float* st) {
  for (int64_t c0 = 0; c0 < nk; c0 += Blocking<V>::mr)
    score_block<V>(qt, ld_q, k, k_stride, c0, nk, d, scale, st);
}

// O^T rows k0 .. k0+MR-1 of one micro-column, rows below `first` left as they are:
//   Ot[k][r] = pre[r] Ot[k][r] + post[r] sum_c V[c][k] Pt[c][r].
// kClamp: the head dim is narrower than MR, so the extra rows repeat the last dim (and are not stored).
template <class V, bool kClamp>
[[gnu::noinline]] void output_block(const float* pt, const float* v_rows, int64_t v_stride, int64_t nk,
                                    int64_t k0, int first, int64_t d, const float* pre, const float* post,
                                    float* ot, int64_t ld_o) {
  constexpr int NV = Blocking<V>::nv, MR = Blocking<V>::mr, L = V::lanes, W = NV * L;
  int64_t dim[MR];
  for (int m = 0; m < MR; ++m) dim[m] = kClamp ? std::min<int64_t>(k0 + m, d - 1) : k0 + m;
  V acc[MR][NV];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v) acc[m][v] = V::zero();
  for (int64_t c = 0; c < nk; ++c) {
    V p[NV];
    for (int v = 0; v < NV; ++v) p[v] = V::load(pt + c * W + v * L);
    const float* v_row = v_rows + c * v_stride;
    for (int m = 0; m < MR; ++m) {
      const V v_m = V::splat(v_row[dim[m]]);
      for (int v = 0; v < NV; ++v) acc[m][v] = fma(v_m, p[v], acc[m][v]);
    }
  }
  // The rescale of the running output, fused into the store: one read and one write of O^T per K/V tile.
  // [[maybe_unused]]: read only by exercise tiled-rescale's line; a student's copy without it must still
  // compile warning-free.
  for (int v = 0; v < NV; ++v) {
    [[maybe_unused]] const V pre_v = V::load(pre + v * L), post_v = V::load(post + v * L);
    for (int m = first; m < MR; ++m) {
      if (k0 + m >= d) break;
      [[maybe_unused]] float* out = ot + (k0 + m) * ld_o + v * L;
      // EXERCISE BEGIN tiled-rescale
      fma(acc[m][v], post_v, V::load(out) * pre_v).store(out);
      // EXERCISE END tiled-rescale
    }
  }
}

// O^T = diag(pre) O^T + diag(post) V^T P^T for one micro-column (P^T dense nk x micro_width, O^T row stride
// ld_o), all head dims.
template <class V>
void output_column(const float* pt, const float* v_rows, int64_t v_stride, int64_t nk, int64_t d,
                   const float* pre, const float* post, float* ot, int64_t ld_o) {
  constexpr int MR = Blocking<V>::mr;
  if (d < MR) {
    output_block<V, true>(pt, v_rows, v_stride, nk, 0, 0, d, pre, post, ot, ld_o);
    return;
  }
  int64_t k0 = 0;
  for (; k0 + MR <= d; k0 += MR)
    output_block<V, false>(pt, v_rows, v_stride, nk, k0, 0, d, pre, post, ot, ld_o);
  // The last dims: a block shifted back to end at d, storing only the rows not yet written.
  if (k0 < d)
    output_block<V, false>(pt, v_rows, v_stride, nk, d - MR, static_cast<int>(k0 - (d - MR)), d, pre, post,
                           ot, ld_o);
}

// C (rows x cols) = scale A B, or += with kAccumulate, in product_block's terms (A read in place with strides
// a_m, a_k; B's rows ld_b apart; cols a multiple of W, B and C padded to it). The micro-columns of B are the
// outer loop, so that one slice of B (depth x W floats) stays in L1 while the row blocks of A stream past it;
// a depth larger than kDepthStep is taken in steps, the slice of one step then 32 KiB with AVX-512.
template <class V, bool kAccumulate>
void tile_product(const float* a, int64_t a_m, int64_t a_k, int64_t rows, const float* b, int64_t ld_b,
                  int64_t cols, int64_t depth, float* c, int64_t ld_c, float scale = 1.0f) {
  constexpr int MR = Blocking<V>::mr, W = micro_width<V>();
  constexpr int64_t kDepthStep = 128;
  for (int64_t n0 = 0; n0 < cols; n0 += W)
    for (int64_t k0 = 0; k0 < depth; k0 += kDepthStep) {
      const int64_t step = std::min(kDepthStep, depth - k0);
      for (int64_t m0 = 0; m0 < rows; m0 += MR) {
        const int block_rows = static_cast<int>(std::min<int64_t>(MR, rows - m0));
        const float* a_block = a + m0 * a_m + k0 * a_k;
        const float* b_block = b + k0 * ld_b + n0;
        float* c_block = c + m0 * ld_c + n0;
        if (kAccumulate || k0 > 0)
          product_block<V, true>(a_block, a_m, a_k, block_rows, b_block, ld_b, step, c_block, ld_c, scale);
        else
          product_block<V, false>(a_block, a_m, a_k, block_rows, b_block, ld_b, step, c_block, ld_c, scale);
      }
    }
}

}  // namespace flashlab::cpu_tiled
