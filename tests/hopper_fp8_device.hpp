// The FP8 kernels of cuda_v3_hopper on the device, for tests/test_hopper_fp8.cpp: built for the emulator, and
// for the GPU (sm_90a) when the build has CUDA, so that the same checks run on either. Both go through the
// registry entry's own device set-up (cuda_v3_hopper/fp8_device.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "common/cuda/target.hpp"
#include "common/problem.hpp"
#include "common/tensor.hpp"
#include "cuda_v3_hopper/fp8_emulated.hpp"

namespace flashlab::testing {

// What the pre-pass wrote: the e4m3 operands (fp8_prepass.hpp's layouts) and the tile descales and LSE shift.
struct Fp8PrepassOutputs {
  std::vector<uint8_t> q8, k8, v8;
  std::vector<float> q_descale, k_descale, v_descale, lse_shift;
};

FLASHLAB_FOR_EACH_TARGET(
    // The pre-pass alone, its scratch poisoned first (0xff: NaN in e4m3 and fp32), so that an element it does
    // not write cannot match.
    Fp8PrepassOutputs fp8_prepass_on_device(const Problem& problem, const AttentionInputs& inputs,
                                            const hopper::Fp8Config& config);
    // The pre-pass then the main kernel: O (bf16, as float) and LSE.
    AttentionOutputs fp8_attention_on_device(const Problem& problem, const AttentionInputs& inputs,
                                             const hopper::Fp8Config& config);)

}  // namespace flashlab::testing
