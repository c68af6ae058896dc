// The FP8 pass's device-side set-up: the pre-pass and main-kernel parameters on a problem's device tensors,
// the scratch carved from their workspace (fp8_stage.hpp, Fp8Workspace). The one path from device tensors to
// the two kernels: the registry's launchers (fp8_stage.cu) and the FP8 tests (tests/hopper_fp8_device.cu)
// both go through it.
#pragma once

#include "common/cuda/target.hpp"
#include "common/registry.hpp"
#include "cuda_v3_hopper/fp8.hpp"
#include "cuda_v3_hopper/fp8_emulated.hpp"
#include "cuda_v3_hopper/fp8_prepass.hpp"

namespace flashlab::hopper {

struct Fp8DeviceParams {
  Fp8PrepassParams prepass;
  Fp8AttentionParams attention;
};

// Points the pre-pass at tensors.q/k/v (bf16) and the kernel at tensors.o (bf16) and tensors.lse, and both
// at their scratch in tensors.workspace (fp8_workspace(problem, config).bytes); copies the int32 lengths and
// the Hadamard factors there (default stream). Fails naming the field for what the pre-pass does not do
// (an explicit mask, paged K/V, storage other than bf16, per-tensor scales, outlier extraction, a study knob
// off); the main kernel checks its own parameters at launch (launch_fp8_attention). In each build of
// fp8_stage.cu (common/cuda/target.hpp):
FLASHLAB_FOR_EACH_TARGET(Fp8DeviceParams fp8_device_params(const Problem& problem,
                                                           const DeviceTensors& tensors,
                                                           const Fp8Config& config);
                         // The pre-pass, then the main kernel, on `stream`.
                         void run_fp8(const Fp8DeviceParams& params, cudaStream_t stream);)

}  // namespace flashlab::hopper
