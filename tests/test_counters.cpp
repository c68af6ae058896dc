// The emulator's counters (emulator/counters.hpp) on small kernels whose counts follow from their source, so
// that each definition is pinned down: bytes, not sectors; cp.async counts its source bytes, not its
// zero-filled rest; TMA counts the elements inside the tensor only; one mma.sync per warp and one wgmma per
// warpgroup, not one per thread. Then what the GPU stages move against their traffic models.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/cuda/device.hpp"
#include "common/inputs.hpp"
#include "common/problem.hpp"
#include "common/registry.hpp"
#include "common/roofline.hpp"
#include "cuda_v2/backward.hpp"
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

// The lanes of a warp accessing `bytes` each at offset(lane) (the lanes in `active` only).
template <typename Offset>
std::vector<emulator::LaneAccess> warp_access(uint32_t bytes, Offset offset, unsigned active = ~0u) {
  std::vector<emulator::LaneAccess> lanes;
  for (int lane = 0; lane < 32; ++lane)
    if ((active >> lane & 1u) != 0) lanes.push_back({lane, static_cast<uint64_t>(offset(lane)), bytes});
  return lanes;
}
std::string units_of(const emulator::AccessCounts& c) {
  return std::to_string(c.instructions) + " instructions, " + std::to_string(c.units) + " of ideal " +
         std::to_string(c.ideal);
}
std::string units_of(uint64_t instructions, uint64_t units, uint64_t ideal) {
  return units_of(emulator::AccessCounts{instructions, units, ideal});
}

}  // namespace

// The definitions of emulator/counters.hpp on access patterns whose answers follow from the definitions of
// NVIDIA's profiler (32-byte sectors; 32 banks of 4 bytes; 8- and 16-byte accesses in half- and quarter-warp
// phases).
TEST_CASE("sectors and wavefronts of planted warp accesses") {
  using emulator::sectors;
  using emulator::wavefronts;
  SUBCASE("global: coalesced, misaligned, strided, broadcast, 16-byte, half the lanes") {
    CHECK(units_of(sectors(warp_access(4, [](int l) { return 4 * l; }))) == units_of(1, 4, 4));
    CHECK(units_of(sectors(warp_access(4, [](int l) { return 4 + 4 * l; }))) == units_of(1, 5, 4));
    CHECK(units_of(sectors(warp_access(4, [](int l) { return 128 * l; }))) == units_of(1, 32, 4));
    CHECK(units_of(sectors(warp_access(4, [](int) { return 64; }))) == units_of(1, 1, 1));
    CHECK(units_of(sectors(warp_access(16, [](int l) { return 16 * l; }))) == units_of(1, 16, 16));
    CHECK(units_of(sectors(warp_access(
              4, [](int l) { return 4 * l; }, 0x0000ffffu))) == units_of(1, 2, 2));
    CHECK(units_of(sectors(warp_access(2, [](int l) { return 64 * l; }))) == units_of(1, 32, 2));
  }
  SUBCASE("shared: conflict-free, broadcast, 2-way, 32-way") {
    CHECK(units_of(wavefronts(warp_access(4, [](int l) { return 4 * l; }))) == units_of(1, 1, 1));
    CHECK(units_of(wavefronts(warp_access(4, [](int) { return 256; }))) == units_of(1, 1, 1));
    CHECK(units_of(wavefronts(warp_access(4, [](int l) { return 4 * (l % 16); }))) == units_of(1, 1, 1));
    CHECK(units_of(wavefronts(warp_access(4, [](int l) { return 8 * l; }))) == units_of(1, 2, 1));
    CHECK(units_of(wavefronts(warp_access(4, [](int l) { return 128 * l; }))) == units_of(1, 32, 1));
    CHECK(units_of(wavefronts(warp_access(2, [](int l) { return 2 * l; }))) == units_of(1, 1, 1));
  }
  SUBCASE("shared, 8 and 16 bytes a lane: half- and quarter-warp phases") {
    CHECK(units_of(wavefronts(warp_access(8, [](int l) { return 8 * l; }))) == units_of(1, 2, 2));
    CHECK(units_of(wavefronts(warp_access(8, [](int l) { return 16 * l; }))) == units_of(1, 4, 2));
    CHECK(units_of(wavefronts(warp_access(16, [](int l) { return 16 * l; }))) == units_of(1, 4, 4));
    // The first 16-byte chunk of rows 0-31 of a 256-byte-wide tile: unswizzled, each quarter-warp's 8 rows
    // start in the same 4 banks (8-way); swizzled (chunk c of row r at c ^ r % 8), in 8 different chunks.
    CHECK(units_of(wavefronts(warp_access(16, [](int l) { return 256 * l; }))) == units_of(1, 32, 4));
    CHECK(units_of(wavefronts(warp_access(16, [](int l) { return 256 * l + 16 * (l % 8); }))) ==
          units_of(1, 4, 4));
    // Only lanes 8-15 active: one phase.
    CHECK(units_of(wavefronts(warp_access(
              16, [](int l) { return 16 * l; }, 0x0000ff00u))) == units_of(1, 1, 1));
  }
}

