// decoding/cuda_split_kv kernels: Flash-Decoding (Dao, Haziza, Massa, Sizov 2023).
//
//   split_kv_kernel   one block per (split, kv head x row tile, batch): the partial (O_j, LSE_j) of the
//                     query rows of one GQA group over the keys of split j; K/V tiles stream through a
//                     cp.async ring of kStages shared-memory buffers, the online softmax runs per split.
//   combine_kernel    one block per query row: merges the partials by LSE (SoftmaxState::merge).
//
// With one split the first kernel writes O and LSE itself and the second is not launched.
//
// The block's query rows are the heads of one GQA group times the query positions (row = qi * group + g),
// at most kMaxRows of them: K and V of the group are read once for all of them (more rows, e.g. MQA with
// speculative decoding, take several row tiles, which read the same K/V again, mostly from L2).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/cuda/convert.cuh"
#include "common/cuda/launch.cuh"
#include "common/cuda/ptx.cuh"
#include "common/cuda/warp_reduce.cuh"
#include "common/mask.hpp"
#include "common/softmax_state.hpp"
#include "decoding/cuda_split_kv.hpp"

namespace flashlab::decoding::kernels {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockN = 32;                // keys per K/V tile: one key per lane in S = Q K^T
constexpr int kMaxRows = kSplitKvMaxRows;  // query rows per block
// K/V tiles in the ring, kStages - 1 in flight: 2 (45 KB at d 128) fits 5 blocks (20 warps) an SM, still
// 5 x 16 KB requested ahead per SM against the ~25 KB HBM's bandwidth x latency needs.
constexpr int kStages = 2;
// P's shared-memory row pitch: one float of padding, so the two rows a warp reads in O += P V sit in
// different banks.
constexpr int kPPitch = kBlockN + 1;

template <int D>
struct Geometry {
  static constexpr int kChunks = D / 8;  // 16-byte chunks (8 elements) per K/V row
  // Shared-memory row pitch in elements: 16 bytes of padding, so that the 8 lanes of a quarter-warp reading
  // 16 bytes each from 8 consecutive K rows (S = Q K^T, lane = key) hit 8 different groups of 4 banks.
  static constexpr int kRowPitch = D + 8;
  static constexpr int kTileElems = kBlockN * kRowPitch;
  static constexpr int kRowsPerWarp = kMaxRows / kWarps;          // S and softmax: warp w has rows w + 4k
  static constexpr int kRowGroups = kThreads / kChunks;           // O += P V: rows side by side
  static constexpr int kRowsPerThread = kMaxRows / kRowGroups;    // O += P V: accumulator rows/thread
  static constexpr int kSmemBytes = 2 * kStages * kTileElems * 2  // K and V rings (16-bit elements)
                                    + kMaxRows * D * 4            // Q, float, pre-scaled
                                    + kMaxRows * kPPitch * 4      // P of the current tile
                                    + 3 * kMaxRows * 4;           // rescale factor, final row_max, row_sum
  static_assert(D % 64 == 0 && kBlockN * kChunks % kThreads == 0 && kThreads % kChunks == 0 &&
                kMaxRows % kRowGroups == 0);
};

// --- 16-bit element conversion, 8 at a time (one 16-byte vector) ---

// `raw` by value: the caller's load of it is one 16-byte load (LDS.128), not four 4-byte loads through a
// reference (which the counters saw as 4-way bank conflicts on K's padded rows).
template <typename T>
__device__ inline void to_float8(const uint4 raw, float (&x)[8]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<T, __half>) {
      const float2 pair = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
      x[2 * i] = pair.x;
      x[2 * i + 1] = pair.y;
    } else {
      // bf16 is the upper half of a float: widening is a shift (exact), and it keeps the 16-byte load whole
      // (the compiler splits it into 8-byte loads when it sees 16-bit fields used).
      x[2 * i] = __uint_as_float(words[i] << 16);
      x[2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000u);
    }
  }
}

template <typename T>
__device__ inline uint4 from_float8(const float (&x)[8]) {
  return {cuda::pack_pair<T>(x[0], x[1]), cuda::pack_pair<T>(x[2], x[3]), cuda::pack_pair<T>(x[4], x[5]),
          cuda::pack_pair<T>(x[6], x[7])};
}

