// The random Hadamard transform of incoherent processing: orthogonal, equal to the explicit matrix
// H diag(s) / sqrt(d), and leaving every score q . k unchanged; dimensions that are not powers of two
// refused.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "common/error.hpp"
#include "common/hadamard.hpp"

namespace flashlab {

namespace {

// Row r of M, i.e. e_r M.
std::vector<float> matrix_of(const RandomHadamard& transform) {
  const int64_t d = transform.dim();
  std::vector<float> m(static_cast<size_t>(d * d), 0.0f);
  for (int64_t r = 0; r < d; ++r) {
    m[r * d + r] = 1.0f;
    transform.apply(&m[r * d]);
  }
  return m;
}

// Sylvester's H entry (r, c) = (-1)^popcount(r & c), written without the butterfly.
float sylvester(int64_t r, int64_t c) {
  return (__builtin_popcountll(r & c) % 2) ? -1.0f : 1.0f;
}

}  // namespace

TEST_CASE("the random Hadamard transform is H diag(s) / sqrt(d) and orthogonal") {
  for (int64_t d : {1, 2, 8, 64, 128, 256}) {
    INFO("d = ", d);
    const RandomHadamard transform(d, 42);
    const std::vector<float> m = matrix_of(transform);
    const float entry = 1.0f / std::sqrt(static_cast<float>(d));
    // M = H diag(s) / sqrt(d): column c is H's column c times one sign s_c.
    int negative_signs = 0;
    for (int64_t c = 0; c < d; ++c) {
      const float sign = m[c] / (sylvester(0, c) * entry);
      CHECK(std::fabs(std::fabs(sign) - 1.0f) < 1e-6f);
      negative_signs += sign < 0;
      for (int64_t r = 0; r < d; ++r)
        CHECK(m[r * d + c] == doctest::Approx(sylvester(r, c) * sign * entry).epsilon(1e-6));
    }
    if (d >= 64) {  // the signs are random, not all equal
      CHECK(negative_signs > 0);
      CHECK(negative_signs < d);
    }
    // M M^T = I
    double worst = 0.0;
    for (int64_t a = 0; a < d; ++a)
      for (int64_t b = 0; b < d; ++b) {
        double dot = 0.0;
        for (int64_t c = 0; c < d; ++c) dot += double(m[a * d + c]) * m[b * d + c];
        worst = std::max(worst, std::fabs(dot - (a == b ? 1.0 : 0.0)));
      }
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("apply_transpose undoes apply, and (Q M)(K M)^T equals Q K^T to rounding") {
  for (int64_t d : {16, 64, 128, 256}) {
    INFO("d = ", d);
    const RandomHadamard transform(d, 7);
    Random random(3);
    std::vector<float> x(static_cast<size_t>(d)), y(static_cast<size_t>(d));
    for (int trial = 0; trial < 50; ++trial) {
      for (int64_t c = 0; c < d; ++c) {
        x[c] = static_cast<float>(random.normal());
        y[c] = static_cast<float>(random.normal());
        if (random.uniform() < 0.01) x[c] *= 100.0f;  // an outlier, as in FA3's Table 3 inputs
      }
      std::vector<float> xm = x, ym = y;
      transform.apply(xm.data());
      transform.apply(ym.data());
      double dot = 0.0, dot_transformed = 0.0, norm_x = 0.0, norm_y = 0.0;
      for (int64_t c = 0; c < d; ++c) {
        dot += double(x[c]) * y[c];
        dot_transformed += double(xm[c]) * ym[c];
        norm_x += double(x[c]) * x[c];
        norm_y += double(y[c]) * y[c];
      }
      // float rounding in log2(d) butterfly rounds: relative to |x| |y|, a few units of 2^-24 per round.
      CHECK(std::fabs(dot - dot_transformed) <= 1e-6 * std::log2(double(d)) * std::sqrt(norm_x * norm_y));
      std::vector<float> back = xm;
      transform.apply_transpose(back.data());
      for (int64_t c = 0; c < d; ++c)
        CHECK(back[c] == doctest::Approx(x[c]).epsilon(1e-5).scale(std::sqrt(norm_x)));
    }
  }
}

TEST_CASE("the Hadamard transform spreads an outlier over the whole row") {
  const int64_t d = 128;
  const RandomHadamard transform(d, 1);
  std::vector<float> x(static_cast<size_t>(d), 0.0f);
  x[17] = 100.0f;
  transform.apply(x.data());
  for (float value : x) CHECK(std::fabs(value) == doctest::Approx(100.0 / std::sqrt(128.0)));
}

TEST_CASE("head dims that are not powers of two are refused with the reason") {
  CHECK(RandomHadamard::why_unsupported(128).empty());
  CHECK(RandomHadamard::why_unsupported(80) ==
        "head_dim (80) must be a power of two for the Walsh-Hadamard transform (Sylvester's construction)");
  CHECK_THROWS_WITH_AS(RandomHadamard(59, 1),
                       "head_dim (59) must be a power of two for the Walsh-Hadamard transform (Sylvester's "
                       "construction)",
                       Error);
}

}  // namespace flashlab
