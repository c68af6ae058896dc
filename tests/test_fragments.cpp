// The emulator's fragment maps and layouts (emulator/fragments.hpp, emulator/gmma.hpp, the TMA swizzle of
// emulator/tensor_map.hpp) against NVIDIA's own definitions in CuTe (CUTLASS's header-only layout library,
// from the pinned nvidia-cutlass package): MMA_Traits for mma.sync and the SM90 GMMA atoms and Copy_Traits
// for ldmatrix give, for every (thread, value) of an instruction, the element (or, for copies, the bit) of
// the tile it holds; make_gmma_desc encodes the wgmma descriptor of a shared-memory tile whose every
// element's address CuTe knows; get_tma_swizzle_bits names the TMA swizzle mode of a swizzled layout. Each
// check counts the entries where the emulator disagrees; each is also run on a copy of the emulator's map
// with one entry (or one bit of its decoding) changed, which it must catch. (The PTX ISA's formulas are
// checked by tests/test_emulator.cpp, through the emulated instructions themselves.)
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cuda.h>

#include <cstddef>
#include <cstdint>

// CuTe's make_gmma_desc asks for the shared-window address of the tile it describes; on the host the test's
// tiles live at made-up addresses (never dereferenced), which stand for themselves.
inline size_t __cvta_generic_to_shared(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer);
}
#define CUTE_CVTA_GENERIC_TO_SHARED_ACTIVATED 1

#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/arch/mma_sm90_gmma_ext.hpp>
#include <cute/atom/copy_traits_sm75.hpp>
#include <cute/atom/copy_traits_sm90_tma_swizzle.hpp>
#include <cute/atom/mma_traits_sm80.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma_ext.hpp>
#include <cute/tensor.hpp>

#include <functional>

#include "emulator/fragments.hpp"
#include "emulator/gmma.hpp"
#include "emulator/tensor_map.hpp"

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

// ---- Hopper: wgmma fragments, descriptors and swizzles, TMA's swizzle ----

namespace {

namespace gm = flashlab::emulator::gmma;
namespace GMMA = cute::SM90::GMMA;
using GmmaMap = std::function<gm::Element(uint32_t thread, uint32_t reg)>;
using GmmaAMap = std::function<gm::Element(uint32_t bytes, uint32_t thread, uint32_t reg, uint32_t value)>;

// CuTe's GMMA layouts index the 64 x N accumulator and the 64 x K A operand column-major: m + 64 n, m + 64 k.
template <class Op>
int gmma_accumulator_mismatches(uint32_t n, const GmmaMap& map = gm::accumulator) {
  const auto layout = typename cute::MMA_Traits<Op>::CLayout{};
  REQUIRE(int(cute::size<1>(layout)) == int(n / 2));
  int wrong = 0;
  for (uint32_t thread = 0; thread < 128; ++thread)
    for (uint32_t reg = 0; reg < n / 2; ++reg) {
      const auto index = static_cast<uint32_t>(layout(thread, reg));
      wrong += !(map(thread, reg) == gm::Element{index % 64, index / 64});
    }
  return wrong;
}

// A thread's values are its four registers' elements in order: value v is register v / (4 / bytes), element
// v % (4 / bytes) of it (lowest bits first).
template <class Op>
int gmma_a_mismatches(uint32_t bytes, const GmmaAMap& map = gm::a_fragment) {
  const auto layout = typename cute::MMA_Traits<Op>::ALayout{};
  const uint32_t per_register = 4 / bytes;
  REQUIRE(uint32_t(cute::size<1>(layout)) == 4 * per_register);
  int wrong = 0;
  for (uint32_t thread = 0; thread < 128; ++thread)
    for (uint32_t v = 0; v < 4 * per_register; ++v) {
      const auto index = static_cast<uint32_t>(layout(thread, v));
      wrong +=
          !(map(bytes, thread, v / per_register, v % per_register) == gm::Element{index % 64, index / 64});
    }
  return wrong;
}

// The emulator's decoding of a descriptor: the shared address of element (mn, k) of one instruction's
// operand.
using Decoder =
    std::function<uint32_t(uint64_t descriptor, gm::Major major, uint32_t bytes, uint32_t mn, uint32_t k)>;
const Decoder emulator_decoder = [](uint64_t descriptor, gm::Major major, uint32_t bytes, uint32_t mn,
                                    uint32_t k) {
  return gm::element_address(gm::decode(descriptor), major, bytes, mn, k);
};

// A tile of kMN x kKTotal elements laid out from CuTe's canonical GMMA atom, at a made-up 1024-byte-aligned
// shared address, cut into one instruction's K (32 bytes) at a time; make_gmma_desc encodes each block, and
// the emulator must find every element where CuTe's swizzled pointer puts it.
template <class T, GMMA::Major kMajor, class Atom, int kMN, int kKTotal>
int descriptor_mismatches(const Decoder& decoder) {
  T* const base = reinterpret_cast<T*>(uintptr_t{0x10400});
  const auto full =
      cute::make_tensor(cute::make_smem_ptr(base),
                        cute::tile_to_shape(Atom{}, cute::Shape<cute::Int<kMN>, cute::Int<kKTotal>>{}));
  constexpr int kK = 32 / sizeof(T);
  const gm::Major major = kMajor == GMMA::Major::K ? gm::Major::k : gm::Major::mn;
  int wrong = 0;
  for (int j = 0; j < kKTotal / kK; ++j) {
    const auto block =
        cute::local_tile(full, cute::Shape<cute::Int<kMN>, cute::Int<kK>>{}, cute::make_coord(0, j));
    const uint64_t descriptor = GMMA::make_gmma_desc<kMajor>(block).desc_;
    for (int mn = 0; mn < kMN; ++mn)
      for (int k = 0; k < kK; ++k) {
        const auto theirs = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(&block(mn, k)));
        wrong += decoder(descriptor, major, sizeof(T), mn, k) != theirs;
      }
  }
  return wrong;
}

