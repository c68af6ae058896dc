// The GPU ceilings of a build without CUDA: no devices, and why. A CUDA build compiles the measuring version
// in its place (common/CMakeLists.txt).
#include "common/machine.hpp"

namespace flashlab {

const GpuReport& gpu_ceilings() {
  static const GpuReport report{{}, "built without CUDA"};
  return report;
}

}  // namespace flashlab
