// Timing a GPU implementation's launchers on device pointers (flashlab gpu-bench): no copy and no host
// synchronization inside the timed region. One build per target (common/cuda/target.hpp): on the GPU with
// CUDA events; in the emulator with its events, which read the host's clock (gpu-bench --emulate, the GPU
// report's rehearsal: the same code path, and a time that measures the emulator, never a GPU).
#pragma once

#include <cstddef>

#include "common/cuda/target.hpp"
#include "common/registry.hpp"
#include "common/tensor.hpp"

namespace flashlab::cuda {

struct TimingPlan {
  // Copies of the inputs are uploaded until they hold more than rotate_bytes (twice the L2 cache, so that no
  // run finds its inputs there), at most max_copies; the runs rotate through them.
  size_t rotate_bytes = 0;
  int max_copies = 16;
  // Repeats: as many as fit `seconds` of device time at the first run's pace, within [min_repeats,
  // max_repeats].
  double seconds = 1.0;
  int min_repeats = 3;
  int max_repeats = 20;
};

struct Timing {
  double median_ms = 0;  // median of the timed runs, each bracketed by its own pair of events
  int repeats = 0;
};

FLASHLAB_FOR_EACH_TARGET(
    // The forward of `build` on `problem`: first one untimed run on copy 0, whose O and LSE go to `checked`
    // (poisoned by the caller: every element must be written), then the timed runs.
    Timing time_forward(const Problem& problem, const AttentionInputs& inputs, const DeviceBuild& build,
                        const TimingPlan& plan, AttentionOutputs& checked);
    // The main kernel of `build`'s forward alone (DeviceBuild::forward_main): the whole forward once on every
    // copy, untimed (the pre-pass's output in each copy's workspace); then O and LSE of copy 0 poisoned and
    // the main kernel run on it, its O and LSE to `checked`; then the timed runs of the main kernel.
    Timing time_forward_main(const Problem& problem, const AttentionInputs& inputs, const DeviceBuild& build,
                             const TimingPlan& plan, AttentionOutputs& checked);
    // The backward of `build` from the forward's O and LSE and dO: first one untimed run whose gradients go
    // to `checked`, then the timed runs (one copy: its inputs, outputs and gradients are far beyond the L2).
    Timing time_backward(const Problem& problem, const AttentionInputs& inputs,
                         const AttentionOutputs& forward, const HostTensor& d_out, const DeviceBuild& build,
                         const TimingPlan& plan, AttentionGradients& checked);)
using namespace FLASHLAB_CUDA_TARGET;

}  // namespace flashlab::cuda
