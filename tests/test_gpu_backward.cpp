// cuda_v2's backward (cuda_v2/backward.cu) in the emulator beyond the case matrix, which
// tests/test_backward.cpp runs it over: dQ's two modes. With atomics, the order in which the key tiles'
// shares reach dQ depends on the schedule; the deterministic mode stores each tile's share and sums them in
// the order of the tiles, so its gradients are the same bits under every schedule. Both are held to the
// gradient tolerance, and so are the kernels with 128 keys a block (cuda_v2/split_q_bwd128's, 32 query rows a
// step, and cuda_v2/split_q_bwd64x128's, 64 in FlashAttention-2's warp layout) under both schedules.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/cuda/device.hpp"
#include "common/cuda/gpu_stage.hpp"
#include "common/inputs.hpp"
#include "common/reference_backward.hpp"
#include "common/tolerance.hpp"
#include "cuda_v2/backward.hpp"
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
  const emulator::ScheduleSetting before = emulator::schedule();
  emulator::set_schedule(schedule);
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
  emulator::set_schedule(before);
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

}  // namespace flashlab::testing
