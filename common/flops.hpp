// FLOP and byte counts, in one place (docs/conventions.md §10).
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

// The backward's memory-bound minimum: Q, K, V, O, dO and LSE read once, dQ, dK and dV written once.
double backward_min_bytes(const Problem& problem, double bytes_per_element);

// How a GPU kernel loads its tiles. cp.async (cuda_v2, and the plain 16-byte loads of its first rung): every
// block loads its Q rows, and a key tile up to the batch element's last key (the rest is zero-filled without
// a read). TMA (cuda_v3_hopper): a block that visits no key tile loads no Q, and a key tile's box reads to
// the tensor's end (padding keys included).
enum class TileLoads { cp_async, tma };

// Which key tiles a query block visits: only those that hold a key one of its valid rows sees (FA2's block
// skipping: causal, window and padding), or every tile up to the batch element's last key (the ladder's rungs
// before block skipping, which mask the hidden keys element by element).
enum class KeyTiles { visible, all };

// The tensor traffic of FA2's Q-block-outer order on a GPU (cuda_v2, cuda_v3_hopper): each block of `block_m`
// query rows of one query head reads its Q rows and every key tile of `block_n` keys that holds a key one of
// its valid rows sees (K and V), as `loads` says, and writes its O rows and their LSE. So K and V are read
// once per query block of every query head: the re-reading FA2 trades for keeping O on chip. Q, K, V and O at
// `element_bytes`; LSE float32. Left out: each thread's reads of the per-batch lengths and of an explicit
// mask (tests/test_counters.cpp states them).
double q_block_outer_bytes(const Problem& problem, int64_t block_m, int64_t block_n, double element_bytes,
                           TileLoads loads, KeyTiles tiles = KeyTiles::visible);

}  // namespace flashlab
