// The machine's own ceilings, measured here and now (SPEC "Measuring"): the FP32 FMA peak (a
// register-resident FMA loop at the widest vector width this build targets) and the memory bandwidth (a large
// copy).
#pragma once

#include <string>

namespace flashlab {

struct MachineCeilings {
  std::string cpu;              // model name from /proc/cpuinfo
  int threads = 1;              // OpenMP threads used for the all-core figures
  int vector_bits = 128;        // width of the FMA loop's vectors
  double fma_gflops_1core = 0;  // FP32 FMA peak, one thread (2 FLOPs per lane per FMA)
  double fma_gflops_all = 0;    // FP32 FMA peak, all threads
  double copy_gbps = 0;         // large copy, counting bytes read plus bytes written
};

// Measures once per process (about half a second) and returns the cached figures afterwards.
const MachineCeilings& machine_ceilings();

}  // namespace flashlab
