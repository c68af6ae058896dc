// The GPU ceilings where nothing measures them (a build without CUDA, or a CUDA build without
// common/cuda/machine_gpu.cu): no devices, and why. common/CMakeLists.txt picks this file or that one.
#include "common/machine.hpp"

namespace flashlab {

const GpuReport& gpu_ceilings() {
#if defined(FLASHLAB_CUDA_BUILD)
  static const GpuReport report{{}, "this CUDA build does not measure GPU ceilings yet"};
#else
  static const GpuReport report{{}, "built without CUDA"};
#endif
  return report;
}

}  // namespace flashlab
