// The FP8 pre-pass on sm_90a (fp8_prepass.hpp): bf16 Q, K, V to the e4m3 operands of the Hopper FP8 kernel,
// byte for byte what fp8_emulated.cpp's quantization_prepass computes. Built for the GPU and for the emulator
// (common/cuda/target.hpp). Bit-exactness rules followed here:
//   - every float operation is the emulation's, one IEEE operation at a time, in the emulation's order
//     (__fadd_rn, __fsub_rn, __fmul_rn, __fdiv_rn: nvcc may not fuse them into an FMA that the host would not
//     do);
//   - the sums whose order changes the result (K's mean, the LSE shift, both in fp64) run in the emulation's
//     order: the LSE shift one thread per sum, K's mean by chunks of keys (kFp8MeanChunk), many chunks at
//     once and their sums added in order; the maxima (amax) are order-free and reduce in any order;
//   - the butterflies of the Walsh-Hadamard transform are RandomHadamard::walsh_hadamard's: stage by stage
//     (half = 1, 2, 4, ...), each producing a + b and a - b from the same a and b.
#include "cuda_v3_hopper/fp8_prepass.hpp"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "common/cuda/check.hpp"
#include "common/cuda/launch.cuh"
#include "common/cuda/ptx.cuh"
#include "common/error.hpp"

