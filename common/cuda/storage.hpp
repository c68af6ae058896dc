// The formats GPU stages keep Q, K, V and O in, converted from and to the host's float32 tensors, in one
// place for the GPU and the emulator: f32 -> float, f16 -> __half, bf16 -> __nv_bfloat16 (the bit patterns of
// common/number_format.hpp), and e4m3 problems as bf16 (the FP8 stage quantizes in its own pre-pass,
// docs/conventions.md §6).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/problem.hpp"

namespace flashlab::cuda {

DType storage_dtype(DType dtype);
size_t storage_bytes(DType dtype);  // bytes per element of storage_dtype(dtype)

// float32 -> storage format (round to nearest even, as common/number_format.hpp rounds), and back.
std::vector<std::byte> to_storage(DType dtype, const float* values, size_t count);
void from_storage(DType dtype, const std::byte* stored, size_t count, float* values);

// The same for the 16-bit formats (f16, bf16), as bit patterns.
std::vector<uint16_t> to_16bit(const std::vector<float>& values, DType dtype);
std::vector<float> from_16bit(const std::vector<uint16_t>& bits, DType dtype);

}  // namespace flashlab::cuda
