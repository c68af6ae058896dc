// decoding/cuda_split_kv_mma's split kernel: Flash-Decoding with the block's query rows on the tensor cores
// (docs/07b-decoding-gpu.md, "The query rows on the tensor cores").
//
//   split_kv_mma_kernel   one block per (split, kv head x row tile, batch), as split_kv_kernel: the partial
//                         (O_j, LSE_j) of its up to 16 query rows (a GQA group's heads times the query
//                         positions) over the keys of split j. The 16 rows are one m16 row tile of mma.sync:
//                         S = Q K^T and O += P V are tensor-core products, the rows a short group leaves
//                         empty computed on zeros. Each of the 4 warps takes 16 keys of every 64-key tile
//                         with its own online softmax, a split of the split; the 4 warps' states merge at the
//                         end (SoftmaxState::merge, the combine's own math).
//
// combine_kernel (cuda_split_kv.cuh) merges the splits as it does split_kv_kernel's: the partials are the
// same.
//
// split_kv_kernel does S and P V on the CUDA cores: each warp widens every K row of a tile for its own rows,
// and a thread adds P x V for 8 channels of a row, so a 16 KB tile of K and V costs the block about 5,000
// instructions, and the H200 ran it at 46% of the copy bandwidth with its issue slots two-thirds busy. Here a
// tile of 64 keys (32 KB) costs each warp 16 + 16 mma and 16 ldmatrix, the softmax of 8 scores a thread and
// the rescale of its 64 accumulators.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/cuda/convert.cuh"
#include "common/cuda/launch.cuh"
#include "common/cuda/ptx.cuh"
#include "common/mask.hpp"
#include "common/softmax_state.hpp"
#include "cuda_v2/tensor_core.cuh"
#include "decoding/cuda_split_kv.cuh"

