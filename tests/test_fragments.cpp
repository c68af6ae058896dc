// The emulator's fragment maps (emulator/fragments.hpp) against NVIDIA's own definitions in CuTe (CUTLASS's
// header-only layout library, from the pinned nvidia-cutlass package): MMA_Traits for mma.sync and
// Copy_Traits for ldmatrix give, for every (thread, value) of an instruction, the element (or, for copies,
// the bit) of the tile it holds. Each check counts the entries where the emulator disagrees; each is also run
// on a copy of the emulator's map with one entry changed, which it must catch. (The PTX ISA's formulas are
// checked by tests/test_emulator.cpp, through the emulated instructions themselves.)
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cute/atom/copy_traits_sm75.hpp>
#include <cute/atom/mma_traits_sm80.hpp>
#include <cute/tensor.hpp>

#include <functional>

#include "emulator/fragments.hpp"

namespace {

namespace f = flashlab::emulator::fragments;
using Map = std::function<f::Element(int lane, int reg, int half)>;  // 16-bit operand maps
using AccumulatorMap = std::function<f::Element(int lane, int reg)>;

// CuTe's MMA layouts map (thread, value) to an index of the operand in column-major order: (m, k) for A is
// m + M k, (n, k) for B is n + N k, (m, n) for C is m + M n. A thread's values are its registers' 16-bit
// halves in order (value v = 2 register + half) for A and B, its accumulators for C.
template <typename Layout>
int mismatches_16bit(Layout layout, int rows, const Map& map, bool k_major_index) {
  int wrong = 0;
  for (int lane = 0; lane < 32; ++lane)
    for (int v = 0; v < int(cute::size<1>(layout)); ++v) {
      const int index = layout(lane, v);
      const f::Element mine = map(lane, v / 2, v % 2);
      // A: {row m, col k}; B: {row k, col n}, indexed n + N k.
      const f::Element theirs =
          k_major_index ? f::Element{index % rows, index / rows} : f::Element{index / rows, index % rows};
      wrong += !(mine == theirs);
    }
  return wrong;
}

template <typename Layout>
int mismatches_accumulator(Layout layout, const AccumulatorMap& map) {
  int wrong = 0;
  for (int lane = 0; lane < 32; ++lane)
    for (int v = 0; v < int(cute::size<1>(layout)); ++v) {
      const int index = layout(lane, v);
      wrong += !(map(lane, v) == f::Element{index % f::m16n8k16::M, index / f::m16n8k16::M});
    }
  return wrong;
}

// CuTe's ldmatrix layouts index bits of the copied data: the source layout says which 128-bit row each lane's
// address provides, the destination layout where each bit of each lane's registers comes from.
template <typename Traits>
int mismatches_ldmatrix(int matrices, bool transpose,
                        const std::function<f::Element(int, int, bool)>& element = f::ldmatrix::element) {
  const auto source = typename Traits::SrcLayout{};
  const auto destination = typename Traits::DstLayout{};
  int wrong = 0;
  for (int lane = 0; lane < 32; ++lane)
    for (int bit = 0; bit < 32 * matrices; ++bit) {
      const int reg = bit / 32, half = bit % 32 / 16;
      const f::Element e = element(lane, half, transpose);  // within matrix `reg`
      const int address_lane = f::ldmatrix::address_lane(reg, e.row);
      const int expected = int(source(address_lane, 0)) + 16 * e.col + bit % 16;
      wrong += int(destination(lane, bit)) != expected;
    }
  return wrong;
}

}  // namespace

TEST_CASE("mma.sync m16n8k16 fragments match CuTe's MMA_Traits (f16 and bf16)") {
  using F16 = cute::MMA_Traits<cute::SM80_16x8x16_F32F16F16F32_TN>;
  using BF16 = cute::MMA_Traits<cute::SM80_16x8x16_F32BF16BF16F32_TN>;
  const Map a = f::m16n8k16::a, b = [](int lane, int reg, int half) {
    const f::Element e = f::m16n8k16::b(lane, reg, half);  // {k, n}: CuTe indexes n + N k
    return f::Element{e.col, e.row};
  };
  CHECK(mismatches_16bit(typename F16::ALayout{}, f::m16n8k16::M, a, true) == 0);
  CHECK(mismatches_16bit(typename BF16::ALayout{}, f::m16n8k16::M, a, true) == 0);
  CHECK(mismatches_16bit(typename F16::BLayout{}, f::m16n8k16::N, b, true) == 0);
  CHECK(mismatches_16bit(typename BF16::BLayout{}, f::m16n8k16::N, b, true) == 0);
  CHECK(mismatches_accumulator(typename F16::CLayout{}, f::m16n8k16::c) == 0);
  CHECK(mismatches_accumulator(typename BF16::CLayout{}, f::m16n8k16::c) == 0);

  // One changed entry is caught: lanes 5 and 6 swap their first accumulator; lane 9's A register 2 is read
  // from the wrong row.
  const AccumulatorMap swapped = [](int lane, int reg) {
    if (reg == 0 && (lane == 5 || lane == 6)) return f::m16n8k16::c(11 - lane, reg);
    return f::m16n8k16::c(lane, reg);
  };
  CHECK(mismatches_accumulator(typename F16::CLayout{}, swapped) == 2);
  const Map off_by_a_row = [](int lane, int reg, int half) {
    f::Element e = f::m16n8k16::a(lane, reg, half);
    if (lane == 9 && reg == 2) e.row ^= 8;
    return e;
  };
  CHECK(mismatches_16bit(typename F16::ALayout{}, f::m16n8k16::M, off_by_a_row, true) == 2);
}

TEST_CASE("ldmatrix fragments match CuTe's Copy_Traits (.x1, .x2, .x4, with and without .trans)") {
  CHECK(mismatches_ldmatrix<cute::Copy_Traits<cute::SM75_U32x1_LDSM_N>>(1, false) == 0);
  CHECK(mismatches_ldmatrix<cute::Copy_Traits<cute::SM75_U32x2_LDSM_N>>(2, false) == 0);
  CHECK(mismatches_ldmatrix<cute::Copy_Traits<cute::SM75_U32x4_LDSM_N>>(4, false) == 0);
  CHECK(mismatches_ldmatrix<cute::Copy_Traits<cute::SM75_U16x2_LDSM_T>>(1, true) == 0);
  CHECK(mismatches_ldmatrix<cute::Copy_Traits<cute::SM75_U16x4_LDSM_T>>(2, true) == 0);
  CHECK(mismatches_ldmatrix<cute::Copy_Traits<cute::SM75_U16x8_LDSM_T>>(4, true) == 0);

  // .trans dropped: every lane but the diagonal ones gets the wrong elements.
  const auto no_transpose = [](int lane, int half, bool) { return f::ldmatrix::element(lane, half, false); };
  CHECK(mismatches_ldmatrix<cute::Copy_Traits<cute::SM75_U16x8_LDSM_T>>(4, true, no_transpose) > 0);
  // One lane's element moved by one column.
  const auto moved = [](int lane, int half, bool transpose) {
    f::Element e = f::ldmatrix::element(lane, half, transpose);
    if (lane == 13 && half == 1) e.col ^= 1;
    return e;
  };
  CHECK(mismatches_ldmatrix<cute::Copy_Traits<cute::SM75_U32x4_LDSM_N>>(4, false, moved) == 4 * 16);
}
