#include "common/cuda/gpu_stage.hpp"

#include <climits>
#include <string>
#include <utility>

#include "common/cuda/device.hpp"
#include "common/error.hpp"

namespace flashlab {

std::string grid_extent_limit(const char* field, int64_t value) {
  if (value <= 65535) return "";
  return std::string(field) + " (" + std::to_string(value) + ") must be at most 65535 (a CUDA grid extent)";
}

std::string int_lengths_and_positive_scale(const Problem& p, const std::string& name) {
  // Packed, the cumulative lengths are narrowed to int too (padded offsets are 64-bit: no such limit).
  const int64_t packed_q = p.packed() ? p.tokens_q() : 0, packed_k = p.packed() ? p.tokens_k() : 0;
  for (const auto& [field, value] : {std::pair<const char*, int64_t>{"seqlen_q", p.seqlen_q},
                                     {"seqlen_k", p.seqlen_k},
                                     {"window_left", p.window_left},
                                     {"window_right", p.window_right},
                                     {"the packed tokens of Q (cu_seqlens_q)", packed_q},
                                     {"the packed tokens of K (cu_seqlens_k)", packed_k}})
    if (value > INT_MAX) return std::string(field) + " (" + std::to_string(value) + ") must fit an int";
  if (!(p.softmax_scale() > 0.0))
    return "scale (" + std::to_string(p.softmax_scale()) + ") must be positive for " + name;
  return "";
}

Implementation gpu_implementation(Implementation impl, DeviceBuilds builds) {
  impl.device = Device::cuda;
  // Why the GPU build cannot run here: the machine's reason first, then the stage's own (an architecture).
  auto gpu_reason = [gpu = builds.gpu, own = std::move(impl.availability)]() -> std::string {
    if (gpu == nullptr) return "built without CUDA";
    const std::string& reason = cuda::unavailable_reason();
    if (!reason.empty() || !own) return reason;
    return own();
  };
  impl.emulation = [gpu_reason]() -> std::string {
    if (cuda::emulation_forced()) return "emulation requested (--emulate or FLASHLAB_EMULATE=1)";
    return gpu_reason();
  };
  impl.availability = [] { return std::string(); };  // the emulator's build runs anywhere
  if (builds.gpu != nullptr) {
    impl.gpu_build.forward = builds.gpu;
    if (builds.gpu_workspace != nullptr) impl.gpu_build.workspace = builds.gpu_workspace;
  }
  impl.emulated_build.forward = builds.emulated;
  if (builds.emulated_workspace != nullptr) impl.emulated_build.workspace = builds.emulated_workspace;
  impl.forward = [emulation = impl.emulation, gpu = impl.gpu_build, emulated_build = impl.emulated_build](
                     const Problem& problem, const AttentionInputs& inputs, AttentionOutputs& outputs) {
    const bool emulated = !emulation().empty();
    const DeviceBuild& build = emulated ? emulated_build : gpu;
    const size_t bytes = build.workspace ? build.workspace(problem) : 0;
    const auto launch = [&problem, &build](const DeviceTensors& tensors) { build.forward(problem, tensors); };
    if (emulated) {
      cuda::emulated::run_on_device(problem, inputs, outputs, bytes, launch);
      return;
    }
#if FLASHLAB_HAVE_CUDA
    cuda::gpu::run_on_device(problem, inputs, outputs, bytes, launch);
#endif
  };
  return impl;
}

Implementation with_main_kernel(Implementation impl, DeviceMainBuilds builds) {
  if (builds.gpu != nullptr) impl.gpu_build.forward_main = builds.gpu;
  impl.emulated_build.forward_main = builds.emulated;
  return impl;
}

Implementation with_gpu_backward(Implementation impl, DeviceBackwardBuilds builds,
                                 std::function<std::string(const Problem&)> supports) {
  impl.supports_backward = std::move(supports);
  if (builds.gpu != nullptr) impl.gpu_build.backward = builds.gpu;
  impl.emulated_build.backward = builds.emulated;
  if (builds.workspace != nullptr)
    impl.gpu_build.backward_workspace = impl.emulated_build.backward_workspace = builds.workspace;
  impl.backward = [builds, emulation = impl.emulation](
                      const Problem& problem, const AttentionInputs& inputs, const AttentionOutputs& forward,
                      const HostTensor& d_out, AttentionGradients& gradients) {
    const bool emulated = !emulation().empty();
    const DeviceBackwardLauncher launcher = emulated ? builds.emulated : builds.gpu;
    const size_t bytes = builds.workspace ? builds.workspace(problem) : 0;
    const auto launch = [&problem, launcher](const BackwardTensors& tensors) { launcher(problem, tensors); };
    if (emulated) {
      cuda::emulated::run_backward_on_device(problem, inputs, forward, d_out, gradients, bytes, launch);
      return;
    }
#if FLASHLAB_HAVE_CUDA
    cuda::gpu::run_backward_on_device(problem, inputs, forward, d_out, gradients, bytes, launch);
#endif
  };
  return impl;
}

}  // namespace flashlab
