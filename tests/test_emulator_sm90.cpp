// The emulator's Hopper instructions (emulator/warpgroup.cpp, emulator/tma.cpp) on small kernels
// (hopper_kernels.cu), against the PTX ISA's definitions spelled out here: wgmma's products from shared
// memory and from registers (16-bit and e4m3), chained k-steps, and e4m3's sums, which the ISA leaves open,
// against Hopper's as measured (common/e4m3_block_sum.hpp); TMA's box, its out-of-bounds zeros and its
// 128-byte swizzle, the store's dropped elements; mbarrier phases and parity; setmaxnreg's hand-over. Where
// an sm_90 GPU is present the same kernels run on it too and must agree. Then the mistakes a Hopper kernel
// can make, each named by the emulator with its operation and the barrier, phase or arithmetic at fault. (The
// layouts themselves are checked against CuTe by tests/test_fragments.cpp.)
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "common/cuda/device.hpp"
#include "common/e4m3_block_sum.hpp"
#include "common/error.hpp"
#include "common/inputs.hpp"
#include "common/number_format.hpp"
#include "cuda_v3_hopper/ws_stage.hpp"
#include "emulator/launch.hpp"
#include "tests/harness.hpp"
#include "tests/hopper_kernels.hpp"

namespace flashlab::testing {

namespace {

namespace k = kernels;
using Mistake = k::HopperMistake;

struct Builds {
  decltype(&k::emulated::wgmma_ss) wgmma_ss;
  decltype(&k::emulated::wgmma_rs) wgmma_rs;
  decltype(&k::emulated::wgmma_rs_e4m3) wgmma_rs_e4m3;
  decltype(&k::emulated::tma_box) tma_box;
  decltype(&k::emulated::mbarrier_rounds) mbarrier_rounds;
  decltype(&k::emulated::setmaxnreg_handover) setmaxnreg_handover;
};

// The emulator's build always; the GPU's where an sm_90 device can run it.
void on_each_target(const std::function<void(const Builds&)>& check) {
  SUBCASE("emulated") {
    check({k::emulated::wgmma_ss, k::emulated::wgmma_rs, k::emulated::wgmma_rs_e4m3, k::emulated::tma_box,
           k::emulated::mbarrier_rounds, k::emulated::setmaxnreg_handover});
  }
#if FLASHLAB_HAVE_CUDA
  if (hopper::needs_sm90a().empty()) {
    SUBCASE("gpu") {
      check({k::gpu::wgmma_ss, k::gpu::wgmma_rs, k::gpu::wgmma_rs_e4m3, k::gpu::tma_box,
             k::gpu::mbarrier_rounds, k::gpu::setmaxnreg_handover});
    }
  }
#endif
}

// Values on a grid of eighths in [-2, 2]: exact in bf16 and in e4m3, so that products are exact.
std::vector<float> grid_values(size_t count, uint64_t seed) {
  Random random(seed);
  std::vector<float> values(count);
  for (float& x : values) x = std::round((random.uniform() * 4.0f - 2.0f) * 8.0f) / 8.0f;
  return values;
}

std::vector<uint16_t> bf16_bits(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = encode_bf16(values[i]);
  return bits;
}

// D[m][n] = sum_k A[m][k] B(k, n) in fp64, with b(k, n) the caller's indexing of B; and the error a float
// accumulation of `steps` instructions may add: one rounding of |D| a step, bounded by sum |a b|.
struct Product {
  std::vector<double> d, magnitude;
};
Product product(int m, int n, int kdim, const std::vector<float>& a,
                const std::function<float(int, int)>& b) {
  Product p{std::vector<double>(static_cast<size_t>(m) * n), std::vector<double>(static_cast<size_t>(m) * n)};
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j)
      for (int x = 0; x < kdim; ++x) {
        const double term = double(a[i * kdim + x]) * b(x, j);
        p.d[i * n + j] += term;
        p.magnitude[i * n + j] += std::fabs(term);
      }
  return p;
}

int product_mismatches(const std::vector<float>& got, const Product& expected, int steps) {
  int wrong = 0;
  for (size_t i = 0; i < got.size(); ++i)
    wrong += !(std::fabs(got[i] - expected.d[i]) <= steps * 0x1p-23 * expected.magnitude[i]);  // NaN: wrong
  return wrong;
}

}  // namespace

