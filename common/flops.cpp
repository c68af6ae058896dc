#include "common/flops.hpp"

#include <algorithm>

#include "common/mask.hpp"

namespace flashlab {

int64_t visible_pairs(const Problem& p) {
  const Visibility visibility(p);
  int64_t pairs = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t i = 0; i < p.seqlen_q; ++i) pairs += visibility.visible_count(b, i);
  return pairs;
}

double forward_flops(const Problem& p) {
  return 4.0 * static_cast<double>(p.heads_q) * static_cast<double>(visible_pairs(p)) *
         static_cast<double>(p.head_dim);
}

double backward_flops(const Problem& p) {
  return 2.5 * forward_flops(p);
}

double forward_min_bytes(const Problem& p, double bytes_per_element) {
  const double elements =
      2.0 * static_cast<double>(p.q_elements()) + 2.0 * static_cast<double>(p.kv_elements());
  return elements * bytes_per_element + 4.0 * static_cast<double>(p.lse_elements());
}

double backward_min_bytes(const Problem& p, double bytes_per_element) {
  const double elements =
      4.0 * static_cast<double>(p.q_elements()) + 4.0 * static_cast<double>(p.kv_elements());
  return elements * bytes_per_element + 4.0 * static_cast<double>(p.lse_elements());
}

double q_block_outer_bytes(const Problem& p, int64_t block_m, int64_t block_n, double element_bytes,
                           TileLoads loads, KeyTiles tiles) {
  const Visibility visibility(p);
  double keys = 0;    // keys of K (and of V) read by the query blocks of one query head, over the batch
  double q_rows = 0;  // query rows they load
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t limit = loads == TileLoads::cp_async ? p.rows_k(b) : p.seqlen_k;
    for (int64_t i0 = 0; i0 < p.seqlen_q; i0 += block_m) {
      int64_t begin = p.seqlen_k, end = 0;  // the union of the valid rows' visible keys
      for (int64_t i = i0; i < std::min(i0 + block_m, p.rows_q(b)); ++i) {
        const KeyRange range = visibility.key_range(b, i);
        if (!range.empty()) begin = std::min(begin, range.begin), end = std::max(end, range.end);
      }
      if (tiles == KeyTiles::all) begin = 0, end = p.rows_k(b);  // every tile, whatever the rows see
      if (begin < end || loads == TileLoads::cp_async)
        q_rows += static_cast<double>(std::max<int64_t>(0, std::min(block_m, p.stored_rows_q(b) - i0)));
      for (int64_t tile = begin / block_n; begin < end && tile < (end + block_n - 1) / block_n; ++tile)
        keys +=
            static_cast<double>(std::max<int64_t>(0, std::min((tile + 1) * block_n, limit) - tile * block_n));
    }
  }
  const double per_row = static_cast<double>(p.heads_q * p.head_dim);
  return element_bytes * ((q_rows + 2.0 * keys) * per_row + static_cast<double>(p.q_elements())) +
         4.0 * static_cast<double>(p.lse_elements());
}

}  // namespace flashlab
