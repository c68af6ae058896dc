// A problem's tensors in GPU memory (CUDA builds only): what the registry adapter and the GPU benchmarks hand
// to an implementation's device entry. Host tensors are float32; on the device Q, K, V and O are in the
// problem's storage format, converted here, once for every stage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/cuda/device_buffer.hpp"
#include "common/registry.hpp"
#include "common/tensor.hpp"

namespace flashlab::cuda {

// The format Q, K, V and O are stored in on the device for a dtype: f32 -> float, f16 -> __half,
// bf16 -> __nv_bfloat16. e4m3 problems are stored as bf16: the FP8 stage quantizes in its own pre-pass
// (SPEC).
DType storage_dtype(DType dtype);
size_t storage_bytes(DType dtype);  // bytes per element of storage_dtype(dtype)

// float32 -> storage format (round to nearest even, as common/number_format.hpp rounds), and back.
std::vector<std::byte> to_storage(DType dtype, const float* values, size_t count);
void from_storage(DType dtype, const std::byte* stored, size_t count, float* values);

// The same for the 16-bit formats (f16, bf16), as the stages' selftests hold their device tensors.
std::vector<uint16_t> to_16bit(const std::vector<float>& values, DType dtype);
std::vector<float> from_16bit(const std::vector<uint16_t>& bits, DType dtype);

class DeviceProblem {
 public:
  // Allocates every tensor of `problem`, uploads the inputs (converted), the mask and the per-batch lengths,
  // and `workspace_bytes` of scratch. O and LSE are left uninitialized: the implementation writes them.
  DeviceProblem(const Problem& problem, const AttentionInputs& inputs, size_t workspace_bytes);

  const DeviceTensors& tensors() const { return tensors_; }
  // Copies O (converted to float32) and LSE into host outputs of the problem's shapes.
  void download(AttentionOutputs& outputs) const;
  // Bytes of Q, K, V, O and LSE on the device (what one copy of the problem occupies).
  size_t tensor_bytes() const { return q_.bytes() + k_.bytes() + v_.bytes() + o_.bytes() + lse_.bytes(); }

 private:
  DType dtype_;
  DeviceBuffer<std::byte> q_, k_, v_, o_, workspace_;
  DeviceBuffer<float> lse_;
  DeviceBuffer<uint8_t> mask_;
  DeviceBuffer<int64_t> seqlens_q_, seqlens_k_;
  DeviceTensors tensors_;
};

}  // namespace flashlab::cuda
