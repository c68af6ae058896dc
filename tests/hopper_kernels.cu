// The kernels of tests/hopper_kernels.hpp, built for the emulator and (with CUDA) for the GPU (sm_90a).
#include "tests/hopper_kernels.hpp"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/cuda/check.hpp"
#include "common/cuda/device_buffer.hpp"
#include "common/cuda/launch.cuh"
#include "cuda_v3_hopper/pipeline.cuh"
#include "cuda_v3_hopper/tma.cuh"
#include "cuda_v3_hopper/tma_host.hpp"
#include "cuda_v3_hopper/warpgroup.cuh"
#include "cuda_v3_hopper/wgmma.cuh"
#include "cuda_v3_hopper/wgmma_fp8.cuh"

namespace flashlab::testing::kernels {

namespace {

namespace hopper = ::flashlab::hopper;

using cuda::download;
using cuda::upload;

// A rows x columns row-major tensor as a 4-D TMA map (columns, rows, 1, 1), moved in boxes of box_columns x
// box_rows with the 128-byte swizzle.
CUtensorMap tensor_map(const void* base, CUtensorMapDataType type, int element_bytes, int rows, int columns,
                       int box_rows, int box_columns) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(columns), static_cast<cuuint64_t>(rows), 1, 1};
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(columns) * element_bytes;
  const cuuint64_t strides[3] = {row_bytes, row_bytes * rows, row_bytes * rows};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(box_columns), static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult result =
      hopper::tensor_map_encoder()(&map, type, 4, const_cast<void*>(base), dims, strides, box,
                                   element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                   CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) fail("cuTensorMapEncodeTiled failed (CUresult ", static_cast<int>(result), ")");
  return map;
}

// The block's dynamic shared memory rounded up to the 1024-byte swizzle atom (the launch asks for 1 KiB
// more).
__device__ uint8_t* aligned_shared() {
  const auto raw = reinterpret_cast<uintptr_t>(cuda::dynamic_shared_memory<uint8_t>());
  return reinterpret_cast<uint8_t*>((raw + 1023) & ~uintptr_t(1023));
}

// The fp32 accumulator of wgmma m64nN (PTX ISA, "Register Fragments"): thread t's register r is row
// 16 (t / 32) + (t % 32) / 4 + 8 ((r / 2) % 2), column 8 (r / 4) + 2 (t % 4) + r % 2.
__device__ void store_accumulators(float* out, const float* d, int n) {
  const int t = static_cast<int>(threadIdx.x) % 128, lane = t % 32;
  for (int r = 0; r < n / 2; ++r) {
    const int row = 16 * (t / 32) + lane / 4 + 8 * ((r / 2) % 2),
              column = 8 * (r / 4) + 2 * (lane % 4) + r % 2;
    out[row * n + column] = d[r];
  }
}

constexpr uint32_t kATileBytes = 64 * 128, kBTileBytes = 128 * 128;

__global__ void __launch_bounds__(128, 1)
    wgmma_ss_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                    float* out, HopperMistake mistake) {
  uint8_t* const a_tile = aligned_shared();
  uint8_t* const b_tile = a_tile + kATileBytes;
  uint64_t* const barrier = reinterpret_cast<uint64_t*>(b_tile + kBTileBytes);
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    hopper::mbarrier_init(barrier, 1);
    hopper::fence_barrier_init();
  }
  if (mistake == HopperMistake::mbarrier_used_before_init && tid == 1) hopper::mbarrier_wait(barrier, 0);
  __syncthreads();
  if (tid == 0) {
    const uint32_t bytes =
        kATileBytes + kBTileBytes - (mistake == HopperMistake::mbarrier_expect_tx_short ? 128 : 0);
    hopper::mbarrier_arrive_expect_tx(barrier, bytes);
    hopper::tma_load_4d(a_tile + (mistake == HopperMistake::tma_misaligned_destination ? 64 : 0), &a_map,
                        barrier, 0, 0, 0, 0);
    hopper::tma_load_4d(b_tile, &b_map, barrier, 0, 0, 0, 0);
    if (mistake == HopperMistake::mbarrier_over_arrival) hopper::mbarrier_arrive(barrier);
  }
  hopper::mbarrier_wait(barrier, 0);
  if (mistake == HopperMistake::mbarrier_wrong_parity)
    hopper::mbarrier_wait(barrier, 1);  // phase 1 never comes
  float d[64];
  if (mistake != HopperMistake::wgmma_without_fence) hopper::wgmma_fence();
  for (int k_step = 0; k_step < 4; ++k_step) {
    uint64_t a_descriptor = hopper::k_major_descriptor(a_tile, kATileBytes, k_step);
    if (mistake == HopperMistake::descriptor_base_offset) a_descriptor |= uint64_t{1} << 49;
    hopper::Wgmma<128, __nv_bfloat16>::ss(
        d, a_descriptor, hopper::k_major_descriptor(b_tile, kBTileBytes, k_step), k_step > 0);
  }
  hopper::wgmma_commit();
  if (mistake == HopperMistake::exit_with_wgmma_in_flight) return;
  if (mistake == HopperMistake::accumulator_written_in_flight) d[5] = 1.0f;
  if (mistake == HopperMistake::operand_overwritten_in_flight && tid == 0) a_tile[256] = 0x3f;
  if (mistake == HopperMistake::accumulator_read_before_wait) store_accumulators(out, d, 128);
  hopper::wgmma_wait<0>();
  if (mistake != HopperMistake::accumulator_read_before_wait) store_accumulators(out, d, 128);
}

