// flashlab profile IMPL [problem flags] [--pass forward|backward] [--json]: what a GPU profiler would count
// for one forward pass of a GPU stage, or one backward pass (the forward before it is not counted), counted
// in the CPU emulator of the CUDA execution model (emulator/counters.hpp), beside the stage's own traffic
// model (Implementation::bytes_moved; for the backward, the minimum: inputs read once, gradients written
// once) and the FLOP count the roofline uses. Always
// emulated, even where a GPU is present: the counts are exact and deterministic, and they are counts, not
// times. (On a GPU, NVIDIA's Nsight Compute measures the same requests with its l1tex and lts metrics, and
// the DRAM traffic behind them with dram__bytes_read.sum and dram__bytes_write.sum.)
#include <cstdio>
#include <iostream>

#include "common/cuda/device.hpp"
#include "common/error.hpp"
#include "common/flops.hpp"
#include "common/reference.hpp"
#include "common/reference_backward.hpp"
#include "common/registry.hpp"
#include "common/roofline.hpp"
#include "common/tolerance.hpp"
#include "emulator/counters.hpp"
#include "tools/args.hpp"
#include "tools/command.hpp"
#include "tools/json.hpp"

namespace flashlab::cli {

namespace {

// One pass of `impl` on `p`, counted; and whether its outputs (or gradients) pass against the fp64 reference.
struct CountedPass {
  emulator::Counters counted;
  bool passed = false;
  std::string verdict;
};

// What the emulator counts while `run` runs (counting stops also when it throws).
template <class Run>
emulator::Counters counted(Run run) {
  emulator::start_counting();
  try {
    run();
  } catch (...) {
    emulator::stop_counting();
    throw;
  }
  return emulator::stop_counting();
}

CountedPass count_forward(const Implementation& impl, const Problem& p, const AttentionInputs& inputs) {
  progress("running " + impl.name + " in the CPU emulator, counting ...");
  AttentionOutputs outputs;
  CountedPass pass;
  pass.counted = counted([&] { outputs = run_forward(impl, p, inputs); });
  progress("checking against the fp64 reference ...");
  const ReferenceResult ref = reference_attention(p, inputs);
  const AttentionOutputs baseline = baseline_attention(p, inputs, p.dtype, impl.rounds_p);
  const Verdict verdict =
      judge(p, outputs, ref, tolerance_from_baseline(p.dtype, deviation(p, baseline, ref)));
  pass.passed = verdict.passed();
  pass.verdict = verdict.explain();
  return pass;
}

// dO as flashlab grad draws it without --do: seeded random, the input seed + 1.
CountedPass count_backward(const Implementation& impl, const Problem& p, const AttentionInputs& inputs,
                           uint64_t d_out_seed) {
  progress("running " + impl.name + " forward in the CPU emulator (not counted) ...");
  const AttentionOutputs forward = run_forward(impl, p, inputs);
  const HostTensor d_out = random_d_out(p, d_out_seed);
  AttentionGradients gradients = AttentionGradients::poisoned(p);
  progress("running " + impl.name + " backward in the CPU emulator, counting ...");
  CountedPass pass;
  pass.counted = counted([&] { impl.backward(p, inputs, forward, d_out, gradients); });
  progress("checking against the fp64 reference backward ...");
  const AttentionGradients baseline = baseline_backward(p, inputs, d_out, p.dtype, impl.rounds_p);
  const ReferenceGradients ref = reference_backward(p, inputs, d_out);
  const GradientVerdict verdict = judge_gradients(
      p, gradients, ref, gradient_tolerance_from_baseline(p.dtype, gradient_deviation(p, baseline, ref)));
  pass.passed = verdict.passed();
  pass.verdict = verdict.explain();
  return pass;
}

int profile_command(const std::vector<std::string>& argv) {
  auto valued = problem_flags();
  valued.insert("--pass");
  auto switches = problem_switches();
  switches.insert("--json");
  const Args args(argv, valued, switches);
  const Implementation& impl = implementation_from_args(args, "profile");
  const std::string pass_name = args.get("--pass").value_or("forward");
  if (pass_name != "forward" && pass_name != "backward")
    fail("--pass (", pass_name, ") must be forward or backward");
  const bool backward = pass_name == "backward";
  if (impl.device != Device::cuda)
    fail(impl.name,
         " runs on the CPU: profile counts what a GPU kernel does (see flashlab list for the GPU ones)");
  if (!emulator::counting_complete())
    fail(
        "this build (the sanitizer's) does not see every global access of emulated kernels: profile with the "
        "release build");
  cuda::force_emulation(true);
  const ProblemSetup setup = problem_from_args(args);
  const Problem p = in_own_dtype(impl, setup.problem, args.has("--dtype"));  // as compare runs it
  require_can_run(impl, p, backward);

  const CountedPass pass =
      backward ? count_backward(impl, p, setup.inputs, static_cast<uint64_t>(args.get_int("--seed", 0) + 1))
               : count_forward(impl, p, setup.inputs);
  progress("");
  const emulator::Counters& counted = pass.counted;

  const double bytes = static_cast<double>(counted.global_read_bytes + counted.global_write_bytes);
  const Traffic model =
      backward ? Traffic{backward_min_bytes(p, element_bytes(p.dtype)), false} : forward_traffic(impl, p);
  const double flops = backward ? backward_flops(p) : forward_flops(p);
  if (args.has("--json")) {
    Json json;
    json.begin_object().field("impl", impl.name).field("pass", pass_name).field("counted_in", "emulator");
    problem_json(json, p, setup.input_source);
    json.field("launches", static_cast<double>(counted.launches))
        .field("blocks", static_cast<double>(counted.blocks));
    json.field("global_read_bytes", static_cast<double>(counted.global_read_bytes))
        .field("global_write_bytes", static_cast<double>(counted.global_write_bytes))
        .field("global_atomic_bytes", static_cast<double>(counted.global_atomic_bytes));
    json.field("model_bytes", model.bytes).field("model_declared", model.modeled);
    json.field("mma_sync", static_cast<double>(counted.mma_sync))
        .field("wgmma", static_cast<double>(counted.wgmma))
        .field("tensor_flops", counted.tensor_flops);
    json.key("memory_instructions").begin_array();
    for (int kind = 0; kind < emulator::kAccessKinds; ++kind) {
      const auto access = static_cast<emulator::Access>(kind);
      const emulator::AccessCounts& c = counted[access];
      json.begin_object()
          .field("kind", emulator::access_name(access))
          .field("unit", emulator::counts_sectors(access) ? "sectors" : "wavefronts")
          .field("instructions", static_cast<double>(c.instructions))
          .field("count", static_cast<double>(c.units))
          .field("ideal", static_cast<double>(c.ideal))
          .end_object();
    }
    json.end_array();
    json.field("barriers", static_cast<double>(counted.barriers))
        .field("mbarrier_waits", static_cast<double>(counted.mbarrier_waits));
    json.field("flops", flops).field("passed", pass.passed);
    std::cout << json.end_object().str();
    return pass.passed ? 0 : 1;
  }
  std::printf("%s%s on %s\n", impl.name.c_str(), backward ? " backward" : "", p.describe().c_str());
  std::printf(
      "counted in the CPU emulator of the CUDA execution model: exact counts of one %s pass, not a\n"
      "GPU measurement and not a time\n\n",
      pass_name.c_str());
  std::printf("  launches, blocks       %llu, %llu\n", static_cast<unsigned long long>(counted.launches),
              static_cast<unsigned long long>(counted.blocks));
  std::printf("  global bytes           read %.3f MB, written %.3f MB, total %.3f MB\n",
              counted.global_read_bytes / 1e6, counted.global_write_bytes / 1e6, bytes / 1e6);
  if (counted.global_atomic_bytes > 0)
    std::printf("  global atomics         %.3f MB read, modified and written\n",
                counted.global_atomic_bytes / 1e6);
  std::printf("  traffic model          %.3f MB (%s): counted / model = %.3f\n", model.bytes / 1e6,
              model.modeled ? "the stage's bytes_moved"
              : backward    ? "the backward's minimum: inputs read once, gradients written once"
                            : "no model declared: inputs read once, outputs written once",
              model.bytes > 0 ? bytes / model.bytes : 0.0);
  std::printf("\n  %-20s %14s %14s %14s  %s\n", "memory instructions", "warp instr.", "sectors or", "ideal",
              "excess");
  std::printf("  %-20s %14s %14s %14s\n", "", "(all warps)", "wavefronts", "");
  for (int kind = 0; kind < emulator::kAccessKinds; ++kind) {
    const auto access = static_cast<emulator::Access>(kind);
    const emulator::AccessCounts& c = counted[access];
    if (c.instructions == 0) continue;
    char excess[64] = "none";
    if (c.units != c.ideal)
      std::snprintf(excess, sizeof excess, "%.2fx the ideal (%s)", double(c.units) / double(c.ideal),
                    emulator::counts_sectors(access) ? "uncoalesced" : "bank conflicts");
    std::printf("  %-20s %14llu %14llu %14llu  %s\n", emulator::access_name(access),
                static_cast<unsigned long long>(c.instructions), static_cast<unsigned long long>(c.units),
                static_cast<unsigned long long>(c.ideal), excess);
  }
  std::printf("  %-20s %14llu warp arrivals (all warps); mbarrier waits %llu (thread waits)\n\n", "barriers",
              static_cast<unsigned long long>(counted.barriers),
              static_cast<unsigned long long>(counted.mbarrier_waits));
  std::printf("  tensor-core instr.     mma.sync %llu, wgmma %llu: %.4f GFLOP on tensor cores\n",
              static_cast<unsigned long long>(counted.mma_sync),
              static_cast<unsigned long long>(counted.wgmma), counted.tensor_flops / 1e9);
  std::printf("  FLOPs (%s count) %.4f GFLOP: %.1f FLOP/byte counted, %.1f by the model\n",
              backward ? "backward" : "forward", flops / 1e9, arithmetic_intensity(flops, bytes),
              arithmetic_intensity(flops, model.bytes));
  std::printf("  result                 %s: %s\n", pass.passed ? "PASS" : "FAIL", pass.verdict.c_str());
  std::printf(
      "\nglobal bytes: every byte of device memory the kernels' loads, stores, cp.async sources and TMA "
      "copies\n"
      "access; sectors: the 32-byte segments a warp's access touches, against the fewest its bytes fit in;\n"
      "wavefronts: shared-memory passes of 32 banks x 4 bytes, against one per phase "
      "(emulator/counters.hpp).\n"
      "Tensor-core FLOPs include what padding and masked tiles compute. Launches and blocks count every\n"
      "kernel of the pass, the NaN/Inf exact pass after a forward included (common/cuda/exact_rows.hpp;\n"
      "after a full kernel it exits at once where no row met a special value, after a core it reads O).\n"
      "Instructions and barriers are summed over all warps of all launches.\n");
  return pass.passed ? 0 : 1;
}

const CommandRegistration profile{{"profile",
                                   "flashlab profile IMPL [problem flags] [--pass forward|backward] [--json] "
                                   "  (counted in the CPU emulator)",
                                   profile_command}};

}  // namespace

}  // namespace flashlab::cli
