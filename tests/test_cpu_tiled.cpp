// cpu_tiled's building blocks against scalar double-precision arithmetic, for every SIMD backend this build
// has (AVX-512, AVX2, portable): the vector exp, the forward's two micro-kernels and the backward's
// tile_product on sizes that are not multiples of any block (the harness covers the assembled kernels).
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/inputs.hpp"
#include "cpu_tiled/micro_kernel.hpp"
#include "cpu_tiled/tile_step.hpp"

namespace flashlab::cpu_tiled {

#if defined(__AVX512F__)
#define FLASHLAB_AVX512_BACKEND VecAvx512,
#else
#define FLASHLAB_AVX512_BACKEND
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define FLASHLAB_AVX2_BACKEND VecAvx2,
#else
#define FLASHLAB_AVX2_BACKEND
#endif
#define FLASHLAB_BACKENDS FLASHLAB_AVX512_BACKEND FLASHLAB_AVX2_BACKEND VecPortable

namespace {

template <class V>
std::vector<float> weights(const std::vector<float>& scores, float row_max) {
  std::vector<float> out(scores.size());
  for (size_t i = 0; i < scores.size(); i += V::lanes)
    V::exp_weight(V::load(&scores[i]), V::splat(row_max)).store(&out[i]);
  return out;
}

std::vector<float> random_floats(int64_t count, uint64_t seed) {
  Random random(seed);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& x : values) x = static_cast<float>(random.normal());
  return values;
}

}  // namespace

TEST_CASE_TEMPLATE("exp_weight: exp(s - m) within 2 ulp on [-104, 0], masked scores weigh exactly 0", V,
                   FLASHLAB_BACKENDS) {
  std::vector<float> scores;
  for (int i = 0; i <= 208000; ++i) scores.push_back(-104.0f + 0.0005f * static_cast<float>(i));
  while (scores.size() % V::lanes != 0) scores.push_back(0.0f);
  const float row_max = 0.0f;
  const std::vector<float> p = weights<V>(scores, row_max);
  double worst = 0.0;
  for (size_t i = 0; i < scores.size(); ++i) {
    const double exact = std::exp(static_cast<double>(scores[i]) - row_max);
    if (exact < 1e-37) {  // near and below the normal range: absolute error only (AVX2 stops at e^-87.3)
      CHECK(std::fabs(p[i] - exact) <= 1e-37);
      continue;
    }
    worst = std::max(worst, std::fabs(p[i] - exact) / exact);
  }
  INFO(std::string(V::name), " worst relative error ", worst);
  CHECK(worst <= 2.4e-7);  // 2 ulp of 1

  // -inf weighs 0 whatever the row max, also -inf (a row with nothing visible yet); NaN stays NaN.
  std::vector<float> special(V::lanes, -INFINITY);
  special[1] = NAN;
  for (float m : {0.0f, 3.5f, -INFINITY}) {
    const std::vector<float> w = weights<V>(special, m);
    CHECK(w[0] == 0.0f);
    CHECK(std::isnan(w[1]));
  }
}

TEST_CASE_TEMPLATE("micro-kernels match scalar sums on odd key counts and head dims", V, FLASHLAB_BACKENDS) {
  constexpr int64_t W = micro_width<V>();
  for (int64_t d : {1, 3, 5, 7, 59, 111, 128}) {
    for (int64_t nk : {1, 5, 7, 13, 97}) {
      const int64_t k_stride = d + 3, ld = W + 8;  // strides that are not the dense ones
      const std::vector<float> qt = random_floats(d * ld, 1), k = random_floats(nk * k_stride, 2),
                               v = random_floats(nk * k_stride, 3), o_init = random_floats(d * ld, 4),
                               pre = random_floats(W, 5), post = random_floats(W, 6);
      const float scale = 0.37f;
      std::vector<float> st(static_cast<size_t>(nk * W), NAN);
      scores_column<V>(qt.data(), ld, k.data(), k_stride, nk, d, scale, st.data());
      std::vector<float> o = o_init;
      output_column<V>(st.data(), v.data(), k_stride, nk, d, pre.data(), post.data(), o.data(), ld);
      double worst_s = 0.0, worst_o = 0.0;
      for (int64_t c = 0; c < nk; ++c)
        for (int64_t r = 0; r < W; ++r) {
          double dot = 0.0, magnitude = 0.0;
          for (int64_t kk = 0; kk < d; ++kk) {
            dot += static_cast<double>(k[c * k_stride + kk]) * qt[kk * ld + r];
            magnitude += std::fabs(static_cast<double>(k[c * k_stride + kk]) * qt[kk * ld + r]);
          }
          worst_s = std::max(worst_s, std::fabs(st[c * W + r] - scale * dot) / (scale * magnitude + 1e-30));
        }
      for (int64_t kk = 0; kk < d; ++kk)
        for (int64_t r = 0; r < W; ++r) {
          double sum = 0.0, magnitude = 0.0;
          for (int64_t c = 0; c < nk; ++c) {
            sum += static_cast<double>(v[c * k_stride + kk]) * st[c * W + r];
            magnitude += std::fabs(static_cast<double>(v[c * k_stride + kk]) * st[c * W + r]);
          }
          const double expected = pre[r] * static_cast<double>(o_init[kk * ld + r]) + post[r] * sum;
          const double scale_o = std::fabs(pre[r] * o_init[kk * ld + r]) + std::fabs(post[r]) * magnitude;
          worst_o = std::max(worst_o, std::fabs(o[kk * ld + r] - expected) / (scale_o + 1e-30));
        }
      // Lanes past the micro-column and rows past d are not written.
      for (int64_t kk = 0; kk < d; ++kk)
        for (int64_t r = W; r < ld; ++r) CHECK(o[kk * ld + r] == o_init[kk * ld + r]);
      INFO(std::string(V::name), " d=", d, " nk=", nk, ": relative error S ", worst_s, ", O ", worst_o);
      // float accumulation: a few ulp per term of the sum, relative to the sum of magnitudes
      CHECK(worst_s <= 1e-6 * static_cast<double>(d));
      CHECK(worst_o <= 1e-6 * static_cast<double>(nk + 1));
    }
  }
}

