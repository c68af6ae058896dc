// An owning device allocation (RAII): freed when it goes out of scope, even when a check throws. Either
// immediate (cudaMalloc, copies that return when done) or ordered on a stream (cudaMallocAsync, copies and
// the free enqueued on it), for callers whose work must not wait on the host (the Python module's CUDA
// tensors, common/cuda/device_problem.hpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "common/cuda/check.hpp"
#include "common/cuda/target.hpp"

namespace flashlab::cuda {
namespace FLASHLAB_CUDA_TARGET {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count > 0) FLASHLAB_CUDA_CHECK(cudaMalloc(&data_, count * sizeof(T)));
  }
  // Ordered on `stream`: usable by the work enqueued on it after this, and freed on it after that work.
  DeviceBuffer(size_t count, cudaStream_t stream) : count_(count), stream_(stream), ordered_(true) {
    if (count > 0)
      FLASHLAB_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&data_), count * sizeof(T), stream));
  }
  ~DeviceBuffer() {
    if (data_ == nullptr) return;
    if (ordered_)  // no throw from a destructor
      cudaFreeAsync(data_, stream_);
    else
      cudaFree(data_);
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        count_(std::exchange(other.count_, 0)),
        stream_(other.stream_),
        ordered_(other.ordered_) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(count_, other.count_);
    std::swap(stream_, other.stream_);
    std::swap(ordered_, other.ordered_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

  // Ordered: enqueued on the stream (`host` may be released on return: a copy from pageable memory is staged
  // before cudaMemcpyAsync returns).
  void copy_from_host(const T* host) {
    if (ordered_)
      FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(data_, host, bytes(), cudaMemcpyHostToDevice, stream_));
    else
      FLASHLAB_CUDA_CHECK(cudaMemcpy(data_, host, bytes(), cudaMemcpyHostToDevice));
  }
  void copy_to_host(T* host) const {
    FLASHLAB_CUDA_CHECK(cudaMemcpy(host, data_, bytes(), cudaMemcpyDeviceToHost));
  }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
  cudaStream_t stream_ = nullptr;
  bool ordered_ = false;
};

// A host vector in a new device buffer, and a device buffer back in a host vector (after the device has
// finished: a fault in a kernel that wrote it surfaces here, checked).
template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& host) {
  DeviceBuffer<T> buffer(host.size());
  if (!host.empty()) buffer.copy_from_host(host.data());
  return buffer;
}
template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& host, cudaStream_t stream) {  // ordered on `stream`
  DeviceBuffer<T> buffer(host.size(), stream);
  if (!host.empty()) buffer.copy_from_host(host.data());
  return buffer;
}
template <typename T>
std::vector<T> download(const DeviceBuffer<T>& buffer) {
  std::vector<T> host(buffer.size());
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  if (!host.empty()) buffer.copy_to_host(host.data());
  return host;
}

}  // namespace FLASHLAB_CUDA_TARGET
using namespace FLASHLAB_CUDA_TARGET;
}  // namespace flashlab::cuda
