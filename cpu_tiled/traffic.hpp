// Memory-traffic models of the two loop orders (Implementation::bytes_moved), in bytes of float32.
#pragma once

#include "common/problem.hpp"

namespace flashlab::cpu_tiled {

// FA2 order: Q read once, K_j and V_j once per Q tile (only the keys some row of that tile sees), O and LSE
// written once.
double fa2_order_bytes(const Problem& problem);

// FA1 order (Algorithm 1): K and V read once; at every visible (Q tile, K/V tile) pair Q_i is read and O_i,
// l_i, m_i are read and written back (lines 9, 13, 14); then O and LSE written once.
double fa1_order_bytes(const Problem& problem);

}  // namespace flashlab::cpu_tiled