namespace flashlab::hopper {
namespace FLASHLAB_CUDA_TARGET {

namespace {

constexpr float kE4m3MaxFinite = 448.0f;  // S.1111.110 (common/number_format.hpp, E4M3::max_finite)
constexpr int kThreads = 256;

__device__ float load_bf16(const uint16_t* p) {
  return __uint_as_float(static_cast<uint32_t>(*p) << 16);
}

// kCount consecutive bf16 (2, 4 or 8: one 4-, 8- or 16-byte load; `p` aligned to it) as floats.
template <int kCount>
__device__ void load_bf16s(const uint16_t* p, float (&x)[kCount]) {
  static_assert(kCount == 2 || kCount == 4 || kCount == 8, "one 4-, 8- or 16-byte load");
  uint32_t words[kCount / 2];
  if constexpr (kCount == 2) {
    words[0] = *reinterpret_cast<const uint32_t*>(p);
  } else if constexpr (kCount == 4) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    words[0] = v.x, words[1] = v.y;
  } else {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    words[0] = v.x, words[1] = v.y, words[2] = v.z, words[3] = v.w;
  }
  for (int w = 0; w < kCount / 2; ++w) {
    x[2 * w] = __uint_as_float(words[w] << 16);  // the lower address holds the lower half
    x[2 * w + 1] = __uint_as_float(words[w] & 0xffff0000u);
  }
}

// Round to nearest even, saturating to +-448 (infinity too), NaN to NaN: common/number_format.hpp's
// encode_e4m3, which documents that it mirrors this PTX instruction. The pair form converts (a, b) into
// (upper, lower) bytes; x goes in the lower byte.
__device__ uint8_t to_e4m3(float x) {
  return static_cast<uint8_t>(ptx::cvt_e4m3x2(0.0f, x) & 0xffu);
}

// common/number_format.hpp's e4m3_descale: amax / 448, or 1 for a tile with nothing finite to scale (all
// zero, empty, or padding), so that x / descale stays defined.
__device__ float e4m3_descale(float amax) {
  return amax > 0.0f && isfinite(amax) ? __fdiv_rn(amax, kE4m3MaxFinite) : 1.0f;
}

// Max over the block of each thread's `value`; every thread gets the result. Each warp's partial maximum goes
// through the block's dynamic shared memory (kPartialBytes of it).
constexpr size_t kPartialBytes = kThreads / 32 * sizeof(float);
__device__ float block_max(float value) {
  float* partial = cuda::dynamic_shared_memory<float>();
  for (int offset = 16; offset > 0; offset /= 2)
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  float result = partial[0];
  for (int w = 1; w < kThreads / 32; ++w) result = fmaxf(result, partial[w]);
  __syncthreads();  // partial[] is reused by the next call
  return result;
}

__device__ int64_t valid_rows(const int32_t* rows, int64_t b, int64_t seqlen) {
  return rows == nullptr ? seqlen : rows[b];
}

// K smoothing, part 1: mean[b, hk, c] over the valid keys of the finite entries, summed in fp64 in
// fp8_emulated.cpp's order: each chunk of kFp8MeanChunk keys in key order, then the chunks' sums in chunk
// order, then float(sum / count). A block per (batch x kv head, 32 channels), a lane per channel: its warps
// sum kThreads / 32 chunks at once (kMeanLoads loads in flight each), and warp 0 adds their sums in order. (A
// thread per channel summing every key in turn would give 16 blocks at b 2, h 8, d 256, each thread waiting a
// load's latency every few keys.) A load past the chunk's last key reads that key again and is not added: the
// loads carry no condition, so they issue back to back. Under `j + u < j1 ? load : NaN` the compiler gave
// each load its own branch and used its value there, one load's latency per key (456 us for K of 2 x 8 x 8k x
// 256 on an H200).
constexpr int kMeanWarps = kThreads / 32;
constexpr int kMeanLoads = 16;
static_assert(kFp8MeanChunk % kMeanLoads == 0, "a chunk is whole rounds of loads");
constexpr size_t kMeanSharedBytes = 2 * kMeanWarps * 32 * sizeof(double);
__global__ void __launch_bounds__(kThreads) k_mean_kernel(Fp8PrepassParams p) {
  const int64_t b = blockIdx.x / p.heads_kv, hk = blockIdx.x % p.heads_kv;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * 32 + lane;  // head_dim is a multiple of 32
  const int64_t keys = valid_rows(p.rows_k, b, p.seqlen_k),
                chunks = (keys + kFp8MeanChunk - 1) / kFp8MeanChunk;
  const int64_t key_stride = p.heads_kv * p.head_dim;
  const uint16_t* column = p.k + (b * p.seqlen_k * p.heads_kv + hk) * p.head_dim + c;
  double* chunk_sum = cuda::dynamic_shared_memory<double>();  // [kMeanWarps][32]: this round's chunks
  double* finite = chunk_sum + kMeanWarps * 32;               // [kMeanWarps][32]: each warp's count
  double sum = 0.0, count = 0.0;
  for (int64_t first = 0; first < chunks; first += kMeanWarps) {
    const int64_t j0 = (first + warp) * kFp8MeanChunk, j1 = min(j0 + kFp8MeanChunk, keys);
    double partial = 0.0;
    for (int64_t j = j0; j < j1; j += kMeanLoads) {
      float x[kMeanLoads];
      for (int u = 0; u < kMeanLoads; ++u) x[u] = load_bf16(column + min(j + u, j1 - 1) * key_stride);
      for (int u = 0; u < kMeanLoads; ++u)
        if (j + u < j1 && isfinite(x[u]))
          partial = __dadd_rn(partial, static_cast<double>(x[u])), count = __dadd_rn(count, 1.0);
    }
    chunk_sum[warp * 32 + lane] = partial;
    __syncthreads();
    if (warp == 0)
      for (int w = 0; w < kMeanWarps && first + w < chunks; ++w)
        sum = __dadd_rn(sum, chunk_sum[w * 32 + lane]);
    __syncthreads();  // chunk_sum[] is written again by the next round
  }
  finite[warp * 32 + lane] = count;  // counts are whole numbers: their sum is exact in any order
  __syncthreads();
  if (warp == 0) {
    for (int w = 1; w < kMeanWarps; ++w) count = __dadd_rn(count, finite[w * 32 + lane]);
    p.k_mean[(b * p.heads_kv + hk) * p.head_dim + c] =
        count > 0.0 ? __double2float_rn(__ddiv_rn(sum, count)) : 0.0f;
  }
}

// K smoothing, part 2: the LSE shift softmax_scale * q_i . mean of each valid query row (of a batch with at
// least one key), summed in fp64 over the channels in order; 0 elsewhere. Each product double(q) * mean is
// exact (8 + 24 significant bits), so the host's FMA contraction, if any, cannot change it either. A thread
// per row (index = the LSE's [batch, heads_q, seqlen_q] offset), a block per kThreads rows. The block's rows
// come through shared memory kShiftSlice channels at a time, a warp reading one row's slice (coalesced), each
// thread then summing its own row's from there: a thread reading its row from global memory alone would make
// every load of a warp touch 32 rows. A row's slice takes kShiftSlice + 1 words, so that the 32 threads of a
// warp, each on its own row, read 32 different banks. Each thread finds its own row's address once, into
// shared memory; a warp then issues its kShiftRows loads of a slice before storing any of them (a row past
// the last reads the last row again, never summed): stored as each arrived, one load at a time, they cost a
// latency per row and slice (235 us for Q of 2 x 8 x 8k x 256 on an H200).
constexpr int kShiftSlice = 32;
constexpr int kShiftWarps = kThreads / 32;
constexpr int kShiftRows = kThreads / kShiftWarps;  // the rows each warp copies into a slice
constexpr size_t kShiftSliceBytes = kThreads * (kShiftSlice + 1) * sizeof(float);
static_assert(kShiftSliceBytes % alignof(const uint16_t*) == 0, "the row addresses follow the slice");
constexpr size_t kShiftSharedBytes = kShiftSliceBytes + kThreads * sizeof(const uint16_t*);
__global__ void __launch_bounds__(kThreads) lse_shift_kernel(Fp8PrepassParams p) {
  const int64_t rows = p.batch * p.heads_q * p.seqlen_q, first = static_cast<int64_t>(blockIdx.x) * kThreads;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t index = first + threadIdx.x;
  // This thread's row; past the last row, the last row again (read into the slice, never summed).
  const int64_t row = min(index, rows - 1), i = row % p.seqlen_q, h = row / p.seqlen_q % p.heads_q,
                b = row / (p.seqlen_q * p.heads_q);
  const bool shifted = p.smooth_k && index < rows && i < valid_rows(p.rows_q, b, p.seqlen_q) &&
                       valid_rows(p.rows_k, b, p.seqlen_k) > 0;
  const float* mean =
      shifted ? p.k_mean + (b * p.heads_kv + h / (p.heads_q / p.heads_kv)) * p.head_dim : nullptr;
  float* slice = cuda::dynamic_shared_memory<float>();  // [kThreads][kShiftSlice + 1]
  const uint16_t** row_at = reinterpret_cast<const uint16_t**>(
      cuda::dynamic_shared_memory<unsigned char>() + kShiftSliceBytes);  // [kThreads]: Q's row of each
  row_at[threadIdx.x] = p.q + ((b * p.seqlen_q + i) * p.heads_q + h) * p.head_dim;
  __syncthreads();
  double sum = 0.0;
  for (int64_t c0 = 0; p.smooth_k && c0 < p.head_dim; c0 += kShiftSlice) {
    float x[kShiftRows];
    for (int k = 0; k < kShiftRows; ++k) x[k] = load_bf16(row_at[warp + k * kShiftWarps] + c0 + lane);
    for (int k = 0; k < kShiftRows; ++k) slice[(warp + k * kShiftWarps) * (kShiftSlice + 1) + lane] = x[k];
    __syncthreads();
    if (shifted)
      for (int c = 0; c < kShiftSlice; ++c)
        sum = __dadd_rn(sum, __dmul_rn(static_cast<double>(slice[threadIdx.x * (kShiftSlice + 1) + c]),
                                       static_cast<double>(mean[c0 + c])));
    __syncthreads();  // the next slice overwrites this one
  }
  if (index < rows) p.lse_shift[index] = shifted ? __double2float_rn(__dmul_rn(sum, p.softmax_scale)) : 0.0f;
}

// One row of Q or K as the main loop will see it, before the scale: bf16, minus K's mean (smoothing), through
// x M = (x H) diag(s) / sqrt(d). A warp holds the row, lane l the kPer consecutive channels from l * kPer:
// the butterflies with half < kPer pair entries of one lane, the wider ones pair lane l with lane l ^ (half /
// kPer), which holds the partner at the same position.
template <int kDim>
struct RowTransform {
  static constexpr int kPer = kDim / 32;
  float x[kPer];

