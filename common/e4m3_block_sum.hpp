// How Hopper's tensor cores sum e4m3 products into an fp32 accumulator: the one place the project writes it
// down, for the emulator's e4m3 wgmma (emulator/warpgroup.cpp) and the CPU emulation of the FP8 pass
// (cuda_v3_hopper/fp8_emulated.cpp). The PTX ISA says only that the accumulation is at least single
// precision, its order and rounding unspecified. This is the H100 model of Khattak and Mikaitis ("Accurate
// Models of NVIDIA Tensor Cores", arXiv 2512.07004, fitted bit for bit to an H100 over 10^5 random inputs;
// they give the H200 the same model), written here from its description:
//   1. every product a_i b_i is exact: its exponent is the sum of the inputs' exponents (a subnormal input
//      takes e4m3's smallest normal exponent, -6) and its significand the product of theirs, in [0, 4), not
//      normalized;
//   2. the products of one block (up to 32: one wgmma's K for e4m3) and the accumulator C are aligned to the
//      largest exponent among them, each keeping 13 bits below that exponent's unit; what falls below is
//      cut off, each term toward zero on its own;
//   3. the aligned terms are summed exactly, and the sum is cut to 14 significant bits (13 after the point),
//      toward zero: that is D.
// An fp32 sum would keep 24 bits. Checked against an H200: docs/06-fp8.md, "The LSE question".
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace flashlab {

namespace e4m3_sum {

inline constexpr int kKeptBits = 13;  // bits kept below the leading unit, in the alignment and in the sum

// The exponent of a nonzero float: floor(log2 |x|) for a normal one. e4m3's subnormals (below 2^-6) are
// normal floats; the tensor core gives them e4m3's smallest normal exponent, which the caller's max with -6
// does.
inline int exponent(float x) {
  return static_cast<int>(std::bit_cast<uint32_t>(x) >> 23 & 0xffu) - 127;
}
// 2^n as a double, for n in its normal range (what std::ldexp(1.0, n) gives, without the library call).
inline double power_of_two(int n) {
  return std::bit_cast<double>(static_cast<uint64_t>(n + 1023) << 52);
}

}  // namespace e4m3_sum

// D = sum_i a[i] b[i] + c, the sum of one tensor-core block: a[i] and b[i] are e4m3 values (products of
// codes and signs, nothing else), k <= 32. A NaN operand or C makes D NaN (0 x NaN included, as in IEEE
// arithmetic); an infinite C stays infinite.
//
// Written with the steps folded together: a term t aligned to exponent `top`, its bits below 2^(top - 13)
// cut toward zero, is trunc(t / 2^(top - 13)) units of 2^(top - 13); for C, first cut to 13 bits after its
// own point, the two cuts make one, since its exponent is at most `top`. Each term is then an integer below
// 2^15 and 33 of them sum exactly in a double.
template <typename T>
float e4m3_block_sum(const T* a, const T* b, int k, float c) {
  using e4m3_sum::kKeptBits;
  constexpr int kNone = -1000;  // the exponent of a zero term, which takes no part in the alignment
  double product[32];
  int top = -133;  // the model's floor on the alignment exponent
  int nan = std::isnan(c);
#pragma omp simd reduction(max : top) reduction(| : nan)
  for (int i = 0; i < k; ++i) {
    const float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    product[i] = static_cast<double>(x) * y;  // exact: 4 significant bits times 4
    nan |= std::isnan(product[i]);
    const int e = x == 0.0f || y == 0.0f
                      ? kNone
                      : std::max(e4m3_sum::exponent(x), -6) + std::max(e4m3_sum::exponent(y), -6);
    top = std::max(top, e);
  }
  if (nan) return NAN;
  if (std::isinf(c)) return c;
  if (c != 0.0f) top = std::max(top, std::max(e4m3_sum::exponent(c), -126));  // a subnormal C: -126
  const double to_units = e4m3_sum::power_of_two(kKeptBits - top);
  double sum = std::trunc(c * to_units);
#pragma omp simd reduction(+ : sum)  // exact in any order: integers, their sum below 2^21
  for (int i = 0; i < k; ++i) sum += std::trunc(product[i] * to_units);
  if (sum == 0.0) return 0.0f;
  // Cut to 14 significant bits, toward zero. Below fp32's normal range the last bit kept is 2^-139 (13 places
  // below 2^-126), as in the model; no sum here is finer than that.
  const int leading = static_cast<int>(std::bit_cast<uint64_t>(sum) >> 52 & 0x7ffu) - 1023;  // of units
  const int last_kept = std::max(top - kKeptBits + leading, -126) - kKeptBits;
  const int drop = last_kept - (top - kKeptBits);
  if (drop > 0) sum = std::trunc(sum * e4m3_sum::power_of_two(-drop)) * e4m3_sum::power_of_two(drop);
  const double value = sum * e4m3_sum::power_of_two(top - kKeptBits);
  if (std::fabs(value) >= 0x1p128) return value > 0.0 ? INFINITY : -INFINITY;
  return static_cast<float>(value);  // exact: 14 significant bits, no finer than 2^-139
}

}  // namespace flashlab
