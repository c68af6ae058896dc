// An owning device allocation (RAII): freed when it goes out of scope, even when a check throws.
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
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);  // no throw from a destructor
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(count_, other.count_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

  void copy_from_host(const T* host) {
    FLASHLAB_CUDA_CHECK(cudaMemcpy(data_, host, bytes(), cudaMemcpyHostToDevice));
  }
  void copy_to_host(T* host) const {
    FLASHLAB_CUDA_CHECK(cudaMemcpy(host, data_, bytes(), cudaMemcpyDeviceToHost));
  }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
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
std::vector<T> download(const DeviceBuffer<T>& buffer) {
  std::vector<T> host(buffer.size());
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  if (!host.empty()) buffer.copy_to_host(host.data());
  return host;
}

}  // namespace FLASHLAB_CUDA_TARGET
using namespace FLASHLAB_CUDA_TARGET;
}  // namespace flashlab::cuda