// --- cp.async (sm_80+, common/cuda/ptx.cuh): global -> shared without registers, several tiles in flight. A
// key past the end of the sequence is zero-filled (src-size 0) rather than left stale (0 * stale NaN would
// poison O += P V).
using ptx::cp_async_16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;

// Where token j of batch b lives: (outer index, row) with outer = b for contiguous K/V, or the page from the
// block table with row j % page_size for a paged cache (page_size a power of two: shift and mask).
struct TokenPlace {
  int64_t outer;
  int64_t row;
};
__device__ inline TokenPlace token_place(const SplitKvParams& p, int b, int j, int page_shift) {
  if (p.block_table == nullptr) return {b, j};
  const int page = __ldg(p.block_table + static_cast<int64_t>(b) * p.block_table_stride + (j >> page_shift));
  return {page, j & (p.page_size - 1)};
}

// --- What the split kernels share (this one and cuda_split_kv_mma.cuh's) ---

// The block's query rows: the heads of one GQA group times the query positions (row = qi * group + g), at
// most kMaxRows of them from its row tile on; `count` of them are real.
struct BlockRows {
  int group, kv_head, row_tile, count;
  __device__ int query_of(int r) const { return (row_tile * kMaxRows + r) / group; }  // query position qi
  __device__ int head_of(int r) const { return kv_head * group + (row_tile * kMaxRows + r) % group; }
};
__device__ inline BlockRows block_rows(const SplitKvParams& p, int row_tiles) {
  const int group = p.heads_q / p.heads_kv, row_tile = static_cast<int>(blockIdx.y) % row_tiles;
  return {group, static_cast<int>(blockIdx.y) / row_tiles, row_tile,
          min(kMaxRows, group * p.seqlen_q - row_tile * kMaxRows)};
}

// Split `split`'s keys as tiles [begin, end) of kTileKeys: the batch element's own length `sk` spread evenly
// over the splits, in whole tiles (splits past its end are empty).
struct SplitTiles {
  int begin, end;
};
template <int kTileKeys>
__device__ inline SplitTiles split_tiles(int sk, int num_splits, int split) {
  const int tiles_total = (sk + kTileKeys - 1) / kTileKeys;
  const int tiles_per_split = (tiles_total + num_splits - 1) / num_splits;
  const int begin = min(tiles_total, split * tiles_per_split);
  return {begin, min(tiles_total, begin + tiles_per_split)};
}

// Writes channels [channel, channel + kCount) of row (b, h, qi)'s finished output `out` (normalized), and its
// LSE when `with_lse`: O itself when the keys are not split, else split `split`'s partial (O_j, LSE_j) in the
// workspace, [row][split][D] floats then [row][split] LSEs, for combine_kernel. Channels past the head dim
// are zeros: never stored to O, kept in the partials (the tile width's rows).
template <typename T, int D, int kCount>
__device__ inline void store_output(const SplitKvParams& p, int num_splits, int split, int b, int qi, int h,
                                    int channel, const float (&out)[kCount], float lse, bool with_lse) {
  static_assert(kCount % 8 == 0, "whole 16-byte chunks of O");
  const int64_t row_index = (static_cast<int64_t>(b) * p.heads_q + h) * p.seqlen_q + qi;
  if (num_splits == 1) {
    T* o = static_cast<T*>(p.o) + b * p.o_stride_batch + qi * p.o_stride_seq + h * p.o_stride_head;
#pragma unroll
    for (int c = 0; c < kCount; c += 8) {
      if (channel + c >= p.head_dim) break;
      float chunk[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) chunk[e] = out[c + e];
      *reinterpret_cast<uint4*>(o + channel + c) = from_float8<T>(chunk);
    }
    if (with_lse) p.lse[row_index] = lse;
  } else {
    float* o_partial = static_cast<float*>(p.workspace);
    const int64_t partial_rows = static_cast<int64_t>(p.batch) * p.heads_q * p.seqlen_q * num_splits;
    const int64_t partial = row_index * num_splits + split;
    float4* o = reinterpret_cast<float4*>(o_partial + partial * D + channel);
#pragma unroll
    for (int c = 0; c < kCount; c += 4) o[c / 4] = make_float4(out[c], out[c + 1], out[c + 2], out[c + 3]);
    if (with_lse) o_partial[partial_rows * D + partial] = lse;  // -inf: an empty partial, weight 0
  }
}