  // What every row of a head takes for the lane's channels, loaded once: K's mean (smoothing) and the
  // Hadamard factors, each where there is one.
  struct Constants {
    bool smooth, rotate;
    float mean[kPer], factor[kPer];
    __device__ Constants(const float* mean_row, const float* factors, int lane)
        : smooth(mean_row != nullptr), rotate(factors != nullptr) {
      for (int e = 0; e < kPer; ++e) {
        mean[e] = smooth ? mean_row[lane * kPer + e] : 0.0f;
        factor[e] = rotate ? factors[lane * kPer + e] : 1.0f;
      }
    }
  };

  // The lane's channels, in one load (the rows are 16-byte aligned: launch_fp8_prepass checks it).
  __device__ void fetch(const uint16_t* row, int lane) { load_bf16s(row + lane * kPer, x); }
  // Then the transform, in the emulation's order.
  __device__ void transform(const Constants& head, int lane) {
    if (head.smooth)
      for (int e = 0; e < kPer; ++e) x[e] = __fsub_rn(x[e], head.mean[e]);
    if (!head.rotate) return;
    for (int half = 1; half < kPer; half *= 2)  // in-thread stages
      for (int block = 0; block < kPer; block += 2 * half)
        for (int e = block; e < block + half; ++e) {
          const float a = x[e], b = x[e + half];
          x[e] = __fadd_rn(a, b);
          x[e + half] = __fsub_rn(a, b);
        }
    for (int half = kPer; half < kDim; half *= 2) {  // across lanes
      const int lane_mask = half / kPer;
      const bool upper = (lane & lane_mask) != 0;  // this lane holds the b of its pairs
      for (int e = 0; e < kPer; ++e) {
        const float other = __shfl_xor_sync(0xffffffffu, x[e], lane_mask);
        x[e] = upper ? __fsub_rn(other, x[e]) : __fadd_rn(x[e], other);  // a - b with a = other; a + b
      }
    }
    for (int e = 0; e < kPer; ++e) x[e] = __fmul_rn(x[e], head.factor[e]);
  }
};

// Q or K (BSHD, `heads` heads): one block per (tile of `block` rows, head, batch), a warp per row. Two passes
// over the tile, both computing the rows the same way: the amax of the valid rows' finite entries, then the
// e4m3 codes of x / descale (0 for rows past the valid length, as the emulation pads them). A warp fetches
// kQkRows rows before it transforms any, each lane's channels in one load; a row past the last reads the
// last again and is not used, so the loads carry no condition and issue back to back. (A row at a time, each
// channel its own 2-byte load, kept a warp's one row in flight: Q and K of 2 x 8 x 8k x 256 took 162 and
// 197 us on an H200, at 12% of DRAM throughput.)
constexpr int kQkRows = 2;
template <int kDim>
__global__ void __launch_bounds__(kThreads)
    qk_quantize_kernel(const uint16_t* in, uint8_t* out, float* descale_out, int64_t seqlen, int64_t heads,
                       int64_t block, const int32_t* rows, const float* mean_base, const float* factors) {
  constexpr int kWarps = kThreads / 32, kPer = RowTransform<kDim>::kPer;
  const int64_t tile = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t valid = valid_rows(rows, b, seqlen);
  const int64_t s0 = tile * block, s1 = min(s0 + block, seqlen), valid_end = min(s1, valid);
  const typename RowTransform<kDim>::Constants constants(
      mean_base == nullptr ? nullptr : mean_base + (b * heads + h) * kDim, factors, lane);
  // Row s of the head, in and out: [batch][seqlen][heads][kDim].
  const int64_t row_stride = heads * kDim, head_at = (b * seqlen * heads + h) * kDim;
  auto row_in = [&](int64_t s) { return in + head_at + s * row_stride; };
  RowTransform<kDim> row[kQkRows];

  float amax = 0.0f;
  for (int64_t s = s0 + warp; s < valid_end; s += kQkRows * kWarps) {
#pragma unroll
    for (int r = 0; r < kQkRows; ++r) row[r].fetch(row_in(min(s + r * kWarps, valid_end - 1)), lane);
#pragma unroll
    for (int r = 0; r < kQkRows; ++r) {
      row[r].transform(constants, lane);
      if (s + r * kWarps < valid_end)
#pragma unroll
        for (int e = 0; e < kPer; ++e)
          if (isfinite(row[r].x[e])) amax = fmaxf(amax, fabsf(row[r].x[e]));
    }
  }
  const float descale = e4m3_descale(block_max(amax));
  if (threadIdx.x == 0) descale_out[(b * heads + h) * gridDim.x + tile] = descale;

  for (int64_t s = s0 + warp; s < s1; s += kQkRows * kWarps) {
    if (s < valid_end)
#pragma unroll
      for (int r = 0; r < kQkRows; ++r) row[r].fetch(row_in(min(s + r * kWarps, valid_end - 1)), lane);
#pragma unroll
    for (int r = 0; r < kQkRows; ++r) {
      const int64_t at = s + r * kWarps;
      if (at >= s1) break;
      uint32_t codes[(kPer + 3) / 4] = {};  // the lane's kPer bytes, the first channel lowest
      if (at < valid_end) {
        row[r].transform(constants, lane);
#pragma unroll
        for (int e = 0; e < kPer; e += 2) {
          const uint32_t pair =
              ptx::cvt_e4m3x2(__fdiv_rn(row[r].x[e + 1], descale), __fdiv_rn(row[r].x[e], descale));
          codes[e / 4] |= pair << (8 * (e % 4));
        }
      }
      uint8_t* const row_out = out + head_at + at * row_stride + lane * kPer;
      if constexpr (kPer == 2)
        *reinterpret_cast<uint16_t*>(row_out) = static_cast<uint16_t>(codes[0]);
      else if constexpr (kPer == 4)
        *reinterpret_cast<uint32_t*>(row_out) = codes[0];
      else
        *reinterpret_cast<uint2*>(row_out) = make_uint2(codes[0], codes[1]);
    }
  }
}

// V: the amax of the tile's valid keys, then the tile written k-major, out[b][hk][tile][c][position] (the key
// order of fp8_v_key), keys past the valid length and past seqlen_k (the last tile's padding to block_k) as
// 0. Both passes read V along its rows, 16 bytes a load: the second stages kVChunk keys at a time in shared
// memory and writes each channel's run of kVChunk positions from there. (Read from global memory in the
// output's order, a warp's 32 loads of one channel touched 32 keys' rows, 32 sectors for 64 bytes: V of
// 2 x 8 x 8k x 256 took 181 us on an H200, at 16% of DRAM throughput.) A staged key's row is kDim + 2
// elements long, so that 32 keys at one channel fall in 32 banks. Offsets within the tile are 32-bit and the
// head dim a constant (kDim): a 64-bit division per element would cost more than the element's bytes.
constexpr int kVChunk = 64;  // keys a chunk: whole groups of fp8_v_key's 32, which it permutes within
template <int kDim>
constexpr size_t v_shared_bytes() {
  return kPartialBytes + kVChunk * (kDim + 2) * sizeof(uint16_t);
}
template <int kDim>
__global__ void __launch_bounds__(kThreads) v_quantize_kernel(Fp8PrepassParams p) {
  constexpr int kLoads = kDim / 8;  // 16-byte loads a key
  constexpr int kStagedRow = kDim + 2;
  const int64_t tile = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int bc = static_cast<int>(p.block_k);
  const int64_t valid = valid_rows(p.rows_k, b, p.seqlen_k);
  const int64_t j0 = tile * bc;
  const int64_t left = valid - j0;  // keys of this tile that are valid, if fewer than bc
  const int valid_keys = left <= 0 ? 0 : left < bc ? static_cast<int>(left) : bc;
  const uint16_t* tile_in = p.v + ((b * p.seqlen_k + j0) * p.heads_kv + hk) * kDim;
  const int key_stride = static_cast<int>(p.heads_kv * kDim);
  // The 16-byte load `index` of the tile's keys from `first` on, in row-major order: key first + index /
  // kLoads, channels 8 (index % kLoads) on.
  auto chunk = [&](int first, int index) {
    return tile_in + static_cast<int64_t>(first + index / kLoads) * key_stride + index % kLoads * 8;
  };

  float amax = 0.0f;
  for (int index = static_cast<int>(threadIdx.x); index < valid_keys * kLoads; index += kThreads) {
    float x[8];
    load_bf16s(chunk(0, index), x);
    for (int e = 0; e < 8; ++e)
      if (isfinite(x[e])) amax = fmaxf(amax, fabsf(x[e]));
  }
  const float descale = e4m3_descale(block_max(amax));
  if (threadIdx.x == 0) p.v_descale[(b * p.heads_kv + hk) * gridDim.x + tile] = descale;

  uint16_t* const staged =
      reinterpret_cast<uint16_t*>(cuda::dynamic_shared_memory<unsigned char>() + kPartialBytes);
  uint8_t* out = p.v8 + ((b * p.heads_kv + hk) * gridDim.x + tile) * kDim * bc;
  for (int k0 = 0; k0 < bc; k0 += kVChunk) {
    const int keys = min(kVChunk, bc - k0), staged_keys = max(0, min(keys, valid_keys - k0));
    for (int index = static_cast<int>(threadIdx.x); index < staged_keys * kLoads; index += kThreads) {
      const uint4 raw = *reinterpret_cast<const uint4*>(chunk(k0, index));
      uint32_t* const at =
          reinterpret_cast<uint32_t*>(staged + index / kLoads * kStagedRow + index % kLoads * 8);
      at[0] = raw.x, at[1] = raw.y, at[2] = raw.z, at[3] = raw.w;  // a row is 4-byte aligned, not 16
    }
    __syncthreads();
    // A warp writes a channel's run of positions, coalesced. The index is split by the chunk's full width, a
    // constant (a shift and a mask), not by `keys`: a division by a run-time count took about 30 instructions
    // of each byte's 98 in the sm_90a SASS the H200 timed. A shorter last chunk skips the positions past it.
    for (int index = static_cast<int>(threadIdx.x); index < kDim * kVChunk; index += kThreads) {
      const int c = index / kVChunk, in_chunk = index % kVChunk, position = k0 + in_chunk;
      if (in_chunk >= keys) continue;
      const int key = fp8_v_key(position, bc);  // in [k0, k0 + keys): groups stay whole
      out[c * bc + position] =
          key < valid_keys ? to_e4m3(__fdiv_rn(load_bf16(staged + (key - k0) * kStagedRow + c), descale))
                           : uint8_t{0};
    }
    __syncthreads();  // the next chunk overwrites the staged keys
  }
}

template <int kDim>
void launch_qk(const uint16_t* in, uint8_t* out, float* descale, int64_t batch, int64_t seqlen, int64_t heads,
               int64_t block, const int32_t* rows, const float* mean, const float* factors,
               cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(fp8_tiles(seqlen, block)), static_cast<unsigned>(heads),
                  static_cast<unsigned>(batch));
  cuda::launch_kernel<qk_quantize_kernel<kDim>>(grid, kThreads, kPartialBytes, stream, in, out, descale,
                                                seqlen, heads, block, rows, mean, factors);
}

void require(bool ok, const std::string& message) {
  if (!ok) fail("fp8 pre-pass: " + message);
}

}  // namespace

