#include "common/flops.hpp"

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

}  // namespace flashlab
