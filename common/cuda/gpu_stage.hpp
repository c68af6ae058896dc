// The pattern every GPU stage follows, in ordinary C++ so that it compiles with or without CUDA:
//
//   cuda_vN/variant.cu    (compiled only when FLASHLAB_HAVE_CUDA) the kernel and its launcher on device
//   pointers:
//                           void launch_variant(const Problem&, const DeviceTensors&);
//   cuda_vN/variant.cpp   (always compiled) the registration:
//                           static const Registration variant{gpu_implementation(
//                               {.name = "cuda_vN/variant", .summary = ..., .supports = ...},
//                               FLASHLAB_CUDA_LAUNCHER(launch_variant))};
//
// gpu_implementation() completes the entry: device cuda; `availability` says "built without CUDA" or
// "no CUDA device: ..." when it cannot run here (so the implementation is still listed, and its tests are
// skipped with that reason), and otherwise what the stage's own `availability` says, if it set one (e.g. a
// compute capability it needs); `forward_device` is the launcher (benchmarks time it on device pointers); and
// `forward` is the registry adapter: it copies the host float32 inputs to the device in the problem's storage
// format, runs the launcher, and copies O and LSE back, so the harness and the tool treat a GPU
// implementation like a CPU one.
#pragma once

#include <cstddef>
#include <functional>

#include "common/registry.hpp"

namespace flashlab {

using DeviceLauncher = void (*)(const Problem&, const DeviceTensors&);

// `launcher` is nullptr in a build without CUDA (FLASHLAB_CUDA_LAUNCHER does that).
Implementation gpu_implementation(Implementation implementation, DeviceLauncher launcher);

// Limits that the GPU stages' supports() share, each as a reason naming the field ("" when the problem fits):
// - `field` (value) used as a grid's y or z extent, which CUDA limits to 65535;
std::string grid_extent_limit(const char* field, int64_t value);
// - kernels whose parameters hold the lengths and windows as int (seqlen_q, seqlen_k, window_left,
//   window_right) and that take the row max of unscaled scores and fold the scale into exp2 afterwards, which
//   keeps the max in place only for a positive scale (`name` is the implementation, for the message).
std::string int_lengths_and_positive_scale(const Problem& problem, const std::string& name);

#if FLASHLAB_HAVE_CUDA
// What the registry adapter does around a launcher, for callers that launch something else (a stage's
// kernel with non-default knobs): uploads `inputs` in the problem's storage format with `workspace_bytes` of
// scratch, runs `launch` on the device tensors, synchronizes (a fault in a kernel surfaces here, checked) and
// downloads O and LSE into `outputs`.
void run_on_device(const Problem& problem, const AttentionInputs& inputs, AttentionOutputs& outputs,
                   size_t workspace_bytes, const std::function<void(const DeviceTensors&)>& launch);
#endif

}  // namespace flashlab

// The launcher where the build has CUDA, nullptr where it does not (the launcher is then not even declared).
#if FLASHLAB_HAVE_CUDA
#define FLASHLAB_CUDA_LAUNCHER(launcher) (&(launcher))
#else
#define FLASHLAB_CUDA_LAUNCHER(launcher) nullptr
#endif