// A's fragment from registers (PTX ISA, "Register Fragments", wgmma .m64nNk16 and .m64nNk32): register r of
// thread t holds row 16 (t / 32) + (t % 32) / 4 + 8 (r % 2); its elements, lowest bits first, are the columns
// from 2 (t % 4) + 8 (r / 2) for 16-bit inputs, from 4 (t % 4) + 16 (r / 2) for e4m3.
__device__ void a_fragment_bf16(const uint16_t* a, uint32_t (&registers)[4]) {
  const int t = static_cast<int>(threadIdx.x), lane = t % 32;
  for (int r = 0; r < 4; ++r) {
    const int row = 16 * (t / 32) + lane / 4 + 8 * (r % 2), column = 2 * (lane % 4) + 8 * (r / 2);
    registers[r] = uint32_t(a[row * 16 + column]) | uint32_t(a[row * 16 + column + 1]) << 16;
  }
}
__device__ void a_fragment_e4m3(const uint8_t* a, uint32_t (&registers)[4]) {
  const int t = static_cast<int>(threadIdx.x), lane = t % 32;
  for (int r = 0; r < 4; ++r) {
    const int row = 16 * (t / 32) + lane / 4 + 8 * (r % 2), column = 4 * (lane % 4) + 16 * (r / 2);
    registers[r] = 0;
    for (int e = 0; e < 4; ++e) registers[r] |= uint32_t(a[row * 32 + column + e]) << (8 * e);
  }
}

__global__ void __launch_bounds__(128, 1)
    wgmma_rs_kernel(const __grid_constant__ CUtensorMap b_map, const uint16_t* a, float* out) {
  uint8_t* const b_tile = aligned_shared();  // 16 rows (k) of 64 columns (n): MN-major, one 2 KiB panel
  uint64_t* const barrier = reinterpret_cast<uint64_t*>(b_tile + 16 * 128);
  if (threadIdx.x == 0) {
    hopper::mbarrier_init(barrier, 1);
    hopper::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    hopper::mbarrier_arrive_expect_tx(barrier, 16 * 128);
    hopper::tma_load_4d(b_tile, &b_map, barrier, 0, 0, 0, 0);
  }
  uint32_t registers[4];
  a_fragment_bf16(a, registers);
  hopper::mbarrier_wait(barrier, 0);
  float d[32];
  hopper::wgmma_fence();
  hopper::Wgmma<64, __nv_bfloat16>::rs(d, registers, hopper::mn_major_descriptor(b_tile, 16 * 128, 0), 0);
  hopper::wgmma_commit();
  hopper::wgmma_wait<0>();
  store_accumulators(out, d, 64);
}

__global__ void __launch_bounds__(128, 1)
    wgmma_rs_e4m3_kernel(const __grid_constant__ CUtensorMap b_map, const uint8_t* a, float* out) {
  uint8_t* const b_tile = aligned_shared();  // 128 rows (n) of 128 bytes (k): K-major, one 16 KiB panel
  uint64_t* const barrier = reinterpret_cast<uint64_t*>(b_tile + kBTileBytes);
  if (threadIdx.x == 0) {
    hopper::mbarrier_init(barrier, 1);
    hopper::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    hopper::mbarrier_arrive_expect_tx(barrier, kBTileBytes);
    hopper::tma_load_4d(b_tile, &b_map, barrier, 0, 0, 0, 0);
  }
  uint32_t registers[4];
  a_fragment_e4m3(a, registers);
  hopper::mbarrier_wait(barrier, 0);
  float d[64];
  hopper::wgmma_fence();
  hopper::WgmmaE4m3<128>::rs(d, registers, hopper::k_major_descriptor(b_tile, kBTileBytes, 0), 0);
  hopper::wgmma_commit();
  hopper::wgmma_wait<0>();
  store_accumulators(out, d, 128);
}

