// The CPU emulator of the CUDA execution model (emulator/), on small kernels that exercise one feature each
// (tests/emulator_kernels.cu). Expected results are spelled out here from NVIDIA's definitions (the CUDA
// C++ Programming Guide for the intrinsics, the PTX ISA for the instructions), not taken from the emulator or
// from the stages' kernels. Where a GPU is present the same kernels run on it and must give the same results.
// Kernels that go wrong on purpose (races, deadlocks, out-of-bounds accesses) run in the emulator only.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "common/cuda/device.hpp"
#include "common/error.hpp"
#include "common/inputs.hpp"
#include "common/number_format.hpp"
#include "emulator/launch.hpp"
#include "tests/emulator_kernels.hpp"
#include "tests/harness.hpp"

namespace flashlab::testing {

namespace k = kernels;

namespace {

// Runs `check` on the emulator's build of the test kernels and, where a GPU can run them, on the GPU's.
template <typename Check>
void on_each_target(Check&& check) {
  SUBCASE("emulated") {
    check(k::emulated::shuffle, k::emulated::vote, k::emulated::syncthreads_reductions, k::emulated::ldmatrix,
          k::emulated::mma, k::emulated::cp_async);
  }
#if FLASHLAB_HAVE_CUDA
  if (cuda::unavailable_reason().empty()) {
    SUBCASE("gpu") {
      check(k::gpu::shuffle, k::gpu::vote, k::gpu::syncthreads_reductions, k::gpu::ldmatrix, k::gpu::mma,
            k::gpu::cp_async);
    }
  }
#endif
}

}  // namespace

TEST_CASE("shuffles return what the CUDA Programming Guide says, for every mode, width and mask") {
  on_each_target([](auto shuffle, auto, auto, auto, auto, auto) {
    for (int width : {32, 16, 8, 4, 2, 1})
      for (unsigned mask : {0xffffffffu, 0x0000ffffu}) {
        if (mask != 0xffffffffu && width > 16) continue;  // every source lane must be named by the mask
        for (int b = 0; b < 32; ++b)
          for (k::Shuffle mode : {k::Shuffle::idx, k::Shuffle::up, k::Shuffle::down, k::Shuffle::bfly}) {
            const std::vector<int> out = shuffle(mode, mask, b, width);
            for (int lane = 0; lane < 32; ++lane) {
              if ((mask >> lane & 1u) == 0) continue;
              // A lane reads within its segment of `width` lanes; up and down out of it keep their own value;
              // xor may reach an earlier segment but not a later one.
              const int start = lane / width * width;
              int source = lane;
              switch (mode) {
                case k::Shuffle::idx:
                  source = start + b % width;
                  break;
                case k::Shuffle::up:
                  source = lane - b >= start ? lane - b : lane;
                  break;
                case k::Shuffle::down:
                  source = lane + b < start + width ? lane + b : lane;
                  break;
                case k::Shuffle::bfly:
                  source = (lane ^ b) < start + width ? lane ^ b : lane;
                  break;
              }
              INFO("mode ", static_cast<int>(mode), " width ", width, " mask ", mask, " b ", b, " lane ",
                   lane);
              CHECK(out[lane] == source * 10 + 7);
            }
          }
      }
  });
}

TEST_CASE("votes: ballot, all and any over the lanes of the mask") {
  on_each_target([](auto, auto vote, auto, auto, auto, auto) {
    Random random(3);
    for (unsigned mask : {0xffffffffu, 0x0000ffffu, 0x80000001u, 0x00ff00ffu})
      for (int n = 0; n < 8; ++n) {
        const unsigned truth = n == 0 ? 0u : n == 1 ? ~0u : static_cast<unsigned>(random.next());
        const unsigned ballot = truth & mask;
        const auto ballots = vote(k::Vote::ballot, mask, truth), alls = vote(k::Vote::all, mask, truth),
                   anys = vote(k::Vote::any, mask, truth);
        for (int lane = 0; lane < 32; ++lane) {
          if ((mask >> lane & 1u) == 0) continue;
          INFO("mask ", mask, " predicates ", truth, " lane ", lane);
          CHECK(ballots[lane] == ballot);
          CHECK(alls[lane] == static_cast<unsigned>(ballot == mask));
          CHECK(anys[lane] == static_cast<unsigned>(ballot != 0));
        }
      }
  });
}

TEST_CASE("__syncthreads_count, _and and _or count the whole block") {
  on_each_target([](auto, auto, auto reductions, auto, auto, auto) {
    for (int threads : {32, 96, 128, 1024})
      for (int modulus : {1, 3, 2000}) {
        const std::vector<int> out = reductions(threads, modulus);
        int count = 0;
        for (int t = 0; t < threads; ++t) count += t % modulus == 0;
        for (int t = 0; t < threads; ++t) {
          INFO("threads ", threads, " modulus ", modulus, " thread ", t);
          CHECK(out[3 * t] == count);
          CHECK(out[3 * t + 1] == (count == threads));
          CHECK(out[3 * t + 2] == (count > 0));
        }
      }
  });
}

// PTX ISA, "Warp-level matrix load instruction: ldmatrix": lanes 8m..8m+7 give the addresses of rows 0-7 of
// matrix m; each thread receives the 32-bit element at row laneid / 4, 16-bit columns 2 (laneid % 4) and
// 2 (laneid % 4) + 1 of each matrix, and with .trans the matrix is transposed as it is loaded.
TEST_CASE("ldmatrix .x1, .x2, .x4, with and without .trans, gives each lane the elements the PTX ISA names") {
  on_each_target([](auto, auto, auto, auto ldmatrix, auto, auto) {
    std::vector<uint16_t> shared(64 * 8);  // 64 rows of 8 elements, each element its own index
    std::iota(shared.begin(), shared.end(), uint16_t{1});
    std::vector<int> rows(32);
    for (int lane = 0; lane < 32; ++lane) rows[lane] = (lane * 37 + 5) % 64;  // scattered rows
    for (int matrices : {1, 2, 4})
      for (bool transpose : {false, true})
        for (bool window_address : {false, true}) {
          const std::vector<uint32_t> out = ldmatrix(matrices, transpose, shared, rows, window_address);
          auto element = [&](int m, int row, int col) {
            return uint32_t{shared[rows[m * 8 + row] * 8 + col]};
          };
          for (int lane = 0; lane < 32; ++lane)
            for (int m = 0; m < matrices; ++m) {
              const int group = lane / 4, pair = lane % 4;
              const uint32_t expected =
                  transpose ? element(m, 2 * pair, group) | element(m, 2 * pair + 1, group) << 16
                            : element(m, group, 2 * pair) | element(m, group, 2 * pair + 1) << 16;
              INFO(".x", matrices, transpose ? ".trans" : "", window_address ? " at a window address" : "",
                   " lane ", lane, " matrix ", m);
              CHECK(out[lane * matrices + m] == expected);
            }
        }
  });
}

// PTX ISA, "Matrix fragments for mma.m16n8k16 with floating point type", in its own element numbering (a0..a7
// are the eight 16-bit halves of a lane's four A registers, low half first; b0..b3 of its two B registers;
// c0..c3 its accumulators), with groupID = laneid / 4 and threadID_in_group = laneid % 4:
//   A: row = groupID for a0, a1, a4, a5, else groupID + 8; col = 2 threadID_in_group + (i & 1), + 8 for i >=
//   4 B: row = 2 threadID_in_group + (i & 1), + 8 for i >= 2; col = groupID C, D: row = groupID for c0, c1,
//   else groupID + 8; col = 2 threadID_in_group + (i & 1)
TEST_CASE("mma.sync m16n8k16 computes D = A B + C through the PTX ISA's fragment layouts, f16 and bf16") {
  on_each_target([](auto, auto, auto, auto, auto mma, auto) {
    for (bool bf16 : {false, true}) {
      Random random(bf16 ? 11 : 10);
      auto small = [&random] { return static_cast<float>(static_cast<int>(random.next() % 17) - 8); };
      float A[16][16], B[16][8], C[16][8];
      for (auto& row : A)
        for (float& x : row) x = small();
      for (auto& row : B)
        for (float& x : row) x = small() / 4;  // exact in both formats
      for (auto& row : C)
        for (float& x : row) x = small() * 3;
      auto bits = [bf16](float x) { return uint32_t{bf16 ? encode_bf16(x) : encode_fp16(x)}; };
      std::vector<uint32_t> a(128), b(64);
      std::vector<float> c(128);
      for (int lane = 0; lane < 32; ++lane) {
        const int group = lane / 4, in_group = lane % 4;
        for (int i = 0; i < 8; ++i) {
          const int row = (i < 2 || (i >= 4 && i < 6)) ? group : group + 8;
          const int col = 2 * in_group + (i & 1) + (i >= 4 ? 8 : 0);
          a[4 * lane + i / 2] |= bits(A[row][col]) << (16 * (i % 2));
        }
        for (int i = 0; i < 4; ++i) {
          const int row = 2 * in_group + (i & 1) + (i >= 2 ? 8 : 0);
          b[2 * lane + i / 2] |= bits(B[row][group]) << (16 * (i % 2));
        }
        for (int i = 0; i < 4; ++i) c[4 * lane + i] = C[i < 2 ? group : group + 8][2 * in_group + (i & 1)];
      }
      const std::vector<float> d = mma(bf16, a, b, c);
      for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < 4; ++i) {
          const int row = i < 2 ? lane / 4 : lane / 4 + 8, col = 2 * (lane % 4) + (i & 1);
          float expected = C[row][col];
          for (int kk = 0; kk < 16; ++kk) expected += A[row][kk] * B[kk][col];  // exact: small values
          INFO((bf16 ? "bf16" : "f16"), " lane ", lane, " d", i);
          CHECK(d[4 * lane + i] == expected);
        }
    }
  });
}

