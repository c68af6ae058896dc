// cuda_v2's backward (cuda_v2/backward.cu) in the emulator beyond the case matrix, which
// tests/test_backward.cpp runs it over: dQ's two modes. With atomics, the order in which the key tiles'
// shares reach dQ depends on the schedule; the deterministic mode stores each tile's share and sums them in
// the order of the tiles, so its gradients are the same bits under every schedule. Both are held to the
// gradient tolerance, and so are the kernels with 128 keys a block (cuda_v2/split_q_bwd128's, 32 query rows a
// step, and cuda_v2/split_q_bwd64x128's, 64 in FlashAttention-2's warp layout) under both schedules. Last,
// cuda_v2/split_q_bwd64x128_longest_first's order of key tiles, and its blocks against the grid's kernel;
// cuda_v2/split_q_bwd64x128_tiled_dq's accumulator map, and its gradients against the grid's kernel's.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/cuda/device.hpp"
#include "common/cuda/gpu_stage.hpp"
#include "common/inputs.hpp"
#include "common/reference_backward.hpp"
#include "common/tolerance.hpp"
#include "cuda_v2/backward.hpp"
#include "cuda_v2/dq_tile.hpp"
#include "emulator/fragments.hpp"
#include "emulator/launch.hpp"
#include "tests/harness.hpp"

