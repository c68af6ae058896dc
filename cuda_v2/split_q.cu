// cuda_v2/split_q: FlashAttention-2 forward on tensor cores (Dao 2023, Algorithm 1), fp16/bf16 in and out,
// fp32 accumulation.
//
// One thread block per (q-block, head, batch): the grid covers the query blocks, so a long sequence fills the
// GPU even at batch 1 (FA2 change 1). Each of its warps owns 16 or 32 query rows for the whole kernel and
// walks all key tiles itself (split-Q, FA2 change 2): a row's statistics and output never leave the warp, so
// there is no inter-warp reduction. The output stays unnormalized until the last tile (FA2 change 3: one
// division per row, at the end).
//
// Per key tile j (Algorithm 1 lines 6-11), for a warp's rows:
//   S = Q K_j^T                 mma.sync m16n8k16; Q and K_j come from swizzled shared memory via ldmatrix
//   m_new = max(m, rowmax(S))   reduced across the lane quad that holds a row (see tensor_core.cuh)
//   P = exp2(S * scale * log2(e) - m_new)   scores in the log2 domain: FMUL, FADD and EX2 per element
//   l = l * exp2(m - m_new) + rowsum(P)
//   O = O * exp2(m - m_new) + P V_j        P rounded to fp16/bf16 for the mma
// and at the end O / l and LSE = (m + log2 l) * ln 2. K/V tile j+1 is copied with cp.async while tile j is
// used.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "common/cuda/check.hpp"
#include "common/cuda/exact_rows.cuh"
#include "common/cuda/int_lengths.hpp"
#include "common/cuda/launch.cuh"
#include "common/cuda/ptx.cuh"
#include "common/cuda/tile_width.hpp"
#include "common/cuda/warp_reduce.cuh"
#include "cuda_v2/block_mask.cuh"
#include "cuda_v2/split_q.hpp"
#include "cuda_v2/tensor_core.cuh"
#include "cuda_v2/variants.cuh"

