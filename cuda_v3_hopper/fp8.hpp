// cuda_v3_hopper/fp8: FlashAttention-3's FP8 forward pass on sm_90a, the GPU form of fp8_emulated.hpp. Two
// kernels: the pre-pass (fp8_prepass.hpp: bf16 Q, K, V to e4m3 operands and tile descales, V k-major) and the
// main kernel here (fp8_kernel.cuh): the warp-specialized, ping-pong, intra-warpgroup-overlapped loop of
// cuda_v3_hopper/ws with wgmma ... e4m3.e4m3 (k = 32), the descales folded into the softmax scale and the O
// rescale, P scaled by p_scale before its e4m3 cast, O in bf16 and the LSE (+ K smoothing's shift).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flashlab::hopper {

// Bc of the main kernel for a head dim, FA3's fp8 tiles (fa3_fp8_config): the quantization tiles of K and V
// must be the kernel's key blocks, since one K descale and one V descale apply to a whole block.
constexpr int64_t fp8_kernel_block_k(int64_t head_dim) {
  return head_dim == 128 ? 224 : head_dim == 256 ? 128 : 0;
}

struct Fp8AttentionParams {
  // The pre-pass's outputs (fp8_prepass.hpp, Fp8PrepassParams: same layouts).
  const uint8_t* q8 = nullptr;  // [batch, seqlen_q, heads_q, head_dim] e4m3
  const uint8_t* k8 = nullptr;  // [batch, seqlen_k, heads_kv, head_dim] e4m3
  const uint8_t* v8 =
      nullptr;  // [batch, heads_kv, tiles_k, head_dim, block_k] e4m3, k-major, fp8_v_key order
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  const float* lse_shift = nullptr;    // [batch, heads_q, seqlen_q]
  uint16_t* o = nullptr;               // [batch, seqlen_q, heads_q, head_dim] bf16 bits
  float* lse = nullptr;                // [batch, heads_q, seqlen_q]
  const int32_t* seqlens_q = nullptr;  // valid rows per batch (device); nullptr: all
  const int32_t* seqlens_k = nullptr;
  int batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  int block_q = 0;  // the Q quantization tile (any size: the kernel looks a descale up per row)
  int block_k = 0;  // the K/V quantization tile: must be fp8_kernel_block_k(head_dim)
  float softmax_scale = 0.0f;
  float p_scale = 256.0f;  // Fp8Config::p_scale
  bool causal = false;
  int window_left = -1, window_right = -1;
};

// "" when the kernel takes these parameters, else the field at fault, named.
const char* fp8_attention_unsupported(const Fp8AttentionParams& params);

// Runs the main kernel on `stream`; throws flashlab::Error naming the field when the parameters are not
// taken.
void launch_fp8_attention(const Fp8AttentionParams& params, cudaStream_t stream);

}  // namespace flashlab::hopper