TEST_CASE("cp.async copies 16 bytes, or zero-fills them when the source is out of range") {
  on_each_target([](auto, auto, auto, auto, auto, auto cp_async) {
    const int chunks = 40;
    std::vector<float> source(4 * chunks);
    std::iota(source.begin(), source.end(), 1.0f);
    std::vector<int> in_range(chunks);
    for (int c = 0; c < chunks; ++c) in_range[c] = c % 3 != 1;
    const std::vector<float> out = cp_async(source, in_range);
    for (int i = 0; i < 4 * chunks; ++i) {
      INFO("element ", i);
      CHECK(out[i] == (in_range[i / 4] ? source[i] : 0.0f));
    }
  });
}

TEST_CASE("red.global.add.v2.f32 and .v4.f32 add every float of a vector, each atomically, from many lanes") {
  // 3 blocks of 96 threads onto 5 vectors: vector i takes the threads t of each block with t % 5 == i, each
  // adding (1, 2[, 3, 4]) (b + 1); small integers, so every order of the adds gives the same sums exactly.
  const int blocks = 3, threads = 96, vectors = 5;
  const auto check = [&](int width, const std::vector<float>& sums) {
    REQUIRE(sums.size() == static_cast<size_t>(width * vectors));
    for (int i = 0; i < vectors; ++i) {
      const int adders = threads / vectors + (i < threads % vectors ? 1 : 0);  // a block's threads on i
      const float first = static_cast<float>(adders * (1 + 2 + 3));            // blocks 0, 1, 2 add 1, 2, 3
      for (int e = 0; e < width; ++e) {
        INFO("width ", width, ", vector ", i, ", element ", e);
        CHECK(sums[width * i + e] == static_cast<float>(e + 1) * first);
      }
    }
  };
  SUBCASE("emulated") {
    for (const int width : {2, 4}) {
      check(width, k::emulated::red_vectors(width, blocks, threads, vectors));
      // A GPU faults on a vector red that is not aligned to its bytes; the emulator stops the kernel and
      // says why: one float off, and for .v4 also two (8-byte aligned, not 16).
      CHECK_THROWS_WITH(
          k::emulated::red_vectors(width, 1, 32, vectors, 1),
          doctest::Contains(width == 4 ? "is not aligned to 16 bytes" : "is not aligned to 8 bytes"));
    }
    CHECK_THROWS_WITH(k::emulated::red_vectors(4, 1, 32, vectors, 2),
                      doctest::Contains("is not aligned to 16 bytes"));
  }
#if FLASHLAB_HAVE_CUDA
  if (cuda::unavailable_reason().empty()) {
    SUBCASE("gpu") {
      for (const int width : {2, 4}) check(width, k::gpu::red_vectors(width, blocks, threads, vectors));
    }
  }
#endif
}