namespace flashlab::decoding::kernels::mma {

using cuda_v2::LdmatrixRow;
using cuda_v2::SwizzledTile;

constexpr int kWarps = kernels::kWarps, kThreads = kernels::kThreads;
constexpr int kRows = kMaxRows;              // one m16 row tile of mma.sync
constexpr int kBlockN = 64;                  // keys a K/V tile
constexpr int kWarpKeys = kBlockN / kWarps;  // 16 a warp: S's two n-tiles, P V's one k-step
constexpr int kStages = 2;                   // K/V tiles in the ring: the next in flight while one is used
static_assert(kRows == 16 && kWarpKeys == 16, "a warp's S is one 16 x 16 mma tile pair");
constexpr float kLog2e = 1.4426950408889634f;

template <int D>
struct Geometry {
  static constexpr int kChunks = D / 8;  // 16-byte chunks a K/V or Q row
  static constexpr int kTileElems = kBlockN * D;
  // K and V rings and Q (16-bit, swizzled: tensor_core.cuh); each warp's P for the exact path (float).
  static constexpr int kSmemBytes =
      (2 * kStages * kTileElems + kRows * D) * 2 + kWarps * kRows * kWarpKeys * 4;
  // The end of a split: each warp's O (float, rows kMergePitch apart: an odd pitch puts the 16 rows a warp
  // reads at one column in 16 different banks), row max and row sum, in the ring.
  static constexpr int kMergePitch = D + 1;
  static constexpr int kMergeFloats = kWarps * kRows * (kMergePitch + 2);
  static_assert(D % 64 == 0 && kBlockN * kChunks % kThreads == 0 &&
                kMergeFloats * 4 <= 2 * kStages * kTileElems * 2);
};

// A warp's P where the exact path needs it: P itself where the row sees the key, kHidden where it does not.
constexpr float kHidden = -1.0f;

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    split_kv_mma_kernel(const __grid_constant__ SplitKvParams p, int num_splits, int row_tiles) {
  using G = Geometry<D>;
  using Tile = SwizzledTile<D>;
  T* const k_ring = cuda::dynamic_shared_memory<T>();                  // [kStages][kBlockN][D]
  T* const v_ring = k_ring + kStages * G::kTileElems;                  // [kStages][kBlockN][D]
  T* const q_smem = v_ring + kStages * G::kTileElems;                  // [kRows][D]
  float* const p_smem = reinterpret_cast<float*>(q_smem + kRows * D);  // [kWarps][kRows][kWarpKeys]

  const int split = blockIdx.x, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad_lane = lane % 4;  // mma fragment coordinates (cuda_v2/tensor_core.cuh)
  const BlockRows block = block_rows(p, row_tiles);
  const int sk = p.seqlens_k != nullptr ? p.seqlens_k[b] : p.seqlen_k;
  const int page_shift = p.block_table != nullptr ? __ffs(p.page_size) - 1 : 0;
  const auto [tile_begin, tile_end] = split_tiles<kBlockN>(sk, num_splits, split);

  // K and V tile `tile` into ring slot `slot`, swizzled, as one cp.async group (committed also when there is
  // nothing to load, so that the waits count tiles uniformly). Keys past sk and lanes past the head dim are
  // zero-filled, never stale: a hidden key's V row is then 0 or a real row. A thread's keys are a multiple of
  // 8 rows apart, so its swizzled offset steps by whole rows.
  KvTileLoader<T, D, kBlockN> loader(p, b, block.kv_head, tile_begin);
  const int load_at = Tile::offset(loader.key0, loader.chunk * 8);
  auto load_tile = [&](int tile, int slot) {
    if (tile < tile_end)
      loader.load(p, b, block.kv_head, tile, sk, page_shift, k_ring + slot * G::kTileElems,
                  v_ring + slot * G::kTileElems,
                  [&](int key, int) { return Tile::step(load_at, key - loader.key0, 0); });
    cp_async_commit();
  };

  // Q of the block's rows, swizzled (rows past the block's count and lanes past the head dim are zero), then
  // the first K/V tile: two groups.
  for (int index = threadIdx.x; index < kRows * G::kChunks; index += kThreads) {
    const int r = index / G::kChunks, chunk = index % G::kChunks;
    const bool real = r < block.count && chunk * 8 < p.head_dim;
    const T* src = static_cast<const T*>(p.q);
    if (real)
      src += b * p.q_stride_batch + block.query_of(r) * p.q_stride_seq + block.head_of(r) * p.q_stride_head +
             chunk * 8;
    cp_async_16(q_smem + Tile::offset(r, chunk * 8), src, real);
  }
  cp_async_commit();
  load_tile(tile_begin, 0);
  cp_async_wait<1>();  // Q has landed (this thread's copies) ...
  __syncthreads();     // ... and everyone's
  // Q's A fragments, held for the whole split: D / 16 k-steps of 4 registers.
  uint32_t q_frag[D / 16][4];
  const LdmatrixRow a_at = cuda_v2::a_operand_row(lane), nk_at = cuda_v2::b_operand_row_nk(lane),
                    kn_at = cuda_v2::b_operand_row_kn(lane);
  const int q_at = Tile::offset(a_at.row, a_at.col);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) ptx::ldmatrix_x4(q_frag[kk], q_smem + Tile::step(q_at, 0, 16 * kk));
  // This warp's 16 keys of a tile, as the B operand of S (K, [key][dim]) and of P V (V, .trans).
  const int k_at = Tile::offset(kWarpKeys * warp + nk_at.row, nk_at.col);
  const int v_at = Tile::offset(kWarpKeys * warp + kn_at.row, kn_at.col);

  // This thread's two accumulator rows, g and g + 8 (i = 0, 1), and their visible keys (common/mask.hpp).
  // The rows past the block's count (a GQA group of 4 leaves 12) are computed on zeros and never written:
  // they take no mask, and a NaN that reaches them reaches nothing.
  KeyRange band[2];
  int query[2];
  bool real_row[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = group + 8 * i;
    real_row[i] = r < block.count;
    query[i] = real_row[i] ? block.query_of(r) : 0;
    band[i] = real_row[i] ? band_key_range(query[i], p.seqlen_q, sk, p.causal, p.window_left, p.window_right)
                          : KeyRange{INT64_MIN, INT64_MAX};
  }
  const auto sees = [&](int i, int j) {  // row i sees key j
    return !real_row[i] ||
           (j >= band[i].begin && j < band[i].end && explicit_mask_allows(p.mask, p.seqlen_k, query[i], j));
  };
  const float scale_log2 = p.scale * kLog2e;  // exp(scale * s) = exp2(scale * log2(e) * s)
  float o_acc[D / 8][4] = {};                 // O~ of this warp's keys: 16 rows x D, unnormalized
  float row_max[2] = {-INFINITY, -INFINITY};  // m, in the log2 domain
  float raw_max[2] = {-INFINITY, -INFINITY};  // the max of the unscaled scores (m in the natural domain)
  float row_sum[2] = {0.0f, 0.0f};            // l, this thread's keys; the quad sum is taken at the end

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int slot = (tile - tile_begin) % kStages;
    cp_async_wait<0>();  // this tile's copies have landed ...
    __syncthreads();     // ... everyone's; and the slot refilled below was released by every warp
    load_tile(tile + 1, slot ^ 1);
    const T* const k_tile = k_ring + slot * G::kTileElems;
    const T* const v_tile = v_ring + slot * G::kTileElems;
    // The same as shared-window addresses (bytes): a fragment's ldmatrix takes one plus its offset.
    constexpr uint32_t kElementBytes = sizeof(T);
    const uint32_t k_addr = ptx::shared_address(k_tile), v_addr = ptx::shared_address(v_tile);
    const int key0 = tile * kBlockN + kWarpKeys * warp;

