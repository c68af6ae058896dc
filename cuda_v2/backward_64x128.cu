// cuda_v2/split_q_bwd64x128's backward kernel: FlashAttention-2's Algorithm 2 in FlashAttention-2's own
// warp layout, the one its launch template takes at d 128 on A100 and H100: 64 query rows a step over a
// tile of 128 keys, 8 warps (docs/08-backward.md, "The 64 x 128 tile"). backward.cu's kernel, beside it,
// takes 32 query rows a step and computes everything transposed, each warp owning 16 keys.
//
// One thread block per (K/V tile j of 128 keys, kv head, batch). For every query head of the kv head's group
// and every Q tile i of 64 rows that sees tile j (causal, window and padding skip the rest):
//   S     = Q_i K_j^T               64 x 128; warps 2 (rows) x 4 (keys), each a 32 x 32 square
//   P     = exp(S scale - LSE_i)    in registers, exactly 0 where hidden; to shared memory as bf16
//   dP    = dO_i V_j^T              as S
//   dS    = P (dP - D_i)            in registers, exactly 0 where hidden; to shared memory as bf16
//   -- barrier: P and dS are the whole block's now
//   dV_j += P^T dO_i                128 x d; warps 4 (keys) x 2 (dims), each 32 keys x d/2, in registers
//   dQ_i += dS K_j                  64 x d; warps 2 (rows) x 4 (dims), each 32 x d/4; fp32 atomics
//   dK_j += dS^T Q_i                as dV
// and at the end dK_j scale; dQ's accumulator takes the scale where it is converted (backward_steps.cuh,
// score_gradient).
// A warp owns a square of S and dP, not every query row of its keys, so no warp holds a whole column of P
// or dS: both pass through shared memory, and ldmatrix.trans hands out P^T's and dS^T's fragments. In
// exchange each fragment a warp loads feeds more mma (per 16-wide k-step, 4 loads for 8 mma in S and dP,
// 6 for 16 in dV and dK at d 128), and each step's fixed costs (its copy, two barriers, LSE_i and D_i)
// serve 64 query rows instead of 32.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "common/cuda/convert.cuh"
#include "common/cuda/launch.cuh"
#include "common/cuda/ptx.cuh"
#include "common/cuda/sequences.hpp"
#include "cuda_v2/backward.hpp"
#include "cuda_v2/backward_steps.cuh"
#include "cuda_v2/block_mask.cuh"
#include "cuda_v2/tensor_core.cuh"

