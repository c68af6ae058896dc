#include "common/cuda/ceilings.hpp"

#include "common/cuda/device.hpp"

#if FLASHLAB_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "common/cuda/device_buffer.hpp"
#include "common/cuda/event_timer.hpp"
#include "common/error.hpp"
#endif

namespace flashlab::cuda {

#if FLASHLAB_HAVE_CUDA
namespace {

void check_cublas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) fail(call, " failed: ", cublasGetStatusString(status));
}

// 1 GiB copied device to device; the rate counts the bytes read and the bytes written, like the CPU copy
// figure.
double measure_copy_gbps() {
  const size_t bytes = size_t(1) << 30;
  DeviceBuffer<std::byte> source(bytes), target(bytes);
  FLASHLAB_CUDA_CHECK(cudaMemset(source.get(), 1, bytes));
  const double ms = median_event_ms(2, 10, [&](int) {
    FLASHLAB_CUDA_CHECK(cudaMemcpy(target.get(), source.get(), bytes, cudaMemcpyDeviceToDevice));
  });
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

// C = A B with A, B, C bf16 8192 x 8192 and fp32 accumulation: large enough to reach the tensor cores' rate.
double measure_bf16_gemm_tflops() {
  const int n = 8192;
  const size_t elements = size_t(n) * n;
  DeviceBuffer<uint16_t> a(elements), b(elements), c(elements);
  // 0x3c3c as bf16 is about 0.0115: non-zero operands (a zero matrix would flatter the power budget).
  FLASHLAB_CUDA_CHECK(cudaMemset(a.get(), 0x3c, a.bytes()));
  FLASHLAB_CUDA_CHECK(cudaMemset(b.get(), 0x3c, b.bytes()));
  cublasHandle_t handle = nullptr;
  check_cublas(cublasCreate(&handle), "cublasCreate");
  const float alpha = 1.0f, beta = 0.0f;
  double ms = 0;
  try {
    ms = median_event_ms(3, 10, [&](int) {
      check_cublas(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.get(), CUDA_R_16BF, n,
                                b.get(), CUDA_R_16BF, n, &beta, c.get(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
    });
  } catch (...) {
    cublasDestroy(handle);
    throw;
  }
  cublasDestroy(handle);
  return 2.0 * n * double(n) * n / (ms * 1e-3) / 1e12;
}

}  // namespace
#endif

std::optional<GpuCeilings> gpu_ceilings() {
  const std::optional<DeviceProperties> properties = device_properties();
  if (!properties) return std::nullopt;
#if FLASHLAB_HAVE_CUDA
  static const GpuCeilings ceilings = [&] {
    GpuCeilings measured;
    measured.name = properties->name;
    measured.sm_count = properties->sm_count;
    measured.copy_gbps = measure_copy_gbps();
    measured.bf16_gemm_tflops = measure_bf16_gemm_tflops();
    return measured;
  }();
  return ceilings;
#else
  return std::nullopt;
#endif
}

}  // namespace flashlab::cuda