namespace flashlab::cuda_v2 {
namespace {

// Tile sizes per tile width (the compiled head dims, common/cuda/tile_width.hpp: a head dim runs in the
// narrowest that holds it). Each warp owns kMTiles row tiles of 16 query rows (kBlockM = 16 * kMTiles *
// kWarps); a K or V fragment loaded with ldmatrix then feeds kMTiles mma instead of one, which halves the
// shared-memory traffic per mma at kMTiles = 2 (shared-memory bandwidth, not the tensor cores, bounds
// mma.sync kernels on H100). Registers bound the tiles: a thread holds kMTiles * kHeadDim / 2 fp32 of O and
// kMTiles * kBlockN / 2 of S, so d = 256 keeps one row tile and a narrower key tile. Shared memory: Q once, K
// and V twice (double buffer), all in b16. Each width between takes the tiles of the width above it, 96
// those of 128 and 192 those of 256; 32 takes 64's warps but 64 keys a tile (NarrowKeys64 below).
template <int kHeadDim>
struct SplitQConfig;
// The 64 width's tiles, 4 warps of two row tiles over 128 query rows. FA2's key tile: 128 keys, so that per
// 128 keys a warp loads its Q fragments, reduces its rows' max, rescales O and waits at the barriers once
// instead of twice. S is then 128 fp32 a thread: ptxas (nvcc 13) gives it all 255 registers and spills about
// 170-210 bytes (FA2's own kernel: 272); two blocks of 128 threads still fit an SM. On an H200 it ran
// 1.09-1.13x faster than 64 keys a tile on every d 64 shape but the causal one at 1k keys, 0.97x there
// (2026-12-04, as cuda_v2/split_q_bc128; 2 x 32 x 8k: 318 TFLOP/s against 283).
struct WideKeys64 {
  static constexpr int kWarps = 4, kMTiles = 2, kBlockN = split_q_tile(64).block_n;
};
// 64 keys a tile, S 64 fp32 a thread: the kernels with the variants keep it, their registers would not fit
// beside 128 keys, and so does the 32 width, where 128 keys spill (ptxas: 76-88 bytes; this, none) and no GPU
// has timed the two. cuda_v2/split_q_bc64 times it beside split_q at the 64 width.
struct NarrowKeys64 {
  static constexpr int kWarps = 4, kMTiles = 2, kBlockN = split_q_tile(64, true).block_n;
};
template <>
struct SplitQConfig<64> : WideKeys64 {};
// The 128 width's 128 x 64 tile in two warp layouts. FA2's: 4 warps of two row tiles, a warp reading 160
// shared-memory bytes per mma. ptxas (nvcc 13) gives it all 255 registers and spills about 50-80 bytes;
// two blocks of 128 threads fit an SM. On an H200 it ran 1.23-1.32x faster than the other on every prefill
// shape at d 128 (2026-12-04; 2 x 16 x 8k: 356 TFLOP/s against 270), despite the spill.
struct TwoRowTiles128 {
  static constexpr int kWarps = 4, kMTiles = 2, kBlockN = split_q_tile(128).block_n;
};
// 8 warps of one row tile: 288 shared-memory bytes per mma, and registers to spare. The kernels with the
// variants (variants.cuh) keep it: their score modification and dropout need registers that FA2's layout
// has not got. cuda_v2/split_q_8warps times it beside split_q.
struct OneRowTile128 {
  static constexpr int kWarps = 8, kMTiles = 1, kBlockN = split_q_tile(128).block_n;
};
template <>
struct SplitQConfig<128> : TwoRowTiles128 {};
template <>
struct SplitQConfig<256> {
  static constexpr int kWarps = 4, kMTiles = 1, kBlockN = split_q_tile(256).block_n;
};
template <>
struct SplitQConfig<32> : NarrowKeys64 {};
template <>
struct SplitQConfig<96> : SplitQConfig<128> {};
template <>
struct SplitQConfig<192> : SplitQConfig<256> {};

// The kernels with the variants: split_q's tiles, but 64 keys a tile at the 64 width and 8 warps of one row
// tile at the 128 width (and 96).
template <int kHeadDim>
struct VariantsConfig : SplitQConfig<kHeadDim> {};
template <>
struct VariantsConfig<64> : NarrowKeys64 {};
template <>
struct VariantsConfig<128> : OneRowTile128 {};
template <>
struct VariantsConfig<96> : OneRowTile128 {};

// The tensor-core ladder (docs/04-cuda-v2.md, "The tensor-core ladder"): cuda_v2/mma (mma.cu) loads the mma's
// operands element by element; this kernel uses ldmatrix and a swizzled layout at every rung, and each rung
// adds one idea over the one before.
struct LdmatrixRung {                        // cuda_v2/mma_ldmatrix
  static constexpr bool kAsyncCopy = false;  // synchronous copies of the K/V tiles, one stage
  static constexpr bool kSkipTiles = false;  // every key tile up to the batch's last key, masked element-wise
  static constexpr int kWidth = 0;           // every tile width (SplitQConfig)
  static constexpr bool kTileOrder = false;  // the grid's own order of tiles (SplitQRung below)
};
struct CpAsyncRung {                        // cuda_v2/mma_cp_async
  static constexpr bool kAsyncCopy = true;  // + cp.async double buffering: tile j + 1 loads while j is used
  static constexpr bool kSkipTiles = false;
  static constexpr int kWidth = 0;
  static constexpr bool kTileOrder = false;
};
struct SplitQRung {  // cuda_v2/split_q
  static constexpr bool kAsyncCopy = true;
  static constexpr bool kSkipTiles = true;  // + FA2's block skipping: only the tiles a valid row sees
  static constexpr int kWidth = 0;
  // Beside the ladder, its grid may also be numbered in another order (SplitQParams::longest_first,
  // cuda_v2/split_q_longest_first); the other rungs keep the grid's own, so that their code is unchanged.
  static constexpr bool kTileOrder = true;
};

// Beside the ladder, two entries of split_q's kernel with other tiles, each built for one tile width, bf16
// only, with no score modification or dropout (check_one_width, split_q_params.cpp).
//
// cuda_v2/split_q_8warps, at the 128 width: split_q's layout before FA2's (OneRowTile128 above), 8 warps of
// one row tile, so that a GPU run times the two layouts side by side.
struct EightWarpsRung {
  static constexpr bool kAsyncCopy = true;
  static constexpr bool kSkipTiles = true;
  static constexpr int kWidth = 128;
  static constexpr bool kTileOrder = false;
};
// cuda_v2/split_q_bc64, at the 64 width: split_q's tile before FA2's (NarrowKeys64 above), 64 keys a tile.
struct NarrowKeysRung {
  static constexpr bool kAsyncCopy = true;
  static constexpr bool kSkipTiles = true;
  static constexpr int kWidth = 64;
  static constexpr bool kTileOrder = false;
};

// The tiles a rung takes in a tile width: split_q's, or its variants' kernel's, but for the entries built
// for one width.
template <int kHeadDim, class Rung, class Variant>
struct RungConfig : std::conditional_t<std::is_same_v<Variant, Variants>, VariantsConfig<kHeadDim>,
                                       SplitQConfig<kHeadDim>> {};
template <>
struct RungConfig<128, EightWarpsRung, NoVariant> : OneRowTile128 {};
template <>
struct RungConfig<64, NarrowKeysRung, NoVariant> : NarrowKeys64 {};

template <int kHeadDim, class Rung, class Variant>
struct SplitQShape {
  using Config = RungConfig<kHeadDim, Rung, Variant>;
  static_assert(Rung::kWidth == 0 || Rung::kWidth == kHeadDim, "an entry built for one tile width");
  static_assert(Rung::kWidth == 0 || std::is_same_v<Variant, NoVariant>,
                "the entries of one tile width take no variant (RungConfig gives them their own tiles)");
  static constexpr int kWarps = Config::kWarps;
  static constexpr int kMTiles = Config::kMTiles;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWarpRows = 16 * kMTiles;  // query rows owned by one warp
  static constexpr int kBlockM = kWarpRows * kWarps;
  static constexpr int kBlockN = Config::kBlockN;
  static constexpr int kStages = Rung::kAsyncCopy ? 2 : 1;  // K/V double buffer, or one stage
  static constexpr int kSmemElements = kBlockM * kHeadDim + 2 * kStages * kBlockN * kHeadDim;
  static constexpr int kSmemBytes = kSmemElements * 2;
  static_assert(kBlockM == split_q_tile(kHeadDim).block_m,
                "split_q_tile (split_q.hpp) states the query tile");
  static_assert(Rung::kWidth != 0 ||
                    kBlockN == split_q_tile(kHeadDim, std::is_same_v<Variant, Variants>).block_n,
                "split_q_tile (split_q.hpp) states the key tile, which the traffic models read");
};

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 2^x in one MUFU.EX2 instruction (relative error ~2^-22, far below fp16/bf16 rounding); 2^-inf = +0.
// Subnormal results are flushed to zero (.ftz, as FlashAttention's kernels and ws do): a weight below 2^-126
// of the row's largest (which is 1) adds nothing to the row sum. Without .ftz ptxas guards each MUFU.EX2 with
// a test and two scalings for a subnormal result: 3 more instructions an element, 192 of a full key tile's
// in split_q's kernel at d 128.
__device__ inline float fast_exp2(float x) {
  return ptx::ex2_approx<true>(x);
}

// This block's tile: (blockIdx.x, blockIdx.y, blockIdx.z) of the grid (q-block, head, batch), or, where the
// rung takes another order and the launch asks for it, tile blockIdx.x of p.order.
template <class Rung>
__device__ inline cuda::Tile tile_of_block(const SplitQParams& p) {
  if constexpr (Rung::kTileOrder)
    if (p.longest_first) return p.order(static_cast<int>(blockIdx.x));
  return cuda::Tile{static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z)};
}

// kHeadDim: the tile width the kernel is compiled for; the problem's head dim p.head_dim is at most that, and
// its lanes past p.head_dim are zeros (common/cuda/tile_width.hpp). Variant: NoVariant, or Variants for a
// problem with a score modification or dropout (variants.cuh). Rung: the ladder's rung (LdmatrixRung,
// CpAsyncRung, SplitQRung above).
template <typename Element, int kHeadDim, class Variant, class Rung>
__global__ void __launch_bounds__(SplitQShape<kHeadDim, Rung, Variant>::kThreads, 1)
    split_q_kernel(const SplitQParams p) {
  using Shape = SplitQShape<kHeadDim, Rung, Variant>;
  using Tile = SwizzledTile<kHeadDim>;
  constexpr int kBlockM = Shape::kBlockM, kBlockN = Shape::kBlockN, kThreads = Shape::kThreads;
  constexpr int kMTiles = Shape::kMTiles;
  constexpr int kRows = 2 * kMTiles;      // accumulator rows per thread: g and g + 8 of each row tile
  constexpr int kNTilesS = kBlockN / 8;   // 8-wide mma n-tiles of S
  constexpr int kNTilesO = kHeadDim / 8;  // 8-wide mma n-tiles of O

  Element* const sQ = cuda::dynamic_shared_memory<Element>();    // [kBlockM][kHeadDim]
  Element* const sK = sQ + kBlockM * kHeadDim;                   // [kStages][kBlockN][kHeadDim]
  Element* const sV = sK + Shape::kStages * kBlockN * kHeadDim;  // [kStages][kBlockN][kHeadDim]

  // FA2 change 1: the grid is (q-block, head, batch). split_q_longest_first numbers the same tiles in
  // p.order's order on a grid of one dimension: under a causal mask the longest first (tile_order.hpp).
  const cuda::Tile mine = tile_of_block<Rung>(p);
  const int q_block = mine.block, head = mine.head, b = mine.batch;
  const int head_kv = head / (p.heads_q / p.heads_kv);  // GQA/MQA by indexing: no K/V copies
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad_lane = lane % 4;  // mma fragment coordinates (tensor_core.cuh)
  const int row_begin = q_block * kBlockM;
  BlockMask block = BlockMask::make<kBlockN>(p, b, row_begin, row_begin + kBlockM);
  if constexpr (!Rung::kSkipTiles) block.visit_every_tile<kBlockN>();  // the rungs before block skipping

  // Batch element b's rows, padded or packed (split_q.hpp): only its stored rows exist.
  const int stored_rows = cuda::stored_rows_q(p, b);
  const Element* const q = static_cast<const Element*>(p.q) + cuda::q_begin(p, b) + head * p.q_head_stride;
  const Element* const k = static_cast<const Element*>(p.k) + cuda::k_begin(p, b) + head_kv * p.k_head_stride;
  const Element* const v = static_cast<const Element*>(p.v) + cuda::v_begin(p, b) + head_kv * p.v_head_stride;

  // Prologue: Q once (Algorithm 1 line 4), then the first K/V tile; each is its own cp.async group.
  if constexpr (Rung::kAsyncCopy) {
    load_tile_async<kBlockM, kHeadDim, kThreads>(sQ, q, p.q_row_stride, row_begin, stored_rows, p.head_dim);
    cp_async_commit();
    if (block.tile_begin < block.tile_end) {
      load_tile_async<kBlockN, kHeadDim, kThreads>(sK, k, p.k_row_stride, block.tile_begin * kBlockN,
                                                   block.rows_k, p.head_dim);
      load_tile_async<kBlockN, kHeadDim, kThreads>(sV, v, p.v_row_stride, block.tile_begin * kBlockN,
                                                   block.rows_k, p.head_dim);
    }
    cp_async_commit();
  } else {
    load_tile_sync<kBlockM, kHeadDim, kThreads>(sQ, q, p.q_row_stride, row_begin, stored_rows, p.head_dim);
  }

  // FA2 change 2 (split-Q): this warp owns rows [warp_row, warp_row + kWarpRows) of the block for the whole
  // kernel. This thread holds accumulator rows g and g + 8 of each of its row tiles: row index i = 2 mt + r.
  const int warp_row = warp * Shape::kWarpRows;
  int rows[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) rows[i] = row_begin + warp_row + (i / 2) * 16 + group + (i % 2) * 8;

  // The shared-memory row each lane hands to ldmatrix, per operand (tensor_core.cuh), and its offset in the
  // first fragment; the other fragments' offsets are moved from it (SwizzledTile::moved).
  const LdmatrixRow q_at = a_operand_row(lane), k_at = b_operand_row_nk(lane), v_at = b_operand_row_kn(lane);
  const int q_row = warp_row + q_at.row, q0 = Tile::offset(q_row, q_at.col);
  const int k0 = Tile::offset(k_at.row, k_at.col), v0 = Tile::offset(v_at.row, v_at.col);

  const float scale_log2 = p.softmax_scale * kLog2e;  // exp(scale * s) = exp2(scale * log2(e) * s)
  float o_acc[kMTiles][kNTilesO][4] = {};             // O~: unnormalized output (Algorithm 1 line 10)
  // m, the max of the unscaled scores s: the log2 domain's max is raw_max * scale_log2 (rounded as each
  // score is), and the LSE takes the natural domain's
  float raw_max[kRows];
  float row_sum[kRows];  // l, this thread's columns only; the quad sum is deferred to the end
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    raw_max[i] = -INFINITY;
    row_sum[i] = 0.0f;
  }

