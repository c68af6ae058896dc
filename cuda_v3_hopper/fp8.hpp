// cuda_v3_hopper/fp8: FlashAttention-3's FP8 forward pass on sm_90a, the GPU form of fp8_emulated.hpp. Two
// kernels: the pre-pass (fp8_prepass.hpp: bf16 Q, K, V to e4m3 operands and tile descales, V k-major) and the
// main kernel here (fp8_kernel.cuh): the warp-specialized, ping-pong, intra-warpgroup-overlapped loop of
// cuda_v3_hopper/ws with wgmma ... e4m3.e4m3 (k = 32), the descales folded into the softmax scale and the O
// rescale, P scaled by p_scale before its e4m3 cast, O in bf16 and the LSE (+ K smoothing's shift).
#pragma once

#include <cstdint>

#include "cuda_v3_hopper/fp8_params.hpp"
#include "cuda_v3_hopper/fp8_prepass.hpp"

namespace flashlab::hopper {

// Runs the main kernel on `stream` (each build of fp8_launch.cu); throws flashlab::Error naming the field
// when the parameters are not taken.
FLASHLAB_FOR_EACH_TARGET(void launch_fp8_attention(const Fp8AttentionParams& params, cudaStream_t stream);)

}  // namespace flashlab::hopper
