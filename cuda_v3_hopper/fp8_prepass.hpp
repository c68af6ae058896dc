// The FP8 pre-pass on the GPU (sm_90a): bf16 Q, K, V (BSHD, device) to the e4m3 operands of the Hopper FP8
// kernel, byte for byte what the emulation's pre-pass (fp8_emulated.hpp, fp8_prepass()) computes:
//   K smoothing   K <- K - mean over the valid keys, per (batch, kv head, channel), summed in fp64 over
//                 the finite entries, in chunks of kFp8MeanChunk keys; the LSE shift scale * q_i . mean per
//                 query row (when Fp8Config::smooth_k)
//   incoherence   x <- (x H) diag(s) / sqrt(d) on every row of Q and K: a fast Walsh-Hadamard transform in
//                 registers (a warp per row, butterflies in-thread then by shuffles), the factors s_c /
//                 sqrt(d) of common/hadamard.hpp's RandomHadamard for the same seed
//   block scales  descale = amax / 448 per Br x d tile of Q and Bc x d tile of K and V (finite entries of the
//                 valid rows), the value cast as e4m3(x / descale) by cvt.rn.satfinite.e4m3x2.f32
//   V k-major     FP8 wgmma takes only k-major operands, and for O += P V the reduction runs over the keys:
//                 V is written transposed per tile, [batch][kv head][tile][channel][key in tile], each tile
//                 padded with zeros to Bc keys, the keys of each 32-key group in the order of fp8_v_key
// Q and K stay BSHD (their reduction dimension, the channel, is already the contiguous one).
#pragma once

#include <cstdint>

#include "common/cuda/stream.hpp"
#include "common/cuda/target.hpp"
#include "common/host_device.hpp"

namespace flashlab::hopper {

struct Fp8PrepassParams {
  // Inputs, bf16 bits in BSHD (uint16_t: the header stays free of cuda_bf16.h).
  const uint16_t* q = nullptr;
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  int64_t block_q = 0, block_k = 0;  // Br, Bc: the quantization tiles (Fp8Config::block_q, block_k)
  // Valid rows per batch (device, [batch]); nullptr: every row is valid. Rows past them are written as 0.
  const int32_t* rows_q = nullptr;
  const int32_t* rows_k = nullptr;
  bool smooth_k = false;
  const float* hadamard_factors = nullptr;  // device, [head_dim]: RandomHadamard::output_factor; nullptr: off
  double softmax_scale = 0.0;               // for the LSE shift of K smoothing
  // Outputs (device).
  uint8_t* q8 = nullptr;       // [batch, seqlen_q, heads_q, head_dim] e4m3
  uint8_t* k8 = nullptr;       // [batch, seqlen_k, heads_kv, head_dim] e4m3
  uint8_t* v8 = nullptr;       // [batch, heads_kv, tiles_k, head_dim, block_k] e4m3 (k-major per tile)
  float* q_descale = nullptr;  // [batch, heads_q, tiles_q]
  float* k_descale = nullptr;  // [batch, heads_kv, tiles_k]
  float* v_descale = nullptr;  // [batch, heads_kv, tiles_k]
  float* lse_shift = nullptr;  // [batch, heads_q, seqlen_q]
  float* k_mean = nullptr;     // workspace [batch, heads_kv, head_dim] (used when smooth_k)
};

// K smoothing's mean sums each channel over the keys in chunks of this many: a chunk's keys in key order,
// then the chunks' sums in chunk order, in fp64. The emulation (fp8_emulated.cpp) and the GPU pre-pass both
// sum in this order, the GPU many chunks at once, so that their means agree bit for bit.
inline constexpr int64_t kFp8MeanChunk = 64;

FLASHLAB_HOST_DEVICE inline int64_t fp8_tiles(int64_t seqlen, int64_t block) {
  return (seqlen + block - 1) / block;
}

// The key order inside a V8 tile. O += P V takes P from registers as the A operand of wgmma ... k32, whose
// e4m3 fragment gives thread t of a quad the 4 consecutive k positions 4t..4t+3 (and 16 + 4t..) of a 32-key
// step; the fp32 accumulator of S gives the same thread the keys 2t, 2t + 1, 8 + 2t, 9 + 2t (and 16 more).
// Rather than moving P between threads (quad shuffles), V's keys are stored in the order the accumulator
// already holds them: position 16h + 4t + 2q + e of a 32-key group holds key 16h + 8q + 2t + e. P V sums over
// the same pairs (P_j, V_j), only in another order. A tile's last partial group (block_k % 32 keys, possible
// only for tiles the FP8 kernel does not take) keeps the natural order. In the integer type of the caller's
// offsets: the pre-pass's per-element loop takes 32-bit ones (positions within a tile of at most 4096 keys).
template <typename Int>
FLASHLAB_HOST_DEVICE constexpr Int fp8_v_key(Int position, Int block_k) {
  if (position >= block_k / 32 * 32) return position;
  const Int group = position / 32 * 32, w = position % 32;
  return group + 16 * (w / 16) + 8 * ((w % 4) / 2) + 2 * ((w % 16) / 4) + w % 2;
}
FLASHLAB_HOST_DEVICE constexpr int64_t fp8_v_position(int64_t key, int64_t block_k) {
  if (key >= block_k / 32 * 32) return key;
  const int64_t group = key / 32 * 32, r = key % 32;
  return group + 16 * (r / 16) + 4 * ((r % 8) / 2) + 2 * ((r % 16) / 8) + r % 2;
}

// Offset of V[b, j, hk, c] in the k-major V8 layout.
inline int64_t fp8_v_offset(int64_t b, int64_t j, int64_t hk, int64_t c, int64_t heads_kv, int64_t seqlen_k,
                            int64_t head_dim, int64_t block_k) {
  const int64_t tiles = fp8_tiles(seqlen_k, block_k);
  return (((b * heads_kv + hk) * tiles + j / block_k) * head_dim + c) * block_k +
         fp8_v_position(j % block_k, block_k);
}

// Runs the pre-pass on `stream` (each build of fp8_prepass.cu: the GPU's and the emulator's). Head dims 64,
// 128 and 256 (the Hopper kernel's); throws flashlab::Error naming the field otherwise.
FLASHLAB_FOR_EACH_TARGET(void launch_fp8_prepass(const Fp8PrepassParams& params, cudaStream_t stream);)

}  // namespace flashlab::hopper