  for (int tile = block.tile_begin; tile < block.tile_end; ++tile) {
    const int stage = (tile - block.tile_begin) % Shape::kStages;
    // K_j's and V_j's stage as shared-window addresses (bytes): a fragment's ldmatrix takes the base plus its
    // offset. (From a generic pointer a fragment, ptxas formed each K and V address in three instructions
    // more: the stage's offset, the scale to bytes and the base, for every XOR along the row; sm_90a SASS.)
    constexpr uint32_t kElementBytes = sizeof(Element), kStageBytes = kBlockN * kHeadDim * kElementBytes;
    const uint32_t kj = ptx::shared_address(sK) + stage * kStageBytes;
    const uint32_t vj = ptx::shared_address(sV) + stage * kStageBytes;
    if constexpr (Rung::kAsyncCopy) {
      // Prefetch tile + 1 into the other stage (freed by the barrier that ended the previous iteration).
      if (tile + 1 < block.tile_end) {
        Element* const next_k = sK + (stage ^ 1) * kBlockN * kHeadDim;
        Element* const next_v = sV + (stage ^ 1) * kBlockN * kHeadDim;
        load_tile_async<kBlockN, kHeadDim, kThreads>(next_k, k, p.k_row_stride, (tile + 1) * kBlockN,
                                                     block.rows_k, p.head_dim);
        load_tile_async<kBlockN, kHeadDim, kThreads>(next_v, v, p.v_row_stride, (tile + 1) * kBlockN,
                                                     block.rows_k, p.head_dim);
      }
      cp_async_commit();  // possibly empty: keeps "all but the newest group" meaning "tile `tile` has landed"
      cp_async_wait<1>();
    } else {
      // K_j and V_j through registers, while every thread waits (the barrier that ended the previous
      // iteration freed the one stage; the first time, it also publishes Q).
      load_tile_sync<kBlockN, kHeadDim, kThreads>(sK, k, p.k_row_stride, tile * kBlockN, block.rows_k,
                                                  p.head_dim);
      load_tile_sync<kBlockN, kHeadDim, kThreads>(sV, v, p.v_row_stride, tile * kBlockN, block.rows_k,
                                                  p.head_dim);
    }
    __syncthreads();

    // S = Q K_j^T (Algorithm 1 line 8). A = the warp's Q row tiles; B = K_j's rows used as columns (K needs
    // no transpose). Each K fragment serves all kMTiles row tiles.
    float s[kMTiles][kNTilesS][4] = {};
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
        ldmatrix_x4(a[mt], sQ + Tile::moved(q0, q_row, q_at.col, mt * 16, kk * 16));
#pragma unroll
      for (int np = 0; np < kNTilesS / 2; ++np) {
        uint32_t bk[4];  // b0, b1 of n-tiles 2np and 2np + 1
        ldmatrix_x4(bk, kj + kElementBytes * Tile::moved(k0, k_at.row, k_at.col, np * 16, kk * 16));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_m16n8k16<Element>(s[mt][2 * np], a[mt], bk[0], bk[1]);
          mma_m16n8k16<Element>(s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
        }
      }
    }

