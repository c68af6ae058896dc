// The fp8 formats, exhaustively: every one of the 256 codes of e4m3 and e5m2 decodes to the value the OCP FP8
// spec gives it and re-encodes to itself; encoding rounds to the nearest code with ties to the even code
// (checked against a brute-force search over all codes), saturates, and keeps NaN. And how Hopper's tensor
// cores sum e4m3 products (common/e4m3_block_sum.hpp), case by case from the model's three steps.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/e4m3_block_sum.hpp"
#include "common/inputs.hpp"
#include "common/number_format.hpp"

namespace flashlab {

namespace {

// The value of a code computed from the spec's formula, independently of Fp8Format::decode:
// (-1)^s * 2^(e - bias) * (1 + m / 2^M) for e > 0, (-1)^s * 2^(1 - bias) * (m / 2^M) for e == 0.
template <int E, int M>
double spec_value(int code) {
  const int bias = (1 << (E - 1)) - 1;
  const int e = (code >> M) & ((1 << E) - 1), m = code & ((1 << M) - 1);
  const double magnitude = e == 0 ? std::ldexp(m, 1 - bias - M) : std::ldexp((1 << M) + m, e - bias - M);
  return (code & 0x80) ? -magnitude : magnitude;
}

bool is_nan_code_e4m3(int code) {
  return (code & 0x7f) == 0x7f;
}
bool is_nan_code_e5m2(int code) {
  return (code & 0x7f) > 0x7c;
}
bool is_inf_code_e5m2(int code) {
  return (code & 0x7f) == 0x7c;
}

// The code nearest to x among the finite codes (ties to the even code, i.e. the one with mantissa lsb 0),
// saturating beyond the largest: the rounding rule written as a search, to check encode() against.
template <typename Format>
uint8_t brute_force_encode(float x, const std::vector<int>& finite_codes) {
  const double target = std::fabs(static_cast<double>(x));
  int best = -1;
  double best_distance = INFINITY;
  for (int code : finite_codes) {
    if (code & 0x80) continue;  // magnitudes only
    const double distance =
        std::fabs(static_cast<double>(Format::decode(static_cast<uint8_t>(code))) - target);
    if (distance < best_distance || (distance == best_distance && (code & 1) == 0)) {
      best = code;
      best_distance = distance;
    }
  }
  return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}

template <typename Format, typename IsSpecial>
std::vector<int> finite_codes(IsSpecial is_special) {
  std::vector<int> codes;
  for (int code = 0; code < 256; ++code)
    if (!is_special(code)) codes.push_back(code);
  return codes;
}

// Every finite positive code in increasing order of value (codes increase with value for a sign-magnitude
// format).
template <typename Format>
std::vector<float> positive_values(const std::vector<int>& codes) {
  std::vector<float> values;
  for (int code : codes)
    if (!(code & 0x80)) values.push_back(Format::decode(static_cast<uint8_t>(code)));
  return values;
}

template <typename Format>
void check_rounding_against_search(const std::vector<int>& codes) {
  const std::vector<float> values = positive_values<Format>(codes);
  // Every midpoint between neighbours (a tie: must go to the even code), and points just either side of it.
  for (size_t n = 0; n + 1 < values.size(); ++n) {
    const float low = values[n], high = values[n + 1];
    const float middle = static_cast<float>((static_cast<double>(low) + high) / 2);  // exact: few bits
    for (float x : {middle, std::nextafter(middle, 0.0f), std::nextafter(middle, INFINITY), low, high})
      for (float sign : {1.0f, -1.0f}) {
        INFO("x = ", sign * x);
        CHECK(Format::encode(sign * x) == brute_force_encode<Format>(sign * x, codes));
        CHECK(Format::round(sign * x) == Format::decode(Format::encode(sign * x)));  // the fast path agrees
      }
    // The tie itself: the result is the neighbour whose code is even.
    const uint8_t expected = (Format::encode(low) & 1) == 0 ? Format::encode(low) : Format::encode(high);
    CHECK(Format::encode(middle) == expected);
  }
  // Random values over the whole range, including the subnormal range and beyond the largest (saturation).
  Random random(77);
  for (int n = 0; n < 20000; ++n) {
    const float x =
        static_cast<float>(random.normal() * std::ldexp(1.0, static_cast<int>(random.next() % 40) - 20));
    INFO("x = ", x);
    CHECK(Format::encode(x) == brute_force_encode<Format>(x, codes));
    CHECK(Format::round(x) == Format::decode(Format::encode(x)));
  }
}

}  // namespace

TEST_CASE("e4m3: all 256 codes decode per the spec and re-encode to themselves") {
  int nan_codes = 0;
  for (int code = 0; code < 256; ++code) {
    const float value = decode_e4m3(static_cast<uint8_t>(code));
    INFO("code 0x", std::hex, code);
    if (is_nan_code_e4m3(code)) {
      ++nan_codes;
      CHECK(std::isnan(value));
      CHECK(std::isnan(decode_e4m3(encode_e4m3(value))));
      continue;
    }
    CHECK(std::isfinite(value));  // e4m3 has no infinity
    CHECK(static_cast<double>(value) == spec_value<4, 3>(code));
    CHECK(encode_e4m3(value) == code);  // -0 (0x80) included: the sign survives
  }
  CHECK(nan_codes == 2);  // 0x7f and 0xff
  CHECK(decode_e4m3(0x7e) == 448.0f);
  CHECK(decode_e4m3(0x38) == 1.0f);
  CHECK(decode_e4m3(0x08) == std::ldexp(1.0f, -6));      // smallest normal
  CHECK(decode_e4m3(0x01) == std::ldexp(1.0f, -9));      // smallest subnormal
  CHECK(decode_e4m3(0x07) == 7 * std::ldexp(1.0f, -9));  // largest subnormal
  CHECK(E4M3::max_finite == 448.0);
}

TEST_CASE("e5m2: all 256 codes decode per the spec and re-encode to themselves") {
  int nan_codes = 0, inf_codes = 0;
  for (int code = 0; code < 256; ++code) {
    const float value = decode_e5m2(static_cast<uint8_t>(code));
    INFO("code 0x", std::hex, code);
    if (is_nan_code_e5m2(code)) {
      ++nan_codes;
      CHECK(std::isnan(value));
      CHECK(std::isnan(decode_e5m2(encode_e5m2(value))));
      continue;
    }
    if (is_inf_code_e5m2(code)) {
      ++inf_codes;
      CHECK(std::isinf(value));
      CHECK((value < 0) == ((code & 0x80) != 0));
      // Encoding saturates: infinity becomes the largest finite value, keeping its sign.
      CHECK(encode_e5m2(value) == ((code & 0x80) | 0x7b));
      continue;
    }
    CHECK(std::isfinite(value));
    CHECK(static_cast<double>(value) == spec_value<5, 2>(code));
    CHECK(encode_e5m2(value) == code);
  }
  CHECK(nan_codes == 6);
  CHECK(inf_codes == 2);
  CHECK(decode_e5m2(0x7b) == 57344.0f);
  CHECK(decode_e5m2(0x3c) == 1.0f);
  CHECK(decode_e5m2(0x04) == std::ldexp(1.0f, -14));  // smallest normal
  CHECK(decode_e5m2(0x01) == std::ldexp(1.0f, -16));  // smallest subnormal
  CHECK(E5M2::max_finite == 57344.0);
}

TEST_CASE("e4m3 and e5m2 round to nearest, ties to even, over every neighbour pair and random values") {
  SUBCASE("e4m3") {
    check_rounding_against_search<E4M3>(finite_codes<E4M3>(is_nan_code_e4m3));
  }
  SUBCASE("e5m2") {
    check_rounding_against_search<E5M2>(
        finite_codes<E5M2>([](int code) { return is_nan_code_e5m2(code) || is_inf_code_e5m2(code); }));
  }
}

TEST_CASE("fp8 ties, subnormals, saturation and NaN, spelled out") {
  // Ties: 1.0625 is halfway between 1.0 (mantissa 000) and 1.125 (001): to the even 1.0. 1.1875 is halfway
  // between 1.125 (001) and 1.25 (010): up to 1.25.
  CHECK(round_to_e4m3(1.0625f) == 1.0f);
  CHECK(round_to_e4m3(1.1875f) == 1.25f);
  CHECK(round_to_e4m3(std::nextafter(1.0625f, 2.0f)) == 1.125f);
  CHECK(round_to_e5m2(1.125f) == 1.0f);  // halfway between 1.0 and 1.25 (e5m2 has 2 mantissa bits)
  CHECK(round_to_e5m2(1.375f) == 1.5f);
  // Subnormals: e4m3 steps by 2^-9 below 2^-6; half the smallest subnormal is a tie that goes to (even) zero.
  const float tiny = std::ldexp(1.0f, -9);
  CHECK(round_to_e4m3(tiny) == tiny);
  CHECK(round_to_e4m3(0.5f * tiny) == 0.0f);
  CHECK(round_to_e4m3(0.75f * tiny) == tiny);
  CHECK(round_to_e4m3(1.5f * tiny) == 2 * tiny);  // tie between codes 0x01 and 0x02: to the even 0x02
  CHECK(round_to_e4m3(2.5f * tiny) == 2 * tiny);  // tie between 0x02 and 0x03: to 0x02
  CHECK(encode_e4m3(7.5f * tiny) == 0x08);        // rounds up out of the subnormals into the smallest normal
  CHECK(std::signbit(round_to_e4m3(-0.25f * tiny)));  // underflow keeps the sign: -0
  CHECK(round_to_e5m2(std::ldexp(1.0f, -17)) == 0.0f);
  CHECK(round_to_e5m2(std::ldexp(3.0f, -17)) == std::ldexp(1.0f, -15));
  // Saturation: everything beyond the largest finite value, infinity too, becomes it (cvt.rn.satfinite).
  CHECK(round_to_e4m3(449.0f) == 448.0f);
  CHECK(round_to_e4m3(464.0f) == 448.0f);  // the tie with the would-be next value 480 also saturates
  CHECK(round_to_e4m3(1e30f) == 448.0f);
  CHECK(round_to_e4m3(INFINITY) == 448.0f);
  CHECK(round_to_e4m3(-INFINITY) == -448.0f);
  CHECK(round_to_e5m2(60000.0f) == 57344.0f);
  CHECK(round_to_e5m2(-INFINITY) == -57344.0f);
  // NaN stays NaN, with its code.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(encode_e4m3(nan) == 0x7f);
  CHECK(std::isnan(round_to_e4m3(nan)));
  CHECK(std::isnan(round_to_e5m2(nan)));
}

TEST_CASE("fp16 rounding agrees with the compiler's _Float16 conversion everywhere") {
  Random random(5);
  for (int n = 0; n < 200000; ++n) {
    const float x =
        static_cast<float>(random.normal() * std::ldexp(1.0, static_cast<int>(random.next() % 60) - 30));
    INFO("x = ", x);
    CHECK(round_to_fp16(x) == static_cast<float>(static_cast<_Float16>(x)));
  }
  for (float x : {65504.0f, 65519.0f, 65520.0f, 0x1p-14f, 0x1p-25f, 0x3p-26f, -0x1p-24f})
    CHECK(round_to_fp16(x) == static_cast<float>(static_cast<_Float16>(x)));
}

TEST_CASE("an e4m3 problem's tensors are bf16: round_to(e4m3) rounds to bf16") {
  CHECK(round_to(DType::e4m3, 1.00390625f) == round_to_bf16(1.00390625f));
  CHECK(round_to(DType::e4m3, 0.1f) == round_to_bf16(0.1f));
}

// Each expected value below follows from the model's three steps by hand (common/e4m3_block_sum.hpp); most
// cases are ones an fp32 sum gets otherwise. Exponents of products are the sums of the inputs' exponents.
float block_sum(std::vector<float> a, std::vector<float> b, float c = 0.0f) {
  return e4m3_block_sum(a.data(), b.data(), static_cast<int>(a.size()), c);
}

TEST_CASE("e4m3 tensor-core sums: 13 bits kept below the largest term, the sum cut to 14, toward zero") {
  // Exact where every term fits the window: eighths times eighths, 32 of them.
  std::vector<float> a(32), b(32);
  double exact = 0.0;
  for (int i = 0; i < 32; ++i) {
    a[i] = static_cast<float>(i - 16) / 8.0f, b[i] = static_cast<float>(i % 7) / 4.0f;
    exact += double(a[i]) * b[i];
  }
  CHECK(block_sum(a, b) == exact);

  // Alignment: the largest term, 1 (exponent 0), keeps the bits down to 2^-13. 2^-6 x 2^-7 = 2^-13 stays,
  // 2^-7 x 2^-7 = 2^-14 is cut off.
  CHECK(block_sum({1.0f, 0x1p-6f}, {1.0f, 0x1p-7f}) == 1.0f + 0x1p-13f);
  CHECK(block_sum({1.0f, 0x1p-7f}, {1.0f, 0x1p-7f}) == 1.0f);
  // Each term is cut toward zero on its own: -2^-14 is cut to 0, not to -2^-13.
  CHECK(block_sum({1.0f, -0x1p-7f}, {1.0f, 0x1p-7f}) == 1.0f);
  CHECK(block_sum({-1.0f, -0x1p-7f}, {1.0f, 0x1p-7f}) == -1.0f);
  // A product's significand is not normalized: 1.875 x 1.875 = 3.515625 keeps exponent 0, so the window
  // still reaches 2^-13, and two such terms add 2^-12, which the 14-bit sum (exponent 1) keeps.
  CHECK(block_sum({1.875f, 0x1p-6f, 0x1p-6f}, {1.875f, 0x1p-7f, 0x1p-7f}) == 3.515625f + 0x1p-12f);
  // ... but one 2^-13 alone is below the sum's last bit at exponent 1, and is cut.
  CHECK(block_sum({1.875f, 0x1p-6f}, {1.875f, 0x1p-7f}) == 3.515625f);
  // A subnormal input (2^-9, e4m3's smallest) takes exponent -6: 2^-9 x 256 = 0.5 aligns the block at
  // exponent -6 + 8 = 2, whose window ends at 2^-11, so 2^-7 x 2^-7 = 2^-14 is cut (at the input's own
  // exponent, -9, the window would reach 2^-14).
  CHECK(block_sum({0x1p-9f, 0x1p-7f}, {256.0f, 0x1p-7f}) == 0.5f);

  // The accumulator C is a term like the products: aligned with them, and it keeps only 13 bits after its
  // own point.
  CHECK(block_sum({}, {}, 1.0f + 0x1p-20f) == 1.0f);
  CHECK(block_sum({0.25f}, {0.25f}, 1024.0f) == 1024.0f);  // 2^-4 below 1024's window (down to 2^-3)
  CHECK(block_sum({0.25f}, {0.5f}, 1024.0f) == 1024.125f);
  // The sum is cut to 14 significant bits: 1 + (1 + 2^-13) = 2 + 2^-13, whose last kept bit is 2^-12.
  CHECK(block_sum({1.0f}, {1.0f}, 1.0f + 0x1p-13f) == 2.0f);
  CHECK(block_sum({}, {}, std::numeric_limits<float>::max()) == 0x1.fff8p127f);
  CHECK(block_sum({448.0f}, {448.0f}, std::numeric_limits<float>::max()) == 0x1.fff8p127f);

  // Zeros take no part; an empty block is 0.
  CHECK(block_sum({0.0f, 3.0f}, {5.0f, 0.0f}) == 0.0f);
  CHECK(block_sum({1.0f, -1.0f}, {1.0f, 1.0f}) == 0.0f);
}

TEST_CASE("e4m3 tensor-core sums: NaN and infinity") {
  CHECK(std::isnan(block_sum({NAN, 1.0f}, {0.0f, 1.0f})));  // 0 x NaN is NaN
  CHECK(std::isnan(block_sum({1.0f}, {1.0f}, NAN)));
  CHECK(block_sum({1.0f}, {-1.0f}, INFINITY) == INFINITY);
  CHECK(block_sum({1.0f}, {1.0f}, -INFINITY) == -INFINITY);
}

}  // namespace flashlab
