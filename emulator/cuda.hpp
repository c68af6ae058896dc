// The CUDA that emulated translation units see: the language's keywords, the built-in variables and
// functions, the vector and 16-bit float types, and the runtime API, all mapped onto the emulator. The
// headers in emulator/include/ (cuda_runtime.h, cuda_fp16.h, cuda_bf16.h, ...) stand in for NVIDIA's and
// include this file, so the kernels' source compiles unchanged with the host compiler (FLASHLAB_EMULATED is
// defined).
//
// Every name is declared in flashlab::emulator::cuda_api and brought into the global namespace, so that a
// program holding both the GPU build (NVIDIA's headers) and the emulated build of a stage links the two
// without their types or functions colliding.
#pragma once

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <source_location>
#include <string_view>
#include <type_traits>

#include "common/number_format.hpp"
#include "emulator/device.hpp"

// ---- Keywords ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__
// Static shared memory: one copy per OS thread, and an OS thread runs one block at a time. Dynamic shared
// memory (`extern __shared__`) is not declared this way: kernels ask for it through
// common/cuda/launch.cuh's dynamic_shared_memory<T>().
#define __shared__ static thread_local

// Streams and events are opaque handles, as in CUDA (declared at global scope, where CUDA declares them).
struct CUstream_st;
struct CUevent_st;

namespace flashlab::emulator::cuda_api {

// ---- Built-in types ----
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
struct __attribute__((aligned(8))) float2 {
  float x, y;
};
struct float3 {
  float x, y, z;
};
struct __attribute__((aligned(16))) float4 {
  float x, y, z, w;
};
struct __attribute__((aligned(8))) int2 {
  int x, y;
};
struct __attribute__((aligned(16))) int4 {
  int x, y, z, w;
};
struct __attribute__((aligned(8))) uint2 {
  unsigned x, y;
};
struct __attribute__((aligned(16))) uint4 {
  unsigned x, y, z, w;
};
inline float2 make_float2(float x, float y) {
  return {x, y};
}
inline float4 make_float4(float x, float y, float z, float w) {
  return {x, y, z, w};
}
inline int2 make_int2(int x, int y) {
  return {x, y};
}
inline int4 make_int4(int x, int y, int z, int w) {
  return {x, y, z, w};
}
inline uint2 make_uint2(unsigned x, unsigned y) {
  return {x, y};
}
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
  return {x, y, z, w};
}

// ---- 16-bit floating point (cuda_fp16.h, cuda_bf16.h): storage and conversions ----
struct __attribute__((aligned(2))) __half {
  unsigned short __x;
};
struct __attribute__((aligned(4))) __half2 {
  __half x, y;
};
struct __attribute__((aligned(2))) __nv_bfloat16 {
  unsigned short __x;
};
struct __attribute__((aligned(4))) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
inline __half __float2half_rn(float x) {
  return {encode_fp16(x)};
}
inline __half __float2half(float x) {
  return __float2half_rn(x);
}
inline float __half2float(__half h) {
  return decode_fp16(h.__x);
}
inline __half2 __floats2half2_rn(float low, float high) {
  return {__float2half_rn(low), __float2half_rn(high)};
}
inline __half2 __float2half2_rn(float x) {
  return {__float2half_rn(x), __float2half_rn(x)};
}
inline float2 __half22float2(__half2 h) {
  return {__half2float(h.x), __half2float(h.y)};
}
inline float __low2float(__half2 h) {
  return __half2float(h.x);
}
inline float __high2float(__half2 h) {
  return __half2float(h.y);
}
inline __nv_bfloat16 __float2bfloat16_rn(float x) {
  return {encode_bf16(x)};
}
inline __nv_bfloat16 __float2bfloat16(float x) {
  return __float2bfloat16_rn(x);
}
inline float __bfloat162float(__nv_bfloat16 h) {
  return decode_bf16(h.__x);
}
inline __nv_bfloat162 __floats2bfloat162_rn(float low, float high) {
  return {__float2bfloat16_rn(low), __float2bfloat16_rn(high)};
}
inline float2 __bfloat1622float2(__nv_bfloat162 h) {
  return {__bfloat162float(h.x), __bfloat162float(h.y)};
}