    // The score modification (Variant::score: soft-capping, ALiBi, a bias) before the mask and the max; rows
    // and keys past the tensors' ends are left alone, the mask hides them. Then the mask, only where the tile
    // is cut by one (the diagonal, a window edge, the ragged end, an explicit mask).
    const int key0 = tile * kBlockN;
    const bool modified = Variant::modifies_scores(p), cut = !block.tile_is_full<kBlockN>(key0);
    if (modified || cut) {
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        // Each row's visible keys (common/mask.hpp), formed here rather than held in registers across the
        // tiles: only a cut tile needs them.
        const KeyRange keys = BlockMask::band(p, block, rows[i]);
        const int mt = i / 2, r = i % 2;
#pragma unroll
        for (int nt = 0; nt < kNTilesS; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float& score = s[mt][nt][2 * r + c];
            const int key = key0 + nt * 8 + 2 * quad_lane + c;
            if (modified && rows[i] < p.seqlen_q && key < p.seqlen_k)
              score = Variant::score(p, score, b, head, rows[i], key, block.rows_q, block.rows_k);
            if (cut && !element_visible(p, keys, rows[i], key)) score = -INFINITY;
          }
      }
    }

    // Online softmax (Algorithm 1 lines 9-10), each row's max reduced over its quad. The scores are taken to
    // the log2 domain first, each rounded once, so that the row max is one of them and its own weight is
    // exactly exp2(0) = 1. (exp2(fma(s, scale_log2, -max)) would leave the max's rounding error in its own
    // exponent: with scores ~1e4 that is 2^(+-5e-4), which P's rounding to fp16 for the mma turns into a
    // one-ulp error in O that the fp32 row sum does not share.) The max is taken of the unscaled scores and
    // then scaled: rounding is monotone, so that is the max of the scaled ones, and the unscaled max gives
    // the LSE in the natural domain the backward recomputes P in (backward.cu).
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int mt = i / 2, r = i % 2;
      float tile_max = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kNTilesS; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          tile_max = fmaxf(tile_max, s[mt][nt][2 * r + c]);
          s[mt][nt][2 * r + c] = __fmul_rn(s[mt][nt][2 * r + c], scale_log2);  // never fused with - max
        }
      // Both maxima are rounded products, as each score is: a plain product here lets nvcc fuse it with the
      // subtraction below (an FFMA), and a max that did not grow then gives a rescale of 2^(its rounding
      // error), not 1. l and O take that factor each tile, so O / l hides it but the LSE keeps it: with
      // scores ~1e4 and 2000 keys it moved the backward's P by 3% on an H200 (the emulator does not fuse).
      const float old_max = __fmul_rn(raw_max[i], scale_log2);
      raw_max[i] = fmaxf(raw_max[i], quad_max(tile_max));
      const float new_max = __fmul_rn(raw_max[i], scale_log2);
      // Every key so far masked (new_max = -inf): subtract 0 instead, since -inf - (-inf) would be NaN; the
      // masked scores then give exp2(-inf) = 0 and the row stays empty.
      const float max_used = new_max == -INFINITY ? 0.0f : new_max;
      const float rescale = fast_exp2(old_max - max_used);  // 0 when old_max was -inf: nothing to keep
      row_sum[i] *= rescale;
      // A warp none of whose rows i grew leaves O as it is, to the bit (common/cuda/warp_reduce.cuh).
      if (cuda::warp_must_rescale(rescale)) {
#pragma unroll
        for (int nt = 0; nt < kNTilesO; ++nt) {
          o_acc[mt][nt][2 * r] *= rescale;
          o_acc[mt][nt][2 * r + 1] *= rescale;
        }
      }
