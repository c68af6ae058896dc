// Seeded input generators. The same seed gives the same inputs on every machine (our own generator and normal
// transform, not the standard library's implementation-defined distributions).
#pragma once

#include <cstdint>
#include <string_view>

#include "common/problem.hpp"
#include "common/tensor.hpp"

namespace flashlab {

enum class Distribution {
  normal,    // every entry N(0, 1)
  large,     // N(0, 100^2): scores reach about +-1e4, which overflows exp() without the max subtraction
  outliers,  // N(0, 1) plus N(0, 10^2) added with probability 0.001 (FlashAttention-3's Table 3 inputs)
};

std::string_view to_string(Distribution distribution);
Distribution parse_distribution(std::string_view text);  // throws Error naming "distribution"

// Splitmix64-seeded xoshiro256**: small, fast, and reproducible everywhere.
class Random {
 public:
  explicit Random(uint64_t seed);
  uint64_t next();
  double uniform();  // [0, 1)
  double normal();   // N(0, 1), Box-Muller
 private:
  uint64_t s_[4];
};

// Q, K and V of the problem's shapes, drawn from `distribution`, rounded to the problem's dtype.
AttentionInputs random_inputs(const Problem& problem, Distribution distribution, uint64_t seed);

// An upstream gradient dO = dL/dO for the backward pass: N(0, 1) entries of O's shape, rounded to the dtype.
HostTensor random_d_out(const Problem& problem, uint64_t seed);

}  // namespace flashlab
