#include "common/cuda/storage.hpp"

#include <cstring>

#include "common/error.hpp"
#include "common/number_format.hpp"

namespace flashlab::cuda {

DType storage_dtype(DType dtype) {
  return dtype == DType::e4m3 ? DType::bf16 : dtype;
}

size_t storage_bytes(DType dtype) {
  return storage_dtype(dtype) == DType::f32 ? sizeof(float) : sizeof(uint16_t);
}

std::vector<std::byte> to_storage(DType dtype, const float* values, size_t count) {
  std::vector<std::byte> stored(count * storage_bytes(dtype));
  const DType format = storage_dtype(dtype);
  if (format == DType::f32) {
    if (count > 0) std::memcpy(stored.data(), values, count * sizeof(float));
    return stored;
  }
  for (size_t n = 0; n < count; ++n) {
    const uint16_t bits = format == DType::f16 ? encode_fp16(values[n]) : encode_bf16(values[n]);
    std::memcpy(stored.data() + 2 * n, &bits, 2);
  }
  return stored;
}

void from_storage(DType dtype, const std::byte* stored, size_t count, float* values) {
  const DType format = storage_dtype(dtype);
  if (format == DType::f32) {
    if (count > 0) std::memcpy(values, stored, count * sizeof(float));
    return;
  }
  for (size_t n = 0; n < count; ++n) {
    uint16_t bits;
    std::memcpy(&bits, stored + 2 * n, 2);
    values[n] = format == DType::f16 ? decode_fp16(bits) : decode_bf16(bits);
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

}  // namespace flashlab::cuda