#pragma unroll
      for (int nt = 0; nt < kNTilesS; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float weight = fast_exp2(s[mt][nt][2 * r + c] - max_used);
          row_sum[i] += weight;  // l sums P in fp32, before P is rounded for the mma
          // S becomes P in place (Variant::weight: dropout, after the normalizer).
          s[mt][nt][2 * r + c] =
              Variant::weight(p, weight, b, head, rows[i], key0 + nt * 8 + 2 * quad_lane + c);
        }
    }

    // O += P V_j (Algorithm 1 line 10). The S accumulators of n-tiles 2kk and 2kk + 1 are exactly the A
    // fragment of k-step kk, so P goes from registers to the tensor cores without touching shared memory.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        a[mt][0] = pack_pair<Element>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = pack_pair<Element>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = pack_pair<Element>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = pack_pair<Element>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int np = 0; np < kNTilesO / 2; ++np) {
        uint32_t bv[4];  // V_j is [key][dim] = B row-major: ldmatrix.trans gives the column-major fragment
        ldmatrix_x4_trans(bv, vj + kElementBytes * Tile::moved(v0, v_at.row, v_at.col, kk * 16, np * 16));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_m16n8k16<Element>(o_acc[mt][2 * np], a[mt], bv[0], bv[1]);
          mma_m16n8k16<Element>(o_acc[mt][2 * np + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before the next iteration loads into it
  }
  // With no tile at all, Q's copies (made by every thread) may still be in flight into the buffer reused
  // below (or, without cp.async, still unpublished).
  if constexpr (Rung::kAsyncCopy) cp_async_wait<0>();
  __syncthreads();

  // Epilogue (Algorithm 1 lines 12-13), FA2 change 3: one division per row, at the end; LSE = m + log l, back
  // to natural log.
  float lse[kRows];
  bool special = false;  // whether this thread writes a NaN or an Inf (the exact pass's flag, below)
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int mt = i / 2, r = i % 2;
    const float l = quad_sum(row_sum[i]);
    // A padded row, or one whose every key is masked, is fully masked: O = 0 and LSE = -inf by definition.
    // Its accumulator is not used at all (a padded row may have accumulated anything), so no 0/0 and no NaN.
    const bool empty = rows[i] >= block.rows_q || l == 0.0f;
    const float inv_l = empty ? 0.0f : 1.0f / l;
    // LSE = max + log l in the natural domain: the max's own scaling rounded as the backward rounds S scale,
    // so that where one key dominates a row (scores ~1e4, LSE ~4e4 with a float ulp of 0.004) the backward's
    // S scale - LSE is exactly 0 for it.
    lse[i] = empty ? -INFINITY : __fmul_rn(raw_max[i], p.softmax_scale) + log2f(l) * kLn2;
#pragma unroll
    for (int nt = 0; nt < kNTilesO; ++nt) {
      o_acc[mt][nt][2 * r] = empty ? 0.0f : o_acc[mt][nt][2 * r] * inv_l;
      o_acc[mt][nt][2 * r + 1] = empty ? 0.0f : o_acc[mt][nt][2 * r + 1] * inv_l;
      special |= !isfinite(o_acc[mt][nt][2 * r]) || !isfinite(o_acc[mt][nt][2 * r + 1]);
    }
  }
  // A NaN or Inf input reaches O through P V even for the keys a row does not see (0 x NaN): the exact pass
  // after this kernel repairs such rows, and runs only when some thread noted one (exact_rows.hpp).
  cuda::note_special_rows(p.special_rows, special);

  // O goes through this warp's own rows of sQ (no other warp reads them any more) so that global stores are
  // whole 16-byte chunks of a row, coalesced, instead of 4-byte fragments.
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int nt = 0; nt < kNTilesO; ++nt)
      *reinterpret_cast<uint32_t*>(sQ + Tile::offset(rows[i] - row_begin, nt * 8) + 2 * quad_lane) =
          pack_pair<Element>(o_acc[i / 2][nt][2 * (i % 2)], o_acc[i / 2][nt][2 * (i % 2) + 1]);
  __syncwarp();
  Element* const o = static_cast<Element*>(p.o) + cuda::o_begin(p, b) + head * p.o_head_stride;
  constexpr int kChunksPerRow = kHeadDim / 8;
  for (int chunk = lane; chunk < Shape::kWarpRows * kChunksPerRow; chunk += 32) {
    const int r = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
    const int row = row_begin + warp_row + r;
    // The last q-block's rows past seqlen_q (packed: the sequence) do not exist, nor do the columns past
    // head_dim of a head dim narrower than the tile (its zero lanes).
    if (row < stored_rows && col < p.head_dim)
      *reinterpret_cast<uint4*>(o + row * p.o_row_stride + col) =
          *reinterpret_cast<const uint4*>(sQ + Tile::offset(warp_row + r, col));
  }
  if (quad_lane == 0) {
    float* const lse_row = p.lse + cuda::lse_begin(p, b, head);
#pragma unroll
    for (int i = 0; i < kRows; ++i)
      if (rows[i] < stored_rows) lse_row[rows[i]] = lse[i];
  }
}

