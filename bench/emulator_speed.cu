// How fast the CPU emulator of the CUDA execution model runs the operations kernels are made of, on this CPU:
// emulated mma.sync m16n8k16, warp shuffles, block barriers and shared-memory accesses per second. Built for
// the emulator only (a CPU figure: it says how long emulated tests take, nothing about a GPU).
//
//   build/bin/emulator_speed
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <functional>

#include "common/cuda/check.hpp"
#include "common/cuda/device_buffer.hpp"
#include "common/cuda/launch.cuh"
#include "common/cuda/ptx.cuh"

namespace {

using namespace flashlab;

constexpr int kBlocks = 8, kThreads = 128;

__global__ void mma_loop(float* out, int iterations) {
  const uint32_t a[4] = {0x3c003c00u, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};  // f16 ones
  float d[4] = {0, 0, 0, 0};
  for (int i = 0; i < iterations; ++i) ptx::mma_m16n8k16<__half>(d, a, 0x3c003c00u, 0x3c003c00u);
  out[blockIdx.x * blockDim.x + threadIdx.x] = d[0];
}

__global__ void shuffle_loop(float* out, int iterations) {
  float x = static_cast<float>(threadIdx.x);
  for (int i = 0; i < iterations; ++i) x += __shfl_xor_sync(0xffffffffu, x, 1 + i % 16);
  out[blockIdx.x * blockDim.x + threadIdx.x] = x;
}

__global__ void barrier_loop(float* out, int iterations) {
  for (int i = 0; i < iterations; ++i) __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f;
}

__global__ void shared_loop(float* out, int iterations) {
  volatile float* shared = cuda::dynamic_shared_memory<float>();  // volatile: every access happens
  const int t = static_cast<int>(threadIdx.x);
  shared[t] = 1.0f;
  float x = 0.0f;
  for (int i = 0; i < iterations; ++i) {
    shared[t] = x;  // one store and one load of the thread's own word
    x += shared[t];
  }
  out[blockIdx.x * blockDim.x + t] = x;
}

// Seconds for one launch of `kBlocks` blocks of `kThreads` threads (the best of three).
double seconds(const std::function<void()>& launch) {
  double best = 1e30;
  for (int run = 0; run < 3; ++run) {
    const auto start = std::chrono::steady_clock::now();
    launch();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

int main() {
  cuda::DeviceBuffer<float> out(kBlocks * kThreads);
  const int warps = kBlocks * kThreads / 32;
  std::printf("flashlab emulator on this CPU (%d blocks of %d threads; the best of three launches)\n",
              kBlocks, kThreads);
  struct Row {
    const char* what;
    double per_launch;  // operations per launch
    std::function<void()> launch;
  };
  const int mma = 2000, shuffles = 2000, barriers = 500, shared = 20000;
  const Row rows[] = {
      {"mma.sync m16n8k16 (per warp)", double(warps) * mma,
       [&] { cuda::launch_kernel<mma_loop>(kBlocks, kThreads, 0, nullptr, out.get(), mma); }},
      {"__shfl_xor_sync (per warp)", double(warps) * shuffles,
       [&] { cuda::launch_kernel<shuffle_loop>(kBlocks, kThreads, 0, nullptr, out.get(), shuffles); }},
      {"__syncthreads (per block)", double(kBlocks) * barriers,
       [&] { cuda::launch_kernel<barrier_loop>(kBlocks, kThreads, 0, nullptr, out.get(), barriers); }},
      {"shared load or store (per thread)", 2.0 * kBlocks * kThreads * shared,
       [&] {
         cuda::launch_kernel<shared_loop>(kBlocks, kThreads, 4 * kThreads, nullptr, out.get(), shared);
       }},
  };
  for (const Row& row : rows) {
    const double s = seconds(row.launch);
    std::printf("  %-36s %12.0f per second  (%7.1f ns each)\n", row.what, row.per_launch / s,
                1e9 * s / row.per_launch);
  }
  return 0;
}
