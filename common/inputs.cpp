#include "common/inputs.hpp"

#include <cmath>
#include <numbers>

#include "common/error.hpp"
#include "common/number_format.hpp"

namespace flashlab {

std::string_view to_string(Distribution distribution) {
  switch (distribution) {
    case Distribution::normal:
      return "normal";
    case Distribution::large:
      return "large";
    case Distribution::outliers:
      return "outliers";
  }
  return "?";
}

Distribution parse_distribution(std::string_view text) {
  if (text == "normal") return Distribution::normal;
  if (text == "large") return Distribution::large;
  if (text == "outliers") return Distribution::outliers;
  fail("distribution '", text, "' is not one of normal, large, outliers");
}

Random::Random(uint64_t seed) {
  for (uint64_t& word : s_) {  // splitmix64 expands the seed into the state
    seed += 0x9e3779b97f4a7c15ull;
    uint64_t z = seed;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    word = z ^ (z >> 31);
  }
}

uint64_t Random::next() {
  auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Random::uniform() {
  return static_cast<double>(next() >> 11) * 0x1.0p-53;
}

double Random::normal() {
  const double u1 = 1.0 - uniform();  // (0, 1]: log is finite
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

namespace {

void fill(HostTensor& tensor, Distribution distribution, Random& random, DType dtype) {
  for (float& x : tensor.data) {
    double value = random.normal();
    if (distribution == Distribution::large) value *= 100.0;
    if (distribution == Distribution::outliers && random.uniform() < 0.001) value += 10.0 * random.normal();
    x = round_to(dtype, static_cast<float>(value));
  }
}

}  // namespace

AttentionInputs random_inputs(const Problem& p, Distribution distribution, uint64_t seed) {
  p.validate();
  AttentionInputs inputs = empty_inputs(p);
  Random random(seed);
  fill(inputs.q, distribution, random, p.dtype);
  fill(inputs.k, distribution, random, p.dtype);
  // V keeps unit scale in every distribution: only the scores need to be large to test the max subtraction.
  fill(inputs.v, distribution == Distribution::large ? Distribution::normal : distribution, random, p.dtype);
  return inputs;
}

HostTensor random_d_out(const Problem& p, uint64_t seed) {
  p.validate();
  HostTensor d_out(p.q_shape());
  Random random(seed);
  fill(d_out, Distribution::normal, random, p.dtype);
  return d_out;
}

}  // namespace flashlab