// Every canonical layout: both majors, each swizzle, 16-bit and 8-bit elements, tiles that span several atoms
// in both directions (so that the leading and the stride byte offsets both matter).
int all_descriptor_mismatches(const Decoder& decoder) {
  using H = cute::half_t;
  using E = cute::float_e4m3_t;
  int wrong = 0;
  wrong += descriptor_mismatches<H, GMMA::Major::K, GMMA::Layout_K_INTER_Atom<H>, 64, 32>(decoder);
  wrong += descriptor_mismatches<H, GMMA::Major::K, GMMA::Layout_K_SW32_Atom<H>, 64, 32>(decoder);
  wrong += descriptor_mismatches<H, GMMA::Major::K, GMMA::Layout_K_SW64_Atom<H>, 64, 64>(decoder);
  wrong += descriptor_mismatches<H, GMMA::Major::K, GMMA::Layout_K_SW128_Atom<H>, 64, 128>(decoder);
  wrong += descriptor_mismatches<H, GMMA::Major::MN, GMMA::Layout_MN_INTER_Atom<H>, 64, 32>(decoder);
  wrong += descriptor_mismatches<H, GMMA::Major::MN, GMMA::Layout_MN_SW32_Atom<H>, 64, 32>(decoder);
  wrong += descriptor_mismatches<H, GMMA::Major::MN, GMMA::Layout_MN_SW64_Atom<H>, 64, 32>(decoder);
  wrong += descriptor_mismatches<H, GMMA::Major::MN, GMMA::Layout_MN_SW128_Atom<H>, 128, 32>(decoder);
  wrong += descriptor_mismatches<E, GMMA::Major::K, GMMA::Layout_K_INTER_Atom<E>, 64, 64>(decoder);
  wrong += descriptor_mismatches<E, GMMA::Major::K, GMMA::Layout_K_SW128_Atom<E>, 128, 128>(decoder);
  wrong += descriptor_mismatches<E, GMMA::Major::MN, GMMA::Layout_MN_SW128_Atom<E>, 256, 64>(decoder);
  return wrong;
}

