// The naive pieces other files reuse: naive/backward takes its forward and its memory check from here.
#pragma once

#include <string>

#include "common/problem.hpp"
#include "common/tensor.hpp"

namespace flashlab::naive {

// naive/one_pass: one pass over the keys per query row with the running max, sum and output (SoftmaxState).
void one_pass_attention(const Problem& p, const AttentionInputs& in, AttentionOutputs& out);

// "" when `matrices` seqlen_q x seqlen_k float matrices per thread fit in half this machine's memory, else
// why not: the materialized stages refuse larger problems through supports().
std::string fits_in_memory(const Problem& p, int matrices);

}  // namespace flashlab::naive
