// cuda_v2's backward: FlashAttention-2's Algorithm 2 on tensor cores, fp16/bf16 in and out, fp32
// accumulation (backward.hpp; docs/08-backward.md, "On the GPU").
//
// One thread block per (K/V tile j of 64 or 128 keys, kv head, batch); each of its 4 or 8 warps owns 16 keys
// of the tile for the whole kernel and keeps their dK_j and dV_j in registers. For every query head of the kv
// head's group and every Q tile i of 32 rows that sees tile j (causal, window and padding skip the rest, as
// the forward skips key tiles), with Q_i and dO_i in swizzled shared memory:
//   S^T  = K_j Q_i^T                        mma.sync, this warp's 16 keys x 32 queries, as the forward's S
//   P^T  = exp(S^T scale - LSE_i)           recomputed from the forward's LSE; exactly 0 where hidden
//   dV_j += P^T dO_i                        P^T straight from the accumulators into the A fragment
//   dP^T = V_j dO_i^T
//   dS^T = P^T (dP^T - D_i)                 exactly 0 where hidden; the scale is left to dK's and dQ's sums
//   dK_j += dS^T Q_i
//   dQ_i += dS K_j                          dS^T through shared memory (ldmatrix.trans gives dS's fragment);
//                                           fp32 atomics into dQ's accumulator, or tile j's own partial
// and at the end dK_j scale here, dQ_i scale in dq_kernel (backward_steps.cuh, score_gradient).
// Everything is transposed against the forward (keys are the rows here), so that dK_j and dV_j are row tiles
// of accumulators that stay in their warp, and no product needs a transpose in registers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "common/cuda/check.hpp"
#include "common/cuda/convert.cuh"
#include "common/cuda/int_lengths.hpp"
#include "common/cuda/launch.cuh"
#include "common/cuda/ptx.cuh"
#include "common/error.hpp"
#include "cuda_v2/backward.hpp"
#include "cuda_v2/backward_steps.cuh"
#include "cuda_v2/block_mask.cuh"
#include "cuda_v2/score_mod.cuh"
#include "cuda_v2/tensor_core.cuh"

namespace flashlab::cuda_v2 {
namespace {

// dot_kernel, dq_kernel and exact_kernel: 4 warps. backward_kernel: a warp per 16 keys of its tile.
constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kBlockM = kBackwardBlockM;
static_assert(kBlockM == 32, "dQ's 32 x head_dim tile is split into 2 row tiles x (warps / 2) column parts");
// backward_kernel's threads: a warp per 16 keys of its tile.
template <int kBlockN>
constexpr int kBlockThreadsOf = 32 * (kBlockN / 16);
// dS^T's row pitch in shared memory, in elements: 80 bytes, so the 8 rows of one ldmatrix matrix fall in 8
// different 16-byte bank groups (0, 80, 160, ... mod 128 are 8 different multiples of 16).
constexpr int kDsPitch = kBlockM + 8;

// K_j and V_j; Q_i and dO_i twice (the next Q tile's copy lands in one buffer while the other is computed
// on); dS^T; LSE_i and D_i twice.
template <int kHeadDim, int kBlockN>
constexpr int smem_bytes() {
  return (2 * kBlockN * kHeadDim + 2 * 2 * kBlockM * kHeadDim + kBlockN * kDsPitch) * 2 + 2 * 2 * kBlockM * 4;
}

// D_i = rowsum(dO_i * O_i) (Algorithm 2 line 4), 0 for a padded row; and row i of dQ's accumulator zeroed (in
// the fragments' order, the block's whole tile).
// Each warp takes 16 rows and forms D as the diagonal of dO O^T on the tensor cores: the same instructions,
// in the same order over head_dim, as the main kernel's dP = dO V^T. Where one key j dominates a row, O_i is
// V_j to the bit and dP_ij - D_i is then exactly 0, as it is in exact arithmetic (a CUDA-core sum would round
// differently and leave ~1e-6 |dO| |V|, which dK = dS^T Q multiplies by |Q|; the case matrix's
// large-magnitude case found it).
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(kThreads) dot_kernel(const SplitQBackwardParams p) {
  const SplitQParams& f = p.forward;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = lane / 4, quad_lane = lane % 4;
  const int row0 = (blockIdx.x * kWarps + warp) * 16, head = blockIdx.y, b = blockIdx.z;
  if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0) *p.nonfinite = 0;
  if (p.dq_tiled) {  // the block's 64 rows are one tile in the fragments' order: zeroed whole, padding too
    static_assert(16 * kWarps == DqFragmentTile::kRows, "a block's rows are one tile");
    float4* const tile =
        reinterpret_cast<float4*>(p.dq_accum + dq_tile_begin(p, b, head, 16 * kWarps * blockIdx.x));
    for (int i = threadIdx.x; i < DqFragmentTile::kRows * kHeadDim / 4; i += kThreads) tile[i] = float4{};
  }
  if (row0 >= f.seqlen_q) return;  // the whole warp
  const int rows_q = cuda::rows_q(f, b);
  const int64_t offset = cuda::o_begin(f, b) + head * f.o_head_stride;
  const Element* const o = static_cast<const Element*>(f.o) + offset;
  const Element* const d_out = static_cast<const Element*>(p.d_out) + offset;
  // Two adjacent elements of row `row` (0 for a padded row), as one fragment register.
  const auto pair = [&](const Element* tensor, int row, int col) -> uint32_t {
    if (row >= rows_q) return 0u;
    return *reinterpret_cast<const uint32_t*>(tensor + row * f.o_row_stride + col);
  };
  float c[2][4] = {};  // dO O^T for O's rows row0 .. row0 + 7 and row0 + 8 .. row0 + 15
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    const int col = kk * 16 + 2 * quad_lane;  // the fragment layout of tensor_core.cuh
    const uint32_t a[4] = {pair(d_out, row0 + group, col), pair(d_out, row0 + group + 8, col),
                           pair(d_out, row0 + group, col + 8), pair(d_out, row0 + group + 8, col + 8)};
#pragma unroll
    for (int n = 0; n < 2; ++n)
      mma_m16n8k16<Element>(c[n], a, pair(o, row0 + 8 * n + group, col),
                            pair(o, row0 + 8 * n + group, col + 8));
  }
  // The diagonal: (i, i) for i < 8 is n-tile 0's C[g][2t + e] with g = i; for i >= 8, n-tile 1's C[g +
  // 8][...].
  const int e = group - 2 * quad_lane;
  if (e == 0 || e == 1)
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int row = row0 + 8 * n + group;
      if (row < f.seqlen_q) p.d_sum[row_index(f, b, head, row)] = c[n][2 * n + e];
    }
  if (!p.deterministic && !p.dq_tiled)
    for (int r = 0; r < 16 && row0 + r < f.seqlen_q; ++r)
      for (int col = lane; col < kHeadDim; col += 32)
        p.dq_accum[row_index(f, b, head, row0 + r) * kHeadDim + col] = 0.0f;
}

