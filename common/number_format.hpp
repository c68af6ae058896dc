// Number formats, exact and in one place: rounding float32 to bf16 and fp16 (round to nearest, ties to even),
// and the two 8-bit floating-point formats of Hopper's tensor cores, e4m3 and e5m2 (OCP FP8 spec), encoded to
// their byte and decoded back. Host tensors stay float32; a value "in bf16" is a float32 whose bits fit bf16.
#pragma once

#include <algorithm>
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
  if (magnitude >= 0x1p-14f && magnitude < 65504.0f) {
    // Normal range, no overflow possible: drop float32's low 13 mantissa bits on the bit pattern, ties to
    // even.
    uint32_t bits = std::bit_cast<uint32_t>(x);
    bits += 0x0fffu + ((bits >> 13) & 1u);
    return std::bit_cast<float>(bits & ~0x1fffu);
  }
  if (magnitude >= 65520.0f)
    return std::copysign(INFINITY, x);  // 65520 is the halfway point to 2^16: rounds up
  int exponent = 0;
  std::frexp(magnitude, &exponent);                        // magnitude = f * 2^exponent, f in [0.5, 1)
  const int unit_exponent = std::max(exponent - 11, -24);  // 11 significant bits; subnormal spacing 2^-24
  const float unit = std::ldexp(1.0f, unit_exponent);
  // Scaling by a power of two is exact, and nearbyint rounds half to even in the default rounding mode.
  return std::copysign(std::nearbyint(magnitude / unit) * unit, x);
}

// The 16-bit formats as bit patterns (what CUDA's __nv_bfloat16 and __half hold): encode rounds to nearest,
// ties to even, like round_to_bf16 / round_to_fp16 above; NaN encodes to the canonical NaN 0x7fff, as CUDA's
// __float2bfloat16_rn and __float2half_rn do.
inline uint16_t encode_bf16(float x) {
  if (std::isnan(x)) return 0x7fff;
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(round_to_bf16(x)) >> 16);
}
inline float decode_bf16(uint16_t bits) {
  return std::bit_cast<float>(uint32_t{bits} << 16);
}
inline uint16_t encode_fp16(float x) {
  if (std::isnan(x)) return 0x7fff;
  const float rounded = round_to_fp16(x);
  const uint16_t sign = std::signbit(rounded) ? 0x8000 : 0x0000;
  const float magnitude = std::fabs(rounded);
  if (std::isinf(magnitude)) return sign | 0x7c00;
  if (magnitude >= 0x1p-14f) {  // normal: re-bias float32's exponent, keep the top 10 mantissa bits
    const uint32_t bits = std::bit_cast<uint32_t>(magnitude);
    const uint32_t exponent = (bits >> 23) - 127 + 15;
    return static_cast<uint16_t>(sign | exponent << 10 | (bits & 0x7fffff) >> 13);
  }
  return static_cast<uint16_t>(sign |
                               static_cast<uint16_t>(magnitude * 0x1p24f));  // subnormal: units of 2^-24
}
inline float decode_fp16(uint16_t bits) {
  // Built from bits, as the emulator decodes every f16 operand of every mma through here.
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
  if (exponent == 0x1f) return mantissa == 0 ? std::bit_cast<float>(sign | 0x7f800000) : NAN;
  if (exponent == 0)  // subnormal: units of 2^-24, exact in float32
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(static_cast<float>(mantissa) * 0x1p-24f));
  return std::bit_cast<float>(sign | (exponent - 15 + 127) << 23 | mantissa << 13);  // re-bias, widen
}

// An 8-bit float: 1 sign bit, `exponent_bits`, `mantissa_bits`, exponent bias 2^(exponent_bits-1) - 1.
//   e4m3 (OCP "E4M3FN"): no infinities; S.1111.111 is NaN, so the largest finite is S.1111.110 = 448 = 1.75 *
//   2^8;
//         smallest normal 2^-6, subnormals are multiples of 2^-9.
//   e5m2: IEEE-like; S.11111.00 is infinity, S.11111.{01,10,11} are NaN; largest finite 57344 = 1.75 * 2^15;
//         smallest normal 2^-14, subnormals are multiples of 2^-16.
// encode() rounds to nearest, ties to even, and saturates: any magnitude above the largest finite value,
// infinity included, becomes the largest finite value with its sign (PTX cvt.rn.satfinite, the conversion FP8
// kernels use, so that one large value cannot turn a whole tile into inf or NaN). NaN encodes to NaN.
template <int exponent_bits, int mantissa_bits, bool has_infinity>
struct Fp8Format {
  static constexpr int bias = (1 << (exponent_bits - 1)) - 1;
  static constexpr int max_exponent_field = (1 << exponent_bits) - 1;
  // e4m3 spends only the all-ones mantissa of the top binade on NaN; e5m2 spends the whole top binade.
  static constexpr int top_finite_exponent = has_infinity ? max_exponent_field - 1 : max_exponent_field;
  static constexpr int top_finite_mantissa =
      has_infinity ? (1 << mantissa_bits) - 1 : (1 << mantissa_bits) - 2;
  static constexpr int min_normal_exponent = 1 - bias;  // unbiased exponent of the smallest normal
  static constexpr double max_finite =
      (1.0 + top_finite_mantissa / double(1 << mantissa_bits)) * double(1 << (top_finite_exponent - bias));
  static constexpr uint8_t nan_code = has_infinity ? uint8_t(max_exponent_field << mantissa_bits | 1) : 0x7f;

