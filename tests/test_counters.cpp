// The emulator's counters (emulator/counters.hpp) on small kernels whose counts follow from their source, so
// that each definition is pinned down: bytes, not sectors; cp.async counts its source bytes, not its
// zero-filled rest; TMA counts the elements inside the tensor only; one mma.sync per warp and one wgmma per
// warpgroup, not one per thread. Then what the GPU stages move against their traffic models.
#include <doctest/doctest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "common/cuda/device.hpp"
#include "common/inputs.hpp"
#include "common/problem.hpp"
#include "common/registry.hpp"
#include "common/roofline.hpp"
#include "decoding/cuda_split_kv.hpp"
#include "emulator/counters.hpp"
#include "tests/emulator_kernels.hpp"
#include "tests/harness.hpp"
#include "tests/hopper_kernels.hpp"

namespace flashlab::testing {

namespace {

namespace k = kernels;

template <typename Run>
emulator::Counters counted(Run&& run) {
  emulator::start_counting();
  run();
  return emulator::stop_counting();
}

}  // namespace

TEST_CASE("the emulator counts global bytes, cp.async sources, TMA elements and tensor-core instructions") {
  if (!emulator::counting_complete()) {
    MESSAGE("skipped: this build (the sanitizer's) does not see every global access of emulated kernels");
    return;
  }
  SUBCASE(
      "mma.sync: each lane loads its 4 + 2 + 4 registers and stores 4 floats; one instruction, 4096 FLOPs") {
    const auto c = counted([] {
      k::emulated::mma(false, std::vector<uint32_t>(128, 0), std::vector<uint32_t>(64, 0),
                       std::vector<float>(128, 0.0f));
    });
    CHECK(c.launches == 1);
    CHECK(c.blocks == 1);
    CHECK(c.global_read_bytes == 32 * (4 + 2 + 4) * 4);
    CHECK(c.global_write_bytes == 32 * 4 * 4);
    CHECK(c.mma_sync == 1);
    CHECK(c.tensor_flops == 2.0 * 16 * 8 * 16);
  }
  SUBCASE("cp.async: 16 bytes for a chunk in range, none for a zero-filled one") {
    const std::vector<int> in_range{1, 0, 1, 1, 0, 1, 1, 1};  // 6 of 8 chunks copied
    const auto c = counted([&] { k::emulated::cp_async(std::vector<float>(32, 1.0f), in_range); });
    CHECK(c.global_read_bytes == 6 * 16 + 8 * 4);  // the sources, and the 8 flags the lanes read
    CHECK(c.global_write_bytes == 8 * 4 * 4);      // out: 4 floats a chunk
  }
  SUBCASE("TMA: a 32 x 64 box of which 24 x 32 lies inside the tensor moves 24 x 32 elements each way") {
    std::vector<uint16_t> stored;
    const auto c = counted(
        [&] { k::emulated::tma_box(std::vector<uint16_t>(40 * 80, 0x3f80), 40, 80, 48, 16, stored); });
    CHECK(c.global_read_bytes == 24 * 32 * 2);
    CHECK(c.global_write_bytes == 24 * 32 * 2 + 32 * 64 * 2);  // the store, and the kernel's copy of the box
  }
  SUBCASE("wgmma: four chained m64n128k16 instructions of one warpgroup") {
    const auto c = counted([] {
      k::emulated::wgmma_ss(std::vector<uint16_t>(64 * 64, 0x3f80), std::vector<uint16_t>(128 * 64, 0x3f80),
                            k::HopperMistake::none);
    });
    CHECK(c.wgmma == 4);
    CHECK(c.mma_sync == 0);
    CHECK(c.tensor_flops == 4 * 2.0 * 64 * 128 * 16);
  }
  SUBCASE("nothing is counted while counting is off") {
    k::emulated::mma(false, std::vector<uint32_t>(128, 0), std::vector<uint32_t>(64, 0),
                     std::vector<float>(128, 0.0f));
    const auto c = counted([] {});
    CHECK(c.launches == 0);
    CHECK(c.global_read_bytes == 0);
  }
}

namespace {

// One forward pass of `name` in the emulator: the global bytes it moved, and its traffic model's.
std::pair<double, double> counted_and_modeled(const char* name, const Problem& p) {
  const Implementation* impl = find_implementation(name);
  REQUIRE(impl != nullptr);
  REQUIRE(why_cannot_run(*impl, p).empty());
  const bool forced = cuda::emulation_forced();
  cuda::force_emulation(true);
  const AttentionInputs inputs = random_inputs(p, Distribution::normal, 7);
  emulator::start_counting();
  run_forward(*impl, p, inputs);
  const emulator::Counters counted = emulator::stop_counting();
  cuda::force_emulation(forced);
  return {static_cast<double>(counted.global_read_bytes + counted.global_write_bytes),
          forward_traffic(*impl, p).bytes};
}

Problem shaped(int64_t heads, int64_t kv_heads, int64_t sq, int64_t sk, int64_t d, DType dtype, bool causal,
               int64_t batch = 1) {
  Problem p = problem_shape(batch, heads, kv_heads, sq, sk, d);
  p.dtype = dtype;
  p.causal = causal;
  return p;
}
Problem windowed(Problem p, int64_t left, int64_t right) {
  p.window_left = left;
  p.window_right = right;
  return p;
}

}  // namespace

// The traffic models the stages declare (bytes_moved, what the roofline places them by) are what their
// kernels move: FA1's O, l, m re-read and rewritten per K/V block (cuda_v1), FA2's K and V re-read per query
// block (cuda_v2, cuda_v3_hopper), the decoding kernel's K and V read once per kv head.
TEST_CASE("the GPU stages move the global bytes their traffic models say") {
  if (!emulator::counting_complete()) {
    MESSAGE("skipped: this build (the sanitizer's) does not see every global access of emulated kernels");
    return;
  }
  struct Expected {
    const char* impl;
    Problem problem;
  };
  // Exactly, on shapes without per-batch lengths or an explicit mask (each thread reads those too, and the
  // models leave them out): causal, windows, GQA, batch 2, and a causal problem whose first query block sees
  // no key (seqlen_q 300 > seqlen_k 100: the Hopper kernel loads no Q for it, cuda_v2 does).
  for (const Expected& e : {
           Expected{"cuda_v1/split_k", shaped(4, 2, 300, 333, 64, DType::f32, false)},
           Expected{"cuda_v2/split_q_simt", shaped(2, 2, 256, 200, 64, DType::f32, false, 2)},
           Expected{"cuda_v2/split_q", shaped(2, 2, 256, 256, 128, DType::bf16, false)},
           Expected{"cuda_v2/split_q", shaped(4, 2, 300, 333, 64, DType::f16, true)},
           Expected{"cuda_v2/split_q", windowed(shaped(2, 1, 400, 400, 64, DType::bf16, false, 2), 100, 30)},
           Expected{"cuda_v2/split_q", shaped(2, 2, 300, 100, 64, DType::f16, true)},
           Expected{"cuda_v3_hopper/ws", shaped(2, 2, 256, 256, 128, DType::bf16, false)},
           Expected{"cuda_v3_hopper/ws", shaped(4, 2, 300, 333, 64, DType::f16, true)},
           Expected{"cuda_v3_hopper/ws",
                    windowed(shaped(2, 1, 400, 400, 64, DType::bf16, false, 2), 100, 30)},
           Expected{"cuda_v3_hopper/ws", shaped(2, 2, 300, 100, 64, DType::f16, true)},
       }) {
    const auto [counted, modeled] = counted_and_modeled(e.impl, e.problem);
    INFO(std::string(e.impl), " on ", e.problem.describe(), ": counted ", counted, " bytes, the model ",
         modeled);
    CHECK(counted == modeled);
  }
  // cuda_v1's model is an upper bound where a mask hides tiles (its blocks skip them).
  {
    const auto [counted, modeled] =
        counted_and_modeled("cuda_v1/split_k", shaped(4, 2, 300, 333, 64, DType::f32, true));
    CHECK(counted < modeled);
    CHECK(counted > 0.8 * modeled);
  }
  // Decoding: K and V once per kv head, Q once per split, the partials written and read back, O and LSE; and
  // one thing the model leaves out on purpose: every one of the combine kernel's head_dim threads reads its
  // row's LSE_j (a broadcast, one transaction on a GPU, head_dim requests here).
  {
    const Problem p = shaped(8, 2, 1, 4096, 128, DType::bf16, false);
    const auto [counted, modeled] = counted_and_modeled("decoding/cuda_split_kv", p);
    const double partials = static_cast<double>(decoding::emulated::cuda_split_kv_partial_elements(p));
    const double splits = partials / static_cast<double>(p.lse_elements() * (p.head_dim + 1));
    CHECK(splits > 1);
    CHECK(counted == modeled + 4.0 * static_cast<double>((p.head_dim - 1) * p.lse_elements()) * splits);
  }
}

}  // namespace flashlab::testing
