// The kernels of tests/emulator_kernels.hpp, built for the emulator and (with CUDA) for the GPU.
#include "tests/emulator_kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/cuda/check.hpp"
#include "common/cuda/device_buffer.hpp"
#include "common/cuda/launch.cuh"
#include "common/cuda/ptx.cuh"

namespace flashlab::testing::kernels {

namespace {

using cuda::download;
using cuda::upload;

__global__ void shuffle_kernel(int* out, Shuffle mode, unsigned mask, int b, int width) {
  const int lane = static_cast<int>(threadIdx.x);
  if ((mask >> lane & 1u) == 0) {
    out[lane] = -1;
    return;
  }
  const int value = lane * 10 + 7;
  int result = 0;
  switch (mode) {
    case Shuffle::idx:
      result = __shfl_sync(mask, value, b, width);
      break;
    case Shuffle::up:
      result = __shfl_up_sync(mask, value, static_cast<unsigned>(b), width);
      break;
    case Shuffle::down:
      result = __shfl_down_sync(mask, value, static_cast<unsigned>(b), width);
      break;
    case Shuffle::bfly:
      result = __shfl_xor_sync(mask, value, b, width);
      break;
  }
  out[lane] = result;
}

__global__ void vote_kernel(unsigned* out, Vote mode, unsigned mask, unsigned true_lanes) {
  const unsigned lane = threadIdx.x;
  if ((mask >> lane & 1u) == 0) {
    out[lane] = 0xdeadbeefu;
    return;
  }
  const bool predicate = (true_lanes >> lane & 1u) != 0;
  switch (mode) {
    case Vote::ballot:
      out[lane] = __ballot_sync(mask, predicate);
      break;
    case Vote::all:
      out[lane] = static_cast<unsigned>(__all_sync(mask, predicate));
      break;
    case Vote::any:
      out[lane] = static_cast<unsigned>(__any_sync(mask, predicate));
      break;
  }
}

__global__ void syncthreads_kernel(int* out, int modulus) {
  const int t = static_cast<int>(threadIdx.x);
  const bool predicate = t % modulus == 0;
  out[3 * t] = __syncthreads_count(predicate);
  out[3 * t + 1] = __syncthreads_and(predicate);
  out[3 * t + 2] = __syncthreads_or(predicate);
}

template <int kMatrices, bool kTranspose>
__global__ void ldmatrix_kernel(uint32_t* out, const uint16_t* shared_init, int count, const int* rows,
                                bool window_address) {
  uint16_t* shared = cuda::dynamic_shared_memory<uint16_t>();
  const int lane = static_cast<int>(threadIdx.x);
  for (int i = lane; i < count; i += 32) shared[i] = shared_init[i];
  __syncwarp();
  // Lanes past the rows the instruction reads still pass an address (it is not used).
  const int row = rows[lane < kMatrices * 8 ? lane : 0];
  uint32_t registers[kMatrices];
  if (window_address)  // the operand as PTX takes it: the row's byte address in the shared window
    ptx::ldmatrix<kMatrices, kTranspose>(registers, ptx::shared_address(shared) + row * 16);
  else
    ptx::ldmatrix<kMatrices, kTranspose>(registers, shared + row * 8);
  for (int m = 0; m < kMatrices; ++m) out[lane * kMatrices + m] = registers[m];
}

template <typename Element>
__global__ void mma_kernel(float* out, const uint32_t* a, const uint32_t* b, const float* c) {
  const int lane = static_cast<int>(threadIdx.x);
  const uint32_t a_registers[4] = {a[4 * lane], a[4 * lane + 1], a[4 * lane + 2], a[4 * lane + 3]};
  float d[4] = {c[4 * lane], c[4 * lane + 1], c[4 * lane + 2], c[4 * lane + 3]};
  ptx::mma_m16n8k16<Element>(d, a_registers, b[2 * lane], b[2 * lane + 1]);
  for (int i = 0; i < 4; ++i) out[4 * lane + i] = d[i];
}

// Every thread adds (1, 2) or (1, 2, 3, 4) times its block's number plus one to vector `threadIdx.x %
// vectors` of `sums`, in one red.global.add.v2.f32 or .v4.f32: many lanes add to the same vector at once.
template <int kWidth>
__global__ void red_vectors_kernel(float* sums, int vectors) {  // sums: aligned, or a planted mistake
  const float scale = static_cast<float>(blockIdx.x + 1);
  float* const at = sums + kWidth * (threadIdx.x % vectors);
  if constexpr (kWidth == 2) {
    ptx::red_add_f32x2(at, scale, 2.0f * scale);
  } else {
    const float values[4] = {scale, 2.0f * scale, 3.0f * scale, 4.0f * scale};
    ptx::red_add_f32x4(at, values);
  }
}

__global__ void cp_async_kernel(float* out, const float* source, const int* in_range, int chunks) {
  float* shared = cuda::dynamic_shared_memory<float>();
  const int lane = static_cast<int>(threadIdx.x);
  for (int chunk = lane; chunk < chunks; chunk += 32)
    ptx::cp_async_16(shared + 4 * chunk, source + 4 * chunk, in_range[chunk] != 0);
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
  __syncwarp();
  for (int i = lane; i < 4 * chunks; i += 32) out[i] = shared[i];
}

// Each lane reads `width` bytes at its own byte offset into `data` (global memory, or a copy of it in shared
// memory) and stores their sum: one planted warp-level load. The offsets come as a parameter, which the
// counters leave out, so the only other counted accesses are the copy into shared memory and the store.
__global__ void access_pattern_kernel(float* out, const float* data, AccessOffsets offsets, int width,
                                      bool shared_space, int floats) {
  float* shared = cuda::dynamic_shared_memory<float>();
  const int lane = static_cast<int>(threadIdx.x);
  const char* base = reinterpret_cast<const char*>(data);
  if (shared_space) {
    for (int i = lane; i < floats; i += 32) shared[i] = data[i];
    __syncwarp();
    base = reinterpret_cast<const char*>(shared);
  }
  const char* at = base + offsets.bytes[lane];
  float sum = 0.0f;
  if (width == 4) {
    sum = *reinterpret_cast<const float*>(at);
  } else if (width == 8) {
    const float2 v = *reinterpret_cast<const float2*>(at);
    sum = v.x + v.y;
  } else {
    const float4 v = *reinterpret_cast<const float4*>(at);
    sum = v.x + v.y + v.z + v.w;
  }
  out[lane] = sum;
}

__global__ void neighbours_kernel(float* out, const float* in, Mistake mistake) {
  float* shared = cuda::dynamic_shared_memory<float>();
  const int t = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  const int next = (t + 1) % n, partner = t ^ 1;
  switch (mistake) {
    case Mistake::none:
      shared[t] = static_cast<float>(t + 1);
      __syncthreads();
      out[t] = shared[next];
      break;
    case Mistake::missing_syncthreads:
      shared[t] = 0.0f;
      __syncthreads();
      shared[t] = static_cast<float>(t + 1);
      out[t] = shared[next];  // no barrier between the neighbour's write and this read
      break;
    case Mistake::missing_syncwarp:
      shared[t] = 0.0f;
      __syncthreads();
      shared[t] = static_cast<float>(t + 1);
      out[t] = shared[partner];  // a __syncwarp() belongs here
      break;
    case Mistake::shuffle_instead_of_sync: {
      shared[t] = 0.0f;
      __syncthreads();
      shared[t] = static_cast<float>(t + 1);
      const int token = __shfl_xor_sync(0xffffffffu, t, 1);  // every lane got here, but memory is unordered
      out[t] = shared[partner] + static_cast<float>(token - partner);
      break;
    }
    case Mistake::early_exit_at_barrier:
      if (t >= n / 2) return;
      __syncthreads();
      out[t] = 1.0f;
      break;
    case Mistake::crossed_named_barriers:
      // Warp 0 waits at barrier 1, warp 1 at barrier 2; each barrier counts both warps.
      ptx::barrier_sync(t < 32 ? 1 : 2, 64);
      out[t] = 1.0f;
      break;
    case Mistake::mismatched_collective:
      out[t] = t < 16 ? static_cast<float>(__shfl_xor_sync(0xffffffffu, t, 1))
                      : static_cast<float>(__ballot_sync(0xffffffffu, 1));
      break;
    case Mistake::exited_lane_in_mask:
      if (t == 31) return;
      out[t] = static_cast<float>(__shfl_xor_sync(0xffffffffu, t, 1));
      break;
    case Mistake::shared_out_of_bounds:
      shared[t] = 1.0f;
      __syncthreads();
      out[t] = shared[n + t];
      break;
    case Mistake::global_out_of_bounds:
      out[t] = in[t + 1];
      break;
    case Mistake::uninitialized_shared:
      out[t] = shared[t];
      break;
    case Mistake::cp_async_without_wait:
      // The first quarter of the threads copy 16 bytes each (the block has 4 bytes of shared memory a
      // thread).
      if (t < n / 4) {
        ptx::cp_async_16(shared + 4 * t, in + 4 * (t % 4), true);
        ptx::cp_async_commit();
        out[t] = shared[4 * t];  // ptx::cp_async_wait<0>() belongs before this read
        ptx::cp_async_wait<0>();
      }
      break;
    case Mistake::write_after_reads:       // in order, the barrier's last thread reads first: 2 readers
    case Mistake::write_after_many_reads:  // then threads 0, 1, ...: 7 readers
      shared[t] = static_cast<float>(t + 1);
      __syncthreads();
      out[t] = shared[0];  // every thread reads one word, none ordered with another
      if (t == (mistake == Mistake::write_after_reads ? 0 : 5))
        shared[0] = 0.0f;  // a __syncthreads() belongs before this write
      break;
    case Mistake::bytes_then_word:  // in order, threads 0-3 write their byte before thread 4 reads
      shared[t] = 0.0f;
      __syncthreads();
      if (t < 4) reinterpret_cast<unsigned char*>(shared)[t] = static_cast<unsigned char>(t);
      if (t == 4) out[t] = shared[0];  // a __syncthreads() belongs before this read
      break;
  }
}

__global__ void empty_kernel() {}

__global__ void arrival_kernel(int* counter, int* order) {
  const int slot = atomicAdd(counter, 1);
  order[slot] = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
}

}  // namespace

namespace FLASHLAB_CUDA_TARGET {

std::vector<int> shuffle(Shuffle mode, unsigned mask, int b, int width) {
  cuda::DeviceBuffer<int> out(32);
  cuda::launch_kernel<shuffle_kernel>(dim3(1), dim3(32), 0, nullptr, out.get(), mode, mask, b, width);
  return download(out);
}

std::vector<unsigned> vote(Vote mode, unsigned mask, unsigned true_lanes) {
  cuda::DeviceBuffer<unsigned> out(32);
  cuda::launch_kernel<vote_kernel>(dim3(1), dim3(32), 0, nullptr, out.get(), mode, mask, true_lanes);
  return download(out);
}

std::vector<int> syncthreads_reductions(int threads, int modulus) {
  cuda::DeviceBuffer<int> out(3 * static_cast<size_t>(threads));
  cuda::launch_kernel<syncthreads_kernel>(dim3(1), dim3(threads), 0, nullptr, out.get(), modulus);
  return download(out);
}

std::vector<uint32_t> ldmatrix(int matrices, bool transpose, const std::vector<uint16_t>& shared,
                               const std::vector<int>& rows, bool window_address) {
  cuda::DeviceBuffer<uint32_t> out(32 * static_cast<size_t>(matrices));
  const cuda::DeviceBuffer<uint16_t> init = upload(shared);
  const cuda::DeviceBuffer<int> row_list = upload(rows);
  const auto run = [&]<int kMatrices, bool kTranspose>() {
    cuda::launch_kernel<ldmatrix_kernel<kMatrices, kTranspose>>(
        dim3(1), dim3(32), shared.size() * 2, nullptr, out.get(), init.get(), static_cast<int>(shared.size()),
        row_list.get(), window_address);
  };
  switch (matrices * 2 + transpose) {
    case 2:
      run.template operator()<1, false>();
      break;
    case 3:
      run.template operator()<1, true>();
      break;
    case 4:
      run.template operator()<2, false>();
      break;
    case 5:
      run.template operator()<2, true>();
      break;
    case 8:
      run.template operator()<4, false>();
      break;
    case 9:
      run.template operator()<4, true>();
      break;
  }
  return download(out);
}

std::vector<float> mma(bool bf16, const std::vector<uint32_t>& a, const std::vector<uint32_t>& b,
                       const std::vector<float>& c) {
  cuda::DeviceBuffer<float> out(128);
  const cuda::DeviceBuffer<uint32_t> da = upload(a), db = upload(b);
  const cuda::DeviceBuffer<float> dc = upload(c);
  if (bf16)
    cuda::launch_kernel<mma_kernel<__nv_bfloat16>>(dim3(1), dim3(32), 0, nullptr, out.get(), da.get(),
                                                   db.get(), dc.get());
  else
    cuda::launch_kernel<mma_kernel<__half>>(dim3(1), dim3(32), 0, nullptr, out.get(), da.get(), db.get(),
                                            dc.get());
  return download(out);
}

std::vector<float> red_vectors(int width, int blocks, int threads, int vectors, int first) {
  const cuda::DeviceBuffer<float> sums = upload(std::vector<float>(
      static_cast<size_t>(width) * static_cast<size_t>(vectors) + static_cast<size_t>(first), 0.0f));
  const dim3 grid(static_cast<unsigned>(blocks)), block(static_cast<unsigned>(threads));
  if (width == 4)
    cuda::launch_kernel<red_vectors_kernel<4>>(grid, block, 0, nullptr, sums.get() + first, vectors);
  else
    cuda::launch_kernel<red_vectors_kernel<2>>(grid, block, 0, nullptr, sums.get() + first, vectors);
  const std::vector<float> all = download(sums);
  return std::vector<float>(all.begin() + first, all.end());
}

void allocate(std::size_t bytes) {
  const cuda::DeviceBuffer<char> buffer(bytes);
}

bool error_pending() {
  return cudaPeekAtLastError() != cudaSuccess;
}

std::vector<float> cp_async(const std::vector<float>& source, const std::vector<int>& in_range) {
  const int chunks = static_cast<int>(in_range.size());
  cuda::DeviceBuffer<float> out(4 * static_cast<size_t>(chunks));
  const cuda::DeviceBuffer<float> src = upload(source);
  const cuda::DeviceBuffer<int> flags = upload(in_range);
  cuda::launch_kernel<cp_async_kernel>(dim3(1), dim3(32), 16 * static_cast<size_t>(chunks), nullptr,
                                       out.get(), src.get(), flags.get(), chunks);
  return download(out);
}

std::vector<float> access_pattern(bool shared, int width, const AccessOffsets& offsets, int floats) {
  cuda::DeviceBuffer<float> out(32);
  std::vector<float> values(static_cast<size_t>(floats));
  for (int i = 0; i < floats; ++i) values[static_cast<size_t>(i)] = static_cast<float>(i);
  const cuda::DeviceBuffer<float> data = upload(values);
  cuda::launch_kernel<access_pattern_kernel>(dim3(1), dim3(32), shared ? 4 * static_cast<size_t>(floats) : 0,
                                             nullptr, out.get(), data.get(), offsets, width, shared, floats);
  return download(out);
}

std::vector<float> neighbours(int threads, Mistake mistake) {
  cuda::DeviceBuffer<float> out(static_cast<size_t>(threads));
  const cuda::DeviceBuffer<float> in = upload(std::vector<float>(static_cast<size_t>(threads), 2.0f));
  cuda::launch_kernel<neighbours_kernel>(dim3(1), dim3(threads), 4 * static_cast<size_t>(threads), nullptr,
                                         out.get(), in.get(), mistake);
  return download(out);
}

void launch_configuration(int threads, int shared_bytes, int opt_in_bytes) {
  if (opt_in_bytes > 0)
    FLASHLAB_CUDA_CHECK(
        cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, opt_in_bytes));
  cuda::launch_kernel<empty_kernel>(dim3(1), dim3(threads), static_cast<size_t>(shared_bytes), nullptr);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
}

std::vector<int> arrival_order(int blocks) {
  cuda::DeviceBuffer<int> counter = upload(std::vector<int>{0});
  cuda::DeviceBuffer<int> order(64 * static_cast<size_t>(blocks));
  cuda::launch_kernel<arrival_kernel>(dim3(blocks), dim3(64), 0, nullptr, counter.get(), order.get());
  return download(order);
}

}  // namespace FLASHLAB_CUDA_TARGET

}  // namespace flashlab::testing::kernels