// The cp.async copies of a split's K/V tiles of kTileKeys keys, in order, into shared memory: thread t copies
// 16-byte chunk t % (D / 8) of the keys t / (D / 8) + kKeysPerPass l. Contiguous K/V: the thread's offsets
// are formed once and step a tile per load; a paged cache looks each key's page up in the block table. A key
// past the sequence, or a lane past the head dim, reads nothing (src-size 0, zero-filled); its address is the
// tensor's first element all the same, never one past the end.
template <typename T, int D, int kTileKeys>
struct KvTileLoader {
  static constexpr int kChunks = D / 8;
  static constexpr int kKeysPerPass = kThreads / kChunks;
  static constexpr int kLoads = kTileKeys / kKeysPerPass;  // 16-byte copies a thread, of K and of V
  static_assert(kThreads % kChunks == 0 && kTileKeys % kKeysPerPass == 0);
  int chunk, key0;
  bool chunk_real;  // lanes past a narrower head dim: zeros
  int64_t k_pass, v_pass, k_next, v_next;

  __device__ KvTileLoader(const SplitKvParams& p, int b, int kv_head, int tile_begin)
      : chunk(threadIdx.x % kChunks),
        key0(threadIdx.x / kChunks),
        chunk_real(chunk * 8 < p.head_dim),
        k_pass(kKeysPerPass * p.k_stride_seq),
        v_pass(kKeysPerPass * p.v_stride_seq) {
    const int64_t row0 = int64_t{tile_begin} * kTileKeys + key0;
    k_next = b * p.k_stride_batch + row0 * p.k_stride_seq + kv_head * p.k_stride_head + chunk * 8;
    v_next = b * p.v_stride_batch + row0 * p.v_stride_seq + kv_head * p.v_stride_head + chunk * 8;
  }

  // Issues the copies of tile `tile` (the next in order) to k_dst and v_dst + smem_offset(key, chunk).
  template <class SmemOffset>
  __device__ void load(const SplitKvParams& p, int b, int kv_head, int tile, int sk, int page_shift, T* k_dst,
                       T* v_dst, SmemOffset smem_offset) {
    const T* const k_base = static_cast<const T*>(p.k);
    const T* const v_base = static_cast<const T*>(p.v);
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      const int key = key0 + l * kKeysPerPass, j = tile * kTileKeys + key;
      const bool real = j < sk && chunk_real;
      const T* k_src = k_base;
      const T* v_src = v_base;
      if (real && p.block_table == nullptr) {
        k_src += k_next + l * k_pass;
        v_src += v_next + l * v_pass;
      } else if (real) {
        const TokenPlace place = token_place(p, b, j, page_shift);
        k_src = k_base + place.outer * p.k_stride_page + place.row * p.k_stride_seq +
                kv_head * p.k_stride_head + chunk * 8;
        v_src = v_base + place.outer * p.v_stride_page + place.row * p.v_stride_seq +
                kv_head * p.v_stride_head + chunk * 8;
      }
      const int at = smem_offset(key, chunk);
      cp_async_16(k_dst + at, k_src, real);
      cp_async_16(v_dst + at, v_src, real);
    }
    k_next += kTileKeys * p.k_stride_seq;
    v_next += kTileKeys * p.v_stride_seq;
  }
};

