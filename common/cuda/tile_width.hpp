// The head-dim tile widths a GPU kernel is compiled for, and the rule that picks one (docs/conventions.md
// §2). FlashAttention-2 takes every head dim up to 256 that is a multiple of 8, and real models use 32, 64,
// 80, 96, 128 and 256. A kernel compiled for every such width would be 32 kernels per element type and
// variant, so a head dim runs in the narrowest compiled width that holds it: 80 in 96, 112 in 128, 160 in
// 192. Its extra lanes are zero-filled where they are loaded into shared memory and never written back:
//   Q and K zero past head_dim    S = Q K^T sums the same products, plus zeros
//   V zero past head_dim          the extra columns of O are 0, and the store skips them
// A multiple of 8 keeps every row a whole number of 16-byte chunks (8 elements of 16 bits), the unit of
// cp.async and ldmatrix, so a chunk is either all real lanes or all extra ones.
#pragma once

#include <cstdint>
#include <span>

namespace flashlab::cuda {

// cuda_v2/split_q's widths. decoding/cuda_split_kv is compiled for 64 and 128 only.
inline constexpr int kTileWidths[] = {32, 64, 96, 128, 192, 256};

// The compiled width (of `widths`, ascending) that head_dim runs in, or 0 where none does (not a multiple of
// 8, or wider than the widest).
constexpr int tile_width(int64_t head_dim, std::span<const int> widths = kTileWidths) {
  if (head_dim < 8 || head_dim % 8 != 0) return 0;
  for (int width : widths)
    if (head_dim <= width) return width;
  return 0;
}

}  // namespace flashlab::cuda
