// A paged KV cache, as serving engines keep one (vLLM's PagedAttention): K and V live in fixed-size pages of
// page_size tokens, and a per-batch block table maps a sequence's logical page n (its tokens [n P, (n+1) P))
// to a physical page anywhere in the pool. Decoding stages read K/V through the block table
// (docs/07-decoding.md).
//
// A page holds page_size consecutive tokens of one sequence, each token's K (or V) for every kv head, so a
// page is a little BSHD tensor [page_size, heads_kv, head_dim]: within a page tokens are as in the contiguous
// layout.
#pragma once

#include <cstdint>
#include <vector>

#include "common/problem.hpp"
#include "common/tensor.hpp"

namespace flashlab {

struct PagedKV {
  int64_t page_size = 0;       // P: tokens per page
  int64_t token_elements = 0;  // heads_kv * head_dim: one token's K (or V) for every kv head
  std::vector<float> k_pages;  // [pages, page_size, heads_kv, head_dim]
  std::vector<float> v_pages;  // [pages, page_size, heads_kv, head_dim]
  // block_table[b][n]: the physical page holding tokens [n P, (n+1) P) of batch element b. Only the pages
  // that hold the valid tokens (seqlens_k[b]) exist; slots past the last valid token of a last page hold NaN.
  std::vector<std::vector<int64_t>> block_table;

  int64_t pages() const {
    return page_size == 0 ? 0 : static_cast<int64_t>(k_pages.size()) / page_elements();
  }
  int64_t page_elements() const { return page_size * token_elements; }
  // Where token j of batch element b starts in k_pages and v_pages (kv head 0; the kv heads of a token follow
  // each other, head_dim apart).
  int64_t token_offset(int64_t b, int64_t j) const {
    return block_table[b][j / page_size] * page_elements() + (j % page_size) * token_elements;
  }
  const float* k_token(int64_t b, int64_t j) const { return k_pages.data() + token_offset(b, j); }
  const float* v_token(int64_t b, int64_t j) const { return v_pages.data() + token_offset(b, j); }
};

// Copies the valid tokens of the contiguous K and V into pages of problem.page_size (>= 1) tokens. The
// physical pages are a seeded random permutation, so logical neighbours are rarely physical neighbours and a
// reader that ignores the block table reads the wrong tokens.
PagedKV make_paged_kv(const Problem& problem, const HostTensor& k, const HostTensor& v, uint64_t seed);

// Sets inputs.paged to the paged copy of inputs.k and inputs.v when problem.page_size > 0, else clears it.
// Called wherever inputs are made for a problem (the tool, the harness).
void attach_paged_kv(const Problem& problem, AttentionInputs& inputs, uint64_t seed = 0x9a6e);

}  // namespace flashlab