  static uint8_t encode(float x) {
    if (std::isnan(x)) return nan_code;
    const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    const double magnitude = std::fabs(static_cast<double>(x));
    if (magnitude >= max_finite) return sign | max_code();  // saturate (infinity too)
    int exponent = 0;
    std::frexp(magnitude, &exponent);  // magnitude = f * 2^exponent, f in [0.5, 1)
    // The spacing of representable values around `magnitude`; below the normal range it stays 2^(min - m).
    const int unit_exponent = std::max(exponent - 1, min_normal_exponent) - mantissa_bits;
    // Scaling by a power of two is exact in double, and nearbyint rounds half to even in the default mode.
    const double units = std::nearbyint(std::ldexp(magnitude, -unit_exponent));
    const double rounded = std::ldexp(units, unit_exponent);
    if (rounded >= max_finite) return sign | max_code();  // rounding up past the top is saturation too
    if (rounded == 0.0) return sign;
    int rounded_exponent = 0;
    std::frexp(rounded, &rounded_exponent);
    const int unbiased = rounded_exponent - 1;
    if (unbiased < min_normal_exponent)  // subnormal: exponent field 0, mantissa counts units of 2^(min - m)
      return sign | static_cast<uint8_t>(units);
    const int mantissa =
        static_cast<int>(std::ldexp(rounded, mantissa_bits - unbiased)) - (1 << mantissa_bits);
    return sign | static_cast<uint8_t>((unbiased + bias) << mantissa_bits | mantissa);
  }

  static float decode(uint8_t code) {
    const bool negative = (code & 0x80) != 0;
    const int exponent_field = (code >> mantissa_bits) & max_exponent_field;
    const int mantissa = code & ((1 << mantissa_bits) - 1);
    double magnitude = 0.0;
    if (exponent_field == max_exponent_field && has_infinity) {
      magnitude = mantissa == 0 ? INFINITY : NAN;
    } else if (exponent_field == max_exponent_field && mantissa == (1 << mantissa_bits) - 1) {
      magnitude = NAN;  // e4m3's only NaN pattern
    } else if (exponent_field == 0) {
      magnitude = std::ldexp(double(mantissa), min_normal_exponent - mantissa_bits);
    } else {
      magnitude = std::ldexp(double((1 << mantissa_bits) | mantissa), exponent_field - bias - mantissa_bits);
    }
    return static_cast<float>(negative ? -magnitude : magnitude);
  }

  // decode(encode(x)), with a fast path for the normal range: round float32's 23 mantissa bits to
  // `mantissa_bits` on the bit pattern, ties to even, as round_to_bf16 does (the hot loop rounds every P this
  // way).
  static float round(float x) {
    constexpr float min_normal = static_cast<float>(1.0 / (1 << (bias - 1)));
    const float magnitude = std::fabs(x);
    if (!(magnitude >= min_normal && magnitude < static_cast<float>(max_finite))) return decode(encode(x));
    constexpr int dropped = 23 - mantissa_bits;
    uint32_t bits = std::bit_cast<uint32_t>(x);
    bits += ((1u << (dropped - 1)) - 1) + ((bits >> dropped) & 1u);
    const float rounded = std::bit_cast<float>(bits & ~((1u << dropped) - 1));
    // Rounding up past the largest finite value saturates, like encode().
    return std::fabs(rounded) <= static_cast<float>(max_finite)
               ? rounded
               : std::copysign(static_cast<float>(max_finite), x);
  }

 private:
  static constexpr uint8_t max_code() {
    return static_cast<uint8_t>(top_finite_exponent << mantissa_bits | top_finite_mantissa);
  }
};

using E4M3 = Fp8Format<4, 3, false>;
using E5M2 = Fp8Format<5, 2, true>;

inline uint8_t encode_e4m3(float x) {
  return E4M3::encode(x);
}
inline float decode_e4m3(uint8_t code) {
  return E4M3::decode(code);
}
inline float round_to_e4m3(float x) {
  return E4M3::round(x);
}
inline uint8_t encode_e5m2(float x) {
  return E5M2::encode(x);
}
inline float decode_e5m2(uint8_t code) {
  return E5M2::decode(code);
}
inline float round_to_e5m2(float x) {
  return E5M2::round(x);
}

// Scaled fp8: a block of values shares one fp32 scale chosen so that its largest magnitude `amax` lands on
// e4m3's largest finite value; the stored value is e4m3(x / descale) and it stands for e4m3(x / descale) *
// descale. An all-zero (or non-finite) amax keeps descale 1, since amax / 448 = 0 would divide by zero.
inline float e4m3_descale(float amax) {
  return amax > 0.0f && std::isfinite(amax) ? amax / static_cast<float>(E4M3::max_finite) : 1.0f;
}

// Rounds to the format that `dtype` takes its inputs and gives its outputs in (identity for f32). An e4m3
// problem's tensors are bf16 (docs/conventions.md §6: FP8 is quantized from bf16 in the kernel's pre-pass,
// output bf16); the fp8 values themselves need a scale, so they are made by the pre-pass, not here.
inline float round_to(DType dtype, float x) {
  switch (dtype) {
    case DType::f16:
      return round_to_fp16(x);
    case DType::bf16:
    case DType::e4m3:
      return round_to_bf16(x);
    default:
      return x;
  }
}

}  // namespace flashlab