// --- Kernel 1: the partials ---

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    split_kv_kernel(const __grid_constant__ SplitKvParams p, int num_splits, int row_tiles) {
  using G = Geometry<D>;
  T* k_ring = cuda::dynamic_shared_memory<T>();
  T* v_ring = k_ring + kStages * G::kTileElems;
  float* q_smem = reinterpret_cast<float*>(v_ring + kStages * G::kTileElems);  // [kMaxRows][D]
  float* p_smem = q_smem + kMaxRows * D;                                       // [kMaxRows][kPPitch]
  float* factor_smem = p_smem + kMaxRows * kPPitch;                            // [kMaxRows]
  float* row_max_smem = factor_smem + kMaxRows;
  float* row_sum_smem = row_max_smem + kMaxRows;

  const int split = blockIdx.x, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const BlockRows block = block_rows(p, row_tiles);
  const int kv_head = block.kv_head, rows = block.count;
  const int sk = p.seqlens_k != nullptr ? p.seqlens_k[b] : p.seqlen_k;
  const int page_shift = p.block_table != nullptr ? __ffs(p.page_size) - 1 : 0;

  // Block row r: query position qi and query head h.
  auto query_of = [&](int r) { return block.query_of(r); };
  auto head_of = [&](int r) { return block.head_of(r); };

  // This split's keys, whole tiles.
  const auto [tile_begin, tile_end] = split_tiles<kBlockN>(sk, num_splits, split);

  // Issues the cp.async of K and V tile `tile` into ring slot `slot` (keys past sk are zero-filled), then
  // commits a group, also when there is nothing to load, so that wait_group counts tiles uniformly.
  KvTileLoader<T, D, kBlockN> loader(p, b, kv_head, tile_begin);
  auto load_tile = [&](int tile, int slot) {
    if (tile < tile_end)
      loader.load(p, b, kv_head, tile, sk, page_shift, k_ring + slot * G::kTileElems,
                  v_ring + slot * G::kTileElems,
                  [](int key, int chunk) { return key * G::kRowPitch + chunk * 8; });
    cp_async_commit();
  };

  // Start the ring first, so that the loads are in flight while Q is staged.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) load_tile(tile_begin + s, s);

  // Q of the block's rows, as float, pre-multiplied by the softmax scale (S = scale * Q K^T); rows past
  // `rows` are zero and never used.
  const T* q_base = static_cast<const T*>(p.q);
  for (int index = threadIdx.x; index < kMaxRows * G::kChunks; index += kThreads) {
    const int r = index / G::kChunks, chunk = index % G::kChunks;
    float x[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (r < rows && chunk * 8 < p.head_dim) {
      const uint4 raw =
          *reinterpret_cast<const uint4*>(q_base + b * p.q_stride_batch + query_of(r) * p.q_stride_seq +
                                          head_of(r) * p.q_stride_head + chunk * 8);
      to_float8<T>(raw, x);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] *= p.scale;
    }
    float4* out = reinterpret_cast<float4*>(q_smem + r * D + chunk * 8);
    out[0] = make_float4(x[0], x[1], x[2], x[3]);
    out[1] = make_float4(x[4], x[5], x[6], x[7]);
  }

  // The mask band of this warp's softmax rows (rows warp + kWarps * k), from the one definition in mask.hpp.
  SoftmaxState<float> state[G::kRowsPerWarp];
  KeyRange band[G::kRowsPerWarp];
#pragma unroll
  for (int k = 0; k < G::kRowsPerWarp; ++k) {
    const int r = warp + kWarps * k;
    band[k] = r < rows ? band_key_range(query_of(r), p.seqlen_q, sk, p.causal, p.window_left, p.window_right)
                       : KeyRange{};
  }

  // O += P V accumulators: 8 channels (pv_chunk) of up to kRowsPerThread rows (pv_row + kRowGroups * k). With
  // few rows (decode: 4 heads of a 32/8 group), the row groups that would hold no row take a share of each
  // tile's keys instead (key_parts shares, keys pv_part, pv_part + key_parts, ...), so every warp works; the
  // shares are summed once at the end of the split (rescaling by exp(m_old - m_new) is linear, so each share
  // can be rescaled on its own).
  int row_slots = 1;  // rows rounded up to a power of two, at most kRowGroups
  while (row_slots < rows && row_slots < G::kRowGroups) row_slots *= 2;
  const int key_parts = G::kRowGroups / row_slots;
  const int pv_chunk = threadIdx.x % G::kChunks, pv_row_group = threadIdx.x / G::kChunks;
  const int pv_row = pv_row_group % row_slots, pv_part = pv_row_group / row_slots;
  float acc[G::kRowsPerThread][8] = {};

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int slot = (tile - tile_begin) % kStages;
    cp_async_wait<kStages - 2>();  // this thread's copies of `tile` have landed ...
    __syncthreads();               // ... and everyone's; the slot refilled below was released by all
    load_tile(tile + kStages - 1, (tile - tile_begin + kStages - 1) % kStages);
    const T* k_tile = k_ring + slot * G::kTileElems;
    const T* v_tile = v_ring + slot * G::kTileElems;

    // S = scale * Q K^T for key j = tile * kBlockN + lane and this warp's rows.
    float score[G::kRowsPerWarp] = {};
#pragma unroll 4
    for (int chunk = 0; chunk < G::kChunks; ++chunk) {
      float key[8];
      to_float8<T>(*reinterpret_cast<const uint4*>(k_tile + lane * G::kRowPitch + chunk * 8), key);
#pragma unroll
      for (int k = 0; k < G::kRowsPerWarp; ++k) {
        if (warp + kWarps * k >= rows) break;  // warp-uniform
        const float4* q = reinterpret_cast<const float4*>(q_smem + (warp + kWarps * k) * D + chunk * 8);
        const float4 q0 = q[0], q1 = q[1];
        score[k] += q0.x * key[0] + q0.y * key[1] + q0.z * key[2] + q0.w * key[3] + q1.x * key[4] +
                    q1.y * key[5] + q1.z * key[6] + q1.w * key[7];
      }
    }

    // Online softmax per row over this tile (FA2 Alg. 1 lines 8-10), in the shared SoftmaxState: every lane
    // of the warp keeps the same state; the tile max and sum are warp reductions over the 32 keys.
    const int j = tile * kBlockN + lane;
#pragma unroll
    for (int k = 0; k < G::kRowsPerWarp; ++k) {
      const int r = warp + kWarps * k;
      if (r >= rows) break;
      const bool visible =
          j >= band[k].begin && j < band[k].end &&
          (p.mask == nullptr || p.mask[static_cast<int64_t>(query_of(r)) * p.seqlen_k + j] != 0);
      const float s = visible ? score[k] : -INFINITY;
      const float factor =
          state[k].raise_max(cuda::warp_fmax(s));  // exp(m_old - m_new), 1 while nothing is visible
      const float prob = state[k].weight(s);       // exp(s - m_new), exactly 0 for a masked key
      state[k].add(cuda::warp_sum(prob));
      p_smem[r * kPPitch + lane] = prob;
      if (lane == 0) factor_smem[r] = factor;
    }
    __syncthreads();

    // O = diag(exp(m_old - m_new)) O + P V (FA2 Alg. 1 line 10).
#pragma unroll
    for (int k = 0; k < G::kRowsPerThread; ++k) {
      const int r = pv_row + G::kRowGroups * k;
      if (r >= rows) break;
      const float factor = factor_smem[r];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[k][e] *= factor;
#pragma unroll 4
      for (int key = pv_part; key < kBlockN; key += key_parts) {
        const float prob = p_smem[r * kPPitch + key];
        // A masked key adds nothing, even when its V holds NaN or Inf (the reference skips it the same way).
        if (prob == 0.0f) continue;
        float value[8];
        to_float8<T>(*reinterpret_cast<const uint4*>(v_tile + key * G::kRowPitch + pv_chunk * 8), value);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[k][e] += prob * value[e];
      }
    }
  }
  cp_async_wait<0>();  // the trailing (empty) groups
  __syncthreads();     // every thread is done with the ring: its first slot holds the key shares below

  // The final state of each row, from its softmax warp to the threads that hold its accumulator.
