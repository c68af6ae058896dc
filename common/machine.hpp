// The machine's own ceilings, measured here and now (docs/conventions.md §10): the FP32 FMA peak (a
// register-resident FMA loop at the widest vector width this build targets) and the memory bandwidth (a large
// copy); the cache sizes (read from sysfs); and, where a GPU is present, its copy bandwidth and bf16 GEMM
// rate. The one place for these numbers: `machine`, `compare`, `bench` and `roofline` all read them from
// here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flashlab {

struct CacheLevel {
  int level = 0;              // 1, 2, 3
  std::string type;           // "Data" or "Unified" (instruction caches are left out)
  int64_t bytes = 0;          // size of one instance
  int shared_by_threads = 1;  // logical CPUs sharing one instance
};

struct MachineCeilings {
  std::string cpu;                 // model name from /proc/cpuinfo
  int threads = 1;                 // OpenMP threads used for the all-core figures
  int vector_bits = 128;           // width of the FMA loop's vectors
  double fma_gflops_1core = 0;     // FP32 FMA peak, one thread (2 FLOPs per lane per FMA)
  double fma_gflops_all = 0;       // FP32 FMA peak, all threads
  double copy_gbps = 0;            // large copy, counting bytes read plus bytes written
  std::vector<CacheLevel> caches;  // data and unified caches of cpu0, innermost first
};

// The caches as sysfs describes them (/sys/devices/system/cpu/cpu0/cache); empty where sysfs does not say.
// Cheap: no measurement.
std::vector<CacheLevel> cache_levels();

// One GPU's ceilings, measured: a device-to-device copy (bytes read plus written) and a large bf16 GEMM
// (cuBLAS). cuBLAS is opened at run time (FLASHLAB_CUBLAS names the library file where the loader cannot
// find it, e.g. inside PyTorch's nvidia-cublas wheel); without it the GEMM is not measured and says why.
struct GpuCeilings {
  std::string name;
  int sm_count = 0;
  double memory_gib = 0;
  double copy_gbps = 0;
  double bf16_gemm_tflops = 0;   // NaN when gemm_unavailable is set
  std::string gemm_unavailable;  // "" when the GEMM was measured, else why not ("cannot open libcublas...")
};

struct GpuReport {
  std::vector<GpuCeilings> devices;  // empty without a GPU
  std::string absent_reason;         // why `devices` is empty ("built without CUDA", "no CUDA device", ...)
};

// Measures once per process (about half a second) and returns the cached figures afterwards.
const MachineCeilings& machine_ceilings();

// The GPUs' ceilings, measured once per process. Without CUDA (common/machine_gpu_none.cpp) it reports no
// devices and says why; a CUDA build measures them in the file that replaces it (see common/CMakeLists.txt).
const GpuReport& gpu_ceilings();

}  // namespace flashlab