template <typename Element, int kHeadDim, class Variant, class Rung>
void launch_kernel(const SplitQParams& p, cudaStream_t stream) {
  using Shape = SplitQShape<kHeadDim, Rung, Variant>;
  const auto kernel = split_q_kernel<Element, kHeadDim, Variant, Rung>;
  // Above 48 KiB a kernel must opt in to dynamic shared memory (per device, so on every launch; it is cheap).
  FLASHLAB_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape::kSmemBytes));
  const dim3 grid = p.longest_first
                        ? dim3(p.order.tiles())
                        : dim3((p.seqlen_q + Shape::kBlockM - 1) / Shape::kBlockM, p.heads_q, p.batch);
  cuda::launch_kernel<split_q_kernel<Element, kHeadDim, Variant, Rung>>(grid, dim3(Shape::kThreads),
                                                                        Shape::kSmemBytes, stream, p);
}

// The full kernel with the variants where the problem has one; the ladder's lower rungs and the entries of
// one tile width take none.
template <typename Element, int kHeadDim, class Rung>
void launch(const SplitQParams& p, cudaStream_t stream) {
  if constexpr (std::is_same_v<Rung, SplitQRung>)
    if (p.has_variants()) return launch_kernel<Element, kHeadDim, Variants, Rung>(p, stream);
  launch_kernel<Element, kHeadDim, NoVariant, Rung>(p, stream);
}

