// Host side of TMA: the driver's tensor-map encoder, which both Hopper kernels' launchers (ws_launch.cu,
// fp8_launch.cu) use to describe their tiles. Compiled only with CUDA.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include "common/cuda/check.hpp"
#include "common/error.hpp"

namespace flashlab::hopper {

// cuTensorMapEncodeTiled, found through the runtime once (no link against libcuda).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    FLASHLAB_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                                         cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || function == nullptr)
      fail("cuTensorMapEncodeTiled: not available from the installed driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encode;
}

}  // namespace flashlab::hopper