namespace flashlab::testing {

namespace {

// dQ's modes: by atomics or deterministic with 64 keys a block (split_q's), by atomics with 128
// (split_q_bwd128's), by atomics with 64 query rows a step over 128 keys (split_q_bwd64x128's).
enum class Mode { atomic, deterministic, atomic_128_keys, atomic_64x128 };

// The backward of `p` in the emulator under `schedule`, in `mode`.
AttentionGradients emulated_backward(const Problem& p, const AttentionInputs& inputs,
                                     const AttentionOutputs& forward, const HostTensor& d_out,
                                     const emulator::ScheduleSetting& schedule, Mode mode) {
  const ScheduleFor scope(schedule);
  AttentionGradients gradients = AttentionGradients::poisoned(p);
  const bool deterministic = mode == Mode::deterministic;
  cuda::emulated::run_backward_on_device(
      p, inputs, forward, d_out, gradients, cuda_v2::backward_workspace_bytes(p, deterministic),
      [&](const BackwardTensors& tensors) {
        if (mode == Mode::deterministic)
          cuda_v2::emulated::launch_split_q_backward_deterministic(p, tensors);
        else if (mode == Mode::atomic)
          cuda_v2::emulated::launch_split_q_backward(p, tensors);
        else if (mode == Mode::atomic_128_keys)
          cuda_v2::emulated::launch_split_q_bwd128_backward(p, tensors);
        else
          cuda_v2::emulated::launch_split_q_bwd64x128_backward(p, tensors);
      });
  return gradients;
}

}  // namespace

TEST_CASE("the GPU backward's deterministic dQ is the same bits under every schedule") {
  Problem causal_gqa = problem_shape(2, 4, 2, 150, 170, 64);  // several key tiles per query row
  causal_gqa.causal = true;
  causal_gqa.seqlens_q = {150, 97};
  causal_gqa.seqlens_k = {170, 120};
  causal_gqa.dtype = DType::bf16;
  Problem windowed = problem_shape(1, 2, 1, 200, 400, 128);  // up to 6 key tiles a row
  windowed.window_left = 300;
  windowed.window_right = 20;
  windowed.dtype = DType::f16;
  const Implementation* impl = find_implementation("cuda_v2/split_q");
  REQUIRE(impl != nullptr);
  const bool forced = cuda::emulation_forced();
  cuda::force_emulation(true);
  for (const Problem& p : {causal_gqa, windowed}) {
    INFO(p.describe());
    AttentionInputs inputs = random_inputs(p, Distribution::normal, 11);
    poison_padding(p, inputs);
    const HostTensor d_out = random_d_out(p, 12);
    const AttentionOutputs forward = run_forward(*impl, p, inputs);
    const ReferenceGradients reference = reference_backward(p, inputs, d_out);
    const GradientTolerance tolerance = gradient_tolerance_from_baseline(
        p.dtype,
        gradient_deviation(p, baseline_backward(p, inputs, d_out, p.dtype, impl->rounds_p), reference));
    const emulator::ScheduleSetting in_order{false, 0}, shuffled{true, 7};

    const AttentionGradients first =
        emulated_backward(p, inputs, forward, d_out, in_order, Mode::deterministic);
    const AttentionGradients second =
        emulated_backward(p, inputs, forward, d_out, shuffled, Mode::deterministic);
    CHECK(same_bits(first.dq, second.dq));
    CHECK(same_bits(first.dk, second.dk));
    CHECK(same_bits(first.dv, second.dv));
    const GradientVerdict deterministic = judge_gradients(p, first, reference, tolerance);
    INFO("deterministic: ", deterministic.explain());
    CHECK(deterministic.passed());

    const AttentionGradients atomic[2] = {
        emulated_backward(p, inputs, forward, d_out, in_order, Mode::atomic),
        emulated_backward(p, inputs, forward, d_out, shuffled, Mode::atomic)};
    for (const AttentionGradients& gradients : atomic) {
      const GradientVerdict verdict = judge_gradients(p, gradients, reference, tolerance);
      INFO("atomic dQ: ", verdict.explain());
      CHECK(verdict.passed());
    }
    // Where rows see many key tiles, the atomics' order shows in dQ's bits (blocks start in another order
    // under the shuffled schedule): what the deterministic mode is for.
    if (p.window_left == 300) CHECK_FALSE(same_bits(atomic[0].dq, atomic[1].dq));
    // 128 keys a block (bf16 only), 32 or 64 query rows a step: their 8 warps' barriers under the shuffled
    // schedule too.
    if (p.dtype != DType::bf16) continue;
    for (const Mode mode : {Mode::atomic_128_keys, Mode::atomic_64x128})
      for (const emulator::ScheduleSetting& schedule : {in_order, shuffled}) {
        const GradientVerdict verdict = judge_gradients(
            p, emulated_backward(p, inputs, forward, d_out, schedule, mode), reference, tolerance);
        INFO("atomic dQ, 128 keys a block, ", mode == Mode::atomic_64x128 ? "64" : "32", " rows a step, ",
             schedule.describe(), ": ", verdict.explain());
        CHECK(verdict.passed());
      }
  }
  cuda::force_emulation(forced);
}

// split_q_bwd64x128_longest_first's order is the 64 x 128 kernel's key tiles renumbered: (key tile, kv head,
// batch), in sections of pairs whose Q, dO and dQ accumulator fit in L2 unless given, the first key tile
// (under a causal mask the longest) first; a grid too large to number in an int is refused by name.
TEST_CASE("cuda_v2/split_q_bwd64x128_longest_first's order: key tiles in L2 sections, the first first") {
  Problem p = problem_shape(3, 14, 7, 1000, 1000, 128);
  p.dtype = DType::bf16;
  const cuda_v2::SplitQParams params = cuda_v2::split_q_params(p);
  const cuda::TileOrder order = cuda_v2::split_q_bwd_longest_first_order(params);
  CHECK(order.blocks == 8);  // 128 keys a key tile
  CHECK(order.heads == 7);   // kv heads: a block computes one kv head's key tile
  CHECK(order.batches == 3);
  CHECK(order.section == 16);  // 8 bytes x 2 query heads x 1000 rows x 128 a pair in 32 MiB
  CHECK(cuda_v2::split_q_bwd_longest_first_order(params, 3).section == 3);
  CHECK(cuda_v2::split_q_bwd_longest_first_order(params, 100).section == 21);  // at most every pair
  // Block i computes key tile order.mirrored(i) (backward_64x128.cu): a section's first blocks take key tile
  // 0 of each of its pairs, the longest under a causal mask, then key tile 1, and so on; every tile once.
  for (int i = 0; i < order.tiles(); ++i) {
    const cuda::Tile tile = order.mirrored(i);
    const int section_start = i / (order.section * order.blocks) * order.section;
    const int pairs_here = std::min(order.section, order.heads * order.batches - section_start);
    CHECK(tile.block == i % (order.section * order.blocks) / pairs_here);
    CHECK(tile.block == order.blocks - 1 - order(i).block);
  }
  CHECK(order.mirrored(0).block == 0);
  CHECK(order.mirrored(0).head == 0);
  CHECK(order.mirrored(order.tiles() - 1).block == order.blocks - 1);
  CHECK(order.mirrored(order.tiles() - 1).head == 6);
  CHECK(order.mirrored(order.tiles() - 1).batch == 2);
  CHECK(cuda_v2::split_q_bwd64x128_longest_first_backward_supports(p).empty());
  p.batch = 65535, p.heads_q = p.heads_kv = 65535, p.seqlen_q = p.seqlen_k = 128;
  CHECK(contains(cuda_v2::split_q_bwd64x128_longest_first_backward_supports(p),
                 "batch x heads_kv x key tiles (4294836225) must be at most 2147483647"));
  CHECK(cuda_v2::split_q_bwd64x128_backward_supports(p).empty());  // the three-dimensional grid takes it
  // The launcher's parameters hold the order to the problem.
  cuda_v2::SplitQBackwardParams backward;
  backward.forward = params;
  backward.block_n = cuda_v2::kBackwardWideBlockN;
  backward.block_m = cuda_v2::kBackwardWideBlockM;
  backward.longest_first = true;
  backward.order = cuda_v2::split_q_bwd_longest_first_order(params);
  // (Host parameters without device memory: the order passes, and the next check names a pointer.)
  CHECK(contains(error_of([&] { cuda_v2::check_split_q_backward(backward); }), "must be a device pointer"));
  const auto order_refusal = [&](int blocks, int heads, int batches, int section) {
    backward.order.blocks = blocks, backward.order.heads = heads, backward.order.batches = batches;
    backward.order.section = section;
    return error_of([&] { cuda_v2::check_split_q_backward(backward); });
  };
  CHECK(contains(order_refusal(7, 7, 3, 16),
                 "order (7 x 7 x 3 in sections of 16) must number the key tiles x heads_kv x batch"));
  CHECK(contains(order_refusal(8, 14, 3, 16), "order (8 x 14 x 3 in sections of 16) must number"));
  CHECK(contains(order_refusal(8, 7, 1, 16), "order (8 x 7 x 1 in sections of 16) must number"));
  CHECK(contains(order_refusal(8, 7, 3, 0), "in sections of at least 1"));
  backward.order = cuda_v2::split_q_bwd_longest_first_order(params);
  backward.block_m = cuda_v2::kBackwardBlockM;
  CHECK(contains(error_of([&] { cuda_v2::check_split_q_backward(backward); }),
                 "longest_first (true) takes block_m 64, not 32"));
  // dQ's accumulator in the fragments' order is the 64 x 128 kernel's, in either order of its key tiles: the
  // check goes on to the pointers.
  backward.block_m = cuda_v2::kBackwardWideBlockM;
  backward.dq_tiled = true;
  CHECK(contains(error_of([&] { cuda_v2::check_split_q_backward(backward); }), "must be a device pointer"));
  backward.longest_first = false;
  backward.block_m = cuda_v2::kBackwardBlockM;
  CHECK(contains(error_of([&] { cuda_v2::check_split_q_backward(backward); }),
                 "dq_tiled (true) takes block_m 64, not 32"));
  backward.block_m = cuda_v2::kBackwardWideBlockM;
  CHECK(contains(error_of([&] { cuda_v2::check_split_q_backward(backward); }), "must be a device pointer"));
  // Its adds and zeroing are 16 bytes wide: an accumulator off a 16-byte boundary is refused by name (the
  // pointers are made up; the check reads none of them).
  alignas(16) static float made_up[8];
  backward.d_sum = backward.dq_accum = made_up;
  backward.nonfinite = reinterpret_cast<int*>(made_up);
  backward.d_out = backward.dq = backward.dk = backward.dv = made_up;
  backward.forward.q = backward.forward.k = backward.forward.v = backward.forward.o = made_up;
  backward.forward.lse = made_up;
  CHECK(error_of([&] { cuda_v2::check_split_q_backward(backward); }) == "");
  backward.dq_accum = made_up + 2;
  CHECK(contains(error_of([&] { cuda_v2::check_split_q_backward(backward); }),
                 "dq_accum must be 16-byte aligned with dq_tiled (true)"));
  // Every kernel adds at least two floats at a time.
  backward.dq_accum = made_up + 1;
  backward.dq_tiled = false;
  CHECK(contains(error_of([&] { cuda_v2::check_split_q_backward(backward); }),
                 "dq_accum must be 8-byte aligned"));
  backward.dq_accum = made_up + 2;
  CHECK(error_of([&] { cuda_v2::check_split_q_backward(backward); }) == "");
}

// The problems on which a variant of the 64 x 128 kernel is held to split_q_bwd64x128 itself: padded rows
// and keys with NaN and Inf in the padding, GQA, a causal mask, a window at d 128 and packed batches. For
// each, `check` gets the problem, split_q_bwd64x128's gradients (in order), and what to run the variant with:
// its launcher under a schedule, on poisoned outputs.
struct GridKernelCase {
  const Problem& p;
  const AttentionGradients& expected;
  const ReferenceGradients& reference;
  const GradientTolerance& tolerance;
  std::function<AttentionGradients(const emulator::ScheduleSetting&, size_t workspace_bytes,
                                   const std::function<void(const BackwardTensors&)>&)>
      run;
};
void against_the_grid_kernel(const char* entry, const std::function<void(const GridKernelCase&)>& check) {
  Problem causal = problem_shape(2, 4, 2, 300, 400, 64);
  causal.dtype = DType::bf16;
  causal.causal = true;
  causal.seqlens_q = {300, 100};
  causal.seqlens_k = {400, 130};  // batch 1: two key tiles without a key
  Problem window = problem_shape(1, 3, 3, 257, 300, 128);
  window.dtype = DType::bf16;
  window.window_left = 90;
  const Problem packed = packed_causal_problem(64);
  const Implementation& split_q = *find_implementation("cuda_v2/split_q");
  const Implementation& variant = *find_implementation(entry);
  const bool forced = cuda::emulation_forced();
  cuda::force_emulation(true);
  for (const Problem& p : {causal, window, packed}) {
    p.validate();
    INFO(p.describe());
    REQUIRE(why_cannot_run_backward(variant, p).empty());
    AttentionInputs inputs = random_inputs(p, Distribution::normal, 21);
    poison_padding(p, inputs);
    const HostTensor d_out = random_d_out(p, 22);
    const AttentionOutputs forward = run_forward(split_q, p, inputs);
    const ReferenceGradients reference = reference_backward(p, inputs, d_out);
    const GradientTolerance tolerance = gradient_tolerance_from_baseline(
        p.dtype,
        gradient_deviation(p, baseline_backward(p, inputs, d_out, p.dtype, variant.rounds_p), reference));
    const auto run = [&](const emulator::ScheduleSetting& schedule, size_t bytes,
                         const std::function<void(const BackwardTensors&)>& launch) {
      AttentionGradients gradients = AttentionGradients::poisoned(p);
      const ScheduleFor scope(schedule);
      cuda::emulated::run_backward_on_device(p, inputs, forward, d_out, gradients, bytes, launch);
      return gradients;
    };
    const AttentionGradients expected =
        run({false, 0}, cuda_v2::backward_workspace_bytes(p, false), [&](const BackwardTensors& tensors) {
          cuda_v2::emulated::launch_split_q_bwd64x128_backward(p, tensors);
        });
    check({p, expected, reference, tolerance, run});
  }
  cuda::force_emulation(forced);
}

// Each block of split_q_bwd64x128_longest_first (and of split_q_bwd64x128_tiled_dq_longest_first) computes
// the key tile its number names in the order, with split_q_bwd64x128's code (and
// split_q_bwd64x128_tiled_dq's). In sections of 1, 3 (the last one short) and every pair, on the problems
// above, in order and (sections of 3) shuffled: dK and dV, which one block writes a key tile of, must be
// split_q_bwd64x128's bit for bit (a tile never computed shows there); dQ, which every key tile adds to by
// atomics in the order the blocks run, must pass the gradient tolerance (a tile computed twice adds its share
// twice).
TEST_CASE(
    "the 64 x 128 kernel's longest-first entries in sections of 1, 3 and every pair compute its tiles") {
  for (const bool dq_tiled : {false, true}) {
    against_the_grid_kernel(
        dq_tiled ? "cuda_v2/split_q_bwd64x128_tiled_dq_longest_first"
                 : "cuda_v2/split_q_bwd64x128_longest_first",
        [dq_tiled](const GridKernelCase& c) {
          // The last run under the shuffled schedule too: this instantiation's 8 warps and barriers, and dK
          // and dV the same bits whatever the order of the threads.
          const emulator::ScheduleSetting in_order{false, 0}, shuffled{true, 7};
          for (const auto& [section, schedule] :
               {std::pair{1, in_order}, {3, in_order}, {0, in_order}, {3, shuffled}}) {
            INFO("sections of ", section, " pairs (0: as L2 sizes them, here every pair), ",
                 schedule.describe());
            const size_t bytes =
                cuda_v2::backward_workspace_bytes(c.p, false, cuda_v2::kBackwardWideBlockN, dq_tiled);
            const AttentionGradients gradients = c.run(schedule, bytes, [&](const BackwardTensors& tensors) {
              cuda_v2::emulated::launch_split_q_bwd64x128_longest_first_sections(c.p, tensors, section,
                                                                                 dq_tiled);
            });
            CHECK(same_bits(gradients.dk, c.expected.dk));
            CHECK(same_bits(gradients.dv, c.expected.dv));
            const GradientVerdict verdict = judge_gradients(c.p, gradients, c.reference, c.tolerance);
            INFO(verdict.explain());
            CHECK(verdict.passed());
          }
        });
  }
}

// dQ's accumulator in the fragments' order (cuda_v2/dq_tile.hpp): thread t's accumulator (mt, nt) of the 64 x
// 128 kernel's dQ product, whose elements are where the mma's accumulator layout puts them (emulator/
// fragments.hpp's, held to CuTe's by tests/test_fragments.cpp) in its warp's 32 rows x head_dim / 4 columns,
// lies at fragment(t, mt, nt), its 4 floats together; element(row, col) finds the same place from the other
// side; every element of the 64-row tile has one place; and a warp's 32 lanes fill 512 contiguous bytes.
TEST_CASE("dQ's accumulator in the fragments' order holds each element once, where its thread adds it") {
  namespace mma = emulator::fragments::m16n8k16;
  for (const int head_dim : {64, 128}) {
    const cuda_v2::DqFragmentTile tile{head_dim};
    std::vector<int> seen(static_cast<size_t>(tile.elements()), 0);
    int wrong = 0, apart = 0;
    for (int thread = 0; thread < cuda_v2::DqFragmentTile::kThreads; ++thread)
      for (int mt = 0; mt < 2; ++mt)
        for (int nt = 0; nt < tile.n_tiles(); ++nt) {
          const int warp = thread / 32, lane = thread % 32;
          apart += tile.fragment(thread, mt, nt) != tile.fragment(32 * warp, mt, nt) + 4 * lane;
          for (int e = 0; e < mma::c_registers; ++e) {
            const emulator::fragments::Element in_tile = mma::c(lane, e);
            const int row = cuda_v2::DqFragmentTile::first_row(warp) + 16 * mt + in_tile.row;
            const int col = tile.first_col(warp) + 8 * nt + in_tile.col;
            const int at = tile.fragment(thread, mt, nt) + e;
            wrong += tile.element(row, col) != at;
            if (at >= 0 && at < tile.elements()) ++seen[static_cast<size_t>(at)];
          }
        }
    INFO("head_dim ", head_dim);
    CHECK(wrong == 0);
    CHECK(apart == 0);
    CHECK(std::count(seen.begin(), seen.end(), 1) == tile.elements());
  }
}

// split_q_bwd64x128_tiled_dq is split_q_bwd64x128 with dQ's adds in the fragments' order: dK and dV must be
// its bits; dQ, read back from the tiles by dq_kernel (and zeroed through the same map), must be its bits too
// in order, where both kernels' blocks add in the same order, and pass the gradient tolerance shuffled. Rows
// past a sequence's end (300 and 100 of 320 and 128 tiled rows, packed 200, 1 and 129) add into the tiles'
// padding, which no one reads.
TEST_CASE("cuda_v2/split_q_bwd64x128_tiled_dq's gradients are the row order's") {
  against_the_grid_kernel("cuda_v2/split_q_bwd64x128_tiled_dq", [](const GridKernelCase& c) {
    for (const emulator::ScheduleSetting& schedule :
         {emulator::ScheduleSetting{false, 0}, emulator::ScheduleSetting{true, 7}}) {
      INFO(schedule.describe());
      const AttentionGradients gradients =
          c.run(schedule, cuda_v2::backward_workspace_bytes(c.p, false, cuda_v2::kBackwardWideBlockN, true),
                [&](const BackwardTensors& tensors) {
                  cuda_v2::emulated::launch_split_q_bwd64x128_tiled_dq_backward(c.p, tensors);
                });
      CHECK(same_bits(gradients.dk, c.expected.dk));
      CHECK(same_bits(gradients.dv, c.expected.dv));
      if (!schedule.shuffled) CHECK(same_bits(gradients.dq, c.expected.dq));
      const GradientVerdict verdict = judge_gradients(c.p, gradients, c.reference, c.tolerance);
      INFO(verdict.explain());
      CHECK(verdict.passed());
    }
  });
}

}  // namespace flashlab::testing