// The tile width the head dim runs in (common/cuda/tile_width.hpp); the ladder's lower rungs take exactly
// 64 and 128 (split_q_params.cpp).
template <class Rung, typename Element>
void dispatch_head_dim(const SplitQParams& p, cudaStream_t stream) {
  constexpr bool kFull = std::is_same_v<Rung, SplitQRung>;
  if constexpr (Rung::kWidth != 0) {
    launch<Element, Rung::kWidth, Rung>(p, stream);  // its one tile width (check_one_width)
  } else {
    switch (cuda::tile_width(p.head_dim)) {
      case 32:
        if constexpr (kFull) return launch<Element, 32, Rung>(p, stream);
        break;
      case 64:
        return launch<Element, 64, Rung>(p, stream);
      case 96:
        if constexpr (kFull) return launch<Element, 96, Rung>(p, stream);
        break;
      case 128:
        return launch<Element, 128, Rung>(p, stream);
      case 192:
        if constexpr (kFull) return launch<Element, 192, Rung>(p, stream);
        break;
      case 256:
        if constexpr (kFull) return launch<Element, 256, Rung>(p, stream);
        break;
    }
  }
}

// A rung on the registry's device tensors: the kernel, then the exact pass for special values, flagged
// (common/cuda/exact_rows.hpp): NaN and Inf as the reference (docs/08, "NaN and Inf").
template <class Rung>
void forward_rung(SplitQParams params, unsigned* special_rows, cudaStream_t stream) {
  params.special_rows = special_rows;
  if constexpr (Rung::kWidth == 0)  // the entries of one tile width are built for bf16 only
    if (params.dtype == DType::f16) {
      dispatch_head_dim<Rung, __half>(params, stream);
      cuda::exact_rows<__half>(cuda::exact_rows_params(params), stream);
      return;
    }
  dispatch_head_dim<Rung, __nv_bfloat16>(params, stream);
  cuda::exact_rows<__nv_bfloat16>(cuda::exact_rows_params(params), stream);
}

}  // namespace

