// cuda_v3_hopper/fp8's registration: ordinary C++, compiled in every build. It runs on an sm_90 GPU where
// there is one and in the emulator otherwise. The kernels are fp8_prepass.cu and fp8_kernel.cuh, their set-up
// on the registry's device tensors fp8_stage.cu.
#include <climits>
#include <string>
#include <utility>

#include "common/cuda/device.hpp"
#include "common/cuda/gpu_stage.hpp"
#include "common/error.hpp"
#include "cuda_v3_hopper/fp8_emulated.hpp"
#include "cuda_v3_hopper/fp8_params.hpp"
#include "cuda_v3_hopper/fp8_stage.hpp"
#include "cuda_v3_hopper/ws_stage.hpp"

namespace flashlab::hopper {

namespace {

// What the kernel does not take, the field named: the problem's own fields first, then the kernel's rules
// on the shape it would be given (fp8_params.hpp, the same check the launch makes).
std::string supports(const Problem& p) {
  if (p.page_size > 0)
    return "page_size (" + std::to_string(p.page_size) +
           "): paged K/V is not supported by cuda_v3_hopper/fp8";
  // Fp8AttentionParams holds sizes, lengths and windows as int.
  for (const auto& [field, value] : {std::pair<const char*, int64_t>{"seqlen_q", p.seqlen_q},
                                     {"seqlen_k", p.seqlen_k},
                                     {"heads_q", p.heads_q},
                                     {"batch", p.batch},
                                     {"window_left", p.window_left},
                                     {"window_right", p.window_right}})
    if (value > INT_MAX) return std::string(field) + " (" + std::to_string(value) + ") must fit an int";
  if (p.head_dim != 128 && p.head_dim != 256)
    return "head_dim (" + std::to_string(p.head_dim) +
           ") must be 128 or 256 (the compiled tiles; 64 would need a 64-byte swizzle)";
  const Fp8Config config = registered_fp8_config(p.head_dim);
  const Fp8AttentionParams shape{.batch = static_cast<int>(p.batch),
                                 .seqlen_q = static_cast<int>(p.seqlen_q),
                                 .seqlen_k = static_cast<int>(p.seqlen_k),
                                 .heads_q = static_cast<int>(p.heads_q),
                                 .heads_kv = static_cast<int>(p.heads_kv),
                                 .head_dim = static_cast<int>(p.head_dim),
                                 .block_q = static_cast<int>(config.block_q),
                                 .block_k = static_cast<int>(config.block_k),
                                 .softmax_scale = static_cast<float>(p.softmax_scale()),
                                 .p_scale = config.p_scale,
                                 .causal = p.causal,
                                 .window_left = static_cast<int>(p.window_left),
                                 .window_right = static_cast<int>(p.window_right)};
  if (const char* reason = fp8_shape_unsupported(shape); reason[0] != '\0') {
    // The kernel's messages name its parameters; softmax_scale is the problem's scale.
    std::string text = reason;
    if (text.rfind("softmax_scale", 0) == 0)
      text = "scale (" + std::to_string(p.softmax_scale()) + "): " + text;
    return text;
  }
  return "";
}

const Registration fp8{with_main_kernel(
    gpu_implementation(
        {.name = "cuda_v3_hopper/fp8",
         .summary = "FA3's FP8 pass on Hopper: Hadamard + tile-scale pre-pass, e4m3 wgmma, P * 2^8 in e4m3",
         .dtypes = {DType::e4m3},
         .constraints = "e4m3 (bf16 in, bf16 out); sm_90a; head_dim 128, 256; causal, window, padding, GQA; "
                        "no explicit mask, no paged K/V",
         .rounds_p = true,  // P * 2^8 is rounded to e4m3: it is the A operand of the P V wgmma
         .explicit_mask = false,
         .availability = needs_sm90a,
         .supports = supports},
        FLASHLAB_DEVICE_BUILDS(launch_fp8, fp8_workspace_bytes)),
    FLASHLAB_DEVICE_MAIN_BUILDS(launch_fp8_main))};

}  // namespace

std::string fp8_emulation() {
  const Implementation* entry = find_implementation("cuda_v3_hopper/fp8");
  if (entry == nullptr) fail("cuda_v3_hopper/fp8 is not registered");
  return entry->emulation();
}

void fp8_cuda_attention(const Problem& problem, const AttentionInputs& inputs, AttentionOutputs& outputs,
                        const Fp8Config& config) {
  if (const std::string reason = supports(problem); !reason.empty()) fail("cuda_v3_hopper/fp8: ", reason);
  const size_t bytes = fp8_workspace(problem, config).bytes;
  // Where the registry entry would run: on this machine's GPU, or else in the emulator.
  if (!fp8_emulation().empty()) {
    cuda::emulated::run_on_device(problem, inputs, outputs, bytes, [&](const DeviceTensors& tensors) {
      emulated::launch_fp8_config(problem, tensors, config);
    });
    return;
  }
#if FLASHLAB_LINKS_GPU_BUILDS
  cuda::gpu::run_on_device(problem, inputs, outputs, bytes, [&](const DeviceTensors& tensors) {
    gpu::launch_fp8_config(problem, tensors, config);
  });
#endif
}

}  // namespace flashlab::hopper
