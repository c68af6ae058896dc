// FLOP and byte counts, in one place (SPEC "Measuring").
#pragma once

#include <cstdint>

#include "common/problem.hpp"

namespace flashlab {

// Visible (row, key) pairs of one query head summed over the batch: the masks decide the work.
int64_t visible_pairs(const Problem& problem);

// Forward FLOPs: 4 * heads_q * visible pairs * head_dim (2 for S = QK^T, 2 for O = PV). Causal is about half.
double forward_flops(const Problem& problem);

// Backward FLOPs, counted as 2.5x the forward (FlashAttention's convention).
double backward_flops(const Problem& problem);

// The memory-bound minimum: each input read once and each output written once, at `bytes_per_element`
// for Q, K, V and O (LSE is float32).
double forward_min_bytes(const Problem& problem, double bytes_per_element);

}  // namespace flashlab
