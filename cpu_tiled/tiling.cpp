#include "cpu_tiled/tiling.hpp"

#include <omp.h>
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

int64_t work_items(const Problem& p, const TileShape& shape) {
  return p.batch * p.heads_kv * blocks(p.group_size(), shape.heads_per_item) * blocks(p.seqlen_q, shape.br);
}

TileShape tile_shape(const Problem& p) {
  constexpr int64_t W = micro_width<Vec>(), MR = Blocking<Vec>::mr, f32 = 4;
  const CacheSizes& cache = cache_sizes();
  const int64_t d = p.head_dim;
  TileShape shape;
  // Bc: a micro-column of S^T = P^T (Bc x W floats) as large as L1, a multiple of MR. It stays in L1 (or
  // close, in L2) from the score product through the softmax to the output product; the larger the tile,
  // the fewer times each row's per-tile work (its softmax statistics, the rescale of O~) is paid. Half of
  // L1, the earlier rule, measured slower at d 64 (docs/02-cpu-tiled.md, section 7).
  const int64_t bc = cache.l1d / (f32 * W) / MR * MR;
  shape.bc = std::clamp<int64_t>(bc, MR, 256 / MR * MR);
  // GQA: the query heads that share a K/V tile keep their Q^T and O~^T tiles (2 d Br floats each) in half of
  // L2.
  auto set_heads_per_item = [&] {
    shape.heads_per_item = std::clamp<int64_t>((cache.l2 / 2) / (2 * f32 * d * shape.br), 1, p.group_size());
  };
  // Br: the Q^T and O~^T tiles (2 d Br floats) take at most a quarter of L2, so that they stay there for the
  // whole sweep over K/V, and at most 512 rows. The bigger Br, the fewer times K and V are read (once per Q
  // tile): 512 rows ran 2-4% faster than 256 at 4 x 4096 x 4096, d 128, causal or not (docs/02-cpu-tiled.md).
  // Halved while the problem would give each thread fewer than 8 work items to balance.
  shape.br = std::clamp<int64_t>((cache.l2 / 4) / (2 * f32 * d) / W * W, W, std::max<int64_t>(W, 512));
  set_heads_per_item();
  const int64_t wanted_items = 8 * static_cast<int64_t>(omp_get_max_threads());
  while (shape.br > W && work_items(p, shape) < wanted_items) {
    shape.br = std::max(W, shape.br / 2 / W * W);
    set_heads_per_item();
  }
  return shape;
}

}  // namespace flashlab::cpu_tiled