// A device allocation the memory cannot hold (2^40 bytes, a terabyte: more than the emulated device's 80 GiB
// and any GPU's; the emulator refuses it before asking the host) fails as cudaMalloc fails, and the
// check (common/cuda/check.hpp) throws DeviceMemoryError, the problem's size: the tool's exit code 2, a row
// that says so in compare (forward and --backward) and gpu-bench, and Python's MemoryError. Not an
// ExecutionError: the device is fine, and no error is left pending for the next launch's check to report
// against another stage.
TEST_CASE("a device allocation too large for the memory throws DeviceMemoryError, naming the call") {
  const size_t too_large = size_t{1} << 40;
  const auto check = [](const std::function<void()>& allocate) {
    try {
      allocate();
      FAIL("the allocation did not fail");
    } catch (const ExecutionError& error) {
      FAIL("an ExecutionError: ", error.what());
    } catch (const DeviceMemoryError& error) {
      CHECK(contains(error.what(), "cudaMalloc"));
      CHECK(contains(error.what(), "the problem is too large for this device's memory"));
    }
  };
  SUBCASE("emulated") {
    check([&] { k::emulated::allocate(too_large); });
    CHECK_FALSE(k::emulated::error_pending());
    k::emulated::allocate(1024);  // and the next allocation succeeds
  }
#if FLASHLAB_HAVE_CUDA
  if (cuda::unavailable_reason().empty()) {
    SUBCASE("gpu") {
      check([&] { k::gpu::allocate(too_large); });
      CHECK_FALSE(k::gpu::error_pending());
      k::gpu::allocate(1024);
    }
  }
#endif
}