// The backward's five products (cpu_tiled/backward.cpp) are tile_product with A read as A (a_k = 1) or as A^T
// (a_m = 1), accumulating or not; depths past one depth step (128) and row counts that are not multiples of
// MR.
TEST_CASE_TEMPLATE("tile_product matches scalar sums with A read either way, stored or accumulated", V,
                   FLASHLAB_BACKENDS) {
  constexpr int64_t W = micro_width<V>();
  const int64_t cols = 2 * W, ld_b = cols + 16, ld_c = cols + 32;  // C keeps lanes past cols untouched
  for (const bool transposed : {false, true}) {
    for (const bool accumulate : {false, true}) {
      for (int64_t rows : {1, 5, 13, 64}) {
        for (int64_t depth : {1, 7, 128, 300}) {
          const int64_t stride = (transposed ? rows : depth) + 3;  // A's row stride, not the dense one
          const int64_t a_m = transposed ? 1 : stride, a_k = transposed ? stride : 1;
          const std::vector<float> a = random_floats((transposed ? depth : rows) * stride, 7),
                                   b = random_floats(depth * ld_b, 8),
                                   c_init = random_floats((rows + 2) * ld_c, 9);
          std::vector<float> c = c_init;
          if (accumulate)
            tile_product<V, true>(a.data(), a_m, a_k, rows, b.data(), ld_b, cols, depth, c.data(), ld_c);
          else
            tile_product<V, false>(a.data(), a_m, a_k, rows, b.data(), ld_b, cols, depth, c.data(), ld_c);
          double worst = 0.0;
          for (int64_t m = 0; m < rows; ++m)
            for (int64_t n = 0; n < cols; ++n) {
              double sum = accumulate ? c_init[m * ld_c + n] : 0.0, magnitude = std::fabs(sum);
              for (int64_t k = 0; k < depth; ++k) {
                const double term = static_cast<double>(a[m * a_m + k * a_k]) * b[k * ld_b + n];
                sum += term;
                magnitude += std::fabs(term);
              }
              worst = std::max(worst, std::fabs(c[m * ld_c + n] - sum) / (magnitude + 1e-30));
            }
          INFO(std::string(V::name), transposed ? " A^T" : " A", accumulate ? " += " : " = ", "rows=", rows,
               " depth=", depth, ": relative error ", worst);
          CHECK(worst <= 1e-6 * static_cast<double>(depth + 1));
          bool untouched = true;  // lanes past cols, and the rows past `rows`
          for (int64_t m = 0; m < rows + 2; ++m)
            for (int64_t n = m < rows ? cols : 0; n < ld_c; ++n)
              untouched = untouched && c[m * ld_c + n] == c_init[m * ld_c + n];
          CHECK(untouched);
        }
      }
    }
  }
}

TEST_CASE_TEMPLATE("largest_value passes over NaN and reads the tail past the last vector", V,
                   FLASHLAB_BACKENDS) {
  for (int64_t n : {1, 3, V::lanes, 2 * V::lanes + 3}) {
    std::vector<float> x(static_cast<size_t>(n), 0.25f);
    x[n - 1] = 0.75f;  // in the tail where n is not whole vectors
    CHECK(largest_value<V>(x.data(), n) == 0.75f);
    x[0] = NAN;
    if (n > 1) CHECK(largest_value<V>(x.data(), n) == 0.75f);
    x.back() = NAN;
    if (n > 2) CHECK(largest_value<V>(x.data(), n) == 0.25f);
  }
  const float nothing = NAN;
  CHECK(largest_value<V>(&nothing, 1) == -INFINITY);
}

TEST_CASE("v_tile_stride keeps copied V rows on an odd number of cache lines") {
  for (int64_t d : {1, 16, 59, 64, 111, 128, 256}) {
    const int64_t stride = v_tile_stride(d);
    CHECK(stride >= d);
    CHECK(stride % 16 == 0);
    CHECK((stride / 16) % 2 == 1);
  }
}

}  // namespace flashlab::cpu_tiled
