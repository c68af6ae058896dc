// A CUDA stage's source is compiled twice: by nvcc for the GPU, and by the host compiler for the CPU emulator
// of the CUDA execution model (emulator/, with FLASHLAB_EMULATED defined and emulator/include/ standing in
// for NVIDIA's headers). Code compiled once that talks to the CUDA runtime (benchmarks, the GPU ceilings)
// belongs to the GPU build.
//
// Everything either build defines outside an anonymous namespace lives in a namespace named after its target,
// `gpu` or `emulated`, so that both link into one program: the registry then runs a GPU stage on the GPU
// where there is one that can, and in the emulator otherwise (or when asked to, --emulate). A header declares
// such code in FLASHLAB_CUDA_TARGET and makes it visible in the enclosing namespace (`using namespace
// FLASHLAB_CUDA_TARGET;`), so either build's code reads `cuda::DeviceBuffer`; code compiled once that must
// choose spells the target out (`cuda_v2::emulated::launch_split_q`).
#pragma once

#if defined(FLASHLAB_EMULATED)
#define FLASHLAB_CUDA_TARGET emulated
#else
#define FLASHLAB_CUDA_TARGET gpu
#endif

// Declares the same functions for both targets, for code compiled once that picks one at run time (a stage's
// registration): FLASHLAB_FOR_EACH_TARGET(void launch_split_q(const Problem&, const DeviceTensors&);)
#define FLASHLAB_FOR_EACH_TARGET(...) \
  namespace gpu {                     \
  __VA_ARGS__                         \
  }                                   \
  namespace emulated {                \
  __VA_ARGS__                         \
  }
