// CUDA error checks, in one place: every CUDA call and every kernel launch goes through these. A failure
// throws naming the call, the file and line, and CUDA's error string: flashlab::ExecutionError (the tool's
// exit code 1: the implementation or the device failed), except out of device memory, which is the problem's
// size (flashlab::DeviceMemoryError, exit code 2, as a problem too large for the CPU's memory is).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "common/cuda/target.hpp"
#include "common/error.hpp"

namespace flashlab::cuda {
namespace FLASHLAB_CUDA_TARGET {

inline void check(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  const std::string message = std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                              cudaGetErrorName(status) + ": " + cudaGetErrorString(status);
  if (status == cudaErrorMemoryAllocation) {
    // Not sticky: the device stays usable. Cleared here, or the next launch's check would report it again,
    // against the next stage (compare and gpu-bench go on after it).
    (void)cudaGetLastError();
    throw DeviceMemoryError(message + " (the problem is too large for this device's memory)");
  }
  throw ExecutionError(message);
}

}  // namespace FLASHLAB_CUDA_TARGET
using namespace FLASHLAB_CUDA_TARGET;
}  // namespace flashlab::cuda

// FLASHLAB_CUDA_CHECK(cudaMemcpy(...));
#define FLASHLAB_CUDA_CHECK(call) ::flashlab::cuda::check((call), #call, __FILE__, __LINE__)

// After a <<<...>>> launch: catches bad launch configurations at once (asynchronous faults surface at the
// next synchronizing call, which is itself checked).
#define FLASHLAB_CUDA_CHECK_LAUNCH() \
  ::flashlab::cuda::check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