    // S = Q K^T for the 16 rows and this warp's 16 keys: element (nt, e) is row group + 8 (e / 2), key key0 +
    // 8 nt + 2 quad_lane + e % 2.
    float s[2][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t bk[4];
      ptx::ldmatrix_x4(bk, k_addr + kElementBytes * Tile::step(k_at, 0, 16 * kk));
      ptx::mma_m16n8k16<T>(s[0], q_frag[kk], bk[0], bk[1]);
      ptx::mma_m16n8k16<T>(s[1], q_frag[kk], bk[2], bk[3]);
    }

    // The mask, only where it cuts the warp's keys (the ragged end, a causal or window edge, an explicit
    // mask): a hidden score is -inf, weight exactly 0. `hidden_keys` marks the warp's keys some row hides,
    // below sk (past it V is zero-filled): a NaN or Inf in their V would reach the rows that hide them
    // through P V's 0 x V, so such a tile takes the exact path below.
    const bool cut =
        !(band[0].begin <= key0 && key0 + kWarpKeys <= band[0].end && band[1].begin <= key0 &&
          key0 + kWarpKeys <= band[1].end && (p.mask == nullptr || !(real_row[0] || real_row[1])));
    uint32_t hidden_keys = 0;      // bit k: key key0 + k, over the warp
    uint32_t hidden_elements = 0;  // bit 4 nt + e: this thread's element (nt, e)
    if (__any_sync(0xffffffffu, cut)) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = e / 2, k = 8 * nt + 2 * quad_lane + e % 2, j = key0 + k;
          if (!sees(i, j)) {
            s[nt][e] = -INFINITY;
            hidden_elements |= 1u << (4 * nt + e);
            if (j < sk) hidden_keys |= 1u << k;
          }
        }
#pragma unroll
      for (int offset = 1; offset < 32; offset *= 2)
        hidden_keys |= __shfl_xor_sync(0xffffffffu, hidden_keys, offset);
    }

    // Online softmax (FA2 Algorithm 1 lines 9-10) of the two rows over this warp's keys, as split_q's
    // (cuda_v2/split_q.cu, which says why each step is rounded as it is): scores to the log2 domain, the max
    // of the unscaled scores, the rescale of O~ and l, P in place of S.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          tile_max = fmaxf(tile_max, s[nt][2 * i + c]);
          s[nt][2 * i + c] = __fmul_rn(s[nt][2 * i + c], scale_log2);
        }
      raw_max[i] = fmaxf(raw_max[i], cuda_v2::quad_max(tile_max));
      const float new_max = raw_max[i] * scale_log2;
      const float max_used = new_max == -INFINITY ? 0.0f : new_max;  // nothing visible yet: no -inf - -inf
      const float rescale = ptx::ex2_approx(row_max[i] - max_used);
      row_max[i] = new_max;
      row_sum[i] *= rescale;
