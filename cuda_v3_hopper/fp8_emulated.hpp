// The FP8 forward pass of FlashAttention-3, emulated exactly on the CPU: the specification, and later the
// oracle, of the Hopper FP8 kernel in this directory. docs/06-fp8.md explains each step.
//
//   pre-pass   inputs in bf16; optional K smoothing (ours); optional incoherent processing Q M, K M with
//              M = H diag(s) / sqrt(d) (FA3 Sec. 3.3); e4m3 quantization with one scale per Br x d tile
//              of Q and per Bc x d tile of K and V (block quantization), or one scale per tensor
//   main loop  FA2/FA3 Algorithm 1 over Bc-key tiles: S = Q8 K8^T * (q_descale k_descale softmax_scale),
//              online softmax (common/softmax_state.hpp), P = exp(S - m) * 2^8 rounded to e4m3,
//              O += P8 V8; the V tile's descale is folded into the O rescale. Q8 K8^T and P8 V8 are summed
//              as Hopper's tensor cores sum them (common/e4m3_block_sum.hpp), the rest is fp32
//   epilogue   O = O * v_descale / (2^8 l) rounded to bf16, LSE = m + log l (+ the smoothing shift)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/problem.hpp"
#include "common/tensor.hpp"

namespace flashlab::hopper {

enum class Fp8Scaling {
  per_tensor,  // one scale for each of Q, K and V: FA3 Table 3's baseline
  per_block,   // one scale per Br x d tile of Q and per Bc x d tile of K and of V (FA3 "block quantization")
};

// Every knob of the FP8 pass. The Hopper kernel takes this same struct, so the two can be compared knob by
// knob.
struct Fp8Config {
  int64_t block_q = 128;  // Br: query rows per tile (a Q scale per tile when per_block)
  int64_t block_k = 128;  // Bc: keys per tile (a K and a V scale per tile when per_block)
  Fp8Scaling scaling = Fp8Scaling::per_block;
  bool hadamard = true;             // incoherent processing of Q and K; only where head_dim is a power of two
  uint64_t hadamard_seed = 0x5eed;  // the random signs s of M
  float p_scale = 256.0f;           // 2^8: P in [0, 1] is scaled before its e4m3 cast, undone in the epilogue
  // Beyond FA3 (docs/06-fp8.md "Going further"):
  // Subtract K's per-channel mean over the tokens before quantizing. Every score of row i moves by the same
  // scale * q_i . mean, which softmax ignores; the LSE adds it back. Removes a shared offset (a bias, or a
  // shift of all keys) from what the fp8 grid has to cover.
  bool smooth_k = false;
  // Outlier decomposition (as in LLM.int8; 0 = off): entries of Q and K (v_: of V) above this many times
  // their tile's RMS leave the fp8 tensor for a sparse list kept in bf16. The scores gain the exact terms
  // q_c k_c of the extracted channels c (bf16 values of both), O gains P v_out in fp32: no outlier product
  // goes through fp8. For Q and K it replaces incoherent processing (the sparse terms live in the original
  // basis), so it needs hadamard off.
  float qk_outlier_threshold = 0.0f;
  float v_outlier_threshold = 0.0f;
  // Study knobs, emulation only (the kernel always quantizes): switch one rounding off to measure its share
  // of the error.
  bool quantize_qk = true;  // Q and K to e4m3 (off: the scaled values are kept in fp32)
  bool quantize_v = true;   // V to e4m3
  bool round_p = true;      // P * 2^8 to e4m3
  // The products' sums as Hopper's tensor cores form them (common/e4m3_block_sum.hpp: a wgmma's 32 products
  // and the accumulator aligned, 13 bits kept, the sum cut to 14 significant bits), where both operands are
  // e4m3. Off: summed in fp32.
  bool tensor_core_sums = true;
};

// FA3's fp8 tile sizes (Br x Bc: d <= 64: 192 x 160, d <= 128: 128 x 224, larger: 128 x 128), Hadamard and
// block scales on: the method of FA3's Table 3.
Fp8Config fa3_fp8_config(int64_t head_dim);

// The registered cuda_v3_hopper/fp8_emulated: FA3's method plus K smoothing, which makes the pass invariant
// to a shift shared by all keys (the shift property of docs/conventions.md §8; without it the shift enlarges
// K and its fp8 error).
Fp8Config registered_fp8_config(int64_t head_dim);

// "" when the config is usable, else the knob at fault, named.
std::string why_invalid(const Fp8Config& config);

// What the pre-pass hands the main loop (without the outlier decomposition, which the kernel does not do):
// Q, K and V as the float values of their e4m3 codes in the BSHD layout of the inputs (rows past a batch's
// valid length hold 0), the descale of every tile, descale[(b * heads + h) * tiles + t], and the LSE shift of
// K smoothing per query row, [batch, heads_q, seqlen_q] (0 without smoothing). The one host definition of the
// pre-pass math: the Hopper pre-pass kernel (fp8_prepass.cu) is checked byte for byte against it.
struct Fp8Prepass {
  std::vector<float> q, k, v;
  std::vector<float> q_descale, k_descale, v_descale;
  std::vector<float> lse_shift;
};
Fp8Prepass fp8_prepass(const Problem& problem, const AttentionInputs& inputs, const Fp8Config& config);

// O (bf16 values) and LSE of `problem` through the FP8 pipeline. Any shape and every mask; Hadamard is
// applied only when the knob is on and head_dim is a power of two.
void fp8_emulated_attention(const Problem& problem, const AttentionInputs& inputs, AttentionOutputs& outputs,
                            const Fp8Config& config);

}  // namespace flashlab::hopper
