// The naive stage's vector softmax, both ways, on overflow-prone inputs, -inf entries and all -inf rows.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "naive/softmax.hpp"

namespace flashlab::naive {

namespace {
using Softmax = float (*)(std::span<const float>, std::span<float>);
constexpr Softmax kBoth[] = {softmax_three_pass, softmax_online};
}  // namespace

TEST_CASE("vector softmax survives scores of 1e4 (exp would overflow without the max)") {
  const std::vector<float> x = {1e4f, 1e4f - 1.0f, -1e4f, 1e4f};
  for (Softmax softmax : kBoth) {
    std::vector<float> y(x.size());
    const float lse = softmax(x, y);
    const double e1 = std::exp(-1.0), total = 2.0 + e1;
    CHECK(y[0] == doctest::Approx(1.0 / total).epsilon(1e-6));
    CHECK(y[1] == doctest::Approx(e1 / total).epsilon(1e-6));
    CHECK(y[2] == 0.0f);
    CHECK(lse == doctest::Approx(1e4 + std::log(total)).epsilon(1e-7));
    CHECK(std::isfinite(lse));
  }
}

TEST_CASE("vector softmax: -inf entries weigh 0, an all -inf row gives 0 and LSE -inf without NaN") {
  const std::vector<float> x = {-INFINITY, 0.0f, -INFINITY, std::log(3.0f)};
  const std::vector<float> all_masked(5, -INFINITY);
  for (Softmax softmax : kBoth) {
    std::vector<float> y(x.size());
    CHECK(softmax(x, y) == doctest::Approx(std::log(4.0)));
    CHECK(y[0] == 0.0f);
    CHECK(y[1] == doctest::Approx(0.25));
    CHECK(y[3] == doctest::Approx(0.75));
    std::vector<float> z(all_masked.size(), 1.0f);
    CHECK(softmax(all_masked, z) == -INFINITY);
    for (float value : z) CHECK(value == 0.0f);
    std::vector<float> none;
    CHECK(softmax(none, none) == -INFINITY);  // zero keys: the log of an empty sum
  }
}

TEST_CASE("vector softmax: three-pass and online agree on random rows") {
  std::vector<float> x(257);
  uint32_t state = 1;
  for (float& value : x) {
    state = state * 1664525u + 1013904223u;
    value = static_cast<float>(state >> 8) / (1 << 24) * 60.0f - 30.0f;
  }
  std::vector<float> a(x.size()), b(x.size());
  CHECK(softmax_three_pass(x, a) == doctest::Approx(softmax_online(x, b)).epsilon(1e-6));
  for (size_t j = 0; j < x.size(); ++j) CHECK(a[j] == doctest::Approx(b[j]).epsilon(1e-5));
}

}  // namespace flashlab::naive