#pragma unroll
  for (int k = 0; k < G::kRowsPerWarp; ++k) {
    const int r = warp + kWarps * k;
    if (r < rows && lane == 0) {
      row_max_smem[r] = state[k].row_max;
      row_sum_smem[r] = state[k].row_sum;
    }
  }
  // Key shares other than the first, through shared memory: share[row group][D].
  float* share = reinterpret_cast<float*>(k_ring);
  if (key_parts > 1 && pv_part > 0 && pv_row < rows) {
    float4* to = reinterpret_cast<float4*>(share + pv_row_group * D + pv_chunk * 8);
    to[0] = make_float4(acc[0][0], acc[0][1], acc[0][2], acc[0][3]);
    to[1] = make_float4(acc[0][4], acc[0][5], acc[0][6], acc[0][7]);
  }
  __syncthreads();
  if (pv_part > 0) return;  // its share is in the first share's sum below
  for (int part = 1; part < key_parts; ++part) {
    if (pv_row >= rows) break;
    const float* from = share + (part * row_slots + pv_row) * D + pv_chunk * 8;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[0][e] += from[e];
  }

#pragma unroll
  for (int k = 0; k < G::kRowsPerThread; ++k) {
    const int r = pv_row + G::kRowGroups * k;
    if (r >= rows) break;
    SoftmaxState<float> row_state;
    row_state.row_max = row_max_smem[r];
    row_state.row_sum = row_sum_smem[r];
    float out[8];
    row_state.finalize(acc[k], out, 8);  // O_j = acc / l; 0 for a split where the row sees no key
    store_output<T, D>(p, num_splits, split, b, query_of(r), head_of(r), pv_chunk * 8, out, row_state.lse(),
                       pv_chunk == 0);
  }
}