__global__ void tma_box_kernel(const __grid_constant__ CUtensorMap load_map,
                               const __grid_constant__ CUtensorMap store_map, uint16_t* landed, int column,
                               int row, HopperMistake mistake) {
  uint8_t* const tile = aligned_shared();  // 32 rows of 128 bytes
  uint64_t* const barrier = reinterpret_cast<uint64_t*>(tile + 32 * 128);
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    hopper::mbarrier_init(barrier, 1);
    hopper::fence_barrier_init();
  }
  __syncthreads();
  if (tid == 0) {
    hopper::mbarrier_arrive_expect_tx(barrier, 32 * 128);
    hopper::tma_load_4d(tile, &load_map, barrier, column, row, 0, 0);
  }
  hopper::mbarrier_wait(barrier, 0);
  for (int i = tid; i < 32 * 64; i += static_cast<int>(blockDim.x))
    landed[i] = reinterpret_cast<const uint16_t*>(tile)[i];
  __syncthreads();
  if (mistake == HopperMistake::tma_store_without_proxy_fence && tid == 0)
    reinterpret_cast<uint16_t*>(tile)[3] = 0;  // an ordinary store the TMA store then reads
  __syncthreads();
  if (tid == 0) {
    // A store's box may run past the tensor's end (those elements are dropped), but its top-left corner
    // cannot have negative indices (CUDA C++ Programming Guide, "Using TMA to transfer multi-dimensional
    // arrays"); a GPU stops the kernel with an illegal instruction. It goes to the nearest corner without.
    const bool clamp = mistake != HopperMistake::tma_store_negative_corner;
    hopper::tma_store_4d(&store_map, tile, clamp && column < 0 ? 0 : column, clamp && row < 0 ? 0 : row, 0,
                         0);
    hopper::tma_store_commit();
    if (mistake == HopperMistake::tma_store_exit_before_read) return;
    hopper::tma_store_wait_read();
  }
}

__global__ void mbarrier_rounds_kernel(int* out, int rounds) {
  uint8_t* const base = aligned_shared();
  uint64_t* const full = reinterpret_cast<uint64_t*>(base);
  uint64_t* const empty = full + 1;
  int* const slot = reinterpret_cast<int*>(base + 16);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (threadIdx.x == 0) {
    hopper::mbarrier_init(full, 32);
    hopper::mbarrier_init(empty, 32);
  }
  __syncthreads();
  if (warp == 1) {
    for (int r = 0; r < rounds; ++r) {
      if (r > 0) hopper::mbarrier_wait(empty, (r - 1) & 1);
      if (lane == 0) *slot = r + 1;
      __syncwarp();
      hopper::mbarrier_arrive(full);
    }
  } else {
    hopper::mbarrier_wait(full, 1);  // the phase before the first: complete from the start
    if (lane == 0) out[0] = -1;
    for (int r = 0; r < rounds; ++r) {
      hopper::mbarrier_wait(full, r & 1);
      if (lane == 0) out[1 + r] = *slot;
      __syncwarp();
      hopper::mbarrier_arrive(empty);
    }
  }
}

template <uint32_t kLaunchRegisters, uint32_t kProducer, uint32_t kConsumer>
__global__ void __launch_bounds__(384, 1) setmaxnreg_kernel(int* sum) {
  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  if (warpgroup == 0) {
    hopper::setmaxnreg_dec<kProducer, kLaunchRegisters>();
    return;
  }
  hopper::setmaxnreg_inc<kConsumer, kLaunchRegisters>();
  atomicAdd(sum, static_cast<int>(threadIdx.x));
}

}  // namespace