// TMA writes a box row-major with its swizzle on the shared address; CuTe's K-major atom of the same swizzle
// is what TMA is asked to fill for it (get_tma_swizzle_bits: Swizzle<B, 4, 3> is mode B of
// CUtensorMapSwizzle).
template <int B>
int tma_swizzle_mismatches(int mode_change = 0) {
  using H = cute::half_t;
  using Atom = std::conditional_t<
      B == 3, GMMA::Layout_K_SW128_Atom<H>,
      std::conditional_t<B == 2, GMMA::Layout_K_SW64_Atom<H>, GMMA::Layout_K_SW32_Atom<H>>>;
  constexpr int kInner = (16 << B) / 2, kRows = 32;  // one swizzle span of 16-bit elements a row
  H* const base = reinterpret_cast<H*>(uintptr_t{0x10400});
  const auto tile =
      cute::make_tensor(cute::make_smem_ptr(base),
                        cute::tile_to_shape(Atom{}, cute::Shape<cute::Int<kRows>, cute::Int<kInner>>{}));
  // CuTe's swizzle bits as the driver's enum (cuda.h), by name as CuTe's to_CUtensorMapSwizzle maps them
  // (that function is compiled for nvcc only).
  uint32_t mode = 0;
  switch (cute::detail::get_tma_swizzle_bits(cute::Swizzle<B, 4, 3>{})) {
    case cute::TMA::SmemSwizzleBits::B32:
      mode = CU_TENSOR_MAP_SWIZZLE_32B;
      break;
    case cute::TMA::SmemSwizzleBits::B64:
      mode = CU_TENSOR_MAP_SWIZZLE_64B;
      break;
    case cute::TMA::SmemSwizzleBits::B128:
      mode = CU_TENSOR_MAP_SWIZZLE_128B;
      break;
    default:
      mode = CU_TENSOR_MAP_SWIZZLE_NONE;
  }
  mode += mode_change;
  int wrong = 0;
  for (int row = 0; row < kRows; ++row)
    for (int col = 0; col < kInner; ++col) {
      const auto theirs = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(&tile(row, col)));
      wrong += flashlab::emulator::tma::shared_address(mode, 0x10400, 2 * (row * kInner + col)) != theirs;
    }
  return wrong;
}

}  // namespace

TEST_CASE("wgmma accumulators match CuTe's GMMA atoms (every N the Hopper kernels use)") {
  CHECK(gmma_accumulator_mismatches<cute::SM90_64x80x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>>(80) ==
        0);
  CHECK(gmma_accumulator_mismatches<cute::SM90_64x128x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>>(
            128) == 0);
  CHECK(gmma_accumulator_mismatches<cute::SM90_64x176x16_F32F16F16_SS<GMMA::Major::K, GMMA::Major::K>>(176) ==
        0);
  CHECK(gmma_accumulator_mismatches<cute::SM90_64x64x16_F32BF16BF16_RS<GMMA::Major::K, GMMA::Major::MN>>(
            64) == 0);
  CHECK(gmma_accumulator_mismatches<cute::SM90_64x256x16_F32F16F16_RS<GMMA::Major::K, GMMA::Major::MN>>(
            256) == 0);
  CHECK(gmma_accumulator_mismatches<cute::SM90_64x224x32_F32E4M3E4M3_SS_TN<>>(224) == 0);
  CHECK(gmma_accumulator_mismatches<cute::SM90_64x256x32_F32E4M3E4M3_RS_TN<>>(256) == 0);

  // Threads 70 and 71 swap their register 5: caught twice.
  const GmmaMap swapped = [](uint32_t thread, uint32_t reg) {
    return reg == 5 && (thread == 70 || thread == 71) ? gm::accumulator(141 - thread, reg)
                                                      : gm::accumulator(thread, reg);
  };
  CHECK(gmma_accumulator_mismatches<cute::SM90_64x128x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>>(
            128, swapped) == 2);
}