namespace FLASHLAB_CUDA_TARGET {

SplitQParams split_q_params(const Problem& problem, const DeviceTensors& tensors) {
  SplitQParams params = cuda_v2::split_q_params(problem);
  params.q = tensors.q;
  params.k = tensors.k;
  params.v = tensors.v;
  params.o = tensors.o;
  params.lse = tensors.lse;
  params.mask = tensors.mask;
  params.mod.slopes = tensors.alibi_slopes;  // the device copies
  params.mod.bias = tensors.bias;
  const cuda::IntLengths lengths = cuda::narrow_lengths(problem, tensors, tensors.workspace);
  params.seqlens_q = lengths.seqlens_q;
  params.seqlens_k = lengths.seqlens_k;
  params.cu_seqlens_q = lengths.cu_seqlens_q;
  params.cu_seqlens_k = lengths.cu_seqlens_k;
  return params;
}

void split_q_forward(const SplitQParams& params, cudaStream_t stream) {
  check_split_q(params);
  forward_rung<SplitQRung>(params, params.special_rows, stream);  // null flag: the pass scans every row
}

void launch_split_q(const Problem& problem, const DeviceTensors& tensors) {
  const SplitQParams params = split_q_params(problem, tensors);
  check_split_q(params);
  forward_rung<SplitQRung>(params, cuda::clear_special_rows_flag(tensors.workspace, problem, tensors.stream),
                           tensors.stream);
}

void launch_mma_ldmatrix(const Problem& problem, const DeviceTensors& tensors) {
  const SplitQParams params = split_q_params(problem, tensors);
  check_split_q_rung(params);
  forward_rung<LdmatrixRung>(
      params, cuda::clear_special_rows_flag(tensors.workspace, problem, tensors.stream), tensors.stream);
}

void launch_split_q_8warps(const Problem& problem, const DeviceTensors& tensors) {
  const SplitQParams params = split_q_params(problem, tensors);
  check_split_q_8warps(params);
  forward_rung<EightWarpsRung>(
      params, cuda::clear_special_rows_flag(tensors.workspace, problem, tensors.stream), tensors.stream);
}

void launch_split_q_bc64(const Problem& problem, const DeviceTensors& tensors) {
  const SplitQParams params = split_q_params(problem, tensors);
  check_split_q_bc64(params);
  forward_rung<NarrowKeysRung>(
      params, cuda::clear_special_rows_flag(tensors.workspace, problem, tensors.stream), tensors.stream);
}

void launch_split_q_longest_first_sections(const Problem& problem, const DeviceTensors& tensors,
                                           int section) {
  SplitQParams params = split_q_params(problem, tensors);
  params.longest_first = true;
  params.order = split_q_longest_first_order(params, section);
  check_split_q_longest_first(params);
  forward_rung<SplitQRung>(params, cuda::clear_special_rows_flag(tensors.workspace, problem, tensors.stream),
                           tensors.stream);
}

void launch_split_q_longest_first(const Problem& problem, const DeviceTensors& tensors) {
  launch_split_q_longest_first_sections(problem, tensors, 0);
}

void launch_mma_cp_async(const Problem& problem, const DeviceTensors& tensors) {
  const SplitQParams params = split_q_params(problem, tensors);
  check_split_q_rung(params);
  forward_rung<CpAsyncRung>(params, cuda::clear_special_rows_flag(tensors.workspace, problem, tensors.stream),
                            tensors.stream);
}

}  // namespace FLASHLAB_CUDA_TARGET

}  // namespace flashlab::cuda_v2
