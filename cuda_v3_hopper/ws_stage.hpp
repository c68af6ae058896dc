// cuda_v3_hopper/ws as a registry entry: the launcher on the registry's device tensors, in plain C++ (ws.hpp
// needs the CUDA headers; the registration, ws.cpp, is compiled in every build).
#pragma once

#include <cstddef>
#include <string>

#include "common/cuda/int_lengths.hpp"
#include "common/registry.hpp"

namespace flashlab::hopper {

// Scratch the launcher needs: the int copies of the per-batch lengths (HopperParams holds them as int).
inline size_t ws_workspace_bytes(const Problem& problem) {
  return cuda::int_lengths_bytes(problem);
}

// "" on a device of compute capability 9.0, else why the sm_90a kernels cannot run here (no device, or its
// compute capability): the availability of every cuda_v3_hopper entry (ws.cpp).
std::string needs_sm90a();

// The full kernel (every ablation ingredient on) for a bf16 or f16 problem, enqueued on the default stream
// (ws_launch.cu; the GPU build only, runs on sm_90a: the emulator does not run the Hopper kernels yet).
namespace gpu {
void launch_ws(const Problem& problem, const DeviceTensors& tensors);
}  // namespace gpu

}  // namespace flashlab::hopper
