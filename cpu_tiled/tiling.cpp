#include "cpu_tiled/tiling.hpp"

#include <unistd.h>

#include <algorithm>

#include "cpu_tiled/micro_kernel.hpp"

namespace flashlab::cpu_tiled {

const CacheSizes& cache_sizes() {
  static const CacheSizes sizes = [] {
    CacheSizes found;
    const long l1d = sysconf(_SC_LEVEL1_DCACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l1d > 0) found.l1d = l1d;  // 0 or -1: unknown (some containers and virtual machines)
    if (l2 > 0) found.l2 = l2;
    return found;
  }();
  return sizes;
}

TileShape tile_shape(const Problem& p) {
  constexpr int64_t W = micro_width<Vec>(), MR = Blocking<Vec>::mr, f32 = 4;
  const CacheSizes& cache = cache_sizes();
  const int64_t d = p.head_dim;
  TileShape shape;
  // Br: while one micro-column of Q^T (d x W floats) is multiplied by every key of a tile, it should sit in
  // L1 beside the MR key rows being broadcast: 2/3 of L1 for it. Bigger Br also means fewer re-reads of K/V.
  shape.br = std::max<int64_t>(W, (cache.l1d * 2 / 3) / (f32 * d) / W * W);
  // Bc: in O^T += V^T P^T, a micro-column of P^T (Bc x W floats) is read once per MR head dims: half of L1
  // for it. A multiple of MR, and K_j plus V_j (2 Bc d floats) within a quarter of L2.
  int64_t bc = (cache.l1d / 2) / (f32 * W) / MR * MR;
  bc = std::min<int64_t>(bc, (cache.l2 / 4) / (2 * f32 * d) / MR * MR);
  shape.bc = std::clamp<int64_t>(bc, MR, 256);
  // GQA: the query heads that share a K/V tile keep their Q^T and O^T tiles (2 d Br floats each) in half of
  // L2.
  const int64_t per_head = 2 * f32 * d * shape.br;
  shape.heads_per_item = std::clamp<int64_t>((cache.l2 / 2) / per_head, 1, p.group_size());
  return shape;
}

}  // namespace flashlab::cpu_tiled