// ---- Built-in variables (read through the macros below) ----
namespace builtin {
inline uint3 thread_index() {
  const Index3 i = ::flashlab::emulator::thread_index();
  return {i.x, i.y, i.z};
}
inline uint3 block_index() {
  const Index3 i = ::flashlab::emulator::block_index();
  return {i.x, i.y, i.z};
}
inline dim3 block_dim() {
  const Index3 i = ::flashlab::emulator::block_dim();
  return {i.x, i.y, i.z};
}
inline dim3 grid_dim() {
  const Index3 i = ::flashlab::emulator::grid_dim();
  return {i.x, i.y, i.z};
}
}  // namespace builtin
constexpr int warpSize = 32;

// ---- Synchronization ----
inline void __syncthreads(Where where = Where::current()) {
  sync_threads(where);
}
inline int __syncthreads_count(int predicate, Where where = Where::current()) {
  return sync_threads_count(predicate != 0, where);
}
inline int __syncthreads_or(int predicate, Where where = Where::current()) {
  return sync_threads_count(predicate != 0, where) != 0;
}
inline int __syncthreads_and(int predicate, Where where = Where::current()) {
  const dim3 block = builtin::block_dim();
  return sync_threads_count(predicate != 0, where) == static_cast<int>(block.x * block.y * block.z);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, Where where = Where::current()) {
  sync_warp(mask, where);
}

// ---- Warp shuffles and votes ----
namespace detail {
// The c operand CUDA's intrinsics pass to shfl.sync: the segment mask from `width`, and the clamp value.
constexpr unsigned shuffle_clamp(int width, bool up) {
  return (static_cast<unsigned>(32 - width) << 8) | (up ? 0u : 0x1fu);
}
template <typename T>
T shuffle_value(ShuffleMode mode, unsigned mask, T value, unsigned b, unsigned c, Where where) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "shuffles move 32-bit or 64-bit values");
  if constexpr (sizeof(T) == 4) {
    return std::bit_cast<T>(shuffle(mode, mask, std::bit_cast<uint32_t>(value), b, c, where));
  } else {
    const auto bits = std::bit_cast<uint64_t>(value);
    const uint64_t low = shuffle(mode, mask, static_cast<uint32_t>(bits), b, c, where);
    const uint64_t high = shuffle(mode, mask, static_cast<uint32_t>(bits >> 32), b, c, where);
    return std::bit_cast<T>(low | high << 32);
  }
}
}  // namespace detail
template <typename T>
T __shfl_sync(unsigned mask, T value, int source_lane, int width = 32, Where where = Where::current()) {
  return detail::shuffle_value(ShuffleMode::idx, mask, value, static_cast<unsigned>(source_lane),
                               detail::shuffle_clamp(width, false), where);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = 32, Where where = Where::current()) {
  return detail::shuffle_value(ShuffleMode::up, mask, value, delta, detail::shuffle_clamp(width, true),
                               where);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32, Where where = Where::current()) {
  return detail::shuffle_value(ShuffleMode::down, mask, value, delta, detail::shuffle_clamp(width, false),
                               where);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32, Where where = Where::current()) {
  return detail::shuffle_value(ShuffleMode::bfly, mask, value, static_cast<unsigned>(lane_mask),
                               detail::shuffle_clamp(width, false), where);
}
inline unsigned __ballot_sync(unsigned mask, int predicate, Where where = Where::current()) {
  return vote(VoteMode::ballot, mask, predicate != 0, where);
}
inline int __all_sync(unsigned mask, int predicate, Where where = Where::current()) {
  return static_cast<int>(vote(VoteMode::all, mask, predicate != 0, where));
}
inline int __any_sync(unsigned mask, int predicate, Where where = Where::current()) {
  return static_cast<int>(vote(VoteMode::any, mask, predicate != 0, where));
}

// ---- Address spaces ----
inline size_t __cvta_generic_to_shared(const void* pointer, Where where = Where::current()) {
  return shared_address(pointer, where);
}
template <typename T>
T __ldg(const T* pointer) {
  return *pointer;
}

// ---- Atomics ----
inline int atomicAdd(int* address, int value, Where where = Where::current()) {
  return atomic_add(address, value, where);
}
inline unsigned atomicAdd(unsigned* address, unsigned value, Where where = Where::current()) {
  return atomic_add(address, value, where);
}
inline float atomicAdd(float* address, float value, Where where = Where::current()) {
  return atomic_add(address, value, where);
}
inline int atomicMax(int* address, int value, Where where = Where::current()) {
  return atomic_max(address, value, where);
}
inline int atomicMin(int* address, int value, Where where = Where::current()) {
  return atomic_min(address, value, where);
}
inline int atomicExch(int* address, int value, Where where = Where::current()) {
  return atomic_exchange(address, value, where);
}
inline int atomicCAS(int* address, int compare, int value, Where where = Where::current()) {
  return atomic_compare_exchange(address, compare, value, where);
}

