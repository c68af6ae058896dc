// Number formats, exact and in one place: rounding float32 to bf16 and fp16 (round to nearest, ties to even).
// Host tensors stay float32; a value "in bf16" is a float32 whose bits fit bf16.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "common/problem.hpp"

namespace flashlab {

// bf16 keeps float32's 8 exponent bits and the top 7 mantissa bits: round the low 16 bits away, ties to even.
inline float round_to_bf16(float x) {
  if (std::isnan(x)) return x;
  uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7fffu + lsb;  // overflow past the largest finite value rounds to inf, as the format does
  return std::bit_cast<float>(bits & 0xffff0000u);
}

// fp16: 5 exponent bits (bias 15), 10 mantissa bits, subnormals below 2^-14, largest finite 65504.
inline float round_to_fp16(float x) {
  if (!std::isfinite(x)) return x;
  const float magnitude = std::fabs(x);
  if (magnitude >= 65520.0f)
    return std::copysign(INFINITY, x);  // 65520 is the halfway point to 2^16: rounds up
  int exponent = 0;
  std::frexp(magnitude, &exponent);                        // magnitude = f * 2^exponent, f in [0.5, 1)
  const int unit_exponent = std::max(exponent - 11, -24);  // 11 significant bits; subnormal spacing 2^-24
  const float unit = std::ldexp(1.0f, unit_exponent);
  // Scaling by a power of two is exact, and nearbyint rounds half to even in the default rounding mode.
  return std::copysign(std::nearbyint(magnitude / unit) * unit, x);
}

// Rounds to the format that `dtype` computes in (identity for f32).
inline float round_to(DType dtype, float x) {
  switch (dtype) {
    case DType::f16:
      return round_to_fp16(x);
    case DType::bf16:
      return round_to_bf16(x);
    default:
      return x;
  }
}

}  // namespace flashlab