#pragma unroll
      for (int nt = 0; nt < D / 8; ++nt) {
        o_acc[nt][2 * i] *= rescale;
        o_acc[nt][2 * i + 1] *= rescale;
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          s[nt][2 * i + c] = ptx::ex2_approx(s[nt][2 * i + c] - max_used);
          row_sum[i] += s[nt][2 * i + c];
        }
    }

    // O~ += P V (line 10): P's accumulators are the A fragment of the k-step; V's rows through
    // ldmatrix.trans. Where a NaN or Inf sits in the V row of a key some row hides (never on finite inputs),
    // P V is taken key by key on the CUDA cores instead, skipping the pairs that do not see each other
    // (exact_p_v below).
    bool special = false;
    if (hidden_keys != 0) {  // the hidden keys' V rows, 16 bytes a lane at a time
      for (int index = lane; index < kWarpKeys * G::kChunks; index += 32) {
        const int k = index / G::kChunks, chunk = index % G::kChunks;
        if ((hidden_keys >> k & 1u) == 0) continue;
        float value[8];
        to_float8<T>(*reinterpret_cast<const uint4*>(v_tile + Tile::offset(kWarpKeys * warp + k, chunk * 8)),
                     value);
#pragma unroll
        for (int e = 0; e < 8; ++e) special |= !isfinite(value[e]);
      }
      special = __any_sync(0xffffffffu, special);
    }
    if (!special) {
      const uint32_t a[4] = {cuda::pack_pair<T>(s[0][0], s[0][1]), cuda::pack_pair<T>(s[0][2], s[0][3]),
                             cuda::pack_pair<T>(s[1][0], s[1][1]), cuda::pack_pair<T>(s[1][2], s[1][3])};
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        uint32_t bv[4];
        ptx::ldmatrix_x4_trans(bv, v_addr + kElementBytes * Tile::step(v_at, 0, 16 * np));
        ptx::mma_m16n8k16<T>(o_acc[2 * np], a, bv[0], bv[1]);
        ptx::mma_m16n8k16<T>(o_acc[2 * np + 1], a, bv[2], bv[3]);
      }
    } else {
      // The exact path: this warp's P (rounded to the element type, as the mma takes it) through its own
      // corner of shared memory, kHidden where the row does not see the key; then each thread adds, for its
      // two rows and its columns, P x V of the keys the row sees only.
      float* const warp_p = p_smem + warp * kRows * kWarpKeys;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = e / 2, k = 8 * nt + 2 * quad_lane + e % 2;
          warp_p[(group + 8 * i) * kWarpKeys + k] =
              hidden_elements >> (4 * nt + e) & 1u ? kHidden : cuda::to_float(cuda::from_float<T>(s[nt][e]));
        }
      __syncwarp();
      for (int k = 0; k < kWarpKeys; ++k) {
        const float weight[2] = {warp_p[group * kWarpKeys + k], warp_p[(group + 8) * kWarpKeys + k]};
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float value =
                cuda::to_float(v_tile[Tile::offset(kWarpKeys * warp + k, 8 * nt) + 2 * quad_lane + c]);
#pragma unroll
            for (int i = 0; i < 2; ++i)
              if (weight[i] != kHidden) o_acc[nt][2 * i + c] += weight[i] * value;
          }
      }
      __syncwarp();  // warp_p is the next tile's
    }
  }
  cp_async_wait<0>();  // the trailing (empty) group
  __syncthreads();     // every warp is done with the ring: it holds the warps' states below

  // The 4 warps' states of each row, merged (SoftmaxState::merge): each warp's O~ with its m (natural
  // domain, from the unscaled max) and l, in the ring; then thread t merges row t % 16, channels (t / 16) D /
  // 8 on, and writes the split's output.
  constexpr int kPitch = G::kMergePitch;
  float* const merge_o = reinterpret_cast<float*>(k_ring);   // [kWarps][kRows][kPitch]
  float* const merge_m = merge_o + kWarps * kRows * kPitch;  // [kWarps][kRows]
  float* const merge_l = merge_m + kWarps * kRows;           // [kWarps][kRows]
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = group + 8 * i;
    const float l = cuda_v2::quad_sum(row_sum[i]);
    if (quad_lane == 0) {
      merge_m[warp * kRows + r] = raw_max[i] == -INFINITY ? -INFINITY : __fmul_rn(raw_max[i], p.scale);
      merge_l[warp * kRows + r] = l;
    }
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        merge_o[(warp * kRows + r) * kPitch + 8 * nt + 2 * quad_lane + c] = o_acc[nt][2 * i + c];
  }
  __syncthreads();
  constexpr int kChannels = D / 8;  // a thread's channels of its row
  const int r = threadIdx.x % kRows, channel = threadIdx.x / kRows * kChannels;
  if (r >= block.count) return;
  SoftmaxState<float> state;
  float acc[kChannels] = {};
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    SoftmaxState<float> part;
    part.row_max = merge_m[w * kRows + r];
    part.row_sum = merge_l[w * kRows + r];
    state.merge(part, merge_o + (w * kRows + r) * kPitch + channel, acc, kChannels);
  }
  float out[kChannels];
  state.finalize(acc, out, kChannels);  // O_j = acc / l; 0 for a split where the row sees no key
  store_output<T, D>(p, num_splits, split, b, block.query_of(r), block.head_of(r), channel, out, state.lse(),
                     channel == 0);
}

}  // namespace flashlab::decoding::kernels::mma