// ---- Integer and float intrinsics ----
inline int min(int a, int b) {
  return a < b ? a : b;
}
inline int max(int a, int b) {
  return a > b ? a : b;
}
inline unsigned min(unsigned a, unsigned b) {
  return a < b ? a : b;
}
inline unsigned max(unsigned a, unsigned b) {
  return a > b ? a : b;
}
inline long long min(long long a, long long b) {
  return a < b ? a : b;
}
inline long long max(long long a, long long b) {
  return a > b ? a : b;
}
inline long min(long a, long b) {
  return a < b ? a : b;
}
inline long max(long a, long b) {
  return a > b ? a : b;
}
inline float min(float a, float b) {
  return std::fmin(a, b);
}
inline float max(float a, float b) {
  return std::fmax(a, b);
}
inline int __ffs(int x) {
  return __builtin_ffs(x);
}
inline int __popc(unsigned x) {
  return std::popcount(x);
}
inline int __clz(int x) {
  return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x));
}
inline float __uint_as_float(unsigned x) {
  return std::bit_cast<float>(x);
}
inline unsigned __float_as_uint(float x) {
  return std::bit_cast<unsigned>(x);
}
inline float __int_as_float(int x) {
  return std::bit_cast<float>(x);
}
inline int __float_as_int(float x) {
  return std::bit_cast<int>(x);
}
// The _rn operations: IEEE round-to-nearest, never fused into an FMA (emulated code is compiled with
// -ffp-contract=off, emulator/CMakeLists.txt, so plain operators are these already; GCC would otherwise fuse
// a * b - c even in ISO C++ mode).
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fdiv_rn(float a, float b) {
  return a / b;
}
inline double __dadd_rn(double a, double b) {
  return a + b;
}
inline double __dmul_rn(double a, double b) {
  return a * b;
}
inline double __ddiv_rn(double a, double b) {
  return a / b;
}
inline float __double2float_rn(double x) {
  return static_cast<float>(x);
}
// The fast approximations (__expf, __logf, __fdividef) are computed accurately here: the GPU's results
// differ from these by the approximations' documented errors.
inline float __expf(float x) {
  return std::exp(x);
}
inline float __logf(float x) {
  return std::log(x);
}
inline float __fdividef(float a, float b) {
  return a / b;
}

// ---- The runtime API (host side) ----
enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorInvalidDevice = 101,
  cudaErrorLaunchFailure = 719,
};
using cudaStream_t = ::CUstream_st*;
using cudaEvent_t = ::CUevent_st*;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int major;
  int minor;
  int multiProcessorCount;
  int l2CacheSize;
  int maxThreadsPerMultiProcessor;
  size_t sharedMemPerMultiprocessor;
  size_t sharedMemPerBlockOptin;
  int regsPerMultiprocessor;
};

// Implemented in emulator/runtime.cpp.
cudaError_t cudaMalloc(void** pointer, size_t bytes);
cudaError_t cudaFree(void* pointer);
cudaError_t cudaMemcpy(void* destination, const void* source, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpy2D(void* destination, size_t destination_pitch, const void* source, size_t source_pitch,
                         size_t width, size_t height, cudaMemcpyKind kind);
cudaError_t cudaMemset(void* destination, int value, size_t bytes);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorName(cudaError_t error);
const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* properties, int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device);
cudaError_t cudaFuncSetAttributeOf(const void* kernel, cudaFuncAttribute attribute, int value);
cudaError_t cudaOccupancyOf(int* blocks, const void* kernel, int threads, size_t dynamic_shared_bytes);
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

// The driver entry points the runtime hands out (cudaGetDriverEntryPointByVersion): the TMA tensor-map
// encoder only, the emulator's (emulator/tensor_map.hpp).
enum cudaDriverEntryPointQueryResult {
  cudaDriverEntryPointSuccess = 0,
  cudaDriverEntryPointSymbolNotFound = 1,
  cudaDriverEntryPointVersionNotSufficent = 2,
};
enum : unsigned long long { cudaEnableDefault = 0 };
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** function, unsigned int version,
                                             unsigned long long flags,
                                             cudaDriverEntryPointQueryResult* status);