TEST_CASE("wgmma A fragments from registers match CuTe's GMMA atoms (16-bit and e4m3)") {
  CHECK(gmma_a_mismatches<cute::SM90_64x128x16_F32BF16BF16_RS<GMMA::Major::K, GMMA::Major::MN>>(2) == 0);
  CHECK(gmma_a_mismatches<cute::SM90_64x64x16_F32F16F16_RS<GMMA::Major::K, GMMA::Major::MN>>(2) == 0);
  CHECK(gmma_a_mismatches<cute::SM90_64x128x32_F32E4M3E4M3_RS_TN<>>(1) == 0);
  CHECK(gmma_a_mismatches<cute::SM90_64x256x32_F32E4M3E4M3_RS_TN<>>(1) == 0);

  // The e4m3 P fragment's bytes swapped within a register (bytes 0 and 1): caught for every thread.
  const GmmaAMap bytes_swapped = [](uint32_t bytes, uint32_t thread, uint32_t reg, uint32_t value) {
    return gm::a_fragment(bytes, thread, reg, value < 2 ? 1 - value : value);
  };
  CHECK(gmma_a_mismatches<cute::SM90_64x128x32_F32E4M3E4M3_RS_TN<>>(1, bytes_swapped) == 128 * 4 * 2);
  // The 16-bit fragment's registers 1 and 2 exchanged (rows + 8 and columns + 8 confused).
  const GmmaAMap registers_exchanged = [](uint32_t bytes, uint32_t thread, uint32_t reg, uint32_t value) {
    return gm::a_fragment(bytes, thread, reg == 1 || reg == 2 ? 3 - reg : reg, value);
  };
  CHECK(gmma_a_mismatches<cute::SM90_64x128x16_F32BF16BF16_RS<GMMA::Major::K, GMMA::Major::MN>>(
            2, registers_exchanged) == 128 * 2 * 2);
}

TEST_CASE("wgmma descriptors decode to CuTe's canonical layouts (make_gmma_desc), every swizzle and major") {
  CHECK(all_descriptor_mismatches(emulator_decoder) == 0);
  // Reading any one bit of the start address, the leading or stride byte offset or the layout type wrongly
  // is caught. (Bits 49-51, the base offset, the emulated wgmma refuses when they are not 0: it does not
  // model them; tests/test_emulator.cpp checks that refusal.)
  for (int bit = 0; bit < 64; ++bit) {
    const bool used = bit <= 13 || (bit >= 16 && bit <= 29) || (bit >= 32 && bit <= 45) || bit >= 62;
    if (!used) continue;
    INFO("descriptor bit ", bit, " read flipped");
    const Decoder flipped = [bit](uint64_t descriptor, gm::Major major, uint32_t bytes, uint32_t mn,
                                  uint32_t k) {
      return emulator_decoder(descriptor ^ (uint64_t{1} << bit), major, bytes, mn, k);
    };
    CHECK(all_descriptor_mismatches(flipped) > 0);
  }
  // The swizzle applied with its row bits taken one position too high.
  const Decoder wrong_swizzle = [](uint64_t descriptor, gm::Major major, uint32_t bytes, uint32_t mn,
                                   uint32_t k) {
    gm::Descriptor d = gm::decode(descriptor);
    const gm::LayoutType layout = d.layout;
    d.layout = gm::LayoutType::interleave;  // unswizzled address, then a shifted swizzle
    const uint32_t plain = gm::element_address(d, major, bytes, mn, k);
    if (layout == gm::LayoutType::interleave) return plain;
    // element_address took the canonical offsets of an unswizzled layout: recompute with the real layout's
    // chunk strides by decoding with it and undoing the swizzle, then swizzle from bits 8 up.
    const uint32_t swizzled = emulator_decoder(descriptor, major, bytes, mn, k);
    const uint32_t mask = gm::chunks_per_row(layout) - 1;
    const uint32_t unswizzled = swizzled ^ (((swizzled >> 7) & mask) << 4);
    return unswizzled ^ (((unswizzled >> 8) & mask) << 4);
  };
  CHECK(all_descriptor_mismatches(wrong_swizzle) > 0);
}

TEST_CASE("TMA's swizzle modes are CuTe's swizzles of the same mode (CU_TENSOR_MAP_SWIZZLE_32B/64B/128B)") {
  CHECK(tma_swizzle_mismatches<1>() == 0);
  CHECK(tma_swizzle_mismatches<2>() == 0);
  CHECK(tma_swizzle_mismatches<3>() == 0);
  // Each mode read as its neighbour is caught.
  CHECK(tma_swizzle_mismatches<3>(-1) > 0);
  CHECK(tma_swizzle_mismatches<2>(1) > 0);
  CHECK(tma_swizzle_mismatches<1>(-1) > 0);
}