// The same patterns run as kernels: the emulator runs a warp's lanes one after another and must group their
// accesses into the warp's instructions.
TEST_CASE("the emulator groups a warp's lanes into instructions and counts their sectors and wavefronts") {
  if (!emulator::counting_complete()) {
    MESSAGE("skipped: this build (the sanitizer's) does not see every global access of emulated kernels");
    return;
  }
  using emulator::Access;
  auto offsets = [](auto offset) {
    k::AccessOffsets o{};
    for (int l = 0; l < 32; ++l) o.bytes[l] = offset(l);
    return o;
  };
  SUBCASE("global: a load at a 128-byte stride, a broadcast; the coalesced store of the results") {
    std::vector<float> out;
    auto c = counted(
        [&] { out = k::emulated::access_pattern(false, 4, offsets([](int l) { return 128 * l; }), 1024); });
    CHECK(units_of(c[Access::global_load]) == units_of(1, 32, 4));
    CHECK(units_of(c[Access::global_store]) == units_of(1, 4, 4));
    CHECK(out[5] == 5 * 32.0f);
    c = counted([&] { out = k::emulated::access_pattern(false, 4, offsets([](int) { return 40; }), 1024); });
    CHECK(units_of(c[Access::global_load]) == units_of(1, 1, 1));
    CHECK(out[31] == 10.0f);
  }
  SUBCASE("atomics: a vector red over 512 contiguous bytes, 16 bytes past a sector, and on one vector") {
    auto c = counted([] { k::emulated::red_vectors(4, 1, 32, 32); });
    CHECK(units_of(c[Access::global_atomic]) == units_of(1, 16, 16));  // one instruction, not one a float
    CHECK(c.global_atomic_bytes == 32 * 16);
    CHECK(c[Access::global_load].instructions + c[Access::global_store].instructions == 0);
    c = counted([] { k::emulated::red_vectors(4, 1, 32, 32, 4); });
    CHECK(units_of(c[Access::global_atomic]) == units_of(1, 17, 16));
    c = counted([] { k::emulated::red_vectors(2, 1, 32, 32); });
    CHECK(units_of(c[Access::global_atomic]) == units_of(1, 8, 8));
    c = counted([] { k::emulated::red_vectors(2, 2, 64, 1); });  // 4 warps, each all lanes on one vector
    CHECK(units_of(c[Access::global_atomic]) == units_of(4, 4, 4));
    CHECK(c.global_atomic_bytes == 128 * 8);
  }
  SUBCASE("shared: 2-way and 32-way conflicts, after a conflict-free fill") {
    auto c =
        counted([&] { k::emulated::access_pattern(true, 4, offsets([](int l) { return 8 * l; }), 1024); });
    CHECK(units_of(c[Access::shared_load]) == units_of(1, 2, 1));
    CHECK(units_of(c[Access::shared_store]) == units_of(32, 32, 32));  // the fill: 32 floats a lane
    CHECK(units_of(c[Access::global_load]) == units_of(32, 128, 128));
    c = counted([&] { k::emulated::access_pattern(true, 4, offsets([](int l) { return 128 * l; }), 1024); });
    CHECK(units_of(c[Access::shared_load]) == units_of(1, 32, 1));
  }
  SUBCASE("shared, 16 bytes a lane: rows of a 256-byte-wide tile, unswizzled and swizzled") {
    auto c =
        counted([&] { k::emulated::access_pattern(true, 16, offsets([](int l) { return 256 * l; }), 2048); });
    CHECK(units_of(c[Access::shared_load]) == units_of(1, 32, 4));
    c = counted([&] {
      k::emulated::access_pattern(true, 16, offsets([](int l) { return 256 * l + 16 * (l % 8); }), 2048);
    });
    CHECK(units_of(c[Access::shared_load]) == units_of(1, 4, 4));
  }
  SUBCASE("ldmatrix.x4: 32 consecutive 16-byte rows, and rows 256 bytes apart") {
    std::vector<int> consecutive(32), apart(32);
    for (int r = 0; r < 32; ++r) consecutive[r] = r, apart[r] = 16 * r;
    for (bool window_address : {false, true}) {  // the rows as pointers or as shared-window addresses
      INFO((window_address ? "window addresses" : "pointers"));
      auto c = counted([&] {
        k::emulated::ldmatrix(4, false, std::vector<uint16_t>(512 * 8, 0), consecutive, window_address);
      });
      CHECK(units_of(c[Access::ldmatrix]) == units_of(1, 4, 4));
      c = counted(
          [&] { k::emulated::ldmatrix(4, true, std::vector<uint16_t>(512 * 8, 0), apart, window_address); });
      CHECK(units_of(c[Access::ldmatrix]) == units_of(1, 32, 4));
    }
  }
  SUBCASE("barriers: one __syncthreads of a 64-thread block is one per warp") {
    const auto c = counted([] { k::emulated::neighbours(64, k::Mistake::none); });
    CHECK(c.barriers == 2);
  }
}