void launch_fp8_prepass(const Fp8PrepassParams& p, cudaStream_t stream) {
  require(p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256,
          "head_dim (" + std::to_string(p.head_dim) + ") must be 64, 128 or 256");
  require(p.batch >= 0 && p.seqlen_q >= 0 && p.seqlen_k >= 0, "batch, seqlen_q and seqlen_k must be >= 0");
  require(p.heads_q >= 1 && p.heads_kv >= 1 && p.heads_q % p.heads_kv == 0,
          "heads_q (" + std::to_string(p.heads_q) + ") must be a positive multiple of heads_kv (" +
              std::to_string(p.heads_kv) + ")");
  require(p.heads_q <= 65535 && p.batch <= 65535, "heads_q and batch must be <= 65535 (grid dimensions)");
  require(p.block_q >= 1 && p.block_k >= 1, "block_q and block_k must be >= 1");
  require(p.block_k <= 4096,
          "block_k (" + std::to_string(p.block_k) + ") must be <= 4096 (a V tile's 32-bit offsets)");
  require(
      p.q && p.k && p.v && p.q8 && p.k8 && p.v8 && p.q_descale && p.k_descale && p.v_descale && p.lse_shift,
      "q, k, v and every output pointer must be set");
  require(!p.smooth_k || p.k_mean != nullptr, "k_mean (the workspace of smooth_k) must be set");
  for (const auto& [name, pointer] : {std::pair{"q", p.q}, std::pair{"k", p.k}, std::pair{"v", p.v}})
    require(reinterpret_cast<uintptr_t>(pointer) % 16 == 0,
            std::string(name) + " must be 16-byte aligned (its rows are read 16 bytes a load)");
  if (p.batch == 0) return;

  const float* mean = nullptr;
  if (p.smooth_k && p.seqlen_k > 0) {
    const dim3 grid(static_cast<unsigned>(p.batch * p.heads_kv), static_cast<unsigned>(p.head_dim / 32));
    cuda::launch_kernel<k_mean_kernel>(grid, kThreads, kMeanSharedBytes, stream, p);
    mean = p.k_mean;
  }
  if (const int64_t rows = p.batch * p.heads_q * p.seqlen_q; rows > 0) {
    Fp8PrepassParams shift = p;
    shift.smooth_k = mean != nullptr;
    cuda::launch_kernel<lse_shift_kernel>(static_cast<unsigned>((rows + kThreads - 1) / kThreads), kThreads,
                                          kShiftSharedBytes, stream, shift);
  }
  auto launch = [&](auto dim_tag) {
    constexpr int kDim = decltype(dim_tag)::value;
    if (p.seqlen_q > 0)
      launch_qk<kDim>(p.q, p.q8, p.q_descale, p.batch, p.seqlen_q, p.heads_q, p.block_q, p.rows_q, nullptr,
                      p.hadamard_factors, stream);
    if (p.seqlen_k > 0) {
      launch_qk<kDim>(p.k, p.k8, p.k_descale, p.batch, p.seqlen_k, p.heads_kv, p.block_k, p.rows_k, mean,
                      p.hadamard_factors, stream);
      const dim3 grid(static_cast<unsigned>(fp8_tiles(p.seqlen_k, p.block_k)),
                      static_cast<unsigned>(p.heads_kv), static_cast<unsigned>(p.batch));
      cuda::launch_kernel<v_quantize_kernel<kDim>>(grid, kThreads, v_shared_bytes<kDim>(), stream, p);
    }
  };
  if (p.head_dim == 64) launch(std::integral_constant<int, 64>{});
  if (p.head_dim == 128) launch(std::integral_constant<int, 128>{});
  if (p.head_dim == 256) launch(std::integral_constant<int, 256>{});
}

}  // namespace FLASHLAB_CUDA_TARGET
}  // namespace flashlab::hopper
