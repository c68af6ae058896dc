// Tile sizes from the cache sizes (docs/02-cpu-tiled.md, "Choosing Br and Bc").
#pragma once

#include <cstdint>

#include "common/problem.hpp"

namespace flashlab::cpu_tiled {

struct CacheSizes {
  int64_t l1d = 48 << 10;  // per core; the defaults are this project's CI machine (Xeon, Sapphire Rapids)
  int64_t l2 = 2 << 20;
};

// Read once from the operating system; the defaults above where it does not say.
const CacheSizes& cache_sizes();

struct TileShape {
  int64_t br = 0;              // query rows per Q tile (a multiple of the micro-kernel's width)
  int64_t bc = 0;              // keys per K/V tile
  int64_t heads_per_item = 1;  // query heads of one GQA group that share each K/V tile while it is hot
};

TileShape tile_shape(const Problem& problem);

// forward's work items: (batch, kv head, chunk of heads_per_item query heads of the group, Q tile).
int64_t work_items(const Problem& problem, const TileShape& shape);

// Ceiling division.
constexpr int64_t blocks(int64_t n, int64_t block) {
  return (n + block - 1) / block;
}

}  // namespace flashlab::cpu_tiled
