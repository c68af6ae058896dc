#include "common/paged_kv.hpp"

#include <algorithm>
#include <limits>
#include <memory>
#include <numeric>

#include "common/error.hpp"
#include "common/inputs.hpp"

namespace flashlab {

PagedKV make_paged_kv(const Problem& p, const HostTensor& k, const HostTensor& v, uint64_t seed) {
  p.validate();
  if (p.page_size < 1) fail("page_size (", p.page_size, ") must be >= 1 to store K/V in pages");
  PagedKV paged;
  paged.page_size = p.page_size;
  paged.token_elements = p.heads_kv * p.head_dim;
  std::vector<int64_t> pages_of(static_cast<size_t>(p.batch));
  int64_t total_pages = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    pages_of[b] = (p.rows_k(b) + p.page_size - 1) / p.page_size;
    total_pages += pages_of[b];
  }
  // The pool's physical pages, handed out in a seeded random order (Fisher-Yates).
  std::vector<int64_t> physical(static_cast<size_t>(total_pages));
  std::iota(physical.begin(), physical.end(), 0);
  Random random(seed);
  for (int64_t n = total_pages - 1; n > 0; --n)
    std::swap(physical[n], physical[static_cast<int64_t>(random.next() % static_cast<uint64_t>(n + 1))]);

  const float nan = std::numeric_limits<float>::quiet_NaN();
  paged.k_pages.assign(static_cast<size_t>(total_pages * paged.page_elements()), nan);
  paged.v_pages.assign(paged.k_pages.size(), nan);
  paged.block_table.resize(static_cast<size_t>(p.batch));
  int64_t next = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    auto& table = paged.block_table[b];
    table.assign(physical.begin() + next, physical.begin() + next + pages_of[b]);
    next += pages_of[b];
    for (int64_t j = 0; j < p.rows_k(b); ++j) {
      const int64_t from = p.kv_offset(b, j, 0);
      const int64_t to = paged.token_offset(b, j);
      std::copy_n(k.ptr() + from, paged.token_elements, paged.k_pages.data() + to);
      std::copy_n(v.ptr() + from, paged.token_elements, paged.v_pages.data() + to);
    }
  }
  return paged;
}

void attach_paged_kv(const Problem& problem, AttentionInputs& inputs, uint64_t seed) {
  inputs.paged.reset();
  if (problem.page_size > 0)
    inputs.paged = std::make_shared<const PagedKV>(make_paged_kv(problem, inputs.k, inputs.v, seed));
}

}  // namespace flashlab
