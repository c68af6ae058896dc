#include "common/cuda/gpu_stage.hpp"

#include <climits>
#include <string>
#include <utility>

#include "common/cuda/device.hpp"
#include "common/error.hpp"

#if FLASHLAB_HAVE_CUDA
#include <cuda_runtime.h>

#include "common/cuda/check.hpp"
#include "common/cuda/device_problem.hpp"
#endif

namespace flashlab {

#if FLASHLAB_HAVE_CUDA
void run_on_device(const Problem& problem, const AttentionInputs& inputs, AttentionOutputs& outputs,
                   size_t workspace_bytes, const std::function<void(const DeviceTensors&)>& launch) {
  const cuda::DeviceProblem device(problem, inputs, workspace_bytes);
  launch(device.tensors());
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());  // a fault inside the kernel surfaces here, checked
  device.download(outputs);
}
#endif

std::string grid_extent_limit(const char* field, int64_t value) {
  if (value <= 65535) return "";
  return std::string(field) + " (" + std::to_string(value) + ") must be at most 65535 (a CUDA grid extent)";
}

std::string int_lengths_and_positive_scale(const Problem& p, const std::string& name) {
  for (const auto& [field, value] : {std::pair<const char*, int64_t>{"seqlen_q", p.seqlen_q},
                                     {"seqlen_k", p.seqlen_k},
                                     {"window_left", p.window_left},
                                     {"window_right", p.window_right}})
    if (value > INT_MAX) return std::string(field) + " (" + std::to_string(value) + ") must fit an int";
  if (!(p.softmax_scale() > 0.0))
    return "scale (" + std::to_string(p.softmax_scale()) + ") must be positive for " + name;
  return "";
}

Implementation gpu_implementation(Implementation impl, DeviceLauncher launcher) {
  impl.device = Device::cuda;
  if (launcher == nullptr) {
    impl.availability = [] { return std::string("built without CUDA"); };
    impl.forward = [name = impl.name](const Problem&, const AttentionInputs&, AttentionOutputs&) {
      fail(name, " cannot run: built without CUDA");
    };
    return impl;
  }
  // The machine's reason first; then the stage's own, if it has one (e.g. an architecture it needs).
  impl.availability = [own = std::move(impl.availability)]() -> std::string {
    const std::string& reason = cuda::unavailable_reason();
    if (!reason.empty() || !own) return reason;
    return own();
  };
  impl.forward_device = launcher;
#if FLASHLAB_HAVE_CUDA
  impl.forward = [launcher, workspace = impl.device_workspace_bytes](
                     const Problem& problem, const AttentionInputs& inputs, AttentionOutputs& outputs) {
    run_on_device(problem, inputs, outputs, workspace ? workspace(problem) : 0,
                  [&problem, launcher](const DeviceTensors& tensors) { launcher(problem, tensors); });
  };
#endif
  return impl;
}

}  // namespace flashlab
