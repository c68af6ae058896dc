#include "common/cuda/device_problem.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

#include "common/error.hpp"

namespace flashlab::cuda {

DType storage_dtype(DType dtype) {
  return dtype == DType::e4m3 ? DType::bf16 : dtype;
}

size_t storage_bytes(DType dtype) {
  return storage_dtype(dtype) == DType::f32 ? sizeof(float) : sizeof(uint16_t);
}

std::vector<std::byte> to_storage(DType dtype, const float* values, size_t count) {
  std::vector<std::byte> stored(count * storage_bytes(dtype));
  switch (storage_dtype(dtype)) {
    case DType::f16: {
      auto* out = reinterpret_cast<__half*>(stored.data());
      for (size_t n = 0; n < count; ++n) out[n] = __float2half_rn(values[n]);
      break;
    }
    case DType::bf16: {
      auto* out = reinterpret_cast<__nv_bfloat16*>(stored.data());
      for (size_t n = 0; n < count; ++n) out[n] = __float2bfloat16_rn(values[n]);
      break;
    }
    default:
      if (count > 0) std::memcpy(stored.data(), values, count * sizeof(float));
  }
  return stored;
}

void from_storage(DType dtype, const std::byte* stored, size_t count, float* values) {
  switch (storage_dtype(dtype)) {
    case DType::f16: {
      const auto* in = reinterpret_cast<const __half*>(stored);
      for (size_t n = 0; n < count; ++n) values[n] = __half2float(in[n]);
      break;
    }
    case DType::bf16: {
      const auto* in = reinterpret_cast<const __nv_bfloat16*>(stored);
      for (size_t n = 0; n < count; ++n) values[n] = __bfloat162float(in[n]);
      break;
    }
    default:
      if (count > 0) std::memcpy(values, stored, count * sizeof(float));
  }
}

std::vector<uint16_t> to_16bit(const std::vector<float>& values, DType dtype) {
  if (storage_bytes(dtype) != 2) fail("to_16bit: dtype ", to_string(dtype), " is not stored in 16 bits");
  const std::vector<std::byte> stored = to_storage(dtype, values.data(), values.size());
  std::vector<uint16_t> bits(values.size());
  if (!bits.empty()) std::memcpy(bits.data(), stored.data(), stored.size());
  return bits;
}

std::vector<float> from_16bit(const std::vector<uint16_t>& bits, DType dtype) {
  if (storage_bytes(dtype) != 2) fail("from_16bit: dtype ", to_string(dtype), " is not stored in 16 bits");
  std::vector<float> values(bits.size());
  from_storage(dtype, reinterpret_cast<const std::byte*>(bits.data()), bits.size(), values.data());
  return values;
}

namespace {

// Uploads host floats in the storage format of `dtype`.
DeviceBuffer<std::byte> upload(DType dtype, const HostTensor& tensor) {
  const std::vector<std::byte> stored = to_storage(dtype, tensor.ptr(), tensor.data.size());
  DeviceBuffer<std::byte> buffer(stored.size());
  if (!stored.empty()) buffer.copy_from_host(stored.data());
  return buffer;
}

template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& values) {
  DeviceBuffer<T> buffer(values.size());
  if (!values.empty()) buffer.copy_from_host(values.data());
  return buffer;
}

}  // namespace

DeviceProblem::DeviceProblem(const Problem& problem, const AttentionInputs& inputs, size_t workspace_bytes)
    : dtype_(problem.dtype),
      q_(upload(problem.dtype, inputs.q)),
      k_(upload(problem.dtype, inputs.k)),
      v_(upload(problem.dtype, inputs.v)),
      o_(static_cast<size_t>(problem.q_elements()) * storage_bytes(problem.dtype)),
      workspace_(workspace_bytes),
      lse_(static_cast<size_t>(problem.lse_elements())),
      seqlens_q_(upload(problem.seqlens_q)),
      seqlens_k_(upload(problem.seqlens_k)) {
  if (inputs.q.size() != problem.q_elements() || inputs.k.size() != problem.kv_elements() ||
      inputs.v.size() != problem.kv_elements())
    fail("inputs do not match the problem's shapes (", problem.describe(), ")");
  if (problem.mask) mask_ = upload(*problem.mask);
  tensors_.q = q_.get();
  tensors_.k = k_.get();
  tensors_.v = v_.get();
  tensors_.o = o_.get();
  tensors_.lse = lse_.get();
  tensors_.mask = problem.mask ? mask_.get() : nullptr;
  tensors_.seqlens_q = problem.seqlens_q.empty() ? nullptr : seqlens_q_.get();
  tensors_.seqlens_k = problem.seqlens_k.empty() ? nullptr : seqlens_k_.get();
  tensors_.workspace = workspace_.get();
}

void DeviceProblem::download(AttentionOutputs& outputs) const {
  if (static_cast<size_t>(outputs.o.size()) * storage_bytes(dtype_) != o_.bytes() ||
      static_cast<size_t>(outputs.lse.size()) != lse_.size())
    fail("outputs do not match the problem's shapes");
  std::vector<std::byte> stored(o_.bytes());
  if (!stored.empty()) o_.copy_to_host(stored.data());
  from_storage(dtype_, stored.data(), outputs.o.data.size(), outputs.o.ptr());
  if (lse_.size() > 0) lse_.copy_to_host(outputs.lse.ptr());
}

}  // namespace flashlab::cuda