namespace FLASHLAB_CUDA_TARGET {

namespace {

std::vector<float> run_wgmma_ss(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b,
                                HopperMistake mistake) {
  const cuda::DeviceBuffer<uint16_t> da = upload(a), db = upload(b);
  cuda::DeviceBuffer<float> out(64 * 128);
  const CUtensorMap a_map = tensor_map(da.get(), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, 64, 64, 64, 64);
  const CUtensorMap b_map = tensor_map(db.get(), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, 128, 64, 128, 64);
  cuda::launch_kernel<wgmma_ss_kernel>(dim3(1), dim3(128), kATileBytes + kBTileBytes + 1024 + 64, nullptr,
                                       a_map, b_map, out.get(), mistake);
  return download(out);
}

}  // namespace

std::vector<float> wgmma_ss(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b,
                            HopperMistake mistake) {
  return run_wgmma_ss(a, b, mistake);
}

std::vector<float> wgmma_rs(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  const cuda::DeviceBuffer<uint16_t> da = upload(a), db = upload(b);
  cuda::DeviceBuffer<float> out(64 * 64);
  const CUtensorMap b_map = tensor_map(db.get(), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, 16, 64, 16, 64);
  cuda::launch_kernel<wgmma_rs_kernel>(dim3(1), dim3(128), 16 * 128 + 1024 + 64, nullptr, b_map, da.get(),
                                       out.get());
  return download(out);
}

std::vector<float> wgmma_rs_e4m3(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  // B's 128 rows padded to 128 bytes each (K-major rows of the 128-byte swizzle); the wgmma reads the
  // first 32.
  std::vector<uint8_t> padded(128 * 128, 0);
  for (int n = 0; n < 128; ++n)
    for (int k = 0; k < 32; ++k) padded[n * 128 + k] = b[n * 32 + k];
  const cuda::DeviceBuffer<uint8_t> da = upload(a), db = upload(padded);
  cuda::DeviceBuffer<float> out(64 * 128);
  const CUtensorMap b_map = tensor_map(db.get(), CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, 128, 128, 128, 128);
  cuda::launch_kernel<wgmma_rs_e4m3_kernel>(dim3(1), dim3(128), kBTileBytes + 1024 + 64, nullptr, b_map,
                                            da.get(), out.get());
  return download(out);
}

std::vector<uint16_t> tma_box(const std::vector<uint16_t>& tensor, int rows, int columns, int column, int row,
                              std::vector<uint16_t>& stored) {
  const cuda::DeviceBuffer<uint16_t> source = upload(tensor);
  cuda::DeviceBuffer<uint16_t> destination = upload(std::vector<uint16_t>(tensor.size(), 0));
  cuda::DeviceBuffer<uint16_t> landed(32 * 64);
  const CUtensorMap load_map =
      tensor_map(source.get(), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, rows, columns, 32, 64);
  const CUtensorMap store_map =
      tensor_map(destination.get(), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, rows, columns, 32, 64);
  cuda::launch_kernel<tma_box_kernel>(dim3(1), dim3(64), 32 * 128 + 1024 + 64, nullptr, load_map, store_map,
                                      landed.get(), column, row, HopperMistake::none);
  stored = download(destination);
  return download(landed);
}

std::vector<int> mbarrier_rounds(int rounds) {
  cuda::DeviceBuffer<int> out(1 + static_cast<size_t>(rounds));
  cuda::launch_kernel<mbarrier_rounds_kernel>(dim3(1), dim3(64), 1024 + 64, nullptr, out.get(), rounds);
  return download(out);
}

int setmaxnreg_handover() {
  cuda::DeviceBuffer<int> sum = upload(std::vector<int>{0});
  cuda::launch_kernel<setmaxnreg_kernel<168, 24, 240>>(dim3(1), dim3(384), 0, nullptr, sum.get());
  return download(sum)[0];
}

void hopper_mistake(HopperMistake mistake) {
  switch (mistake) {
    case HopperMistake::tma_store_without_proxy_fence:
    case HopperMistake::tma_store_exit_before_read:
    case HopperMistake::tma_store_negative_corner: {
      const int at = mistake == HopperMistake::tma_store_negative_corner ? -8 : 0;
      const std::vector<uint16_t> tensor(32 * 64, 0x3f80);
      const cuda::DeviceBuffer<uint16_t> source = upload(tensor);
      cuda::DeviceBuffer<uint16_t> destination(tensor.size()), landed(32 * 64);
      const CUtensorMap load_map =
          tensor_map(source.get(), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, 32, 64, 32, 64);
      const CUtensorMap store_map =
          tensor_map(destination.get(), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, 32, 64, 32, 64);
      cuda::launch_kernel<tma_box_kernel>(dim3(1), dim3(64), 32 * 128 + 1024 + 64, nullptr, load_map,
                                          store_map, landed.get(), at, at, mistake);
      FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
      return;
    }
    case HopperMistake::setmaxnreg_pool_too_small: {  // the kernel states 128 registers at launch: too few
      cuda::DeviceBuffer<int> sum = upload(std::vector<int>{0});
      cuda::launch_kernel<setmaxnreg_kernel<128, 24, 240>>(dim3(1), dim3(384), 0, nullptr, sum.get());
      FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
      return;
    }
    case HopperMistake::setmaxnreg_out_of_range: {
#if defined(FLASHLAB_EMULATED)  // for the GPU ptxas refuses the instruction itself: it never reaches a launch
      cuda::DeviceBuffer<int> sum = upload(std::vector<int>{0});
      cuda::launch_kernel<setmaxnreg_kernel<168, 20, 240>>(dim3(1), dim3(384), 0, nullptr, sum.get());
      FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
#endif
      return;
    }
    default:
      run_wgmma_ss(std::vector<uint16_t>(64 * 64, 0x3f80), std::vector<uint16_t>(128 * 64, 0x3f80), mistake);
  }
}

}  // namespace FLASHLAB_CUDA_TARGET

}  // namespace flashlab::testing::kernels
