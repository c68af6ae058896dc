// The few vector operations the tiled kernels need, in three backends chosen at build time:
//   VecAvx512   16 lanes, __m512 (compiled when __AVX512F__ is defined: -march=native on this machine)
//   VecAvx2      8 lanes, __m256 with FMA (when __AVX2__ and __FMA__ are defined)
//   VecPortable  4 lanes of plain floats (always): loops the compiler may vectorize for any target
// `Vec` is the widest one available. All backends are compiled where the CPU has them, so the tests check
// each.
//
// exp_weight() is SoftmaxState::weight() for a vector of rows: P = exp(s - m), with a masked score (-inf)
// weighing exactly 0. Its exp is a Cephes-style polynomial (docs/02-cpu-tiled.md, "Vectorized exp"):
//   n = round(x log2 e),  r = x - n ln2 (Cody-Waite: ln2 split in two so that n * ln2_hi is exact),
//   exp(r) = 1 + r + r^2 P5(r) on |r| <= ln2/2,  exp(x) = 2^n exp(r).
// Its relative error is below 2 ulp (about 1.2e-7) on [-104, 0], the range the kernels use (x = s - m <= 0);
// the tests measure it against std::exp in double.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace flashlab::cpu_tiled {

namespace exp_constants {
constexpr float log2e = 1.44269504088896341f;
constexpr float ln2_hi = 0.693359375f;  // 9 significant bits: n * ln2_hi is exact for |n| < 2^15
constexpr float ln2_lo = -2.12194440e-4f;
// Below this, exp(x) is under float's smallest denormal (e^-103.3): clamping there also turns -inf into a
// finite argument, so that the range reduction never computes inf - inf.
constexpr float lowest = -104.0f;
// exp(r) - 1 - r = r^2 (c0 + c1 r + ... + c5 r^5) on |r| <= ln2/2 (Cephes expf).
constexpr float c0 = 5.0000001201e-1f, c1 = 1.6666665459e-1f, c2 = 4.1665795894e-2f, c3 = 8.3334519073e-3f,
                c4 = 1.3981999507e-3f, c5 = 1.9875691500e-4f;
}  // namespace exp_constants

#if defined(__AVX512F__)
struct VecAvx512 {
  static constexpr int lanes = 16;
  static constexpr const char* name = "AVX-512";
  __m512 v;

  static VecAvx512 load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static VecAvx512 splat(float x) { return {_mm512_set1_ps(x)}; }
  static VecAvx512 zero() { return {_mm512_setzero_ps()}; }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
  friend VecAvx512 fma(VecAvx512 a, VecAvx512 b, VecAvx512 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
  friend VecAvx512 operator*(VecAvx512 a, VecAvx512 b) { return {_mm512_mul_ps(a.v, b.v)}; }
  friend VecAvx512 operator+(VecAvx512 a, VecAvx512 b) { return {_mm512_add_ps(a.v, b.v)}; }
  // max(a, b) that returns b when b is NaN, so a NaN score reaches the row max (and the row) like the
  // reference.
  friend VecAvx512 max_keep_nan(VecAvx512 a, VecAvx512 b) { return {max(a.v, b.v)}; }

  // GCC 12 reports a false -Wmaybe-uninitialized inside _mm512_max_ps and _mm512_roundscale_ps (their
  // _mm512_undefined_ps() source operand); the masked forms with an all-ones mask are the same instructions.
  static __m512 max(__m512 a, __m512 b) { return _mm512_mask_max_ps(b, __mmask16(0xFFFF), a, b); }
  static __m512 round_nearest(__m512 x) {
    return _mm512_mask_roundscale_ps(x, __mmask16(0xFFFF), x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }

  static VecAvx512 exp_weight(VecAvx512 score, VecAvx512 row_max) {
    using namespace exp_constants;
    const __mmask16 visible = _mm512_cmp_ps_mask(score.v, _mm512_set1_ps(-INFINITY), _CMP_NEQ_UQ);
    __m512 x = _mm512_sub_ps(score.v, row_max.v);
    x = max(_mm512_set1_ps(lowest), x);  // NaN in x is kept (second operand)
    const __m512 n = round_nearest(_mm512_mul_ps(x, _mm512_set1_ps(log2e)));
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(ln2_hi), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(ln2_lo), r);
    __m512 poly = _mm512_fmadd_ps(_mm512_set1_ps(c5), r, _mm512_set1_ps(c4));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(c3));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(c2));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(c1));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(c0));
    poly = _mm512_fmadd_ps(poly, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    // 2^n exp(r); scalef handles the denormal range. Masked scores (-inf) weigh exactly 0, also while the row
    // max is still -inf, where -inf - (-inf) would be NaN (SoftmaxState::weight's guard).
    return {_mm512_maskz_scalef_ps(visible, poly, n)};
  }
};
#endif

#if defined(__AVX2__) && defined(__FMA__)
struct VecAvx2 {
  static constexpr int lanes = 8;
  static constexpr const char* name = "AVX2";
  __m256 v;