// The two shapes of product the backward kernel takes, each for one warp's 16 keys (rows warp_key ..
// warp_key + 15 of the key tile), tiles in swizzled shared memory (tensor_core.cuh's ldmatrix row maps):
//
// keys x queries: acc = A_keys B^T with A, B both [row][kHeadDim] (S^T = K Q^T, dP^T = V dO^T).
template <typename Element, int kHeadDim>
__device__ inline void keys_by_queries(float (&acc)[kBlockM / 8][4], const Element* keys,
                                       const Element* queries, int warp_key, int lane) {
  using Tile = SwizzledTile<kHeadDim>;
  const LdmatrixRow a_at = a_operand_row(lane), nk_at = b_operand_row_nk(lane);
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, keys + Tile::offset(warp_key + a_at.row, kk * 16 + a_at.col));
#pragma unroll
    for (int np = 0; np < kBlockM / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, queries + Tile::offset(np * 16 + nk_at.row, kk * 16 + nk_at.col));
      mma_m16n8k16<Element>(acc[2 * np], a, b[0], b[1]);
      mma_m16n8k16<Element>(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// keys x head_dim: acc += A B with A the keys x queries accumulators `lhs` (their n-tiles 2kq and 2kq + 1 are
// the A fragment of k-step kq, as P's in the forward's O += P V) and B [query][kHeadDim], read with .trans
// (dV += P^T dO, dK += dS^T Q).
template <typename Element, int kHeadDim>
__device__ inline void accumulate_keys_by_dims(float (&acc)[kHeadDim / 8][4],
                                               const float (&lhs)[kBlockM / 8][4], const Element* rhs,
                                               int lane) {
  using Tile = SwizzledTile<kHeadDim>;
  const LdmatrixRow kn_at = b_operand_row_kn(lane);
#pragma unroll
  for (int kq = 0; kq < kBlockM / 16; ++kq) {
    const uint32_t a[4] = {pack_pair<Element>(lhs[2 * kq][0], lhs[2 * kq][1]),
                           pack_pair<Element>(lhs[2 * kq][2], lhs[2 * kq][3]),
                           pack_pair<Element>(lhs[2 * kq + 1][0], lhs[2 * kq + 1][1]),
                           pack_pair<Element>(lhs[2 * kq + 1][2], lhs[2 * kq + 1][3])};
#pragma unroll
    for (int np = 0; np < kHeadDim / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, rhs + Tile::offset(kq * 16 + kn_at.row, np * 16 + kn_at.col));
      mma_m16n8k16<Element>(acc[2 * np], a, b[0], b[1]);
      mma_m16n8k16<Element>(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// kVariants: the problem has a score modification (soft-capping, ALiBi, a bias) or dropout. A kernel of its
// own, since their code costs the head-dim-128 kernel registers it does not have to spare (ptxas -v: spills
// with it, 0 to 16 bytes without; docs/04 section 4.6).
//
// Blocks a SM: at d 64 the 64-key kernel keeps 3 of 4 warps (at most 168 registers), the occupancy the H200
// timed it at as the fastest backward at d 64 (docs/08); ptxas would otherwise take 176 and fit 2.
template <int kBlockN, int kHeadDim, bool kVariants>
constexpr int kBackwardMinBlocks = (kBlockN == kBackwardBlockN && kHeadDim == 64 && !kVariants) ? 3 : 1;
template <typename Element, int kHeadDim, bool kVariants, int kBlockN>
__global__ void __launch_bounds__(kBlockThreadsOf<kBlockN>,
                                  (kBackwardMinBlocks<kBlockN, kHeadDim, kVariants>))
    backward_kernel(const SplitQBackwardParams p) {
  using Tile = SwizzledTile<kHeadDim>;
  constexpr int kBlockThreads = kBlockThreadsOf<kBlockN>, kKeyWarps = kBlockThreads / 32;
  constexpr int kNTilesD = kHeadDim / 8;  // 8-wide n-tiles of a head_dim-wide product (dV, dK)
  constexpr int kNTilesM = kBlockM / 8;   // 8-wide n-tiles of S^T and dP^T (queries)
  const SplitQParams& f = p.forward;

  constexpr int kQTile = kBlockM * kHeadDim;
  Element* const sK = cuda::dynamic_shared_memory<Element>();  // [kBlockN][kHeadDim], swizzled
  Element* const sV = sK + kBlockN * kHeadDim;                 // [kBlockN][kHeadDim]
  Element* const sQ_buffers = sV + kBlockN * kHeadDim;         // [2][kBlockM][kHeadDim]
  Element* const sdO_buffers = sQ_buffers + 2 * kQTile;        // [2][kBlockM][kHeadDim]
  Element* const sdS = sdO_buffers + 2 * kQTile;               // [kBlockN][kDsPitch]: dS^T
  float* const sLse_buffers = reinterpret_cast<float*>(sdS + kBlockN * kDsPitch);  // [2][kBlockM]
  float* const sD_buffers = sLse_buffers + 2 * kBlockM;                            // [2][kBlockM]

  const int kv_tile = blockIdx.x, head_kv = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad_lane = lane % 4;  // mma fragment coordinates (tensor_core.cuh)
  const int key0 = kv_tile * kBlockN, warp_key = 16 * warp;
  const int rows_q = cuda::rows_q(f, b), rows_k = cuda::rows_k(f, b);
  using Schedule = KeyTileSteps<kBlockM, kBlockN, kHeadDim, kBlockThreads>;
  __shared__ typename Schedule::Notes notes;  // backward_steps.cuh
  Schedule::note(p, b, kv_tile, notes);
  __syncthreads();
  load_key_tile<kBlockN, kHeadDim, kBlockThreads>(sK, sV, f, b, head_kv, key0);

  const LdmatrixRow nk_at = b_operand_row_nk(lane), kn_at = b_operand_row_kn(lane);  // for dQ's product
  const float scale = f.softmax_scale;
  float dk[kNTilesD][4] = {}, dv[kNTilesD][4] = {};  // this warp's 16 keys x head_dim (line 7)

  // The steps of this key tile (backward_steps.cuh). A step's Q_i, dO_i, LSE_i and D_i go into one of two
  // buffers: the next step's copy is in flight while this one is computed, as in FlashAttention-2's backward.
  using Step = typename Schedule::Step;
  const Schedule schedule(p, notes, b, head_kv);
  const int steps = schedule.steps;
  const StepBuffers<Element, kBlockM, kHeadDim> buffers{sQ_buffers, sdO_buffers, sLse_buffers, sD_buffers};
  const auto load_step = [&](const Step& step, int buffer) { schedule.load(step, buffers[buffer]); };

  Step step = schedule.first_visit();
  if (step.number < steps) load_step(step, 0);
  for (int buffer = 0; step.number < steps; buffer ^= 1) {
    const Step next = schedule.next_visit(step);
    if (next.number < steps) {
      load_step(next, buffer ^ 1);  // its last readers, a step ago, were all past that step's second barrier
    } else {
      cp_async_commit();  // an empty group, so that the wait below counts the same way
    }
    cp_async_wait<1>();  // this step's copies (and, the first time, K and V) have landed ...
    __syncthreads();     // ... everyone's; and the step before is done with sdS
    const int head = step.head, row0 = step.row0;
    const auto [sQ, sdO, sLse, sD] = buffers[buffer];

    // S^T = K_j Q_i^T (line 9), the forward's products in the forward's order over head_dim.
    float st[kNTilesM][4] = {};
    keys_by_queries<Element, kHeadDim>(st, sK, sQ, warp_key, lane);

    // P^T = exp(S^T scale - LSE) (line 10) where the element is visible to a valid row, else exactly 0
    // (backward_steps.cuh: how P is rounded to be the forward's). Thread element (nt, e): key warp_key +
    // group + 8 (e / 2), query nt * 8 + 2 quad_lane + e % 2 of the tile.
    const bool full = step.full;
    const auto probability = [&](float s, int r) { return recomputed_probability(s, scale, sLse[r]); };
    bool visible[kNTilesM][4];
    float derivative[kNTilesM][4];  // ds"/ds of the score modification (1 without soft-capping)
    if (!kVariants && full && row0 + kBlockM <= rows_q) {
      // A tile inside the mask's band and the rows' length, the common case: every element is visible, and
      // no element's mask is formed (FlashAttention-2 masks only the tiles on a boundary likewise). The
      // element-by-element code below, even with `full` skipping the band, runs about 22 instructions an
      // element on such a tile; this loop about 8 (the sm_90a SASS).
#pragma unroll
      for (int nt = 0; nt < kNTilesM; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          visible[nt][e] = true;
          derivative[nt][e] = 1.0f;
          st[nt][e] = probability(st[nt][e], nt * 8 + 2 * quad_lane + e % 2);
        }
    } else {
      const BlockMask block = schedule.block(step);
#pragma unroll
      for (int nt = 0; nt < kNTilesM; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = nt * 8 + 2 * quad_lane + e % 2, row = row0 + r;
          const int key = key0 + warp_key + group + 8 * (e / 2);
          visible[nt][e] =
              row < rows_q && (full || element_visible(f, BlockMask::band(f, block, row), row, key));
          derivative[nt][e] = 1.0f;
          // The forward's score modification (score_mod.cuh), the same operations on the same S; a key a
          // -inf bias hides takes no part, like a masked one.
          if (kVariants && f.mod.active() && row < f.seqlen_q && key < f.seqlen_k) {
            st[nt][e] = modified_score(f, st[nt][e], b, head, row, key, rows_q, rows_k);
            derivative[nt][e] = score_derivative(f, st[nt][e], b, head, row, key, rows_q, rows_k);
            if (f.mod.hides(b, head, row, key)) visible[nt][e] = false;
          }
          st[nt][e] = visible[nt][e] ? probability(st[nt][e], r) : 0.0f;
        }
    }

    // dV_j += P^T dO_i (line 11): P^T straight from the accumulators; dO_i is [query][dim] = B row-major.
    // (With dropout, after dS below: dV takes P Z, dS needs P.)
    if constexpr (!kVariants) accumulate_keys_by_dims<Element, kHeadDim>(dv, st, sdO, lane);

    // dP^T = V_j dO_i^T (line 12): as S^T, with V for K and dO for Q.
    float dpt[kNTilesM][4] = {};
    keys_by_queries<Element, kHeadDim>(dpt, sV, sdO, warp_key, lane);

    // dS^T = P^T (dP^T - D) (line 13, its scale left to the sums), exactly 0 where hidden (so that a NaN in a
    // hidden dP cannot come through as 0 * NaN), times the modification's derivative. It replaces P^T in st.
    // Dropout (common/ dropout.hpp): the mask Z recomputed, dP is Z dO V^T, and dV takes P Z, which replaces
    // dP^T in dpt.
#pragma unroll
    for (int nt = 0; nt < kNTilesM; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = nt * 8 + 2 * quad_lane + e % 2;
        float keep = 1.0f;
        if (kVariants && f.dropout.active())
          keep = f.dropout.factor<float>(b, head, row0 + r, key0 + warp_key + group + 8 * (e / 2));
        const float p_ij = st[nt][e];
        st[nt][e] =
            visible[nt][e] ? score_gradient(p_ij, dpt[nt][e] * keep, sD[r]) * derivative[nt][e] : 0.0f;
        if constexpr (kVariants) dpt[nt][e] = p_ij * keep;
      }
    if constexpr (kVariants) accumulate_keys_by_dims<Element, kHeadDim>(dv, dpt, sdO, lane);

    // dK_j += dS^T Q_i (line 15): as dV, with dS for P and Q for dO.
    accumulate_keys_by_dims<Element, kHeadDim>(dk, st, sQ, lane);

    // dQ_i += dS K_j (line 14). dS^T goes to shared memory as [key][query]; ldmatrix.trans of it gives dS's
    // A fragment (its four 8 x 8 matrices are addressed as B's of a [n][k] tile: b_operand_row_nk).
#pragma unroll
    for (int nt = 0; nt < kNTilesM; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        *reinterpret_cast<uint32_t*>(sdS + (warp_key + group + 8 * half) * kDsPitch + nt * 8 +
                                     2 * quad_lane) =
            pack_pair<Element>(st[nt][2 * half], st[nt][2 * half + 1]);
    __syncthreads();
    // Warp w: rows 16 (w % 2) to 16 (w % 2) + 15 of dQ_i, columns of part w / 2 (of kKeyWarps / 2 parts);
    // k = the tile's keys.
    constexpr int kPartColumns = kHeadDim / (kKeyWarps / 2);
    static_assert(kPartColumns % 16 == 0, "a warp's part of dQ's columns is whole 16-wide ldmatrix steps");
    const int m0 = 16 * (warp % 2), n_base = (warp / 2) * kPartColumns;
    float dq[kPartColumns / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4_trans(a, sdS + (kk * 16 + nk_at.row) * kDsPitch + m0 + nk_at.col);
#pragma unroll
      for (int np = 0; np < kPartColumns / 16; ++np) {
        uint32_t bk[4];  // K_j is [key][dim] = B row-major here
        ldmatrix_x4_trans(bk, sK + Tile::offset(kk * 16 + kn_at.row, n_base + np * 16 + kn_at.col));
        mma_m16n8k16<Element>(dq[2 * np], a, bk[0], bk[1]);
        mma_m16n8k16<Element>(dq[2 * np + 1], a, bk[2], bk[3]);
      }
    }
    // dQ_i gathers a share from every key tile, each owned by another block: the race (docs/08). This lane's
    // two rows' addresses are formed once a step; each element adds a constant offset (forming the row's
    // index for every element made this part 505 instructions a step, 282 now: the sm_90a SASS at d 128).
    const int64_t rows_total = static_cast<int64_t>(f.batch) * f.heads_q * f.seqlen_q;
    float* row_dq[2];  // this lane's columns' start in its rows 8 apart, or nullptr past the batch's length
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + m0 + group + 8 * half;
      row_dq[half] = row < rows_q
                         ? p.dq_accum + row_index(f, b, head, row) * kHeadDim + n_base + 2 * quad_lane
                         : nullptr;
    }
    // The lane's two columns of a row in one add (add_row_pairs), or in deterministic mode in one 8-byte
    // store into tile j's own partial.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (row_dq[half] == nullptr) continue;
      if (!p.deterministic) {
        add_row_pairs(row_dq[half], dq, half);
        continue;
      }
      float* const partial = row_dq[half] + kv_tile * rows_total * kHeadDim;
#pragma unroll
      for (int nt = 0; nt < kPartColumns / 8; ++nt)
        *reinterpret_cast<float2*>(partial + 8 * nt) = make_float2(dq[nt][2 * half], dq[nt][2 * half + 1]);
    }
    step = next;
  }
  cp_async_wait<0>();  // the last, empty group; or K and V, when no Q tile saw this key tile

  // dK_j scale, dV_j (line 17), once; padded keys past the batch's length hold 0 (packed, they do not exist).
  const int stored_keys = cuda::stored_rows_k(f, b);
  Element* const dk_out = static_cast<Element*>(p.dk) + cuda::k_begin(f, b) + head_kv * f.k_head_stride;
  Element* const dv_out = static_cast<Element*>(p.dv) + cuda::v_begin(f, b) + head_kv * f.v_head_stride;
#pragma unroll
  for (int nt = 0; nt < kNTilesD; ++nt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = key0 + warp_key + group + 8 * half, col = nt * 8 + 2 * quad_lane;
      if (key >= stored_keys) continue;
      const float dk0 = dk[nt][2 * half] * scale, dk1 = dk[nt][2 * half + 1] * scale;
      const float dv0 = dv[nt][2 * half], dv1 = dv[nt][2 * half + 1];
      *reinterpret_cast<uint32_t*>(dk_out + key * f.k_row_stride + col) = pack_pair<Element>(dk0, dk1);
      *reinterpret_cast<uint32_t*>(dv_out + key * f.v_row_stride + col) = pack_pair<Element>(dv0, dv1);
      if (!isfinite(dk0 + dk1 + dv0 + dv1)) atomicExch(p.nonfinite, 1);  // exact_kernel's cue
    }
}

// dQ in the input format: the accumulator (in row order, or in the fragments' order: dq_accumulator_index),
// or the key tiles' partials summed in order of j (deterministic), times the scale the main kernels left out
// of dS. One warp per query row; padded rows are 0.
template <typename Element, int kBlockN>
__global__ void __launch_bounds__(kThreads) dq_kernel(const SplitQBackwardParams p) {
  const SplitQParams& f = p.forward;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarps + warp, head = blockIdx.y, b = blockIdx.z;
  if (row >= cuda::stored_rows_q(f, b)) return;  // packed: past the sequence
  const bool valid = row < cuda::rows_q(f, b);
  const int64_t at = row_index(f, b, head, row) * f.head_dim;
  const int64_t partial_elements = static_cast<int64_t>(f.batch) * f.heads_q * f.seqlen_q * f.head_dim;
  int first = 0, last = 0;  // the key tiles that wrote a partial for this row: those its Q tile visits
  if (p.deterministic && valid) {
    const int row0 = row / kBlockM * kBlockM;
    const BlockMask block = BlockMask::make<kBlockN>(f, b, row0, row0 + kBlockM);
    first = block.tile_begin;
    last = block.tile_end;
  }
  Element* const dq =
      static_cast<Element*>(p.dq) + cuda::q_begin(f, b) + row * f.q_row_stride + head * f.q_head_stride;
  for (int c = lane; c < f.head_dim; c += 32) {
    float value = 0.0f;
    if (valid && !p.deterministic) value = p.dq_accum[dq_accumulator_index(p, b, head, row, c)];
    for (int j = first; j < last; ++j) value += p.dq_accum[j * partial_elements + at + c];
    value *= f.softmax_scale;
    dq[c] = cuda::from_float<Element>(value);
    if (!isfinite(value)) atomicExch(p.nonfinite, 1);
  }
}

// Special values, exactly (docs/08, "NaN and Inf"). A hidden pair's weight is exactly 0 in every product of
// backward_kernel, but a tensor core multiplies it by its operand all the same: a NaN or Inf in a valid
// element of Q, K or dO reaches, as 0 x NaN = NaN, the gradients of the pairs of its tile that never see it.
// When an epilogue raised the flag, each gradient row holding a NaN or Inf is computed again here from the
// same O, LSE and D, pair by pair over the pairs that see each other only, in fp32, and its elements that
// were not finite are replaced. A finite element is never wrong (a leak only adds NaN), so those stay the
// tensor cores'. Rows: dQ's (batch, head, row), then dK's and dV's together (batch, kv head, key), every
// kExactBlocks-th to a block.
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(kThreads) exact_kernel(const SplitQBackwardParams p) {
  static_assert(kHeadDim <= kThreads && kThreads == kExactThreads, "a thread per column");
  if (*p.nonfinite == 0) return;
  const SplitQParams& f = p.forward;
  __shared__ float row_a[kHeadDim], row_b[kHeadDim];  // Q_i and dO_i, or K_j and V_j
  __shared__ float ds[kThreads], weight[kThreads];    // a chunk's dS and P
  __shared__ int seen[kThreads];                      // which pairs of the chunk see each other
  const int t = threadIdx.x, c = t;
  const int group_size = f.heads_q / f.heads_kv;
  const int64_t dq_rows = static_cast<int64_t>(f.batch) * f.heads_q * f.seqlen_q;
  const int64_t jobs = dq_rows + static_cast<int64_t>(f.batch) * f.heads_kv * f.seqlen_k;
  const auto at = [](const void* base, int64_t offset) { return static_cast<const Element*>(base) + offset; };
  const auto dot = [](const Element* x, const float* y) {
    float sum = 0.0f;
    for (int e = 0; e < kHeadDim; ++e) sum += cuda::to_float(x[e]) * y[e];
    return sum;
  };
  // P and dS of a pair that see each other (S from its dot product), as backward_kernel computes them.
  const auto pair = [&](float s, float lse, float dp, float d, float& p_out, int b, int head, int row,
                        int key, int rows_q, int rows_k) {
    float derivative = 1.0f;
    if (f.mod.active()) {
      s = modified_score(f, s, b, head, row, key, rows_q, rows_k);
      derivative = score_derivative(f, s, b, head, row, key, rows_q, rows_k);
    }
    p_out = recomputed_probability(s, f.softmax_scale, lse);
    const float keep =
        f.dropout.factor<float>(b, head, row, key);  // dropout's Z: dP is Z dO V^T, dV takes P Z
    const float d_score = score_gradient(p_out, dp * keep, d) * derivative;
    p_out *= keep;
    return d_score;
  };
  for (int64_t job = blockIdx.x; job < jobs; job += gridDim.x) {
    if (job < dq_rows) {  // dQ_i = sum over the keys row i sees of dS_ij K_j
      const int b = static_cast<int>(job / (int64_t(f.heads_q) * f.seqlen_q));
      const int head = static_cast<int>(job / f.seqlen_q % f.heads_q),
                row = static_cast<int>(job % f.seqlen_q);
      if (row >= cuda::stored_rows_q(f, b)) continue;  // packed: past the sequence (the whole block)
      Element* const out =
          static_cast<Element*>(p.dq) + cuda::q_begin(f, b) + row * f.q_row_stride + head * f.q_head_stride;
      if (!__syncthreads_or(c < kHeadDim && !isfinite(cuda::to_float(out[c])))) continue;
      const int head_kv = head / group_size;
      const int64_t k_offset = cuda::k_begin(f, b) + head_kv * f.k_head_stride;
      const int64_t v_offset = cuda::v_begin(f, b) + head_kv * f.v_head_stride;
      if (c < kHeadDim) {
        row_a[c] =
            cuda::to_float(*at(f.q, cuda::q_begin(f, b) + row * f.q_row_stride + head * f.q_head_stride + c));
        row_b[c] = cuda::to_float(
            *at(p.d_out, cuda::o_begin(f, b) + row * f.o_row_stride + head * f.o_head_stride + c));
      }
      __syncthreads();
      const float lse = lse_of(f, b, head, row), d = p.d_sum[row_index(f, b, head, row)];
      const int rows_q = cuda::rows_q(f, b), rows_k = cuda::rows_k(f, b);
      const KeyRange keys = band_key_range(row, rows_q, rows_k, f.causal, f.window_left, f.window_right);
      float sum = 0.0f;
      for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kThreads) {
        const int64_t j = j0 + t;
        seen[t] =
            j < keys.end && explicit_mask_allows(f.mask, f.seqlen_k, row, j) && !f.mod.hides(b, head, row, j);
        if (seen[t]) {
          float p_ij;
          ds[t] = pair(dot(at(f.k, k_offset + j * f.k_row_stride), row_a), lse,
                       dot(at(f.v, v_offset + j * f.v_row_stride), row_b), d, p_ij, b, head, row,
                       static_cast<int>(j), rows_q, rows_k);
        }
        __syncthreads();
        if (c < kHeadDim)
          for (int e = 0; e < kThreads && j0 + e < keys.end; ++e)
            if (seen[e]) sum += ds[e] * cuda::to_float(*at(f.k, k_offset + (j0 + e) * f.k_row_stride + c));
        __syncthreads();
      }
      if (c < kHeadDim && !isfinite(cuda::to_float(out[c])))
        out[c] = cuda::from_float<Element>(sum * f.softmax_scale);
    } else {  // dK_j and dV_j: sums over the (head, row) pairs of the group that see key j
      const int64_t key_job = job - dq_rows;
      const int b = static_cast<int>(key_job / (int64_t(f.heads_kv) * f.seqlen_k));
      const int head_kv = static_cast<int>(key_job / f.seqlen_k % f.heads_kv);
      const int key = static_cast<int>(key_job % f.seqlen_k);
      if (key >= cuda::stored_rows_k(f, b)) continue;  // packed: past the sequence (the whole block)
      Element* const dk_out = static_cast<Element*>(p.dk) + cuda::k_begin(f, b) + key * f.k_row_stride +
                              head_kv * f.k_head_stride;
      Element* const dv_out = static_cast<Element*>(p.dv) + cuda::v_begin(f, b) + key * f.v_row_stride +
                              head_kv * f.v_head_stride;
      if (!__syncthreads_or(c < kHeadDim &&
                            (!isfinite(cuda::to_float(dk_out[c])) || !isfinite(cuda::to_float(dv_out[c])))))
        continue;
      if (c < kHeadDim) {
        row_a[c] = cuda::to_float(
            *at(f.k, cuda::k_begin(f, b) + key * f.k_row_stride + head_kv * f.k_head_stride + c));
        row_b[c] = cuda::to_float(
            *at(f.v, cuda::v_begin(f, b) + key * f.v_row_stride + head_kv * f.v_head_stride + c));
      }
      __syncthreads();
      const int rows_q = cuda::rows_q(f, b), rows_k = cuda::rows_k(f, b);
      float dk_sum = 0.0f, dv_sum = 0.0f;
      for (int head = head_kv * group_size; head < (head_kv + 1) * group_size; ++head) {
        const int64_t q_offset = cuda::q_begin(f, b) + head * f.q_head_stride;
        const int64_t o_offset = cuda::o_begin(f, b) + head * f.o_head_stride;
        for (int i0 = 0; i0 < rows_q; i0 += kThreads) {
          const int i = i0 + t;
          const KeyRange keys = band_key_range(i, rows_q, rows_k, f.causal, f.window_left, f.window_right);
          seen[t] = i < rows_q && key >= keys.begin && key < keys.end &&
                    explicit_mask_allows(f.mask, f.seqlen_k, i, key) && !f.mod.hides(b, head, i, key);
          if (seen[t])
            ds[t] = pair(dot(at(f.q, q_offset + i * f.q_row_stride), row_a), lse_of(f, b, head, i),
                         dot(at(p.d_out, o_offset + i * f.o_row_stride), row_b),
                         p.d_sum[row_index(f, b, head, i)], weight[t], b, head, i, key, rows_q, rows_k);
          __syncthreads();
          if (c < kHeadDim)
            for (int e = 0; e < kThreads && i0 + e < rows_q; ++e)
              if (seen[e]) {
                dk_sum += ds[e] * cuda::to_float(*at(f.q, q_offset + (i0 + e) * f.q_row_stride + c));
                dv_sum += weight[e] * cuda::to_float(*at(p.d_out, o_offset + (i0 + e) * f.o_row_stride + c));
              }
          __syncthreads();
        }
      }
      if (c < kHeadDim && !isfinite(cuda::to_float(dk_out[c])))
        dk_out[c] = cuda::from_float<Element>(dk_sum * f.softmax_scale);
      if (c < kHeadDim && !isfinite(cuda::to_float(dv_out[c]))) dv_out[c] = cuda::from_float<Element>(dv_sum);
    }
    __syncthreads();  // row_a and row_b are the next row's
  }
}

template <typename Element, int kHeadDim, bool kVariants, int kBlockN>
void launch_backward_kernel(dim3 grid, const SplitQBackwardParams& p, cudaStream_t stream) {
  launch_backward_tile<backward_kernel<Element, kHeadDim, kVariants, kBlockN>>(
      grid, kBlockThreadsOf<kBlockN>, smem_bytes<kHeadDim, kBlockN>(), kBlockM, kBlockN, kHeadDim, stream, p);
}

// The four kernels with kBlockN keys a block; with 128, the plain case only (check_split_q_backward), and the
// main kernel is backward_64x128.cu's where a step takes 64 query rows.
template <typename Element, int kHeadDim, int kBlockN>
void launch(const SplitQBackwardParams& p, cudaStream_t stream) {
  const SplitQParams& f = p.forward;
  const dim3 rows_grid((f.seqlen_q + kWarps - 1) / kWarps, f.heads_q, f.batch);
  const dim3 tiles_grid((f.seqlen_q + 16 * kWarps - 1) / (16 * kWarps), f.heads_q, f.batch);
  cuda::launch_kernel<dot_kernel<Element, kHeadDim>>(tiles_grid, dim3(kThreads), 0, stream, p);
  const int kv_tiles = (f.seqlen_k + kBlockN - 1) / kBlockN;
  if (kv_tiles > 0) {
    const dim3 grid(kv_tiles, f.heads_kv, f.batch);
    if constexpr (kBlockN == kBackwardBlockN) {  // the variants' kernel: 64 keys a block only
      if (f.has_variants())
        launch_backward_kernel<Element, kHeadDim, true, kBlockN>(grid, p, stream);
      else
        launch_backward_kernel<Element, kHeadDim, false, kBlockN>(grid, p, stream);
    } else if (p.block_m == kBackwardWideBlockM) {
      launch_backward_64x128_kernel(grid, p, stream);
    } else {
      launch_backward_kernel<Element, kHeadDim, false, kBlockN>(grid, p, stream);
    }
  }
  cuda::launch_kernel<dq_kernel<Element, kBlockN>>(rows_grid, dim3(kThreads), 0, stream, p);
  cuda::launch_kernel<exact_kernel<Element, kHeadDim>>(dim3(kExactBlocks), dim3(kThreads), 0, stream, p);
}

// The head dims models use up to 128, each its own kernel: a multiple of 32, so that dQ's columns split
// into two halves of whole 16-wide mma steps (backward_kernel), and a swizzled tile row of whole 64-byte
// groups (tensor_core.cuh).
template <typename Element>
void dispatch_head_dim(const SplitQBackwardParams& p, cudaStream_t stream) {
  switch (p.forward.head_dim) {
    case 32:
      return launch<Element, 32, kBackwardBlockN>(p, stream);
    case 64:
      return launch<Element, 64, kBackwardBlockN>(p, stream);
    case 96:
      return launch<Element, 96, kBackwardBlockN>(p, stream);
    case 128:
      return launch<Element, 128, kBackwardBlockN>(p, stream);
  }
}

// 128 keys a block: bf16, d 64 and 128 (a warp's part of dQ's columns is then 16 or 32 wide), 32 or 64 query
// rows a step.
void dispatch_wide(const SplitQBackwardParams& p, cudaStream_t stream) {
  if (p.forward.head_dim == 64) return launch<__nv_bfloat16, 64, kBackwardWideBlockN>(p, stream);
  launch<__nv_bfloat16, 128, kBackwardWideBlockN>(p, stream);
}

}  // namespace

namespace FLASHLAB_CUDA_TARGET {

void split_q_backward(const SplitQBackwardParams& params, cudaStream_t stream) {
  check_split_q_backward(params);
  if (params.block_n == kBackwardWideBlockN)
    dispatch_wide(params, stream);
  else if (params.forward.dtype == DType::f16)
    dispatch_head_dim<__half>(params, stream);
  else
    dispatch_head_dim<__nv_bfloat16>(params, stream);
}

namespace {
// With `section` >= 0, the key tiles in split_q_bwd_longest_first_order (0: sections as L2 sizes them).
// With `dq_tiled`, dQ's accumulator in the fragments' order (the 64 x 128 kernel).
void launch_backward(const Problem& problem, const BackwardTensors& tensors, bool deterministic, int block_n,
                     int block_m = kBackwardBlockM, int section = -1, bool dq_tiled = false) {
  SplitQBackwardParams params;
  params.forward =
      split_q_params(problem, tensors.forward);  // narrows the lengths into the workspace's start
  params.d_out = tensors.d_out;
  params.dq = tensors.dq;
  params.dk = tensors.dk;
  params.dv = tensors.dv;
  char* const workspace = static_cast<char*>(tensors.forward.workspace);
  const BackwardScratch scratch = backward_scratch(problem, deterministic, block_n, dq_tiled);
  params.d_sum = reinterpret_cast<float*>(workspace + scratch.d_sum);
  params.nonfinite = reinterpret_cast<int*>(workspace + scratch.nonfinite);
  params.dq_accum = reinterpret_cast<float*>(workspace + scratch.dq_accum);
  params.deterministic = deterministic;
  params.block_n = block_n;
  params.block_m = block_m;
  params.dq_tiled = dq_tiled;
  if (section >= 0) {
    params.longest_first = true;
    params.order = split_q_bwd_longest_first_order(params.forward, section);
  }
  split_q_backward(params, tensors.forward.stream);
}
}  // namespace

void launch_split_q_backward(const Problem& problem, const BackwardTensors& tensors) {
  launch_backward(problem, tensors, false, kBackwardBlockN);
}
void launch_split_q_backward_deterministic(const Problem& problem, const BackwardTensors& tensors) {
  launch_backward(problem, tensors, true, kBackwardBlockN);
}
void launch_split_q_bwd128_backward(const Problem& problem, const BackwardTensors& tensors) {
  launch_backward(problem, tensors, false, kBackwardWideBlockN);
}
void launch_split_q_bwd64x128_backward(const Problem& problem, const BackwardTensors& tensors) {
  launch_backward(problem, tensors, false, kBackwardWideBlockN, kBackwardWideBlockM);
}
void launch_split_q_bwd64x128_longest_first_sections(const Problem& problem, const BackwardTensors& tensors,
                                                     int section, bool dq_tiled) {
  if (section < 0) fail("section (", section, ") must be at least 0 (0: as L2 sizes them)");
  launch_backward(problem, tensors, false, kBackwardWideBlockN, kBackwardWideBlockM, section, dq_tiled);
}
void launch_split_q_bwd64x128_longest_first_backward(const Problem& problem, const BackwardTensors& tensors) {
  launch_split_q_bwd64x128_longest_first_sections(problem, tensors, 0);
}
void launch_split_q_bwd64x128_tiled_dq_backward(const Problem& problem, const BackwardTensors& tensors) {
  launch_backward(problem, tensors, false, kBackwardWideBlockN, kBackwardWideBlockM, -1, true);
}
void launch_split_q_bwd64x128_tiled_dq_longest_first_backward(const Problem& problem,
                                                              const BackwardTensors& tensors) {
  launch_split_q_bwd64x128_longest_first_sections(problem, tensors, 0, true);
}

}  // namespace FLASHLAB_CUDA_TARGET

}  // namespace flashlab::cuda_v2