// --- Kernel 2: the combine ---

// O = sum_j exp(LSE_j - LSE) O_j with LSE = log sum_j exp(LSE_j): each partial is the state {m = LSE_j, l =
// 1} with accumulator O_j (SoftmaxState::from_lse), merged like any two states. Thread c owns channel c.
// (`num_splits` is [[maybe_unused]] for the exercise's skeleton, which leaves it unread.)
template <typename T, int D>
__global__ void __launch_bounds__(D)
    combine_kernel(const __grid_constant__ SplitKvParams p, [[maybe_unused]] int num_splits) {
  const int64_t row_index = blockIdx.x;  // (b * heads_q + h) * seqlen_q + qi
  const int qi = static_cast<int>(row_index % p.seqlen_q);
  const int h = static_cast<int>(row_index / p.seqlen_q % p.heads_q);
  const int b = static_cast<int>(row_index / (static_cast<int64_t>(p.seqlen_q) * p.heads_q));
  const int channel = threadIdx.x;

  SoftmaxState<float> state;
  float acc = 0.0f;
  // EXERCISE BEGIN cuda-split-kv-combine
  // teaches: Flash-Decoding's second kernel: one block per query row merges the splits' normalized partials
  //   (O_j, LSE_j) exactly, each weighted by exp(LSE_j - LSE); this thread owns one channel of the row
  // difficulty: 2
  // grades: decoding/cuda_split_kv$
  // docs: docs/07-decoding.md#3. Why the merge is exact
  // hint: each split left a normalized partial O_j with its log-sum-exp LSE_j: that is a softmax state whose
  //   max is LSE_j and whose sum is 1, so the partials merge like any two states
  // hint2: find this row's partials in p.workspace (every O_j first, then every LSE_j) and merge each into
  //   state and acc with SoftmaxState<float>::from_lse and merge (common/softmax_state.hpp)
  // hint3: the partials lie in p.workspace, floats: first every O_j, [row][split][D], then every LSE_j,
  //   [row][split], for batch x heads_q x seqlen_q rows of num_splits splits; this row is row_index. A
  //   partial is the softmax state SoftmaxState<float>::from_lse(LSE_j) holding O_j: merge each into state
  //   and acc (common/softmax_state.hpp; merge with head_dim 1, this thread's channel). A split that saw no
  //   key has LSE_j = -inf and must weigh 0.
  const float* o_partial = static_cast<const float*>(p.workspace);
  const int64_t partial_rows = static_cast<int64_t>(p.batch) * p.heads_q * p.seqlen_q * num_splits;
  const float* lse_partial = o_partial + partial_rows * D;
  for (int split = 0; split < num_splits; ++split) {
    const int64_t partial = row_index * num_splits + split;
    state.merge(SoftmaxState<float>::from_lse(lse_partial[partial]), o_partial + partial * D + channel, &acc,
                1);
  }
  // EXERCISE END cuda-split-kv-combine
  float out;
  state.finalize(&acc, &out, 1);  // 0 for a row that saw no key in any split
  T* o = static_cast<T*>(p.o) + b * p.o_stride_batch + qi * p.o_stride_seq + h * p.o_stride_head;
  if (channel < p.head_dim) {  // the lanes past a head dim narrower than D are zeros, never stored
    if constexpr (std::is_same_v<T, __half>) {
      o[channel] = __float2half_rn(out);
    } else {
      o[channel] = __float2bfloat16_rn(out);
    }
  }
  if (channel == 0) p.lse[row_index] = state.lse();
}