// Everything runs synchronously: a stream is only a name, and asynchronous calls complete before returning.
inline cudaError_t cudaDeviceSynchronize() {
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* destination, const void* source, size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t = nullptr) {
  return cudaMemcpy(destination, source, bytes, kind);
}
inline cudaError_t cudaMemcpy2DAsync(void* destination, size_t destination_pitch, const void* source,
                                     size_t source_pitch, size_t width, size_t height, cudaMemcpyKind kind,
                                     cudaStream_t = nullptr) {
  return cudaMemcpy2D(destination, destination_pitch, source, source_pitch, width, height, kind);
}
inline cudaError_t cudaMemsetAsync(void* destination, int value, size_t bytes, cudaStream_t = nullptr) {
  return cudaMemset(destination, value, bytes);
}
// The stream-ordered allocator: with every call complete on return, allocating and freeing in stream order
// are cudaMalloc and cudaFree.
inline cudaError_t cudaMallocAsync(void** pointer, size_t bytes, cudaStream_t) {
  return cudaMalloc(pointer, bytes);
}
inline cudaError_t cudaFreeAsync(void* pointer, cudaStream_t) {
  return cudaFree(pointer);
}
template <typename T>
cudaError_t cudaMalloc(T** pointer, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(pointer), bytes);
}
template <typename Kernel>
cudaError_t cudaFuncSetAttribute(Kernel* kernel, cudaFuncAttribute attribute, int value) {
  return cudaFuncSetAttributeOf(reinterpret_cast<const void*>(kernel), attribute, value);
}
template <typename Kernel>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel* kernel, int threads,
                                                          size_t dynamic_shared_bytes) {
  return cudaOccupancyOf(blocks, reinterpret_cast<const void*>(kernel), threads, dynamic_shared_bytes);
}

// ---- The driver API's tensor maps (cuda.h, cudaTypedefs.h): what TMA launchers use ----
using cuuint32_t = uint32_t;
using cuuint64_t = uint64_t;
enum CUresult { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1 };
struct alignas(64) CUtensorMap {
  unsigned long long opaque[16];
};
enum CUtensorMapDataType {
  CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0,
  CU_TENSOR_MAP_DATA_TYPE_UINT16,
  CU_TENSOR_MAP_DATA_TYPE_UINT32,
  CU_TENSOR_MAP_DATA_TYPE_INT32,
  CU_TENSOR_MAP_DATA_TYPE_UINT64,
  CU_TENSOR_MAP_DATA_TYPE_INT64,
  CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
  CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
  CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
  CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
  CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ,
  CU_TENSOR_MAP_DATA_TYPE_TFLOAT32,
  CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ,
};
enum CUtensorMapInterleave {
  CU_TENSOR_MAP_INTERLEAVE_NONE = 0,
  CU_TENSOR_MAP_INTERLEAVE_16B,
  CU_TENSOR_MAP_INTERLEAVE_32B,
};
enum CUtensorMapSwizzle {
  CU_TENSOR_MAP_SWIZZLE_NONE = 0,
  CU_TENSOR_MAP_SWIZZLE_32B,
  CU_TENSOR_MAP_SWIZZLE_64B,
  CU_TENSOR_MAP_SWIZZLE_128B,
};
enum CUtensorMapL2promotion {
  CU_TENSOR_MAP_L2_PROMOTION_NONE = 0,
  CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
  CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
  CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
};
enum CUtensorMapFloatOOBfill {
  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0,
  CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA,
};
using PFN_cuTensorMapEncodeTiled_v12000 = CUresult (*)(
    CUtensorMap* tensor_map, CUtensorMapDataType data_type, cuuint32_t rank, void* global_address,
    const cuuint64_t* global_dims, const cuuint64_t* global_strides, const cuuint32_t* box_dims,
    const cuuint32_t* element_strides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2_promotion, CUtensorMapFloatOOBfill oob_fill);

}  // namespace flashlab::emulator::cuda_api

// The built-in variables, readable like CUDA's.
#define threadIdx (::flashlab::emulator::cuda_api::builtin::thread_index())
#define blockIdx (::flashlab::emulator::cuda_api::builtin::block_index())
#define blockDim (::flashlab::emulator::cuda_api::builtin::block_dim())
#define gridDim (::flashlab::emulator::cuda_api::builtin::grid_dim())

using namespace flashlab::emulator::cuda_api;  // NOLINT: these names are global in CUDA
using std::isfinite;
using std::isinf;
using std::isnan;
