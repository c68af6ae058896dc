// CUDA error checks, in one place: every CUDA call and every kernel launch goes through these. A failure
// throws flashlab::Error naming the call, the file and line, and CUDA's error string.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "common/cuda/target.hpp"
#include "common/error.hpp"

namespace flashlab::cuda {
namespace FLASHLAB_CUDA_TARGET {

inline void check(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess)
    fail(call, " failed at ", file, ":", line, ": ", cudaGetErrorName(status), ": ",
         cudaGetErrorString(status));
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
