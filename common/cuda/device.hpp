// The CUDA device as the rest of the project sees it, in ordinary C++ (no CUDA header): whether one can run
// kernels here and, if so, what it is. Compiled in every build; without CUDA it reports "built without CUDA".
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace flashlab::cuda {

// "" when a CUDA device can run kernels here; otherwise why not, for `flashlab list` and skipped tests:
// "built without CUDA" or "no CUDA device: <cudaGetDeviceCount's error>". Asked once per process.
const std::string& unavailable_reason();

struct DeviceProperties {
  std::string name;       // e.g. "NVIDIA H100 80GB HBM3"
  int compute_major = 0;  // compute capability, e.g. 9.0
  int compute_minor = 0;
  int sm_count = 0;             // streaming multiprocessors
  size_t shared_per_block = 0;  // bytes of shared memory a block gets without opting in (48 KiB)
  size_t shared_per_block_optin =
      0;                     // the most a block may opt in to (cudaFuncAttributeMaxDynamicSharedMemorySize)
  size_t shared_per_sm = 0;  // bytes of shared memory per SM (bounds the blocks resident per SM)
  size_t l2_bytes = 0;       // L2 cache size
  size_t global_bytes = 0;   // device memory
};

// The current device's properties (queried once); nullopt when unavailable_reason() is not empty.
std::optional<DeviceProperties> device_properties();

// After a CUDA call failed: "" when the device still runs kernels for this process; otherwise the error that
// left its CUDA context unusable (an illegal address, a misaligned access, an unspecified launch failure),
// with which every later CUDA call in this process fails. A failure that leaves it usable (a launch's bad
// configuration) is cleared. "" without a device.
std::string device_fault();

// Whether GPU stages run in the CPU emulator even where a GPU could run them: false unless the environment
// variable FLASHLAB_EMULATE is set to 1, or force_emulation(true) was called (the tool's --emulate).
bool emulation_forced();
void force_emulation(bool forced);

// "" when the device has exactly compute capability major.minor (what code compiled for an arch-specific
// target such as sm_90a needs, `target` in the message); otherwise unavailable_reason(), or which capability
// this device has.
std::string needs_compute_capability(int major, int minor, const char* target);

}  // namespace flashlab::cuda