TEST_CASE("wgmma: the products of the PTX ISA's operand layouts (shared memory and registers, bf16, e4m3)") {
  on_each_target([](const Builds& run) {
    // SS: D (64 x 128) = A (64 x 64) B^T, B 128 x 64: four chained k16 instructions, K-major, 128-byte
    // swizzle.
    const std::vector<float> a = grid_values(64 * 64, 1), b = grid_values(128 * 64, 2);
    const Product ss = product(64, 128, 64, a, [&](int x, int j) { return b[j * 64 + x]; });
    CHECK(product_mismatches(run.wgmma_ss(bf16_bits(a), bf16_bits(b), Mistake::none), ss, 4) == 0);
    // RS: D (64 x 64) = A (64 x 16, registers) B (16 x 64, MN-major in shared memory).
    const std::vector<float> a16 = grid_values(64 * 16, 3), b16 = grid_values(16 * 64, 4);
    const Product rs = product(64, 64, 16, a16, [&](int x, int j) { return b16[x * 64 + j]; });
    CHECK(product_mismatches(run.wgmma_rs(bf16_bits(a16), bf16_bits(b16)), rs, 1) == 0);
    // e4m3 RS: D (64 x 128) = A (64 x 32, registers) B^T, B 128 x 32 K-major.
    const std::vector<float> a8 = grid_values(64 * 32, 5), b8 = grid_values(128 * 32, 6);
    std::vector<uint8_t> a_codes(a8.size()), b_codes(b8.size());
    for (size_t i = 0; i < a8.size(); ++i) a_codes[i] = encode_e4m3(a8[i]);
    for (size_t i = 0; i < b8.size(); ++i) b_codes[i] = encode_e4m3(b8[i]);
    const Product e4m3 = product(64, 128, 32, a8, [&](int x, int j) { return b8[j * 32 + x]; });
    CHECK(product_mismatches(run.wgmma_rs_e4m3(a_codes, b_codes), e4m3, 1) == 0);
  });
}

// The e4m3 wgmma's sums are not the PTX ISA's to define; the emulator takes Hopper's as measured and modeled
// (common/e4m3_block_sum.hpp). Random codes over e4m3's whole range, so that the model's cuts show: every
// element of D must be the model's sum of its row and column to the bit. On a GPU this checks the model
// against the hardware on 8,192 sums (it was fitted to an H100; the FP8 kernel's LSEs checked it on an H200,
// tests/test_hopper_fp8.cpp); in the emulator, that the instruction sums each element's own row and column.
TEST_CASE("wgmma e4m3: each element is the tensor cores' sum of its row and column, to the bit") {
  Random random(7);
  auto finite_code = [&random] {
    const auto code = static_cast<uint8_t>(random.uniform() * 256.0f);
    return (code & 0x7f) == 0x7f ? uint8_t{0} : code;  // NaN's two codes taken as zero
  };
  std::vector<uint8_t> a_codes(64 * 32), b_codes(128 * 32);
  for (uint8_t& code : a_codes) code = finite_code();
  for (uint8_t& code : b_codes) code = finite_code();
  std::vector<float> expected(64 * 128);
  int fp32_differs = 0;
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 128; ++n) {
      float a[32], b[32];
      double exact = 0.0;
      for (int x = 0; x < 32; ++x) {
        a[x] = decode_e4m3(a_codes[m * 32 + x]), b[x] = decode_e4m3(b_codes[n * 32 + x]);
        exact += double(a[x]) * b[x];
      }
      expected[m * 128 + n] = e4m3_block_sum(a, b, 32, 0.0f);
      fp32_differs += static_cast<float>(exact) != expected[m * 128 + n];
    }
  INFO(fp32_differs, " of the 8,192 sums differ from an fp32 sum");
  CHECK(fp32_differs > 8000);  // the inputs tell the model from an fp32 sum (8,182 differ)
  on_each_target([&](const Builds& run) {
    const std::vector<float> d = run.wgmma_rs_e4m3(a_codes, b_codes);
    int wrong = 0;
    for (size_t i = 0; i < d.size(); ++i)
      if (std::bit_cast<uint32_t>(d[i]) != std::bit_cast<uint32_t>(expected[i]) &&
          !(d[i] == 0.0f && expected[i] == 0.0f) && wrong++ < 5)
        MESSAGE("D[", i / 128, "][", i % 128, "] = ", d[i], ", the model's ", expected[i]);
    CHECK(wrong == 0);
  });
}

TEST_CASE("TMA: a box lands swizzled with zeros past the tensor, and a store drops what lies past it") {
  on_each_target([](const Builds& run) {
    const int rows = 37, columns = 104;  // rows of 208 bytes: TMA needs strides that are multiples of 16
    std::vector<uint16_t> tensor(static_cast<size_t>(rows) * columns);
    for (size_t i = 0; i < tensor.size(); ++i)
      tensor[i] = static_cast<uint16_t>(i + 1);  // distinct, non-zero
    for (const auto& [column, row] : {std::pair{0, 0}, std::pair{64, 16}, std::pair{-8, -3}}) {
      INFO("box at column ", column, ", row ", row);
      std::vector<uint16_t> stored;
      const std::vector<uint16_t> landed = run.tma_box(tensor, rows, columns, column, row, stored);
      int wrong = 0;
      for (int r = 0; r < 32; ++r)
        for (int c = 0; c < 64; ++c) {
          const int gr = row + r, gc = column + c;
          const bool inside = gr >= 0 && gr < rows && gc >= 0 && gc < columns;
          // The 128-byte swizzle (PTX ISA, "Tensor copy swizzle modes"): in a 1024-byte-aligned tile, the
          // 16-byte chunk of byte b moves to chunk (b / 16 % 8) ^ (b / 128 % 8) of its 128-byte row.
          const int byte = 2 * (r * 64 + c), chunk = (byte / 16 % 8) ^ (byte / 128 % 8);
          const int at = (byte / 128 * 128 + chunk * 16 + byte % 16) / 2;
          wrong += landed[at] != (inside ? tensor[gr * columns + gc] : 0);
        }
      CHECK(wrong == 0);
      // A store's box may run past the tensor's end, but its top-left corner cannot be negative (CUDA C++
      // Programming Guide, "Using TMA to transfer multi-dimensional arrays"): the kernel stores the landed
      // box at (max(column, 0), max(row, 0)), so there it holds the tensor shifted, zeros included.
      const int store_row = std::max(row, 0), store_column = std::max(column, 0);
      int stored_wrong = 0;
      for (int gr = 0; gr < rows; ++gr)
        for (int gc = 0; gc < columns; ++gc) {
          const int sr = gr - store_row + row, sc = gc - store_column + column;  // where its value came from
          const bool in_box =
              gr - store_row < 32 && gr >= store_row && gc - store_column < 64 && gc >= store_column;
          const bool inside = sr >= 0 && sr < rows && sc >= 0 && sc < columns;
          stored_wrong += stored[gr * columns + gc] != (in_box && inside ? tensor[sr * columns + sc] : 0);
        }
      CHECK(stored_wrong == 0);
    }
  });
}

