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

// How far a GPU kernel reads a key tile it visits: up to the batch element's last key (cp.async copies stop
// there and zero-fill the rest), or up to the tensor's end (a TMA box reads the padding keys like any other).
enum class TileReads { real_keys, whole_tensor };

// The global traffic of FA2's Q-block-outer order on a GPU (cuda_v2, cuda_v3_hopper): each block of `block_m`
// query rows of one query head reads its Q rows once and every key tile of `block_n` keys that holds a key
// one of its valid rows sees (K and V, as far as `reads` says), and writes its O rows and their LSE. So K and
// V are read once per query block of every query head: the re-reading FA2 trades for keeping O on chip. Q, K,
// V and O at `element_bytes`; LSE float32.
double q_block_outer_bytes(const Problem& problem, int64_t block_m, int64_t block_n, double element_bytes,
                           TileReads reads);

}  // namespace flashlab