TEST_CASE("a correct kernel passes under both schedules") {
  for (const emulator::ScheduleSetting& schedule :
       {emulator::ScheduleSetting{false, 0}, emulator::ScheduleSetting{true, 5}}) {
    const std::vector<float> out = [&] {
      const ScheduleFor scope(schedule);
      return k::emulated::neighbours(96, k::Mistake::none);
    }();
    for (int t = 0; t < 96; ++t) CHECK(out[t] == static_cast<float>((t + 1) % 96 + 1));
  }
}

// The shuffled schedule's TMA landing odds (ScheduleSetting::tma_landing_odds) slow the bulk copies a test
// asks it to; odds under 1 are refused by name, and the schedule stays as it was.
TEST_CASE("the emulator's schedule refuses TMA landing odds under 1, naming the field") {
  const emulator::ScheduleSetting before = emulator::schedule();
  CHECK(contains(error_of([] {
                   emulator::set_schedule({true, 1, 0});
                 }),
                 "tma_landing_odds (0) must be >= 1"));
  CHECK(emulator::schedule().describe() == before.describe());
  CHECK(emulator::ScheduleSetting{true, 3, 2000}.describe() == "shuffled:3, TMA landing 1/2000");
  CHECK(emulator::ScheduleSetting{true, 3}.describe() == "shuffled:3");
}

