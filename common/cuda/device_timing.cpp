#include "common/cuda/device_timing.hpp"

#include <algorithm>
#include <functional>
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

// The plan's copies of the problem, each with `workspace` bytes of scratch.
std::vector<std::unique_ptr<DeviceProblem>> rotated_copies(const Problem& p, const AttentionInputs& inputs,
                                                           size_t workspace, const TimingPlan& plan) {
  std::vector<std::unique_ptr<DeviceProblem>> copies;
  copies.push_back(std::make_unique<DeviceProblem>(p, inputs, workspace));
  const size_t per_copy = std::max<size_t>(1, copies[0]->tensor_bytes());
  const size_t wanted = std::min<size_t>(std::max(1, plan.max_copies), plan.rotate_bytes / per_copy + 1);
  while (copies.size() < wanted) copies.push_back(std::make_unique<DeviceProblem>(p, inputs, workspace));
  return copies;
}

// Runs `launch` on copy n (of all, in turn): first the checked run on copy 0, whose O and LSE go to
// `checked`, which also warms up (module load, first-touch); then the timed runs.
Timing timed_runs(const std::vector<std::unique_ptr<DeviceProblem>>& copies, const TimingPlan& plan,
                  const std::function<void(const DeviceTensors&)>& launch, AttentionOutputs& checked) {
  const auto run = [&](int n) { launch(copies[static_cast<size_t>(n) % copies.size()]->tensors()); };
  run(0);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  copies[0]->download(checked);
  Timing timing;
  timing.repeats = repeats_for(plan, median_event_ms(0, 1, run));
  timing.median_ms = median_event_ms(0, timing.repeats, run);
  return timing;
}

}  // namespace

Timing time_forward(const Problem& p, const AttentionInputs& inputs, const DeviceBuild& build,
                    const TimingPlan& plan, AttentionOutputs& checked) {
  if (!build.forward) fail("this build has no forward launcher");
  const auto copies = rotated_copies(p, inputs, build.workspace ? build.workspace(p) : 0, plan);
  return timed_runs(
      copies, plan, [&](const DeviceTensors& tensors) { build.forward(p, tensors); }, checked);
}

Timing time_forward_main(const Problem& p, const AttentionInputs& inputs, const DeviceBuild& build,
                         const TimingPlan& plan, AttentionOutputs& checked) {
  if (!build.forward || !build.forward_main) fail("this build's forward has no main kernel of its own");
  const auto copies = rotated_copies(p, inputs, build.workspace ? build.workspace(p) : 0, plan);
  for (const auto& copy : copies) build.forward(p, copy->tensors());  // the pre-pass's output in each
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  copies[0]->upload_forward(AttentionOutputs::poisoned(p));  // the main kernel must write O and LSE itself
  return timed_runs(
      copies, plan, [&](const DeviceTensors& tensors) { build.forward_main(p, tensors); }, checked);
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