TEST_CASE("mbarrier: each phase completes after its arrivals, and a parity wait names the phase before") {
  on_each_target([](const Builds& run) {
    const std::vector<int> seen = run.mbarrier_rounds(5);
    CHECK(seen == std::vector<int>{-1, 1, 2, 3, 4, 5});
  });
}

TEST_CASE("setmaxnreg: the producer's registers reach the consumers (24 + 2 x 240 of 168 a thread)") {
  on_each_target([](const Builds& run) {
    int expected = 0;
    for (int tid = 128; tid < 384; ++tid) expected += tid;
    CHECK(run.setmaxnreg_handover() == expected);
  });
}

TEST_CASE("the emulator names what a broken Hopper kernel does wrong") {
  struct Expected {
    Mistake mistake;
    std::vector<std::string> message;
    bool needs_tracking = false;  // seen only where the emulator sees every load and store
  };
  const std::vector<Expected> cases{
      {Mistake::wgmma_without_fence, {"wgmma.mma_async", "without a wgmma.fence"}},
      {Mistake::accumulator_written_in_flight, {"wrote accumulator register 5", "in flight"}},
      {Mistake::operand_overwritten_in_flight, {"changed while it was in flight"}},
      {Mistake::descriptor_base_offset, {"base offset", "does not model"}},
      {Mistake::exit_with_wgmma_in_flight, {"exits while", "wgmma.wait_group belongs before the end"}},
      {Mistake::mbarrier_over_arrival, {"mbarrier.arrive", "one arrival too many"}},
      {Mistake::mbarrier_wrong_parity,
       {"deadlock", "mbarrier.try_wait.parity", "parity 1", "is in phase 1 (parity 1) with 1 of 1 arrivals"}},
      {Mistake::mbarrier_expect_tx_short, {"24576 bytes", "arrive.expect_tx announced 24448"}},
      {Mistake::mbarrier_used_before_init, {"mbarrier"}},
      {Mistake::tma_misaligned_destination, {"cp.async.bulk.tensor.4d", "must be 128-byte aligned"}},
      {Mistake::tma_store_without_proxy_fence, {"ordinary store and no fence.proxy.async"}, true},
      {Mistake::tma_store_exit_before_read, {"cp.async.bulk.wait_group.read"}},
      {Mistake::tma_store_negative_corner, {"cp.async.bulk.tensor.4d", "(-8, -8, 0, 0)", "negative indices"}},
      {Mistake::setmaxnreg_pool_too_small,
       {"deadlock", "setmaxnreg.inc 240", "(240 - 128) x 128 = 14336", "the pool has 13312 free",
        "128 registers a thread x 384 threads = 49152"}},
      {Mistake::setmaxnreg_out_of_range, {"setmaxnreg.dec 20", "a multiple of 8 from 24 to 256"}},
  };
  for (const Expected& expected : cases) {
    INFO("mistake ", static_cast<int>(expected.mistake));
    if (expected.needs_tracking && !emulator::memory_tracking()) {
      MESSAGE(
          "not checked in this build: the sanitizer build compiles emulated code without the "
          "instrumentation through which the emulator sees loads and stores (emulator/CMakeLists.txt)");
      continue;
    }
    const std::string error = error_of([&] { k::emulated::hopper_mistake(expected.mistake); });
    INFO("error: ", error);
    if (std::getenv("FLASHLAB_VERBOSE") != nullptr) std::printf("%s\n\n", error.c_str());
    CHECK(!error.empty());
    for (const std::string& part : expected.message) CHECK(contains(error, part));
  }
}

TEST_CASE("accumulators read before wgmma.wait_group hold no result yet (NaN)") {
  const std::vector<float> early =
      k::emulated::wgmma_ss(std::vector<uint16_t>(64 * 64, 0x3f80), std::vector<uint16_t>(128 * 64, 0x3f80),
                            Mistake::accumulator_read_before_wait);
  for (float x : early) CHECK(std::isnan(x));
}

}  // namespace flashlab::testing
