// The harness's main: doctest's, except that with FLASHLAB_REQUIRE_GPU=1 set and no CUDA device here it
// checks nothing and exits with 77, which ctest reports as skipped (the `harness_gpu` entry: the GPU stages
// on a real GPU; everywhere else the emulator runs them in `harness_emulated`).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "common/cuda/device.hpp"

int main(int argc, char** argv) {
  const char* require_gpu = std::getenv("FLASHLAB_REQUIRE_GPU");
  if (require_gpu != nullptr && std::string_view(require_gpu) == "1" &&
      !flashlab::cuda::unavailable_reason().empty()) {
    std::printf("skipped: no GPU to run the GPU stages on (%s); the emulator runs them in harness_emulated\n",
                flashlab::cuda::unavailable_reason().c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
