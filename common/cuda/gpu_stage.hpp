// The pattern every GPU stage follows, in ordinary C++ so that it compiles in every build:
//
//   cuda_vN/variant.cu    the kernel and its launcher on device pointers, compiled twice
//   (common/cuda/target.hpp):
//                         by nvcc for the GPU (CUDA builds only) and by the host compiler for the emulator:
//                           namespace flashlab::cuda_vN::FLASHLAB_CUDA_TARGET {
//                           void launch_variant(const Problem&, const DeviceTensors&);
//                           }
//   cuda_vN/variant.hpp   declares it for both: FLASHLAB_FOR_EACH_TARGET(void launch_variant(...);)
//   cuda_vN/variant.cpp   (compiled once) the registration:
//                           static const Registration variant{gpu_implementation(
//                               {.name = "cuda_vN/variant", .summary = ..., .supports = ...},
//                               FLASHLAB_DEVICE_BUILDS(launch_variant, workspace_bytes))};
//
// gpu_implementation() completes the entry: device cuda; `forward` is the registry adapter, which copies the
// host float32 inputs to device memory in the problem's storage format, runs the launcher and copies O and
// LSE back, so the harness and the tool treat a GPU implementation like a CPU one. It runs the GPU build
// where a CUDA device can run it (the stage's own `availability`, e.g. a compute capability, says whether
// this one can), and the emulator's build otherwise or when emulation is requested (`emulation` says why);
// `gpu_build` and `emulated_build` hold the two builds' launchers (benchmarks time them on device pointers,
// through device_build() of common/registry.hpp).
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "common/cuda/target.hpp"
#include "common/registry.hpp"

namespace flashlab {

using DeviceLauncher = void (*)(const Problem&, const DeviceTensors&);
using DeviceWorkspace = size_t (*)(const Problem&);

// A GPU stage's launcher in each build of its source, and the scratch each needs for a problem (nullptr:
// none). The GPU build's is nullptr in a build without CUDA.
struct DeviceBuilds {
  DeviceLauncher gpu = nullptr;
  DeviceLauncher emulated = nullptr;
  DeviceWorkspace gpu_workspace = nullptr;
  DeviceWorkspace emulated_workspace = nullptr;
};

Implementation gpu_implementation(Implementation implementation, DeviceBuilds builds);

// A GPU stage's backward launcher in each build, and its scratch (one function for both builds).
using DeviceBackwardLauncher = void (*)(const Problem&, const BackwardTensors&);
struct DeviceBackwardBuilds {
  DeviceBackwardLauncher gpu = nullptr;
  DeviceBackwardLauncher emulated = nullptr;
  DeviceWorkspace workspace = nullptr;
};
// Gives an implementation made by gpu_implementation() a backward pass (`supports`: what it accepts beyond
// the forward's rules), run in the build the forward runs in: on the GPU where the forward is, else in the
// emulator. The adapter copies the inputs, the forward's O and LSE and dO to the device and the gradients
// back (cuda::run_backward_on_device).
Implementation with_gpu_backward(Implementation implementation, DeviceBackwardBuilds builds,
                                 std::function<std::string(const Problem&)> supports);

// Gives an implementation made by gpu_implementation(), whose forward is a pre-pass and a main kernel, the
// main kernel's launcher alone in each build (DeviceBuild::forward_main): it runs on a workspace the forward
// has prepared, so that a benchmark can time the kernel apart from the pre-pass.
struct DeviceMainBuilds {
  DeviceLauncher gpu = nullptr;
  DeviceLauncher emulated = nullptr;
};
Implementation with_main_kernel(Implementation implementation, DeviceMainBuilds builds);

// Limits that the GPU stages' supports() share, each as a reason naming the field ("" when the problem fits):
// - `field` (value) used as a grid's y or z extent, which CUDA limits to 65535;
std::string grid_extent_limit(const char* field, int64_t value);
// - kernels whose parameters hold the lengths and windows as int (seqlen_q, seqlen_k, window_left,
//   window_right) and that take the row max of unscaled scores and fold the scale into exp2 afterwards, which
//   keeps the max in place only for a positive scale (`name` is the implementation, for the message).
std::string int_lengths_and_positive_scale(const Problem& problem, const std::string& name);

namespace cuda {
// What the registry adapter does around a launcher, for callers that launch something else (a stage's
// kernel with non-default knobs): uploads `inputs` in the problem's storage format with `workspace_bytes` of
// scratch, runs `launch` on the device tensors, synchronizes (a fault in a kernel surfaces here, checked) and
// downloads O and LSE into `outputs` (common/cuda/device_problem.cpp).
// And the backward's: uploads the inputs, the forward's O and LSE and dO, runs `launch` with
// `workspace_bytes` of scratch, synchronizes, and downloads dQ, dK and dV into `gradients`.
FLASHLAB_FOR_EACH_TARGET(
    void run_on_device(const Problem& problem, const AttentionInputs& inputs, AttentionOutputs& outputs,
                       size_t workspace_bytes, const std::function<void(const DeviceTensors&)>& launch);
    void run_backward_on_device(const Problem& problem, const AttentionInputs& inputs,
                                const AttentionOutputs& forward, const HostTensor& d_out,
                                AttentionGradients& gradients, size_t workspace_bytes,
                                const std::function<void(const BackwardTensors&)>& launch);
    // The same on tensors that already live in the memory of GPU `device`, in the problem's storage
    // format, as a framework's do (the Python module's CUDA tensors): Q, K, V, O, LSE, the workspace and
    // the stream set by the caller (for the backward also dO and the gradients). With `device` current,
    // the problem's small tensors (lengths, mask, bias, slopes) are uploaded on that stream and the launch
    // is enqueued after them; nothing waits on the host: the results are ready when the stream reaches
    // them. No paged KV (it is built from host arrays).
    void run_on_stream(const Problem& problem, int device, DeviceTensors tensors,
                       const std::function<void(const DeviceTensors&)>& launch);
    void run_backward_on_stream(const Problem& problem, int device, BackwardTensors tensors,
                                const std::function<void(const BackwardTensors&)>& launch);)
using namespace FLASHLAB_CUDA_TARGET;
}  // namespace cuda

}  // namespace flashlab

