// Masks, implemented once for every stage: which keys a query row may see.
//
// Three rules combine (docs/conventions.md §3); a key is visible only when all of them allow it:
//  1. the band from causal and the sliding window, aligned bottom-right: with off = sk_b - sq_b, row i sees
//  key j iff
//     i + off - left <= j <= i + off + right (left/right -1 = unbounded; causal is right = 0);
//  2. padding: keys j >= seqlens_k[b] are hidden, rows i >= seqlens_q[b] see nothing;
//  3. the explicit boolean mask [seqlen_q, seqlen_k].
// Rules 1 and 2 give every row one contiguous key range, which is what lets tiled stages skip whole tiles.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/host_device.hpp"
#include "common/problem.hpp"

// Device code (the CUDA stages) calls the band rule below too, so the rule stays in this one place.

namespace flashlab {

struct KeyRange {
  int64_t begin = 0;  // first visible key
  int64_t end = 0;    // one past the last visible key
  FLASHLAB_HOST_DEVICE bool empty() const { return end <= begin; }
  FLASHLAB_HOST_DEVICE int64_t size() const { return empty() ? 0 : end - begin; }
};

// Rules 1 and 2 for row i of a batch element with sq valid query rows and sk valid keys: the one definition
// of the band, shared by Visibility (host) and the GPU kernels (device).
FLASHLAB_HOST_DEVICE inline KeyRange band_key_range(int64_t i, int64_t sq, int64_t sk, bool causal,
                                                    int64_t window_left, int64_t window_right) {
  if (i >= sq) return {0, 0};  // padded query row: fully masked
  const int64_t diagonal = i + sk - sq;
  int64_t right = window_right;
  if (causal) right = 0;  // causal == window (-1, 0); with a window it caps the right side at the diagonal
  KeyRange range{0, sk};
  if (window_left >= 0 && diagonal - window_left > range.begin) range.begin = diagonal - window_left;
  if (right >= 0 && diagonal + right + 1 < range.end) range.end = diagonal + right + 1;
  return range;
}

// Rule 3 alone: the explicit boolean mask [seqlen_q, seqlen_k] (1 = visible); every key when there is none.
// Shared by Visibility (host) and the GPU kernels (device), like the band rule.
FLASHLAB_HOST_DEVICE inline bool explicit_mask_allows(const uint8_t* mask, int64_t seqlen_k, int64_t i,
                                                      int64_t j) {
  return mask == nullptr || mask[i * seqlen_k + j] != 0;
}

// Whether row i sees any key at all under the three rules, `keys` being its band (rules 1 and 2): a question
// only asked of rows whose sum of weights is 0, to tell a fully masked row from one whose scores were all
// -inf.
FLASHLAB_HOST_DEVICE inline bool row_sees_a_key(KeyRange keys, const uint8_t* mask, int64_t seqlen_k,
                                                int64_t i) {
  for (int64_t j = keys.begin; j < keys.end; ++j)
    if (explicit_mask_allows(mask, seqlen_k, i, j)) return true;
  return false;
}

// How a (rows x keys) tile meets the mask: tiled stages skip hidden tiles and mask only partial ones.
enum class TileCover { hidden, partial, full };

class Visibility {
 public:
  explicit Visibility(const Problem& problem) : p_(problem) {}

  // The contiguous range that causal, window and padding leave to row i of batch b (the explicit mask aside).
  KeyRange key_range(int64_t b, int64_t i) const {
    return band_key_range(i, p_.rows_q(b), p_.rows_k(b), p_.causal, p_.window_left, p_.window_right);
  }

  bool has_explicit_mask() const { return p_.mask != nullptr; }

  // The explicit mask alone (true when there is none).
  bool mask_allows(int64_t i, int64_t j) const {
    return explicit_mask_allows(p_.mask ? p_.mask->data() : nullptr, p_.seqlen_k, i, j);
  }

  bool visible(int64_t b, int64_t i, int64_t j) const {
    const KeyRange range = key_range(b, i);
    return j >= range.begin && j < range.end && mask_allows(i, j);
  }

  // Tile of rows [i0, i1) and keys [j0, j1): hidden when no row sees any of its keys, full when every row
  // sees all of them (and there is no explicit mask), else partial. O(rows) work, negligible beside the
  // tile's O(rows*keys*d).
  TileCover tile(int64_t b, int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    bool any = false, all = !has_explicit_mask();
    for (int64_t i = i0; i < i1; ++i) {
      const KeyRange range = key_range(b, i);
      const int64_t lo = std::max(range.begin, j0), hi = std::min(range.end, j1);
      if (hi > lo) any = true;
      if (lo != j0 || hi != j1) all = false;
    }
    if (!any) return TileCover::hidden;
    return all ? TileCover::full : TileCover::partial;
  }

  // Visible keys of a row, all three rules applied.
  int64_t visible_count(int64_t b, int64_t i) const {
    const KeyRange range = key_range(b, i);
    if (!has_explicit_mask()) return range.size();
    int64_t count = 0;
    for (int64_t j = range.begin; j < range.end; ++j) count += mask_allows(i, j);
    return count;
  }

 private:
  const Problem& p_;
};

}  // namespace flashlab
