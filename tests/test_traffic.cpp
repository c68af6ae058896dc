// The GPU stages' traffic models (Implementation::bytes_moved, what the roofline places them by) against the
// global bytes their kernels move in the emulator, to the byte. Part of the harness: a course exercise's copy
// of a stage is held to its model too, so a copy that loads tiles no row needs (a block-skip that visits
// every key tile: right numbers, wasted loads) fails here.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/problem.hpp"
#include "common/roofline.hpp"
#include "emulator/counters.hpp"
#include "tests/harness.hpp"

namespace flashlab::testing {

namespace {

// `name` is the implementation's own name, or a course exercise's copy of it ("exercise/ID/" + name).
bool is_copy_of(const Implementation& impl, const std::string& name) {
  return impl.name == name || (impl.name.size() > name.size() &&
                               impl.name.compare(impl.name.size() - name.size(), name.size(), name) == 0 &&
                               impl.name[impl.name.size() - name.size() - 1] == '/');
}

// The problem with its scores soft-capped at `cap`: a variant, which split_q runs in its variants' kernel.
Problem softcapped(Problem p, double cap) {
  p.softcap = cap;
  return p;
}

}  // namespace

// FA1's O, l, m re-read and rewritten per K/V block (cuda_v1), FA2's K and V re-read per query block of the
// tiles it visits (cuda_v2, cuda_v3_hopper). Exactly, on shapes without per-batch lengths or an explicit mask
// (each thread reads those too, and the models leave them out): causal, windows, GQA, batch 2, and a causal
// problem whose first query block sees no key (seqlen_q 300 > seqlen_k 100: the Hopper kernel loads no Q for
// it, cuda_v2 does). Block skipping is held to a key range that ends exactly on a tile boundary inside the
// tensor (causal, square: the last row of split_q's first 128-row block at d 64 sees keys 0-127, one 128-key
// tile or two of split_q_bc64's 64, and another would be one too many) and to one that ends one key past it
// (seqlen_k one longer). A range that ends at seqlen_k cannot show an extra tile: a load past the tensor's
// end reads nothing.
TEST_CASE("the GPU stages move the global bytes their traffic models say") {
  if (!emulator::counting_complete()) {
    MESSAGE("skipped: this build (the sanitizer's) does not see every global access of emulated kernels");
    return;
  }
  struct Expected {
    const char* impl;
    Problem problem;
  };
  const std::vector<Expected> expected{
      Expected{"cuda_v1/split_k", shaped(4, 2, 300, 333, 64, DType::f32, false)},
      Expected{"cuda_v2/split_q_simt", shaped(2, 2, 256, 200, 64, DType::f32, false, 2)},
      Expected{"cuda_v2/split_q_simt", windowed(shaped(2, 1, 200, 300, 64, DType::f32, true), 70, 0)},
      Expected{"cuda_v2/split_q", shaped(2, 2, 256, 256, 128, DType::bf16, false)},
      // At the 128 width: FA2's 4 warps of two row tiles, and beside them the 8 warps of one.
      Expected{"cuda_v2/split_q", shaped(2, 2, 300, 333, 128, DType::f16, true)},
      Expected{"cuda_v2/split_q_8warps", shaped(2, 2, 300, 333, 128, DType::bf16, true)},
      Expected{"cuda_v2/split_q", shaped(4, 2, 300, 333, 64, DType::f16, true)},
      Expected{"cuda_v2/split_q", windowed(shaped(2, 1, 400, 400, 64, DType::bf16, false, 2), 100, 30)},
      Expected{"cuda_v2/split_q", shaped(2, 2, 300, 100, 64, DType::f16, true)},
      Expected{"cuda_v2/split_q", shaped(2, 2, 256, 256, 64, DType::f16, true)},
      Expected{"cuda_v2/split_q", shaped(2, 2, 256, 257, 64, DType::f16, true)},
      // The tensor-core ladder's rungs below split_q visit every key tile up to the batch's last key.
      Expected{"cuda_v2/mma", shaped(2, 2, 130, 200, 64, DType::f16, false)},
      Expected{"cuda_v2/mma", windowed(shaped(2, 1, 200, 300, 128, DType::f16, true), 70, 0)},
      Expected{"cuda_v2/mma_ldmatrix", shaped(2, 2, 256, 256, 128, DType::f16, true)},
      Expected{"cuda_v2/mma_cp_async", windowed(shaped(2, 1, 200, 300, 64, DType::f16, true), 70, 0)},
      Expected{"cuda_v3_hopper/ws", shaped(2, 2, 256, 256, 128, DType::bf16, false)},
      Expected{"cuda_v3_hopper/ws", shaped(4, 2, 300, 333, 64, DType::f16, true)},
      Expected{"cuda_v3_hopper/ws", windowed(shaped(2, 1, 400, 400, 64, DType::bf16, false, 2), 100, 30)},
      Expected{"cuda_v3_hopper/ws", shaped(2, 2, 300, 100, 64, DType::f16, true)},
      // split_q_bc64's 64-key tile at d 64, and split_q's with a variant: under a causal mask their model
      // reads keys in tiles of 64, so a launch of the 128-key kernel in their place would fail here, as would
      // one of the 64-key kernel in split_q's place above.
      Expected{"cuda_v2/split_q_bc64", shaped(2, 2, 300, 333, 64, DType::bf16, true)},
      Expected{"cuda_v2/split_q_bc64", windowed(shaped(2, 1, 400, 400, 64, DType::bf16, false, 2), 100, 30)},
      Expected{"cuda_v2/split_q", softcapped(shaped(2, 2, 300, 333, 64, DType::f16, true), 30)},
      // split_q's tiles in another order read the same bytes.
      Expected{"cuda_v2/split_q_longest_first", shaped(2, 2, 300, 333, 64, DType::bf16, true)},
      // FA3's 192-row tile: its model counts K and V once per 192 rows, so a launch of the 128-row kernel in
      // its place would fail here.
      Expected{"cuda_v3_hopper/ws_m192", shaped(2, 2, 300, 333, 64, DType::bf16, true)},
      Expected{"cuda_v3_hopper/ws_m192",
               windowed(shaped(2, 1, 400, 400, 64, DType::bf16, false, 2), 100, 30)},
      // FA3's Algorithm 1 as written: every key block up to the batch's last key, TMA boxes to the tensor's
      // end.
      Expected{"cuda_v3_hopper/ws_core", shaped(2, 2, 256, 300, 128, DType::bf16, true)},
      Expected{"cuda_v3_hopper/ws_core", windowed(shaped(2, 1, 200, 200, 64, DType::bf16, false, 2), 40, 10)},
  };
  // Run in the emulator whatever FLASHLAB_DEVICE asks for (the `harness` test selects the CPU stages).
  size_t checked = 0;
  for (const Implementation* impl : selected_implementations(/*any_device=*/true))
    for (const Expected& e : expected) {
      if (!is_copy_of(*impl, e.impl) || !why_cannot_run(*impl, e.problem).empty()) continue;
      ++checked;
      const auto counted = static_cast<int64_t>(counted_forward_bytes(*impl, e.problem));
      const auto modeled = static_cast<int64_t>(forward_traffic(*impl, e.problem).bytes);
      const std::string more =
          counted > modeled ? " (more: it loads what no row needs, e.g. key tiles no row sees)" : "";
      INFO(impl->name, " on ", e.problem.describe(), ": moved ", counted,
           " bytes of global memory, its model ", modeled, more);
      CHECK(counted == modeled);
    }
  if (std::getenv("FLASHLAB_IMPL") == nullptr) CHECK(checked == expected.size());  // every stage is built
}

}  // namespace flashlab::testing