// Whether this program links the stages' GPU builds: where the build has CUDA, unless the program is built
// for the emulator only (FLASHLAB_EMULATOR_ONLY: a course exercise's copy of a stage, cmake/exercises.cmake).
// Code that calls a gpu:: function directly is compiled only where this is 1.
#if FLASHLAB_HAVE_CUDA && !defined(FLASHLAB_EMULATOR_ONLY)
#define FLASHLAB_LINKS_GPU_BUILDS 1
#else
#define FLASHLAB_LINKS_GPU_BUILDS 0
#endif

// The GPU build of a stage's function where the program links them, nullptr where it does not (the function
// is then not even defined).
#if FLASHLAB_LINKS_GPU_BUILDS
#define FLASHLAB_GPU_BUILD(function) (&(gpu::function))
#else
#define FLASHLAB_GPU_BUILD(function) nullptr
#endif

// Both builds of a stage's backward launcher, with its scratch-size function.
#define FLASHLAB_DEVICE_BACKWARD_BUILDS(launcher, workspace)                                               \
  ::flashlab::DeviceBackwardBuilds {                                                                       \
    FLASHLAB_GPU_BUILD(launcher), &emulated::launcher, static_cast<::flashlab::DeviceWorkspace>(workspace) \
  }

// Both builds of a stage's main-kernel launcher (with_main_kernel).
#define FLASHLAB_DEVICE_MAIN_BUILDS(launcher)         \
  ::flashlab::DeviceMainBuilds {                      \
    FLASHLAB_GPU_BUILD(launcher), &emulated::launcher \
  }

// Both builds of a stage's launcher, with one scratch-size function for both (plain C++, compiled once).
#define FLASHLAB_DEVICE_BUILDS(launcher, workspace)                                                         \
  ::flashlab::DeviceBuilds {                                                                                \
    FLASHLAB_GPU_BUILD(launcher), &emulated::launcher, static_cast<::flashlab::DeviceWorkspace>(workspace), \
        static_cast<::flashlab::DeviceWorkspace>(workspace)                                                 \
  }
