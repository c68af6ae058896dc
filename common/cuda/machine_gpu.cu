// The GPU ceilings of common/machine.hpp (gpu_ceilings()), measured in a CUDA build: for each device, a
// device-to-device copy of 1 GiB (bytes read plus written) and a cuBLAS bf16 GEMM of 8192^3 with fp32
// accumulation (2 FLOPs per multiply-add). Host code only (no kernels); nvcc compiles it because
// common/CMakeLists.txt picks this file over machine_gpu_none.cpp in a CUDA build.
//
// cuBLAS is opened here, when the GEMM is measured, not linked: loading libcublasLt costs about 210 MB of
// resident memory before main() (its initializers), which every command of the tool and every test would pay.
// FLASHLAB_CUBLAS, when set, is the library file to open (an offline machine may have cuBLAS only inside
// PyTorch's environment, bench/gpu_report.py finds it there). A machine without it still gets the copy
// bandwidth; the GEMM is reported unavailable, with the reason.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/cuda/check.hpp"
#include "common/cuda/device.hpp"
#include "common/cuda/device_buffer.hpp"
#include "common/cuda/event_timer.hpp"
#include "common/error.hpp"
#include "common/machine.hpp"

namespace flashlab {

namespace {

// The four cuBLAS entry points the GEMM needs, from the library of the major version this file was compiled
// against; opened once and never closed.
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  // cublasGemmEx is overloaded (an inline one takes the compute type as a cudaDataType): the library's own.
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*,
                            void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;

  static const Cublas& get() {
    static const Cublas cublas = [] {
      const char* const given = std::getenv("FLASHLAB_CUBLAS");
      const std::string name = given != nullptr && *given != '\0'
                                   ? std::string(given)
                                   : "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
      void* const library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (library == nullptr) fail("cannot open ", name, ": ", dlerror());
      Cublas loaded;
      symbol(library, "cublasCreate_v2", loaded.create);
      symbol(library, "cublasDestroy_v2", loaded.destroy);
      symbol(library, "cublasGemmEx", loaded.gemm_ex);
      symbol(library, "cublasGetStatusString", loaded.status_string);
      return loaded;
    }();
    return cublas;
  }

  template <typename Function>
  static void symbol(void* library, const char* name, Function& function) {
    function = reinterpret_cast<Function>(dlsym(library, name));
    if (function == nullptr) fail("libcublas has no ", name);
  }

  void check(cublasStatus_t status, const char* call) const {
    if (status != CUBLAS_STATUS_SUCCESS) fail(call, " failed: ", status_string(status));
  }
};

double measure_copy_gbps() {
  const size_t bytes = size_t(1) << 30;
  cuda::DeviceBuffer<std::byte> source(bytes), target(bytes);
  FLASHLAB_CUDA_CHECK(cudaMemset(source.get(), 1, bytes));
  const double ms = cuda::median_event_ms(2, 10, [&](int) {
    FLASHLAB_CUDA_CHECK(cudaMemcpy(target.get(), source.get(), bytes, cudaMemcpyDeviceToDevice));
  });
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

double measure_bf16_gemm_tflops() {
  const int n = 8192;
  const size_t elements = size_t(n) * n;
  cuda::DeviceBuffer<uint16_t> a(elements), b(elements), c(elements);
  // 0x3c3c as bf16 is about 0.0115: non-zero operands (zero matrices would flatter the power budget).
  FLASHLAB_CUDA_CHECK(cudaMemset(a.get(), 0x3c, a.bytes()));
  FLASHLAB_CUDA_CHECK(cudaMemset(b.get(), 0x3c, b.bytes()));
  const Cublas& cublas = Cublas::get();
  cublasHandle_t handle = nullptr;
  cublas.check(cublas.create(&handle), "cublasCreate");
  const float alpha = 1.0f, beta = 0.0f;
  double ms = 0;
  try {
    ms = cuda::median_event_ms(3, 10, [&](int) {
      cublas.check(cublas.gemm_ex(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.get(), CUDA_R_16BF, n,
                                  b.get(), CUDA_R_16BF, n, &beta, c.get(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
    });
  } catch (...) {
    cublas.destroy(handle);
    throw;
  }
  cublas.destroy(handle);
  return 2.0 * n * double(n) * n / (ms * 1e-3) / 1e12;
}

}  // namespace

const GpuReport& gpu_ceilings() {
  static const GpuReport report = [] {
    GpuReport measured;
    measured.absent_reason = cuda::unavailable_reason();
    if (!measured.absent_reason.empty()) return measured;
    int count = 0, current = 0;
    FLASHLAB_CUDA_CHECK(cudaGetDeviceCount(&count));
    FLASHLAB_CUDA_CHECK(cudaGetDevice(&current));
    for (int device = 0; device < count; ++device) {
      FLASHLAB_CUDA_CHECK(cudaSetDevice(device));
      cudaDeviceProp prop{};
      FLASHLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
      GpuCeilings ceilings;
      ceilings.name = prop.name;
      ceilings.sm_count = prop.multiProcessorCount;
      ceilings.memory_gib = static_cast<double>(prop.totalGlobalMem) / double(size_t(1) << 30);
      ceilings.copy_gbps = measure_copy_gbps();
      try {
        ceilings.bf16_gemm_tflops = measure_bf16_gemm_tflops();
      } catch (const Error& error) {  // no cuBLAS here: the copy still counts
        ceilings.bf16_gemm_tflops = std::nan("");
        ceilings.gemm_unavailable = error.what();
      }
      measured.devices.push_back(ceilings);
    }
    FLASHLAB_CUDA_CHECK(cudaSetDevice(current));
    return measured;
  }();
  return report;
}

}  // namespace flashlab
