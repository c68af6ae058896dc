// The shared case matrix: every registered implementation is checked on every case it supports.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/inputs.hpp"
#include "common/problem.hpp"

namespace flashlab::testing {

struct Case {
  std::string name;  // what the case is for, e.g. "causal, seqlen_q > seqlen_k"
  Problem problem;
  Distribution distribution = Distribution::normal;
  uint64_t seed = 1;
};

// The full matrix (docs/conventions.md §8): seqlen 1, awkward lengths, seqlen_q != seqlen_k both ways with
// causal, head dims 1 to 256, GQA and MQA, windows, padding (including 0), a tree mask, large scores,
// outliers, fully masked rows.
const std::vector<Case>& case_matrix();

// A tree-attention mask for speculative decoding: `prefix` committed tokens seen by every draft row, then a
// draft tree in which each draft token sees its ancestors and itself. Shape [seqlen_q, prefix + seqlen_q].
std::vector<uint8_t> tree_mask(int64_t seqlen_q, int64_t prefix, uint64_t seed);

}  // namespace flashlab::testing
