// The GPU's own ceilings, measured here and now (SPEC "Measuring"): the device-to-device copy bandwidth and
// the rate of a large cuBLAS bf16 matrix product. Ordinary C++: callable from `flashlab machine` in any
// build.
#pragma once

#include <optional>
#include <string>

namespace flashlab::cuda {

struct GpuCeilings {
  std::string name;      // device name
  int sm_count = 0;      // streaming multiprocessors
  double copy_gbps = 0;  // cudaMemcpy device to device of 1 GiB, counting bytes read plus bytes written
  double bf16_gemm_tflops = 0;  // cuBLAS 8192^3 GEMM, bf16 in and out, fp32 accumulation (2 FLOPs per MAC)
};

// Measures once per process (about a second on an H100) and returns the cached figures afterwards; nullopt
// without a usable GPU (see unavailable_reason() in common/cuda/device.hpp).
std::optional<GpuCeilings> gpu_ceilings();

}  // namespace flashlab::cuda