namespace flashlab::cuda_v2 {
namespace {

constexpr int kBlockM = kBackwardWideBlockM;  // query rows a step
constexpr int kBlockN = kBackwardWideBlockN;  // keys a block
constexpr int kWarps = 8, kThreads = 32 * kWarps;
// Each warp's square of S and dP, and its keys of dK and dV: 32 rows, 32 keys (2 m-tiles, 4 n-tiles).
constexpr int kWarpRows = 32, kWarpKeys = 32;
static_assert(kBlockM == 2 * kWarpRows && kBlockN == 4 * kWarpKeys, "the warp grids are 2 x 4 and 4 x 2");
// P and dS in shared memory: [query][key], 128 keys wide, swizzled like every tile (tensor_core.cuh), so that
// the fragment stores and both kinds of ldmatrix read of them meet no bank conflict.
using ScoreTile = SwizzledTile<kBlockN>;

// K_j and V_j; Q_i and dO_i twice (the next step's copy lands in one buffer while the other is computed on);
// P and dS; LSE_i and D_i twice. At d 128: 161 KiB.
template <int kHeadDim>
constexpr int smem_bytes() {
  return (2 * kBlockN * kHeadDim + 2 * 2 * kBlockM * kHeadDim + 2 * kBlockM * kBlockN) * 2 +
         2 * 2 * kBlockM * 4;
}

// The three shapes of product, each for one warp, tiles in swizzled shared memory. Each forms its lanes'
// ldmatrix rows once and steps them along the tiles (SwizzledTile::step): the tiles are 64 or 128 wide.
//
// S = Q K^T and dP = dO V^T: this warp's 32 rows x 32 keys, acc[m-tile][n-tile]; A = rows [query][dim],
// B = keys [key][dim]. The forward's product: the same mma in the same order over head_dim, so that S is the
// forward's S to the bit (the recomputed P rests on it).
template <typename Element, int kHeadDim>
__device__ inline void rows_by_keys(float (&acc)[2][4][4], uint32_t rows, uint32_t keys, int row0, int key0,
                                    int lane) {
  using Tile = SwizzledTile<kHeadDim>;
  const LdmatrixRow a_at = a_operand_row(lane), nk_at = b_operand_row_nk(lane);
  const int a0 = Tile::offset(row0 + a_at.row, a_at.col), b0 = Tile::offset(key0 + nk_at.row, nk_at.col);
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    uint32_t a[2][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) ldmatrix_x4(a[mt], rows + 2 * Tile::step(a0, 16 * mt, 16 * kk));
#pragma unroll
    for (int np = 0; np < 2; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, keys + 2 * Tile::step(b0, 16 * np, 16 * kk));
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        mma_m16n8k16<Element>(acc[mt][2 * np], a[mt], b[0], b[1]);
        mma_m16n8k16<Element>(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// dV += P^T dO and dK += dS^T Q: this warp's 32 keys x head_dim / 2 columns, acc[m-tile][n-tile], k = the
// step's 64 query rows. A = P^T (dS^T): .trans of the [query][key] score tile, its four 8 x 8 matrices
// addressed as B's of a [n][k] tile (b_operand_row_nk); B = dO (Q) [query][dim], read with .trans.
template <typename Element, int kHeadDim>
__device__ inline void accumulate_keys_by_dims(float (&acc)[2][kHeadDim / 16][4], uint32_t scores,
                                               uint32_t rows, int key0, int dim0, int lane) {
  using Tile = SwizzledTile<kHeadDim>;
  const LdmatrixRow t_at = b_operand_row_nk(lane), kn_at = b_operand_row_kn(lane);
  const int a0 = ScoreTile::offset(t_at.row, t_at.col), b0 = Tile::offset(kn_at.row, kn_at.col);
#pragma unroll
  for (int kr = 0; kr < kBlockM / 16; ++kr) {
    uint32_t a[2][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
      ldmatrix_x4_trans(a[mt], scores + 2 * ScoreTile::step(a0, 16 * kr, key0 + 16 * mt));
#pragma unroll
    for (int np = 0; np < kHeadDim / 32; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, rows + 2 * Tile::step(b0, 16 * kr, dim0 + 16 * np));
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        mma_m16n8k16<Element>(acc[mt][2 * np], a[mt], b[0], b[1]);
        mma_m16n8k16<Element>(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// dQ's share dS K: this warp's 32 rows x head_dim / 4 columns, k = the tile's 128 keys. A = dS [query][key];
// B = K [key][dim], read with .trans.
template <typename Element, int kHeadDim>
__device__ inline void rows_by_dims(float (&acc)[2][kHeadDim / 32][4], uint32_t scores, uint32_t keys,
                                    int row0, int dim0, int lane) {
  using Tile = SwizzledTile<kHeadDim>;
  const LdmatrixRow a_at = a_operand_row(lane), kn_at = b_operand_row_kn(lane);
  const int a0 = ScoreTile::offset(row0 + a_at.row, a_at.col), b0 = Tile::offset(kn_at.row, kn_at.col);
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    uint32_t a[2][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) ldmatrix_x4(a[mt], scores + 2 * ScoreTile::step(a0, 16 * mt, 16 * kk));
#pragma unroll
    for (int np = 0; np < kHeadDim / 64; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, keys + 2 * Tile::step(b0, 16 * kk, dim0 + 16 * np));
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        mma_m16n8k16<Element>(acc[mt][2 * np], a[mt], b[0], b[1]);
        mma_m16n8k16<Element>(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// A warp's 32 x 32 square of P or dS into the [query][key] score tile, rounded to the element type: thread
// element (mt, nt, e) of the square is query row0 + 16 mt + group + 8 (e / 2), key key0 + 8 nt + 2 quad_lane
// + e % 2 (the mma accumulator's layout, tensor_core.cuh), so each pair (e, e + 1) is one 4-byte store.
template <typename Element>
__device__ inline void store_square(Element* scores, const float (&square)[2][4][4], int row0, int key0,
                                    int lane) {
  // The group's row and the quad's pair, inside the chunk: step() moves the chunk.
  const int at = ScoreTile::offset(row0 + lane / 4, 0) + 2 * (lane % 4);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        *reinterpret_cast<uint32_t*>(scores + ScoreTile::step(at, 16 * mt + 8 * half, key0 + 8 * nt)) =
            pack_pair<Element>(square[mt][nt][2 * half], square[mt][nt][2 * half + 1]);
}

// Bit (mt, nt, e) of a warp's square, in the order of store_square's elements.
__device__ constexpr int square_bit(int mt, int nt, int e) {
  return (mt * 4 + nt) * 4 + e;
}

// The key tile a block computes: the grid's (key tile, kv head, batch), or with kLongestFirst
// (cuda_v2/split_q_bwd64x128_longest_first) the one its number names in p.order, mirrored
// (SplitQBackwardParams::longest_first): the first key tiles, which the most Q tiles visit under a causal
// mask, start first. A template flag, so that the grid's own kernel is unchanged.
template <bool kLongestFirst>
__device__ inline cuda::Tile key_tile_of_block(const SplitQBackwardParams& p) {
  if constexpr (kLongestFirst) {
    return p.order.mirrored(static_cast<int>(blockIdx.x));
  } else {
    return {static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z)};
  }
}

// With kTiledDq (cuda_v2/split_q_bwd64x128_tiled_dq), dQ's accumulator is in the fragments' order
// (dq_tile.hpp): each of a thread's accumulators goes in one red.global.add.v4.f32 to a place known when
// compiling, past the thread's start in its Q tile, with no row's bounds (a padded row's share lands in the
// tile's padding, which dq_kernel never reads).
template <typename Element, int kHeadDim, bool kLongestFirst, bool kTiledDq>
__global__ void __launch_bounds__(kThreads) backward_64x128_kernel(const SplitQBackwardParams p) {
  const SplitQParams& f = p.forward;
  constexpr int kQTile = kBlockM * kHeadDim, kScores = kBlockM * kBlockN;
  Element* const sK = cuda::dynamic_shared_memory<Element>();           // [kBlockN][kHeadDim], swizzled
  Element* const sV = sK + kBlockN * kHeadDim;                          // [kBlockN][kHeadDim]
  Element* const sQ_buffers = sV + kBlockN * kHeadDim;                  // [2][kBlockM][kHeadDim]
  Element* const sdO_buffers = sQ_buffers + 2 * kQTile;                 // [2][kBlockM][kHeadDim]
  Element* const sP = sdO_buffers + 2 * kQTile;                         // [kBlockM][kBlockN], ScoreTile
  Element* const sdS = sP + kScores;                                    // [kBlockM][kBlockN], ScoreTile
  float* const sLse_buffers = reinterpret_cast<float*>(sdS + kScores);  // [2][kBlockM]
  float* const sD_buffers = sLse_buffers + 2 * kBlockM;                 // [2][kBlockM]

  const cuda::Tile mine = key_tile_of_block<kLongestFirst>(p);
  const int kv_tile = mine.block, head_kv = mine.head, b = mine.batch;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad_lane = lane % 4;  // mma fragment coordinates (tensor_core.cuh)
  const int key0 = kv_tile * kBlockN;
  // This warp's part of each product: rows of S, dP and dQ; keys of S, dP, dK and dV; columns of dK and dV,
  // and of dQ.
  const int warp_rows = kWarpRows * (warp / 4), warp_keys = kWarpKeys * (warp % 4);
  constexpr DqFragmentTile kDqTile{kHeadDim};
  static_assert(kDqTile.kRows == kBlockM && kDqTile.kThreads == kThreads && kDqTile.kWarpRows == kWarpRows,
                "dQ's tile is this kernel's");
  const int dkv_dims = kHeadDim / 2 * (warp / 4), dq_dims = kDqTile.first_col(warp);
  const int rows_q = cuda::rows_q(f, b);
  using Schedule = KeyTileSteps<kBlockM, kBlockN, kHeadDim, kThreads>;
  __shared__ typename Schedule::Notes notes;  // backward_steps.cuh
  Schedule::note(p, b, kv_tile, notes);
  __syncthreads();
  load_key_tile<kBlockN, kHeadDim, kThreads>(sK, sV, f, b, head_kv, key0);

  const float scale = f.softmax_scale;
  float dk[2][kHeadDim / 16][4] = {}, dv[2][kHeadDim / 16][4] = {};  // 32 keys x head_dim / 2 (line 7)

  // The steps of this key tile, as backward.cu's kernel takes them (backward_steps.cuh), 64 rows a step; a
  // step's Q_i, dO_i, LSE_i and D_i into one of two buffers.
  using Step = typename Schedule::Step;
  const Schedule schedule(p, notes, b, head_kv);
  const int steps = schedule.steps;
  const StepBuffers<Element, kBlockM, kHeadDim> buffers{sQ_buffers, sdO_buffers, sLse_buffers, sD_buffers};
  const auto load_step = [&](const Step& step, int buffer) { schedule.load(step, buffers[buffer]); };

  Step step = schedule.first_visit();
  if (step.number < steps) load_step(step, 0);
  for (int buffer = 0; step.number < steps; buffer ^= 1) {
    cp_async_wait<0>();  // this step's copies (and, the first time, K and V) have landed ...
    __syncthreads();     // ... everyone's; and the step before is done with P, dS and the other buffers
    // The next step's copy runs under this step's products. Its buffer's last readers were the step
    // before's dV and dK products, after that step's second barrier: only the barrier above orders them.
    const Step next = schedule.next_visit(step);
    if (next.number < steps) load_step(next, buffer ^ 1);
    const int head = step.head, row0 = step.row0;
    const auto [sQ, sdO, sLse, sD] = buffers[buffer];
    const auto square_row = [&](int mt, int e) { return warp_rows + 16 * mt + group + 8 * (e / 2); };

    // S = Q_i K_j^T (line 9).
    float s[2][4][4] = {};
    rows_by_keys<Element, kHeadDim>(s, ptx::shared_address(sQ), ptx::shared_address(sK), warp_rows, warp_keys,
                                    lane);

    // P = exp(S scale - LSE) (line 10) where the element is visible to a valid row, else exactly 0. A tile
    // inside the mask's band and the rows' length (nearly every tile of a non-causal problem) forms no
    // element mask; the others record in `hidden` which of this thread's 32 elements are hidden.
    uint32_t hidden = 0;
    if (step.full && row0 + kBlockM <= rows_q) {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float lse = sLse[square_row(mt, e)];
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
            s[mt][nt][e] = recomputed_probability<true>(s[mt][nt][e], scale, lse);
        }
    } else {
      const BlockMask block = schedule.block(step);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = square_row(mt, e), row = row0 + r;
          const KeyRange band = BlockMask::band(f, block, row);
          const float lse = sLse[r];
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
            const int key = key0 + warp_keys + 8 * nt + 2 * quad_lane + e % 2;
            if (row < rows_q && element_visible(f, band, row, key)) {
              s[mt][nt][e] = recomputed_probability<true>(s[mt][nt][e], scale, lse);
            } else {
              s[mt][nt][e] = 0.0f;
              hidden |= 1u << square_bit(mt, nt, e);
            }
          }
        }
    }
    store_square(sP, s, warp_rows, warp_keys, lane);  // dV's operand, rounded as the forward's P V rounds P

    // dP = dO_i V_j^T (line 12), as S.
    float dp[2][4][4] = {};
    rows_by_keys<Element, kHeadDim>(dp, ptx::shared_address(sdO), ptx::shared_address(sV), warp_rows,
                                    warp_keys, lane);

    // dS = P (dP - D) (line 13), its scale left to dK's and dQ's sums. It replaces P in s.
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float d = sD[square_row(mt, e)];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) s[mt][nt][e] = score_gradient(s[mt][nt][e], dp[mt][nt][e], d);
      }
    // Exactly 0 where hidden, so that a NaN or Inf in a hidden dP (from dO or V) cannot come through as
    // 0 x NaN. Only a thread with a hidden element selects: on a full tile, one branch (selecting every
    // element took 56 instructions a step, the sm_90a SASS).
    if (hidden != 0) {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if ((hidden >> square_bit(mt, nt, e)) & 1u) s[mt][nt][e] = 0.0f;
    }
    store_square(sdS, s, warp_rows, warp_keys, lane);
    __syncthreads();  // P and dS are the block's

    // dV_j += P^T dO_i (line 11).
    accumulate_keys_by_dims<Element, kHeadDim>(dv, ptx::shared_address(sP), ptx::shared_address(sdO),
                                               warp_keys, dkv_dims, lane);

    // dQ_i += dS K_j (line 14): the race of docs/08, by fp32 atomics into dQ's accumulator. In row order,
    // this lane's four rows' addresses are formed once a step and each element adds a constant offset; a
    // lane's two adjacent columns go in one red.global.add.v2.f32 (on the H200 these adds, two a pair, kept
    // the L2's input busy for most of the kernel: docs/08, "the products' addresses from bases converted
    // once"). In the fragments' order (kTiledDq), each accumulator goes whole to the thread's start in the
    // tile plus a constant (fragment() is the thread's offset plus the accumulator's), a warp's add 512
    // contiguous bytes.
    float dq[2][kHeadDim / 32][4] = {};
    rows_by_dims<Element, kHeadDim>(dq, ptx::shared_address(sdS), ptx::shared_address(sK), warp_rows, dq_dims,
                                    lane);
    if constexpr (kTiledDq) {
      float* const at = p.dq_accum + dq_tile_begin(p, b, head, row0) + kDqTile.fragment(threadIdx.x, 0, 0);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < kHeadDim / 32; ++nt)
          ptx::red_add_f32x4(at + kDqTile.fragment(0, mt, nt), dq[mt][nt]);
    } else {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = row0 + square_row(mt, 2 * half);
          if (row >= rows_q) continue;
          add_row_pairs(p.dq_accum + row_index(f, b, head, row) * kHeadDim + dq_dims + 2 * quad_lane, dq[mt],
                        half);
        }
    }

    // dK_j += dS^T Q_i (line 15), as dV.
    accumulate_keys_by_dims<Element, kHeadDim>(dk, ptx::shared_address(sdS), ptx::shared_address(sQ),
                                               warp_keys, dkv_dims, lane);
    step = next;
  }
  cp_async_wait<0>();  // K and V, when no Q tile saw this key tile

  // dK_j scale, dV_j (line 17), once; padded keys past the batch's length hold 0 (packed, they do not exist).
  const int stored_keys = cuda::stored_rows_k(f, b);
  Element* const dk_out = static_cast<Element*>(p.dk) + cuda::k_begin(f, b) + head_kv * f.k_head_stride;
  Element* const dv_out = static_cast<Element*>(p.dv) + cuda::v_begin(f, b) + head_kv * f.v_head_stride;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < kHeadDim / 16; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int key = key0 + warp_keys + 16 * mt + group + 8 * half,
                  col = dkv_dims + nt * 8 + 2 * quad_lane;
        if (key >= stored_keys) continue;
        const float dk0 = dk[mt][nt][2 * half] * scale, dk1 = dk[mt][nt][2 * half + 1] * scale;
        const float dv0 = dv[mt][nt][2 * half], dv1 = dv[mt][nt][2 * half + 1];
        *reinterpret_cast<uint32_t*>(dk_out + key * f.k_row_stride + col) = pack_pair<Element>(dk0, dk1);
        *reinterpret_cast<uint32_t*>(dv_out + key * f.v_row_stride + col) = pack_pair<Element>(dv0, dv1);
        if (!isfinite(dk0 + dk1 + dv0 + dv1)) atomicExch(p.nonfinite, 1);  // exact_kernel's cue
      }
}

template <int kHeadDim, bool kLongestFirst, bool kTiledDq = false>
void launch_order(dim3 grid, const SplitQBackwardParams& p, cudaStream_t stream) {
  launch_backward_tile<backward_64x128_kernel<__nv_bfloat16, kHeadDim, kLongestFirst, kTiledDq>>(
      grid, kThreads, smem_bytes<kHeadDim>(), kBlockM, kBlockN, kHeadDim, stream, p);
}

// The grid's blocks: (key tile, kv head, batch), or as many numbered in p.order; dQ's accumulator in row
// order, or in the fragments' order.
template <int kHeadDim>
void launch_head_dim(dim3 grid, const SplitQBackwardParams& p, cudaStream_t stream) {
  if (p.longest_first) {
    const dim3 ordered(p.order.tiles());
    if (p.dq_tiled) return launch_order<kHeadDim, true, true>(ordered, p, stream);
    return launch_order<kHeadDim, true>(ordered, p, stream);
  }
  if (p.dq_tiled) return launch_order<kHeadDim, false, true>(grid, p, stream);
  launch_order<kHeadDim, false>(grid, p, stream);
}

}  // namespace

namespace FLASHLAB_CUDA_TARGET {

void launch_backward_64x128_kernel(dim3 grid, const SplitQBackwardParams& p, cudaStream_t stream) {
  if (p.forward.head_dim == 64) return launch_head_dim<64>(grid, p, stream);
  launch_head_dim<128>(grid, p, stream);  // check_split_q_backward admits 64 and 128 only
}

}  // namespace FLASHLAB_CUDA_TARGET

}  // namespace flashlab::cuda_v2
