#include "cpu_tiled/traffic.hpp"

#include <algorithm>

#include "common/mask.hpp"
#include "cpu_tiled/tile_step.hpp"
#include "cpu_tiled/tiling.hpp"

namespace flashlab::cpu_tiled {

namespace {
constexpr double f32 = 4.0;
}

double fa2_order_bytes(const Problem& p) {
  const TileShape shape = tile_shape(p);
  const Visibility visibility(p);
  double kv_keys = 0;  // keys streamed per kv head and head chunk, over all Q tiles
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t i0 = 0; i0 < p.seqlen_q; i0 += shape.br)
      kv_keys +=
          static_cast<double>(tile_key_span(visibility, b, i0, std::min(shape.br, p.seqlen_q - i0)).size());
  const double head_chunks = static_cast<double>(blocks(p.group_size(), shape.heads_per_item));
  const double kv = 2.0 * kv_keys * static_cast<double>(p.heads_kv * p.head_dim) * head_chunks;
  return f32 * (2.0 * static_cast<double>(p.q_elements()) + kv + static_cast<double>(p.lse_elements()));
}

double fa1_order_bytes(const Problem& p) {
  const TileShape shape = tile_shape(p);
  const Visibility visibility(p);
  double per_pair = 0;  // Q_i, O_i twice, l_i and m_i twice, for every visible tile pair of one query head
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t j0 = 0; j0 < p.rows_k(b); j0 += shape.bc)
      for (int64_t i0 = 0; i0 < p.seqlen_q; i0 += shape.br) {
        const int64_t rows = std::min(shape.br, p.seqlen_q - i0);
        const int64_t j1 = std::min(j0 + shape.bc, p.rows_k(b));
        if (visibility.tile(b, i0, i0 + rows, j0, j1) == TileCover::hidden) continue;
        per_pair += static_cast<double>(rows) * static_cast<double>(3 * p.head_dim + 4);
      }
  return f32 * (2.0 * static_cast<double>(p.kv_elements()) + per_pair * static_cast<double>(p.heads_q) +
                static_cast<double>(p.q_elements() + p.lse_elements()));
}

}  // namespace flashlab::cpu_tiled
