// The CUDA runtime API of emulated builds (emulator/cuda.hpp): device memory is host memory the emulator
// tracks, every call completes before it returns, and the device is the one DeviceLimits describes.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "emulator/cuda.hpp"
#include "emulator/launch.hpp"
#include "emulator/memory.hpp"
#include "emulator/tensor_map.hpp"

namespace flashlab::emulator::cuda_api {

namespace {

thread_local cudaError_t last_error = cudaSuccess;

cudaError_t record(cudaError_t error) {
  if (error != cudaSuccess) last_error = error;
  return error;
}

// A pointer a copy reads from or writes to: device pointers must lie in an allocation.
bool valid(const void* pointer, size_t bytes, bool device) {
  return !device || bytes == 0 || is_device_range(pointer, bytes);
}

struct Event {
  std::chrono::steady_clock::time_point at;
};

// cuTensorMapEncodeTiled's emulated twin: the same checks, the parameters recorded in the map's 128 bytes.
CUresult encode_tensor_map_tiled(CUtensorMap* map, CUtensorMapDataType data_type, cuuint32_t rank, void* base,
                                 const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                 const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                 CUtensorMapSwizzle swizzle, CUtensorMapL2promotion,
                                 CUtensorMapFloatOOBfill oob_fill) {
  const std::string reason = tma::encode(map, data_type, rank, base, dims, strides, box, element_strides,
                                         interleave, swizzle, oob_fill);
  if (reason.empty()) return CUDA_SUCCESS;
  // The driver says no more than CUDA_ERROR_INVALID_VALUE; the emulator also says why.
  std::fprintf(stderr, "flashlab emulator: cuTensorMapEncodeTiled: %s\n", reason.c_str());
  return CUDA_ERROR_INVALID_VALUE;
}

}  // namespace

cudaError_t cudaMalloc(void** pointer, size_t bytes) {
  if (pointer == nullptr) return record(cudaErrorInvalidValue);
  *pointer = device_allocate(bytes);
  return record(*pointer == nullptr ? cudaErrorMemoryAllocation : cudaSuccess);
}

cudaError_t cudaFree(void* pointer) {
  return record(device_free(pointer) ? cudaSuccess : cudaErrorInvalidDevicePointer);
}

cudaError_t cudaMemcpy(void* destination, const void* source, size_t bytes, cudaMemcpyKind kind) {
  const bool from_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  const bool to_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  if (kind == cudaMemcpyDefault) {
    if (!is_device_range(destination, bytes) && !is_device_range(source, bytes))
      return record(cudaErrorInvalidValue);
  } else if (!valid(source, bytes, from_device) || !valid(destination, bytes, to_device)) {
    return record(cudaErrorInvalidValue);
  }
  if (bytes > 0) std::memmove(destination, source, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpy2D(void* destination, size_t destination_pitch, const void* source, size_t source_pitch,
                         size_t width, size_t height, cudaMemcpyKind kind) {
  if (width > destination_pitch || width > source_pitch) return record(cudaErrorInvalidValue);
  for (size_t row = 0; row < height; ++row) {
    const cudaError_t status = cudaMemcpy(static_cast<char*>(destination) + row * destination_pitch,
                                          static_cast<const char*>(source) + row * source_pitch, width, kind);
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

cudaError_t cudaMemset(void* destination, int value, size_t bytes) {
  if (!valid(destination, bytes, true)) return record(cudaErrorInvalidValue);
  if (bytes > 0) std::memset(destination, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  const cudaError_t error = last_error;
  last_error = cudaSuccess;
  return error;
}

cudaError_t cudaPeekAtLastError() {
  return last_error;
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidDeviceFunction:
      return "cudaErrorInvalidDeviceFunction";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument (emulated device: a pointer outside every device allocation, or a bad size)";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal (the emulator has device 0 only)";
    default:
      return cudaGetErrorName(error);
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  return record(device == 0 ? cudaSuccess : cudaErrorInvalidDevice);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (device != 0) return record(cudaErrorInvalidDevice);
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "flashlab emulator (sm_%d%d limits, CPU)",
                DeviceLimits::compute_major, DeviceLimits::compute_minor);
  p->totalGlobalMem = DeviceLimits::global_bytes;
  p->sharedMemPerBlock = DeviceLimits::shared_per_block;
  p->regsPerBlock = DeviceLimits::registers_per_sm;
  p->warpSize = 32;
  p->maxThreadsPerBlock = DeviceLimits::max_threads_per_block;
  p->major = DeviceLimits::compute_major;
  p->minor = DeviceLimits::compute_minor;
  p->multiProcessorCount = DeviceLimits::sm_count;
  p->l2CacheSize = static_cast<int>(DeviceLimits::l2_bytes);
  p->maxThreadsPerMultiProcessor = DeviceLimits::max_threads_per_sm;
  p->sharedMemPerMultiprocessor = DeviceLimits::shared_per_sm;
  p->sharedMemPerBlockOptin = DeviceLimits::shared_per_block_optin;
  p->regsPerMultiprocessor = DeviceLimits::registers_per_sm;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return cudaErrorInvalidDevice;
  switch (attribute) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = p.maxThreadsPerBlock;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = static_cast<int>(p.sharedMemPerBlock);
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *value = p.warpSize;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = p.multiProcessorCount;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = p.major;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = p.minor;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
      *value = static_cast<int>(p.sharedMemPerMultiprocessor);
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(p.sharedMemPerBlockOptin);
      return cudaSuccess;
  }
  return record(cudaErrorInvalidValue);
}

cudaError_t cudaFuncSetAttributeOf(const void* kernel, cudaFuncAttribute attribute, int value) {
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      static_cast<size_t>(value) > DeviceLimits::shared_per_block_optin)
    return record(cudaErrorInvalidValue);
  set_max_dynamic_shared(kernel, static_cast<size_t>(value));
  return cudaSuccess;
}

// Resident blocks per SM as the limits allow: threads, blocks, and shared memory (each block also takes the
// 1 KiB the system reserves). Registers are not counted: the emulator does not know a kernel's register use.
cudaError_t cudaOccupancyOf(int* blocks, const void*, int threads, size_t dynamic_shared_bytes) {
  if (threads <= 0 || threads > DeviceLimits::max_threads_per_block) return record(cudaErrorInvalidValue);
  int count = std::min(DeviceLimits::max_blocks_per_sm, DeviceLimits::max_threads_per_sm / threads);
  const size_t per_block = dynamic_shared_bytes + DeviceLimits::reserved_shared_per_block;
  count = std::min<int>(count, static_cast<int>(DeviceLimits::shared_per_sm / per_block));
  *blocks = count;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = reinterpret_cast<cudaEvent_t>(new Event);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<Event*>(event);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  reinterpret_cast<Event*>(event)->at = std::chrono::steady_clock::now();
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t) {
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  const auto span = reinterpret_cast<Event*>(end)->at - reinterpret_cast<Event*>(start)->at;
  *ms = std::chrono::duration<float, std::milli>(span).count();
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** function, unsigned int version,
                                             unsigned long long, cudaDriverEntryPointQueryResult* status) {
  if (symbol == nullptr || function == nullptr) return record(cudaErrorInvalidValue);
  const bool found = std::string_view(symbol) == "cuTensorMapEncodeTiled" && version >= 12000;
  *function = found ? reinterpret_cast<void*>(&encode_tensor_map_tiled) : nullptr;
  if (status != nullptr) *status = found ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

}  // namespace flashlab::emulator::cuda_api
