// The main kernel's parameters and what it takes, in plain C++ (no CUDA headers): the registration
// (fp8.cpp, compiled in every build) asks the kernel's own rules through fp8_attention_unsupported().
#pragma once

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

// "" when the kernel takes the shape, lengths, tiles and scales of `p` (its pointers aside), else the field
// at fault, named.
inline const char* fp8_shape_unsupported(const Fp8AttentionParams& p) {
  if (p.head_dim != 128 && p.head_dim != 256) return "head_dim must be 128 or 256 (64 is not built)";
  if (p.block_k != fp8_kernel_block_k(p.head_dim))
    return "block_k must be the kernel's key block, fp8_kernel_block_k(head_dim) (224 for d 128, 128 for d "
           "256)";
  if (p.block_q < 1) return "block_q must be >= 1";
  if (p.batch < 1 || p.heads_q < 1 || p.heads_kv < 1 || p.seqlen_q < 1 || p.seqlen_k < 0)
    return "batch, heads_q, heads_kv and seqlen_q must be >= 1, seqlen_k >= 0";
  if (p.heads_q % p.heads_kv != 0) return "heads_q must be a multiple of heads_kv";
  if (p.heads_q > 65535 || p.batch > 65535) return "heads_q and batch must be <= 65535 (grid dimensions)";
  if (!(p.softmax_scale > 0.0f))
    return "softmax_scale must be positive (the row maximum is taken on raw scores)";
  // P * p_scale <= p_scale must stay within e4m3's 448.
  if (!(p.p_scale > 0.0f && p.p_scale <= 256.0f)) return "p_scale must be in (0, 256]";
  if (p.window_left < -1 || p.window_right < -1) return "window_left and window_right must be >= -1";
  return "";
}

// "" when the kernel takes these parameters, else the field at fault, named.
inline const char* fp8_attention_unsupported(const Fp8AttentionParams& p) {
  if (const char* reason = fp8_shape_unsupported(p); reason[0] != '\0') return reason;
  for (const void* pointer :
       {static_cast<const void*>(p.q8), static_cast<const void*>(p.k8), static_cast<const void*>(p.v8)})
    if (pointer != nullptr && reinterpret_cast<uintptr_t>(pointer) % 16 != 0)
      return "q8, k8 and v8 must be 16-byte aligned (TMA)";
  if (p.q8 == nullptr || p.o == nullptr || p.lse == nullptr || p.q_descale == nullptr ||
      p.lse_shift == nullptr)
    return "q8, q_descale, lse_shift, o and lse must be device pointers";
  if (p.seqlen_k > 0 &&
      (p.k8 == nullptr || p.v8 == nullptr || p.k_descale == nullptr || p.v_descale == nullptr))
    return "k8, v8, k_descale and v_descale must be device pointers";
  return "";
}

}  // namespace flashlab::hopper