// The combine in two passes (decoding/cuda_split_kv_mma_two_pass; decoding/CUDA.md, "The combine in two
// passes"): the row's state over every split's LSE first, each thread merging some splits' and the block
// merging the threads'; each split's weight exp(LSE_j - m) once, into shared memory; then thread c sums its
// channel of every O_j, weighted. The second pass's loads depend on nothing the loop computes, so they can be
// in flight together, where combine_kernel tests each split's LSE before it reads that split's O: on an H200
// its merge of 49 splits waited on about 98 memory latencies in a row. The same exact merge, rounded in
// another order. An empty split (LSE_j = -inf) weighs nothing and its O_j is not added, as in merge.
// Its shared memory, dynamic (so that the emulator's race detector sees it): a weight per split, then each
// warp's state.
template <int D>
constexpr size_t combine_two_pass_smem_bytes() {
  return (kSplitKvMaxSplits + 2 * (D / 32)) * sizeof(float);
}
template <typename T, int D>
__global__ void __launch_bounds__(D)
    combine_two_pass_kernel(const __grid_constant__ SplitKvParams p, int num_splits) {
  static_assert(D % 32 == 0, "whole warps");
  constexpr float kEmpty = -1.0f;                              // a weight no split has: exp() >= 0, or NaN
  float* const weight = cuda::dynamic_shared_memory<float>();  // [split]: exp(LSE_j - m), or kEmpty
  float* const warp_max = weight + kSplitKvMaxSplits;          // [warp]: each warp's state
  float* const warp_sum = warp_max + D / 32;
  const int64_t row_index = blockIdx.x;  // (b * heads_q + h) * seqlen_q + qi
  const int qi = static_cast<int>(row_index % p.seqlen_q);
  const int h = static_cast<int>(row_index / p.seqlen_q % p.heads_q);
  const int b = static_cast<int>(row_index / (static_cast<int64_t>(p.seqlen_q) * p.heads_q));
  const int channel = threadIdx.x, lane = channel % 32, warp = channel / 32;
  const float* o_partial = static_cast<const float*>(p.workspace);
  const int64_t partial_rows = static_cast<int64_t>(p.batch) * p.heads_q * p.seqlen_q * num_splits;
  const float* lse_row = o_partial + partial_rows * D + row_index * num_splits;
  const float* o_row = o_partial + row_index * num_splits * D;
  const auto merge = [](SoftmaxState<float>& state, float row_max, float row_sum) {
    state.merge(SoftmaxState<float>{row_max, row_sum}, static_cast<const float*>(nullptr),
                static_cast<float*>(nullptr), 0);
  };

  // Pass 1: the row's state {m, l} over the splits, every thread ending with the same bits (a merge's sum
  // is the same added either way round, and every thread merges the warps' states in the same order).
  SoftmaxState<float> state;
  for (int split = channel; split < num_splits; split += D) {
    const SoftmaxState<float> partial = SoftmaxState<float>::from_lse(lse_row[split]);
    merge(state, partial.row_max, partial.row_sum);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    merge(state, __shfl_xor_sync(0xffffffffu, state.row_max, offset),
          __shfl_xor_sync(0xffffffffu, state.row_sum, offset));
  if (lane == 0) warp_max[warp] = state.row_max, warp_sum[warp] = state.row_sum;
  // Each split's weight against the row's max, once.
  __syncthreads();
  state = {};
  for (int w = 0; w < D / 32; ++w) merge(state, warp_max[w], warp_sum[w]);
  for (int split = channel; split < num_splits; split += D) {
    const float lse = lse_row[split];
    weight[split] = lse == SoftmaxState<float>::neg_inf ? kEmpty : state.weight(lse);
  }
  __syncthreads();

  // Pass 2: acc = sum_j exp(LSE_j - m) O_j over the splits that saw a key, this thread's channel.
  float acc = 0.0f;
#pragma unroll 8
  for (int split = 0; split < num_splits; ++split) {
    const float w = weight[split], o = o_row[static_cast<int64_t>(split) * D + channel];
    acc = w == kEmpty ? acc : fmaf(w, o, acc);
  }
  float out;
  state.finalize(&acc, &out, 1);  // acc / l: 0 for a row that saw no key in any split
  T* o = static_cast<T*>(p.o) + b * p.o_stride_batch + qi * p.o_stride_seq + h * p.o_stride_head;
  if (channel < p.head_dim) o[channel] = cuda::from_float<T>(out);
  if (channel == 0) p.lse[row_index] = state.lse();
}

}  // namespace flashlab::decoding::kernels