namespace {

// One forward pass of `name` in the emulator: what it counted.
emulator::Counters counted_forward(const char* name, const Problem& p) {
  const Implementation* impl = find_implementation(name);
  REQUIRE(impl != nullptr);
  return testing::counted_forward(*impl, p);
}

// The global bytes a forward pass of `name` moved, and its traffic model's.
std::pair<double, double> counted_and_modeled(const char* name, const Problem& p) {
  const emulator::Counters counted = counted_forward(name, p);
  return {static_cast<double>(counted.global_read_bytes + counted.global_write_bytes),
          forward_traffic(*find_implementation(name), p).bytes};
}

}  // namespace

// Where the models are exact: tests/test_traffic.cpp (in the harness, so that a course exercise's copy is
// held to its model too). Here the two places they are not: cuda_v1 where a mask hides tiles, and the
// decoding kernel.
TEST_CASE("the GPU stages' traffic models: a bound for cuda_v1 under a mask, decoding's broadcast reads") {
  if (!emulator::counting_complete()) {
    MESSAGE("skipped: this build (the sanitizer's) does not see every global access of emulated kernels");
    return;
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
  // Both split kernels (decoding/cuda_split_kv_mma's on the tensor cores) read and write the same.
  for (const bool tensor_cores : {false, true}) {
    const Problem p = shaped(8, 2, 1, 4096, 128, DType::bf16, false);
    const auto [counted, modeled] =
        counted_and_modeled(tensor_cores ? "decoding/cuda_split_kv_mma" : "decoding/cuda_split_kv", p);
    const double partials =
        static_cast<double>(tensor_cores ? decoding::emulated::cuda_split_kv_mma_partial_elements(p)
                                         : decoding::emulated::cuda_split_kv_partial_elements(p));
    const double splits = partials / static_cast<double>(p.lse_elements() * (p.head_dim + 1));
    const char* const kernel = tensor_cores ? "tensor cores" : "CUDA cores";
    INFO(kernel, ": ", splits, " splits");
    CHECK(splits > 1);
    CHECK(counted == modeled + 4.0 * static_cast<double>((p.head_dim - 1) * p.lse_elements()) * splits);
  }
}

// What the swizzles are for (cuda_v2/tensor_core.cuh, docs/04 and 06): split_q's ldmatrix reads of the Q, K
// and V tiles and its cp.async writes of them meet no bank conflict, nor does its epilogue through shared
// memory; the Hopper kernels' wgmma operand reads from 128-byte-swizzled tiles meet none either. And both
// read and write global memory in whole sectors.
TEST_CASE("the swizzled GPU stages meet no bank conflicts and touch no sector more than needed") {
  if (!emulator::counting_complete()) {
    MESSAGE("skipped: this build (the sanitizer's) does not see every global access of emulated kernels");
    return;
  }
  using emulator::Access;
  struct Expected {
    const char* impl;
    Problem problem;
    std::vector<Access> kinds;  // each must have been counted, with no excess
  };
  const std::vector<Access> split_q{Access::ldmatrix, Access::cp_async_shared, Access::shared_store,
                                    Access::cp_async_global, Access::global_store};
  const std::vector<Access> hopper{Access::wgmma_operand, Access::tma_shared, Access::global_store};
  for (const Expected& e : {
           Expected{"cuda_v2/split_q", shaped(2, 2, 256, 256, 128, DType::bf16, false), split_q},
           Expected{"cuda_v2/split_q", shaped(4, 2, 200, 333, 64, DType::f16, true), split_q},
           Expected{"cuda_v3_hopper/ws", shaped(2, 2, 256, 256, 128, DType::bf16, false), hopper},
           Expected{"cuda_v3_hopper/ws", shaped(4, 2, 200, 333, 64, DType::f16, true), hopper},
           // The FP8 stage's own kernel (its quantizing and transposing pre-kernels are plain copies).
           Expected{"cuda_v3_hopper/fp8",
                    shaped(2, 2, 256, 256, 128, DType::e4m3, false),
                    {Access::wgmma_operand, Access::tma_shared}},
       }) {
    const emulator::Counters c = counted_forward(e.impl, e.problem);
    for (const Access kind : e.kinds) {
      const std::string counts = std::string(e.impl) + " on " + e.problem.describe() + ", " +
                                 emulator::access_name(kind) + ": " + units_of(c[kind]) +
                                 (emulator::counts_sectors(kind) ? " sectors" : " wavefronts");
      INFO(counts);
      CHECK(c[kind].instructions > 0);
      CHECK(c[kind].units == c[kind].ideal);
    }
  }
}

// cuda_v2's backward moves the bytes of its traffic model (cuda_v2/backward.hpp), and its atomics add into dQ
// once per (query head, Q tile, key tile that Q tile sees): with 64 keys a block (split_q's) and with 128
// (split_q_bwd128's, bf16 only), whose Q tiles and atomics are half as many where a row sees many keys; and
// with 64 query rows a step over 128 keys (split_q_bwd64x128's), whose K/V tiles are visited by half as many
// Q tiles; and the same with dQ's accumulator in the fragments' order, whose adds cover whole Q tiles.
TEST_CASE("the GPU backward moves the global bytes its traffic model says") {
  if (!emulator::counting_complete()) {
    MESSAGE("skipped: this build (the sanitizer's) does not see every global access of emulated kernels");
    return;
  }
  const bool forced = cuda::emulation_forced();
  cuda::force_emulation(true);
  for (const auto& [name, block_n, block_m, dtype, dq_tiled] :
       {std::tuple{"cuda_v2/split_q", cuda_v2::kBackwardBlockN, cuda_v2::kBackwardBlockM, DType::f16, false},
        std::tuple{"cuda_v2/split_q_bwd128", cuda_v2::kBackwardWideBlockN, cuda_v2::kBackwardBlockM,
                   DType::bf16, false},
        std::tuple{"cuda_v2/split_q_bwd64x128", cuda_v2::kBackwardWideBlockN, cuda_v2::kBackwardWideBlockM,
                   DType::bf16, false},
        std::tuple{"cuda_v2/split_q_bwd64x128_tiled_dq", cuda_v2::kBackwardWideBlockN,
                   cuda_v2::kBackwardWideBlockM, DType::bf16, true}}) {
    const Implementation* impl = find_implementation(name);
    REQUIRE(impl != nullptr);
    for (const Problem& p :
         {shaped(4, 2, 300, 333, 64, dtype, true), shaped(2, 2, 256, 256, 128, DType::bf16, false),
          windowed(shaped(2, 1, 400, 400, 64, DType::bf16, false, 2), 100, 30),
          shaped(2, 2, 300, 100, 64, dtype, true)}) {
      const AttentionInputs inputs = random_inputs(p, Distribution::normal, 7);
      const AttentionOutputs forward = run_forward(*impl, p, inputs);
      const HostTensor d_out = random_d_out(p, 8);
      emulator::start_counting();
      run_backward(*impl, p, inputs, forward, d_out);
      const emulator::Counters c = emulator::stop_counting();
      const cuda_v2::BackwardTraffic model = cuda_v2::backward_traffic(p, block_n, block_m, dq_tiled);
      INFO(name, " on ", p.describe(), ": counted ", c.global_read_bytes + c.global_write_bytes,
           " bytes and ", c.global_atomic_bytes, " in atomics; the model ", model.bytes, " and ",
           model.atomic_bytes);
      CHECK(static_cast<double>(c.global_read_bytes + c.global_write_bytes) == model.bytes);
      CHECK(static_cast<double>(c.global_atomic_bytes) == model.atomic_bytes);
      CHECK(c.launches == 4);
      // Each warp's add into dQ covers whole 32-byte sectors: a quad's 32 bytes of a row (paired adds), or
      // 512 contiguous bytes (the fragments' order). Scalar adds used half of each sector they touched.
      const emulator::AccessCounts& adds = c[emulator::Access::global_atomic];
      INFO("dQ's adds: ", units_of(adds), " sectors");
      CHECK(adds.instructions > 0);
      CHECK(adds.units == adds.ideal);
    }
  }
  cuda::force_emulation(forced);
}

// The decoding kernel's shared-memory reads in its loops (K rows padded by 16 bytes, V rows, P, Q) meet no
// bank conflict; what little excess remains is the once-per-split sum of the key shares (8 floats a thread,
// 32 bytes apart). The counts found its K and V reads 4-way conflicted when a 16-byte row was read through a
// reference as four 4-byte words (to_float8 now takes the vector by value: one 16-byte load).
TEST_CASE("the decoding kernel's shared-memory reads are free of bank conflicts but for the share sum") {
  if (!emulator::counting_complete()) {
    MESSAGE("skipped: this build (the sanitizer's) does not see every global access of emulated kernels");
    return;
  }
  const emulator::Counters c =
      counted_forward("decoding/cuda_split_kv", shaped(32, 8, 1, 2048, 128, DType::bf16, false));
  const emulator::AccessCounts& loads = c[emulator::Access::shared_load];
  INFO(units_of(loads), " wavefronts");
  CHECK(static_cast<double>(loads.units) < 1.02 * static_cast<double>(loads.ideal));
}

}  // namespace flashlab::testing
