// flashlab grad (one implementation's backward pass) and compare --backward (every backward side by side).
// Same contract as run and compare: random seeded inputs unless files are given, exit 1 beyond tolerance, 2
// for invalid or unsupported input with a one-line message naming the field.
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>

#include "common/error.hpp"
#include "common/flops.hpp"
#include "common/memory_meter.hpp"
#include "common/npy.hpp"
#include "common/reference_backward.hpp"
#include "common/timing.hpp"
#include "common/tolerance.hpp"
#include "tools/args.hpp"
#include "tools/command.hpp"
#include "tools/json.hpp"

namespace flashlab::cli {

namespace {

// A timed backward: the first run is the checked one and is measured for extra memory; the time is the median
// of `repeats` further runs, or, for an implementation that runs in the CPU emulator, the checked run's own
// (as measure() times a forward). The forward (O, LSE) is run once beforehand and is not timed.
struct BackwardMeasurement {
  AttentionGradients gradients;
  double median_ms = 0;
  int64_t extra_bytes = -1;  // peak heap above inputs, forward outputs and gradients; -1 when not measured
};

BackwardMeasurement measure_backward(const Implementation& impl, const Problem& p, const AttentionInputs& in,
                                     const AttentionOutputs& fwd, const HostTensor& d_out, int repeats) {
  BackwardMeasurement m;
  m.gradients = AttentionGradients::poisoned(p);
  memory_meter::reset_peak();
  const int64_t before = memory_meter::in_use();
  m.median_ms =
      1e3 * time_pass(
                impl, repeats, 0,
                [&] {
                  impl.backward(p, in, fwd, d_out, m.gradients);  // the checked run, also the warm-up
                  if (heap_metered(impl)) m.extra_bytes = memory_meter::peak() - before;
                },
                [&] {
                  AttentionGradients scratch = AttentionGradients::poisoned(p);
                  impl.backward(p, in, fwd, d_out, scratch);
                })
                .median_seconds;
  return m;
}

// dO from --do (float32 or float64, O's shape), else seeded random (the input seed + 1).
HostTensor d_out_from_args(const Args& args, const Problem& p, std::string& source) {
  if (auto path = args.get("--do")) {
    HostTensor d_out(p.q_shape());
    load_tensor(read_npy(*path, "--do"), "--do", *path, d_out,
                p.packed() ? "[total_q, heads, head_dim]" : "[batch, seqlen_q, heads, head_dim]");
    source = *path;
    return d_out;
  }
  const int64_t seed = args.get_int("--seed", 0) + 1;
  source = "random normal, seed " + std::to_string(seed);
  return random_d_out(p, static_cast<uint64_t>(seed));
}

GradientVerdict check_gradients(const Problem& p, const AttentionInputs& in, const HostTensor& d_out,
                                const AttentionGradients& grad, const ReferenceGradients& ref,
                                bool rounds_p) {
  const AttentionGradients baseline = baseline_backward(p, in, d_out, p.dtype, rounds_p);
  return judge_gradients(p, grad, ref,
                         gradient_tolerance_from_baseline(p.dtype, gradient_deviation(p, baseline, ref)));
}

void verdict_json(Json& json, const GradientVerdict& verdict) {
  json.field("max_err_dq", verdict.deviation.max_err_dq).field("max_err_dk", verdict.deviation.max_err_dk);
  json.field("max_err_dv", verdict.deviation.max_err_dv);
  json.field("tol_dq", verdict.tolerance.dq).field("tol_dk", verdict.tolerance.dk);
  json.field("tol_dv", verdict.tolerance.dv).field("passed", verdict.passed());
}

// ---- grad
// --------------------------------------------------------------------------------------------------------
int grad_command(const std::vector<std::string>& argv) {
  auto valued = problem_flags();
  valued.insert({"--do", "--dq", "--dk", "--dv", "--repeat"});
  auto switches = problem_switches();
  switches.insert({"--no-check", "--json"});
  const Args args(argv, valued, switches);
  const Implementation* impl = &implementation_from_args(args, "grad");
  const std::string& name = impl->name;
  const int64_t repeats = repeats_from_args(args, 5);
  const ProblemSetup setup = problem_from_args(args);
  const Problem p = in_own_dtype(*impl, setup.problem, args.has("--dtype"));  // as compare runs it
  require_can_run(*impl, p, true);
  std::string d_out_source;
  const HostTensor d_out = d_out_from_args(args, p, d_out_source);

  const std::string emulation = emulation_reason(*impl);
  progress("running " + name + (emulation.empty() ? "" : " in the CPU emulator") + " forward ...");
  const AttentionOutputs fwd = run_forward(*impl, p, setup.inputs);
  progress("running " + name + " backward ...");
  const BackwardMeasurement m =
      measure_backward(*impl, p, setup.inputs, fwd, d_out, static_cast<int>(repeats));
  auto write = [&](const char* flag, const HostTensor& gradient) {
    const auto path = args.get(flag);
    if (!path) return;
    try {
      write_npy(*path, gradient.shape, gradient.data);
    } catch (const Error& error) {
      fail(flag, ": ", error.what());
    }
  };
  write("--dq", m.gradients.dq);
  write("--dk", m.gradients.dk);
  write("--dv", m.gradients.dv);
  const double gflops = backward_flops(p) / (m.median_ms * 1e-3) / 1e9;

  std::optional<GradientVerdict> verdict;
  if (!args.has("--no-check")) {
    progress("checking against the fp64 reference backward ...");
    verdict = check_gradients(p, setup.inputs, d_out, m.gradients, reference_backward(p, setup.inputs, d_out),
                              impl->rounds_p);
  }
  progress("");
  if (args.has("--json")) {
    Json json;
    json.begin_object().field("impl", name).field("device", to_string(impl->device));
    problem_json(json, p, setup.input_source);
    json.field("d_out", d_out_source).field("backward_gflop", backward_flops(p) / 1e9);
    // An emulated time is the CPU's, not a GPU's: labelled, and no rate is derived from it.
    json.field("emulated", !emulation.empty()).field("time_ms", m.median_ms);
    json.field("repeat", emulation.empty() ? repeats : 1);  // the runs the time is the median of
    if (emulation.empty())
      json.field("gflops", gflops);
    else
      json.key("gflops").null().field("emulation_reason", emulation);
    extra_bytes_json(json, m.extra_bytes);
    if (verdict) verdict_json(json, *verdict);
    std::cout << json.end_object().str();
  } else {
    std::printf("%s backward on %s\n  inputs: %s; dO: %s\n", name.c_str(), p.describe().c_str(),
                setup.input_source.c_str(), d_out_source.c_str());
    if (emulation.empty())
      std::printf("  time %.3f ms (median of %lld), %.2f GFLOP/s (backward counted as 2.5x forward)\n",
                  m.median_ms, static_cast<long long>(repeats), gflops);
    else
      std::printf(
          "  ran in the CPU emulator of the CUDA execution model (%s): %.1f ms of CPU time, not a GPU "
          "time\n",
          emulation.c_str(), m.median_ms);
    if (m.extra_bytes >= 0) std::printf("  extra memory %.1f MiB\n", m.extra_bytes / 1048576.0);
    if (verdict) std::printf("  %s: %s\n", verdict->passed() ? "PASS" : "FAIL", verdict->explain().c_str());
  }
  return verdict && !verdict->passed() ? 1 : 0;
}

const CommandRegistration grad{
    {"grad",
     "flashlab grad IMPL [problem flags] [--q F --k F --v F --do F] [--dq F --dk F "
     "--dv F] [--repeat N] [--no-check] [--json]",
     grad_command}};

}  // namespace

// ---- compare --backward
// -----------------------------------------------------------------------------------------
int compare_backward(const Args& args) {
  const std::vector<const Implementation*> chosen =
      implementations_from_args(args, [](const Implementation& impl) { return bool(impl.backward); });
  const int64_t repeats = repeats_from_args(args, 5);
  const ProblemSetup setup = problem_from_args(args);
  const Problem& p = setup.problem;
  std::string d_out_source;
  const HostTensor d_out = d_out_from_args(args, p, d_out_source);

  progress("measuring the machine's FMA peak ...");
  const MachineCeilings& machine = machine_ceilings();
  std::optional<ReferenceGradients> ref;  // computed once, when the first implementation has run
  struct Row {
    const Implementation* impl;
    Problem problem;  // p, in the implementation's own dtype unless --dtype was given (in_own_dtype)
    std::string reason;
    BackwardMeasurement m;
    std::optional<GradientVerdict> verdict;
    double rate = 0;      // GFLOP/s
    std::string failure;  // what went wrong while it ran (an ExecutionError)
  };
  std::vector<Row> rows;
  bool all_passed = true;
  const double flops = backward_flops(p);
  // Per dtype and Implementation::rounds_p (the baseline differs).
  std::map<std::pair<DType, bool>, GradientTolerance> tolerances;
  check_injection();
  for (size_t n = 0; n < chosen.size(); ++n) {
    const Problem run = in_own_dtype(*chosen[n], p, args.has("--dtype"));
    Row row{chosen[n], run, why_cannot_run_backward(*chosen[n], run), {}, {}, 0, {}};
    if (row.reason.empty()) row.reason = refusal_after_failure(*row.impl);
    if (row.reason.empty()) {
      progress("[" + std::to_string(n + 1) + "/" + std::to_string(chosen.size()) + "] " + row.impl->name +
               " ...");
      try {
        injected_before_run(row.impl->name);
        const AttentionOutputs fwd = run_forward(*row.impl, run, setup.inputs);
        row.m = measure_backward(*row.impl, run, setup.inputs, fwd, d_out, static_cast<int>(repeats));
      } catch (const DeviceMemoryError& error) {  // the problem's size: a row that says so, as a refusal's
        row.reason = error.what();
        rows.push_back(std::move(row));
        continue;
      } catch (const ExecutionError& error) {  // e.g. what the emulator found wrong in a kernel
        row.failure = error.what();
        note_failure(*row.impl, row.impl->name);
        all_passed = false;
        rows.push_back(std::move(row));
        continue;
      }
      if (!ref) {
        progress("computing the fp64 reference backward ...");
        ref = reference_backward(p, setup.inputs, d_out);
      }
      const std::pair key{run.dtype, row.impl->rounds_p};
      if (!tolerances.contains(key)) {
        row.verdict = check_gradients(run, setup.inputs, d_out, row.m.gradients, *ref, row.impl->rounds_p);
        tolerances[key] = row.verdict->tolerance;
      } else {
        row.verdict = judge_gradients(run, row.m.gradients, *ref, tolerances[key]);
      }
      row.rate = flops / (row.m.median_ms * 1e-3) / 1e9;
      all_passed &= row.verdict->passed();
      row.m.gradients = {};  // release the gradients before the next implementation
    }
    rows.push_back(std::move(row));
  }
  progress("");
  require_one_can_run(!args.positional().empty(), rows, "this problem backward");

  if (args.has("--json")) {
    Json json;
    json.begin_object();
    problem_json(json, p, setup.input_source);
    json.field("d_out", d_out_source).field("backward_gflop", flops / 1e9);
    machine_json(json, machine);
    json.key("results").begin_array();
    for (const Row& row : rows) {
      json.begin_object().field("impl", row.impl->name).field("device", to_string(row.impl->device));
      json.field("dtype", to_string(row.problem.dtype));
      json.field("available", row.reason.empty()).field("reason", row.reason);
      const bool emulated = !emulation_reason(*row.impl).empty();
      json.field("emulated", emulated);
      if (!row.failure.empty()) json.field("failure", row.failure);
      if (row.verdict) {
        json.field("time_ms", row.m.median_ms);
        if (emulated)
          json.key("gflops").null();  // an emulated time is the CPU's, not a GPU's
        else
          json.field("gflops", row.rate);
        verdict_json(json, *row.verdict);
        extra_bytes_json(json, row.m.extra_bytes);
      } else {
        json.key("time_ms").null().key("gflops").null().key("peak_extra_bytes").null();
      }
      json.end_object();
    }
    std::cout << json.end_array().end_object().str();
    return all_passed ? 0 : 1;
  }

  std::printf("backward: %s, %.2f GFLOP (2.5x forward), inputs %s, dO %s\n", p.describe().c_str(),
              flops / 1e9, setup.input_source.c_str(), d_out_source.c_str());
  std::printf("machine: %s, %d threads, FP32 FMA peak %.0f GFLOP/s (measured), copy %.1f GB/s\n\n",
              machine.cpu.c_str(), machine.threads, machine.fma_gflops_all, machine.copy_gbps);
  std::printf("%-26s %-5s %10s %10s %10s %5s %11s %9s %7s %11s  %s\n", "implementation", "dev", "err dQ",
              "err dK", "err dV", "ok", "time ms", "GFLOP/s", "% peak", "extra MiB", "dtype");
  bool any_emulated = false;
  for (const Row& row : rows) {
    // Emulated rows show "emu" as their device, their time marked with a `*` and no rate: their time is the
    // CPU emulator's, not a GPU's (the legend below says so).
    const bool emulated = !emulation_reason(*row.impl).empty();
    const std::string device = emulated ? "emu" : std::string(to_string(row.impl->device));
    if (!row.verdict) {
      std::printf("%-26s %-5s   %s: %s\n", row.impl->name.c_str(), device.c_str(),
                  row.failure.empty() ? "skipped" : "FAILED",
                  (row.failure.empty() ? row.reason : row.failure).c_str());
      continue;
    }
    char extra[32] = "n/a";
    if (row.m.extra_bytes >= 0) std::snprintf(extra, sizeof extra, "%.1f", row.m.extra_bytes / 1048576.0);
    const GradientDeviation& dev = row.verdict->deviation;
    any_emulated |= emulated;
    char time[24], rate[16] = "-", peak[16] = "-";
    if (emulated)
      std::snprintf(time, sizeof time, "%10.1f*", row.m.median_ms);
    else
      std::snprintf(time, sizeof time, "%11.3f", row.m.median_ms);
    if (!emulated) std::snprintf(rate, sizeof rate, "%.1f", row.rate);
    if (row.impl->device == Device::cpu)
      std::snprintf(peak, sizeof peak, "%.1f%%", 100.0 * row.rate / machine.fma_gflops_all);
    std::printf("%-26s %-5s %10.2e %10.2e %10.2e %5s %s %9s %7s %11s  %s\n", row.impl->name.c_str(),
                device.c_str(), dev.max_err_dq, dev.max_err_dk, dev.max_err_dv,
                row.verdict->passed() ? "yes" : "NO", time, rate, peak, extra,
                std::string(to_string(row.problem.dtype)).c_str());
  }
  std::printf(
      "\nerrors: max |grad - ref64| / max(1, |ref64|); ok: within 2x the same-precision naive backward's "
      "error + "
      "floor.\ntime: backward only (the forward runs once before), median of %lld runs after a warm-up; "
      "extra: "
      "peak heap above inputs, forward outputs and gradients (a CPU stage's; n/a on the GPU's).\n",
      static_cast<long long>(repeats));
  if (any_emulated) print_emulated_legend();
  return all_passed ? 0 : 1;
}

}  // namespace flashlab::cli
