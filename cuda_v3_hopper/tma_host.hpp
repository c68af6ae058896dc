// Host side of TMA: the driver's tensor-map encoder, which both Hopper kernels' launchers (ws_launch.cu,
// fp8_launch.cu) use to describe their tiles. In emulated builds the runtime hands out the emulator's encoder
// (emulator/tensor_map.hpp), which checks the same parameters and records them for its TMA.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include "common/cuda/check.hpp"
#include "common/cuda/target.hpp"
#include "common/error.hpp"

namespace flashlab::hopper {
namespace FLASHLAB_CUDA_TARGET {

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

}  // namespace FLASHLAB_CUDA_TARGET
using namespace FLASHLAB_CUDA_TARGET;
}  // namespace flashlab::hopper
