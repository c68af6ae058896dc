#include "common/cuda/device.hpp"

#include <atomic>
#include <cstdlib>
#include <string_view>

#if FLASHLAB_HAVE_CUDA
#include <cuda_runtime.h>

#include "common/cuda/check.hpp"
#endif

namespace flashlab::cuda {

namespace {
std::atomic<bool>& forced_emulation() {
  static std::atomic<bool> forced{[] {
    const char* value = std::getenv("FLASHLAB_EMULATE");
    return value != nullptr && std::string_view(value) == "1";
  }()};
  return forced;
}
}  // namespace

bool emulation_forced() {
  return forced_emulation().load();
}

void force_emulation(bool forced) {
  forced_emulation().store(forced);
}

const std::string& unavailable_reason() {
  static const std::string reason = [] {
#if FLASHLAB_HAVE_CUDA
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    // No driver at all reads, in CUDA's own words, as an old one: say both.
    if (status == cudaErrorInsufficientDriver)
      return std::string(
          "no CUDA device: no NVIDIA driver here, or one older than this build's CUDA "
          "(cudaErrorInsufficientDriver)");
    if (status != cudaSuccess)
      return std::string("no CUDA device: ") + cudaGetErrorName(status) + ": " + cudaGetErrorString(status);
    if (count == 0) return std::string("no CUDA device: cudaGetDeviceCount found 0 devices");
    return std::string();
#else
    return std::string("built without CUDA");
#endif
  }();
  return reason;
}

std::optional<DeviceProperties> device_properties() {
  if (!unavailable_reason().empty()) return std::nullopt;
#if FLASHLAB_HAVE_CUDA
  static const DeviceProperties properties = [] {
    int device = 0;
    FLASHLAB_CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp prop{};
    FLASHLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    DeviceProperties p;
    p.name = prop.name;
    p.compute_major = prop.major;
    p.compute_minor = prop.minor;
    p.sm_count = prop.multiProcessorCount;
    p.shared_per_block = prop.sharedMemPerBlock;
    p.shared_per_block_optin = prop.sharedMemPerBlockOptin;
    p.shared_per_sm = prop.sharedMemPerMultiprocessor;
    p.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
    p.global_bytes = prop.totalGlobalMem;
    return p;
  }();
  return properties;
#else
  return std::nullopt;
#endif
}

std::string device_fault() {
  if (!unavailable_reason().empty()) return "";
#if FLASHLAB_HAVE_CUDA
  (void)cudaGetLastError();  // clears an error that leaves the context usable; a sticky one stays
  const cudaError_t status = cudaDeviceSynchronize();
  if (status != cudaSuccess) return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
#endif
  return "";
}

std::string needs_compute_capability(int major, int minor, const char* target) {
  const std::optional<DeviceProperties> device = device_properties();
  if (!device) return unavailable_reason();
  if (device->compute_major == major && device->compute_minor == minor) return "";
  return "needs compute capability " + std::to_string(major) + "." + std::to_string(minor) + " (" + target +
         "); this device is " + std::to_string(device->compute_major) + "." +
         std::to_string(device->compute_minor);
}

}  // namespace flashlab::cuda