TEST_CASE("the emulator names what a broken kernel does wrong, and where") {
  struct Expected {
    k::Mistake mistake;
    int threads;
    std::vector<std::string> message;  // parts the error must contain
    bool needs_tracking;               // seen only through the instrumentation of loads and stores
  };
  const std::vector<Expected> cases = {
      {k::Mistake::missing_syncthreads, 96, {"data race on shared memory", "no synchronization"}, true},
      {k::Mistake::missing_syncwarp, 32, {"data race on shared memory"}, true},
      {k::Mistake::shuffle_instead_of_sync, 32, {"data race on shared memory"}, true},
      {k::Mistake::early_exit_at_barrier, 64, {"__syncthreads", "exit"}, false},
      {k::Mistake::crossed_named_barriers,
       64,
       {"deadlock", "bar.sync", "barrier 1: 32 of 64", "barrier 2: 32 of 64"},
       false},
      {k::Mistake::mismatched_collective, 32, {"__shfl_xor_sync", "__ballot_sync", ".aligned"}, false},
      {k::Mistake::exited_lane_in_mask, 32, {"lane 31", "exit", "__shfl_xor_sync"}, false},
      {k::Mistake::shared_out_of_bounds, 64, {"out of bounds", "256 bytes of dynamic shared memory"}, true},
      {k::Mistake::global_out_of_bounds,
       64,
       {"not device memory", "0 bytes after the end of the 256-byte allocation"},
       true},
      {k::Mistake::uninitialized_shared, 32, {"which no thread of this block has written"}, true},
      {k::Mistake::cp_async_without_wait, 32, {"cp.async", "wait_group"}, true},
      {k::Mistake::write_after_reads,
       96,
       {"data race on shared memory: writes 4 bytes", "warp 2 lane 31 read with no synchronization"},
       true},
      {k::Mistake::write_after_many_reads,  // the lowest of the racing readers is named
       96,
       {"data race on shared memory: writes 4 bytes", "warp 0 lane 0 read with no synchronization"},
       true},
      // Bytes of one word written by different threads are apart (no race among the writers); a read of the
      // word is ordered after none of them, and the first byte's writer is named.
      {k::Mistake::bytes_then_word,
       32,
       {"data race on shared memory: reads 4 bytes", "warp 0 lane 0 wrote with no synchronization"},
       true},
  };
  for (const Expected& expected : cases) {
    INFO("mistake ", static_cast<int>(expected.mistake));
    if (expected.needs_tracking && !emulator::memory_tracking()) {
      MESSAGE(
          "not checked in this build: the sanitizer build compiles emulated code without the "
          "instrumentation through which the emulator sees loads and stores (emulator/CMakeLists.txt)");
      continue;
    }
    const std::string error = error_of([&] { k::emulated::neighbours(expected.threads, expected.mistake); });
    INFO("error: ", error);
    if (std::getenv("FLASHLAB_VERBOSE") != nullptr) std::printf("%s\n\n", error.c_str());
    CHECK(contains(error, "kernel neighbours_kernel, block (0, 0, 0)"));
    for (const std::string& part : expected.message) CHECK(contains(error, part));
  }
}

TEST_CASE("without the instrumentation, a read before cp.async.wait_group still sees poison, not the data") {
  if (emulator::memory_tracking()) return;  // with it, the read is an error (the test above)
  const std::vector<float> out = k::emulated::neighbours(32, k::Mistake::cp_async_without_wait);
  for (size_t t = 0; t < out.size() / 4; ++t) CHECK(std::isnan(out[t]));  // the threads that copied
}

TEST_CASE("launch configurations a GPU refuses are refused") {
  CHECK(contains(error_of([] { k::emulated::launch_configuration(2048, 0, 0); }), "(1024, 1024, 64)"));
  // As the launcher's failure, not the input's (the tool's exit code 1, a row of its own in compare), as a
  // GPU's cudaErrorInvalidConfiguration is; so is a refused cudaFuncSetAttribute (common/cuda/check.hpp).
  CHECK_THROWS_AS(k::emulated::launch_configuration(2048, 0, 0), ExecutionError);
  CHECK_THROWS_AS(k::emulated::launch_configuration(128, 64 * 1024, 0), ExecutionError);
  CHECK_THROWS_AS(k::emulated::launch_configuration(128, 0, 300 * 1024), ExecutionError);
  CHECK(contains(error_of([] { k::emulated::launch_configuration(128, 64 * 1024, 0); }),
                 "cudaFuncAttributeMaxDynamicSharedMemorySize"));
  CHECK(contains(error_of([] { k::emulated::launch_configuration(128, 0, 300 * 1024); }),
                 "cudaErrorInvalidValue"));
  CHECK(error_of([] { k::emulated::launch_configuration(128, 64 * 1024, 64 * 1024); }).empty());
  CHECK(contains(error_of([] { k::emulated::launch_configuration(128, 100 * 1024, 64 * 1024); }),
                 "at most 65536 bytes"));
}

TEST_CASE("the shuffled schedule runs threads in a seeded order, the in-order schedule in thread order") {
  auto order = [](emulator::ScheduleSetting setting) {
    const ScheduleFor scope(setting);
    return k::emulated::arrival_order(1);
  };
  std::vector<int> identity(64);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(order({false, 0}) == identity);
  const std::vector<int> seven = order({true, 7});
  CHECK(seven != identity);
  CHECK(std::is_permutation(seven.begin(), seven.end(), identity.begin()));
  CHECK(order({true, 7}) == seven);  // the same seed, the same order
  CHECK(order({true, 8}) != seven);
}

}  // namespace flashlab::testing
