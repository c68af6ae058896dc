// Kernel launches and dynamic shared memory, written once for both builds of a kernel's source
// (common/cuda/target.hpp): nvcc's <<<>>> for the GPU, the emulator's grid for the host compiler.
//
//   launch_kernel<split_q_kernel<__half, 64>>(grid, threads, shared_bytes, stream, params);
//   Tiles* tiles = dynamic_shared_memory<Tiles>();   // in place of extern __shared__ __align__(16) ...
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "common/cuda/check.hpp"
#include "common/cuda/target.hpp"

#if defined(FLASHLAB_EMULATED)
#include "emulator/launch_kernel.hpp"
#endif

namespace flashlab::cuda {
namespace FLASHLAB_CUDA_TARGET {

// Launches `Kernel` and checks the launch; a fault inside the kernel surfaces at the next synchronizing call
// on a GPU, and at once (with the emulator's account of it) in the emulator.
template <auto Kernel, typename... Args>
void launch_kernel(dim3 grid, dim3 block, size_t dynamic_shared_bytes, cudaStream_t stream, Args&&... args) {
#if defined(FLASHLAB_EMULATED)
  (void)stream;  // the emulator runs every launch at once, in order
  emulator::launch_kernel<Kernel>(grid, block, dynamic_shared_bytes, std::forward<Args>(args)...);
#else
  // (clang-format would split the launch brackets)
  // clang-format off
  Kernel<<<grid, block, dynamic_shared_bytes, stream>>>(std::forward<Args>(args)...);
  // clang-format on
  FLASHLAB_CUDA_CHECK_LAUNCH();
#endif
}

// The current device's streaming multiprocessors (132 on an H100 SXM, as on the emulator's device): what a
// grid of one block per SM (a split count, a persistent kernel) is sized by. Asked once per thread and
// device.
inline int sm_count() {
  thread_local int cached_device = -1, cached_sms = 0;
  int device = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&device));
  if (device != cached_device) {
    FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&cached_sms, cudaDevAttrMultiProcessorCount, device));
    cached_device = device;
  }
  return cached_sms;
}

// The block's dynamic shared memory (the launch's shared_bytes). CUDA guarantees it 16-byte alignment, so a
// kernel that needs more (a 1024-byte swizzle atom) aligns the pointer itself. Every kernel declares the
// array the same way: nvcc warns when two declarations of it differ in alignment.
template <typename T>
__device__ inline T* dynamic_shared_memory() {
  static_assert(alignof(T) <= 16, "dynamic shared memory is only guaranteed 16-byte alignment");
#if defined(FLASHLAB_EMULATED)
  return static_cast<T*>(emulator::dynamic_shared_memory(16));
#else
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  return reinterpret_cast<T*>(dynamic_shared);
#endif
}

}  // namespace FLASHLAB_CUDA_TARGET
using namespace FLASHLAB_CUDA_TARGET;
}  // namespace flashlab::cuda