  static VecAvx2 load(const float* p) { return {_mm256_loadu_ps(p)}; }
  static VecAvx2 splat(float x) { return {_mm256_set1_ps(x)}; }
  static VecAvx2 zero() { return {_mm256_setzero_ps()}; }
  void store(float* p) const { _mm256_storeu_ps(p, v); }
  friend VecAvx2 fma(VecAvx2 a, VecAvx2 b, VecAvx2 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
  friend VecAvx2 operator*(VecAvx2 a, VecAvx2 b) { return {_mm256_mul_ps(a.v, b.v)}; }
  friend VecAvx2 operator+(VecAvx2 a, VecAvx2 b) { return {_mm256_add_ps(a.v, b.v)}; }
  friend VecAvx2 max_keep_nan(VecAvx2 a, VecAvx2 b) { return {_mm256_max_ps(a.v, b.v)}; }

  static VecAvx2 exp_weight(VecAvx2 score, VecAvx2 row_max) {
    using namespace exp_constants;
    const __m256 visible = _mm256_cmp_ps(score.v, _mm256_set1_ps(-INFINITY), _CMP_NEQ_UQ);
    __m256 x = _mm256_sub_ps(score.v, row_max.v);
    // Without scalef, 2^n is built in the exponent field, which holds n >= -126: clamp at e^-87.3 (1.2e-38),
    // a weight that differs from the true one by less than 1e-37 next to the row's largest weight, 1.
    x = _mm256_max_ps(_mm256_set1_ps(-87.3f), x);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(log2e)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(ln2_hi), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(ln2_lo), r);
    __m256 poly = _mm256_fmadd_ps(_mm256_set1_ps(c5), r, _mm256_set1_ps(c4));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(c3));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(c2));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(c1));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(c0));
    poly = _mm256_fmadd_ps(poly, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i exponent =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 weight = _mm256_mul_ps(poly, _mm256_castsi256_ps(exponent));
    return {_mm256_and_ps(weight, visible)};  // masked scores weigh exactly 0 (see VecAvx512)
  }
};
#endif

struct VecPortable {
  static constexpr int lanes = 4;
  static constexpr const char* name = "portable";
  float v[lanes];

  static VecPortable load(const float* p) { return {{p[0], p[1], p[2], p[3]}}; }
  static VecPortable splat(float x) { return {{x, x, x, x}}; }
  static VecPortable zero() { return splat(0.0f); }
  void store(float* p) const {
    for (int i = 0; i < lanes; ++i) p[i] = v[i];
  }
  friend VecPortable fma(VecPortable a, VecPortable b, VecPortable c) {
    for (int i = 0; i < lanes; ++i) c.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
    return c;
  }
  friend VecPortable operator*(VecPortable a, VecPortable b) {
    for (int i = 0; i < lanes; ++i) a.v[i] *= b.v[i];
    return a;
  }
  friend VecPortable operator+(VecPortable a, VecPortable b) {
    for (int i = 0; i < lanes; ++i) a.v[i] += b.v[i];
    return a;
  }
  friend VecPortable max_keep_nan(VecPortable a, VecPortable b) {
    for (int i = 0; i < lanes; ++i) a.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i];
    return a;
  }
  // The portable backend uses the library's exp: exact to the last bit or so, and the reference for the
  // others.
  static VecPortable exp_weight(VecPortable score, VecPortable row_max) {
    for (int i = 0; i < lanes; ++i)
      score.v[i] = score.v[i] == -INFINITY ? 0.0f : std::exp(score.v[i] - row_max.v[i]);
    return score;
  }
};

// x[c] = exp(x[c] - m) for the n values of a row, a -inf value weighing 0 (V::exp_weight); the last partial
// vector goes through a padded copy, so that every value of the row takes the same arithmetic.
template <class V>
void exp_weights(float* x, int64_t n, float m) {
  constexpr int L = V::lanes;
  const V max = V::splat(m);
  int64_t c = 0;
  for (; c + L <= n; c += L) V::exp_weight(V::load(x + c), max).store(x + c);
  if (c == n) return;
  float tail[L];
  for (int i = 0; i < L; ++i) tail[i] = c + i < n ? x[c + i] : -INFINITY;
  V::exp_weight(V::load(tail), max).store(tail);
  for (int64_t i = 0; c + i < n; ++i) x[c + i] = tail[i];
}

// The largest of x[0..n), NaNs passed over (-inf when there is no other value): max_keep_nan(value, running)
// keeps the running max when the value is NaN.
template <class V>
float largest_value(const float* x, int64_t n) {
  constexpr int L = V::lanes;
  V running = V::splat(-INFINITY);
  int64_t c = 0;
  for (; c + L <= n; c += L) running = max_keep_nan(V::load(x + c), running);
  float lanes[L];
  running.store(lanes);
  float largest = -INFINITY;
  for (const float value : lanes) largest = value > largest ? value : largest;
  for (; c < n; ++c) largest = x[c] > largest ? x[c] : largest;
  return largest;
}

#if defined(__AVX512F__)
using Vec = VecAvx512;
#elif defined(__AVX2__) && defined(__FMA__)
using Vec = VecAvx2;
#else
using Vec = VecPortable;
#endif

}  // namespace flashlab::cpu_tiled
