#include "common/cuda/device_timing.hpp"

#include <algorithm>
#include <memory>
#include <vector>

#include "common/cuda/device_problem.hpp"
#include "common/cuda/event_timer.hpp"
#include "common/error.hpp"

namespace flashlab::cuda::FLASHLAB_CUDA_TARGET {

namespace {

// As many repeats as fit plan.seconds at `first_ms` a run, within the plan's bounds.
int repeats_for(const TimingPlan& plan, double first_ms) {
  const double fitting = plan.seconds * 1e3 / std::max(first_ms, 1e-3);
  return static_cast<int>(std::clamp(fitting, double(plan.min_repeats), double(plan.max_repeats)));
}

}  // namespace

Timing time_forward(const Problem& p, const AttentionInputs& inputs, const DeviceBuild& build,
                    const TimingPlan& plan, AttentionOutputs& checked) {
  if (!build.forward) fail("this build has no forward launcher");
  const size_t workspace = build.workspace ? build.workspace(p) : 0;
  std::vector<std::unique_ptr<DeviceProblem>> copies;
  copies.push_back(std::make_unique<DeviceProblem>(p, inputs, workspace));
  const size_t per_copy = std::max<size_t>(1, copies[0]->tensor_bytes());
  const size_t wanted = std::min<size_t>(std::max(1, plan.max_copies), plan.rotate_bytes / per_copy + 1);
  while (copies.size() < wanted) copies.push_back(std::make_unique<DeviceProblem>(p, inputs, workspace));
  const auto run = [&](int n) {
    build.forward(p, copies[static_cast<size_t>(n) % copies.size()]->tensors());
  };

  run(0);  // the checked run, which also warms up (module load, first-touch)
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  copies[0]->download(checked);
  Timing timing;
  timing.repeats = repeats_for(plan, median_event_ms(0, 1, run));
  timing.median_ms = median_event_ms(0, timing.repeats, run);
  return timing;
}

Timing time_backward(const Problem& p, const AttentionInputs& inputs, const AttentionOutputs& forward,
                     const HostTensor& d_out, const DeviceBuild& build, const TimingPlan& plan,
                     AttentionGradients& checked) {
  if (!build.backward) fail("this build has no backward launcher");
  DeviceProblem device(p, inputs, build.backward_workspace ? build.backward_workspace(p) : 0);
  device.upload_forward(forward);
  const DeviceGradients gradients(p, d_out);
  const BackwardTensors tensors = gradients.tensors(device);
  const auto run = [&](int) { build.backward(p, tensors); };

  run(0);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  gradients.download(checked);
  Timing timing;
  timing.repeats = repeats_for(plan, median_event_ms(0, 1, run));
  timing.median_ms = median_event_ms(0, timing.repeats, run);
  return timing;
}

}  // namespace flashlab::cuda::FLASHLAB_CUDA_TARGET
