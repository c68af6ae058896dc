// flashlab list, run and compare (docs/conventions.md §9: these names and flags are a contract).
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>

#include "common/error.hpp"
#include "common/flops.hpp"
#include "common/machine.hpp"
#include "common/npy.hpp"
#include "common/reference.hpp"
#include "common/registry.hpp"
#include "common/tolerance.hpp"
#include "tools/args.hpp"
#include "tools/command.hpp"
#include "tools/json.hpp"
#include "tools/ladder.hpp"

namespace flashlab::cli {

void print_emulated_legend() {
  std::printf(
      "emu: a GPU stage run in the CPU emulator of the CUDA execution model (no GPU here, or --emulate): its "
      "errors are the kernel's own,\n"
      "     * its time is the emulator's on this CPU (one run): not a GPU time, and not comparable with any "
      "speed above.\n");
}

namespace {

// ---- list
// --------------------------------------------------------------------------------------------------------
int list_command(const std::vector<std::string>& argv) {
  const Args args(argv, {}, {"--json"});
  if (!args.positional().empty()) fail("list takes no arguments (got '", args.positional()[0], "')");
  auto dtypes = [](const Implementation& impl) {
    std::string text;
    for (DType dtype : impl.dtypes) text += (text.empty() ? "" : ",") + std::string(to_string(dtype));
    return text;
  };
  if (args.has("--json")) {
    Json json;
    json.begin_array();
    for (const Implementation& impl : implementations()) {
      const std::string reason = unavailable_reason(impl), emulation = emulation_reason(impl);
      json.begin_object().field("name", impl.name).field("device", to_string(impl.device));
      json.key("dtypes").begin_array();
      for (DType dtype : impl.dtypes) json.value(to_string(dtype));
      json.end_array();
      json.field("summary", impl.summary).field("constraints", impl.constraints);
      json.field("available", reason.empty()).field("reason", reason);
      json.field("emulated", reason.empty() && !emulation.empty()).field("emulation_reason", emulation);
      json.field("backward", bool(impl.backward));
      json.end_object();
    }
    json.end_array();
    std::cout << json.str();
    return 0;
  }
  int name_width = 29;  // the name column fits the longest name
  for (const Implementation& impl : implementations())
    name_width = std::max(name_width, static_cast<int>(impl.name.size()));
  const int indent = name_width + 34;  // where the idea column starts
  std::printf("%-*s %-6s %-14s %-11s %s\n", name_width, "implementation", "device", "dtypes", "available",
              "idea / constraints");
  for (const Implementation& impl : implementations()) {
    const std::string reason = unavailable_reason(impl), emulation = emulation_reason(impl);
    const char* available = !reason.empty() ? "no" : !emulation.empty() ? "emulated" : "yes";
    std::printf("%-*s %-6s %-14s %-11s %s\n", name_width, impl.name.c_str(),
                std::string(to_string(impl.device)).c_str(), dtypes(impl).c_str(), available,
                impl.summary.c_str());
    std::printf("%-*s %s\n", indent, "", impl.constraints.c_str());
    if (!reason.empty())
      std::printf("%-*s unavailable: %s\n", indent, "", reason.c_str());
    else if (!emulation.empty())
      std::printf("%-*s runs in the CPU emulator of the CUDA execution model: %s\n", indent, "",
                  emulation.c_str());
  }
  return 0;
}

// ---- run
// ---------------------------------------------------------------------------------------------------------
int run_command(const std::vector<std::string>& argv) {
  auto valued = problem_flags();
  valued.insert({"--out", "--lse", "--repeat"});
  auto switches = problem_switches();
  switches.insert({"--no-check", "--json"});
  const Args args(argv, valued, switches);
  const Implementation* impl = &implementation_from_args(args, "run");
  const std::string& name = impl->name;
  const int64_t repeats = repeats_from_args(args, 5);
  const ProblemSetup setup = problem_from_args(args);
  const Problem p = in_own_dtype(*impl, setup.problem, args.has("--dtype"));  // as compare runs it
  require_can_run(*impl, p);

  const std::string emulation = emulation_reason(*impl);
  progress("running " + name + (emulation.empty() ? "" : " in the CPU emulator") + " ...");
  const Measurement m = measure(*impl, p, setup.inputs, static_cast<int>(repeats));
  if (auto path = args.get("--out")) write_npy(*path, m.outputs.o.shape, m.outputs.o.data);
  if (auto path = args.get("--lse")) write_npy(*path, m.outputs.lse.shape, m.outputs.lse.data);
  const double gflops = forward_flops(p) / (m.median_ms * 1e-3) / 1e9;

  std::optional<Verdict> verdict;
  if (!args.has("--no-check")) {
    progress("checking against the fp64 reference ...");
    const ReferenceResult ref = reference_attention(p, setup.inputs);
    const AttentionOutputs baseline = baseline_attention(p, setup.inputs, p.dtype, impl->rounds_p);
    verdict = judge(p, m.outputs, ref, tolerance_from_baseline(p.dtype, deviation(p, baseline, ref)));
  }
  progress("");
  if (args.has("--json")) {
    Json json;
    json.begin_object().field("impl", name).field("device", to_string(impl->device));
    problem_json(json, p, setup.input_source);
    // An emulated time is the CPU's, not a GPU's: labelled, and no rate is derived from it.
    json.field("emulated", !emulation.empty()).field("time_ms", m.median_ms).field("repeat", m.runs);
    if (emulation.empty())
      json.field("gflops", gflops);
    else
      json.key("gflops").null().field("emulation_reason", emulation);
    extra_bytes_json(json, m.extra_bytes);
    if (verdict) {
      json.field("max_err_o", verdict->deviation.max_err_o)
          .field("max_err_lse", verdict->deviation.max_err_lse);
      json.field("tol_o", verdict->tolerance.o).field("tol_lse", verdict->tolerance.lse);
      json.field("passed", verdict->passed());
    }
    std::cout << json.end_object().str();
  } else {
    std::printf("%s on %s\n  inputs: %s\n", name.c_str(), p.describe().c_str(), setup.input_source.c_str());
    if (emulation.empty())
      std::printf("  time %.3f ms (median of %d), %.2f GFLOP/s\n", m.median_ms, m.runs, gflops);
    else
      std::printf(
          "  ran in the CPU emulator of the CUDA execution model (%s): %.1f ms of CPU time, not a GPU "
          "time\n",
          emulation.c_str(), m.median_ms);
    if (verdict) std::printf("  %s: %s\n", verdict->passed() ? "PASS" : "FAIL", verdict->explain().c_str());
  }
  return verdict && !verdict->passed() ? 1 : 0;
}

// ---- compare
// -----------------------------------------------------------------------------------------------------
struct CompareRow {
  const Implementation* impl;
  DType dtype;         // the dtype it runs in (in_own_dtype)
  std::string reason;  // why it did not run; "" when it ran
  Measurement m;
  std::optional<Verdict> verdict;
  double rate = 0;        // GFLOP/s (not for an emulated run)
  std::string emulation;  // why it runs in the CPU emulator; "" when natively
  std::string failure;    // what went wrong while it ran (an ExecutionError)
};

// The CPU emulator runs a GPU stage some thousand times slower than a GPU (1 to 9 s a GFLOP on a 2-core
// machine, by stage): unless asked for (named, or --emulate), emulated rows are left out of problems above
// the first limit, with the reason; above the second when a single GPU stage takes the problem (a variant
// that only it supports, e.g. soft-capping: the one stage that can show it runs in a few seconds).
constexpr double kEmulatedFlopLimit = 0.25e9;
constexpr double kLoneEmulatedFlopLimit = 2.5e9;

// Runs `chosen` on one problem, each checked against the fp64 reference (computed once) under the
// same-precision tolerance; without `dtype_given`, each in its own dtype where it does not offer the
// problem's (in_own_dtype). Each is timed `repeats` times, or fewer within `budget_seconds` (measure()).
std::vector<CompareRow> compare_on(const std::vector<const Implementation*>& chosen,
                                   const ProblemSetup& setup, int64_t repeats, bool emulation_asked,
                                   bool dtype_given, double budget_seconds = 0) {
  const Problem& p = setup.problem;
  std::optional<ReferenceResult> ref;  // computed once, when the first implementation has run
  auto reference = [&]() -> const ReferenceResult& {
    if (!ref) {
      progress("computing the fp64 reference ...");
      ref = reference_attention(p, setup.inputs);
    }
    return *ref;
  };
  std::map<std::pair<DType, bool>, Tolerance> tolerances;  // by dtype and rounds_p
  auto tolerance = [&](const Problem& run, bool rounds_p) {
    const std::pair key{run.dtype, rounds_p};
    if (!tolerances.count(key)) {
      const AttentionOutputs baseline = baseline_attention(run, setup.inputs, run.dtype, rounds_p);
      tolerances[key] = tolerance_from_baseline(run.dtype, deviation(run, baseline, reference()));
    }
    return tolerances[key];
  };
  std::vector<CompareRow> rows;
  const double flops = forward_flops(p);
  int emulated_takers = 0;  // the GPU stages that take the problem and would run in the emulator
  for (const Implementation* impl : chosen)
    emulated_takers += !emulation_reason(*impl).empty() &&
                       why_cannot_run(*impl, in_own_dtype(*impl, p, dtype_given)).empty();
  const double emulated_limit = emulated_takers == 1 ? kLoneEmulatedFlopLimit : kEmulatedFlopLimit;
  check_injection();
  for (size_t n = 0; n < chosen.size(); ++n) {
    const Problem run = in_own_dtype(*chosen[n], p, dtype_given);
    CompareRow row{chosen[n], run.dtype, why_cannot_run(*chosen[n], run), {},
                   {},        0,         emulation_reason(*chosen[n]),    {}};
    if (row.reason.empty()) row.reason = refusal_after_failure(*row.impl);
    if (row.reason.empty() && !row.emulation.empty() && !emulation_asked && flops > emulated_limit) {
      char text[160];
      std::snprintf(text, sizeof text,
                    "runs in the CPU emulator here, slowly: %.2f GFLOP is over the %.2f GFLOP that compare "
                    "emulates unasked (name it, or pass --emulate)",
                    flops / 1e9, emulated_limit / 1e9);
      row.reason = text;
    }
    if (row.reason.empty()) {
      progress("[" + std::to_string(n + 1) + "/" + std::to_string(chosen.size()) + "] " + row.impl->name +
               " ...");
      try {
        injected_before_run(row.impl->name);
        row.m = measure(*row.impl, run, setup.inputs, static_cast<int>(repeats), budget_seconds);
      } catch (const DeviceMemoryError& error) {  // the problem's size: a row that says so, as a refusal's
        row.reason = error.what();
        rows.push_back(std::move(row));
        continue;
      } catch (const ExecutionError& error) {  // e.g. what the emulator found wrong in a kernel
        row.failure = error.what();
        note_failure(*row.impl, row.impl->name);
        rows.push_back(std::move(row));
        continue;
      }
      row.verdict = judge(run, row.m.outputs, reference(), tolerance(run, row.impl->rounds_p));
      if (row.emulation.empty()) row.rate = flops / (row.m.median_ms * 1e-3) / 1e9;
      row.m.outputs = {};  // release the outputs before the next implementation
    }
    rows.push_back(std::move(row));
  }
  progress("");
  return rows;
}

bool all_passed(const std::vector<CompareRow>& rows) {
  for (const CompareRow& row : rows)
    if (!row.failure.empty() || (row.verdict && !row.verdict->passed())) return false;
  return true;
}

void print_problem(const ProblemSetup& setup) {
  std::printf("%s, %.2f GFLOP, inputs %s\n", setup.problem.describe().c_str(),
              forward_flops(setup.problem) / 1e9, setup.input_source.c_str());
}

void print_machine(const MachineCeilings& machine) {
  std::printf("machine: %s, %d threads, FP32 FMA peak %.0f GFLOP/s (measured), copy %.1f GB/s\n",
              machine.cpu.c_str(), machine.threads, machine.fma_gflops_all, machine.copy_gbps);
}

void print_header() {
  std::printf("%-29s %-5s %10s %10s %5s %11s %9s %7s %11s  %s\n", "implementation", "dev", "err O", "err LSE",
              "ok", "time ms", "GFLOP/s", "% peak", "extra MiB", "dtype");
}

// Prints the rows; returns whether any ran in the emulator.
bool print_rows(const std::vector<CompareRow>& rows, const MachineCeilings& machine) {
  bool any_emulated = false;
  for (const CompareRow& row : rows) {
    // Emulated rows show "emu" as their device: their time is the CPU emulator's, not a GPU's.
    const std::string device = row.emulation.empty() ? std::string(to_string(row.impl->device)) : "emu";
    if (!row.failure.empty()) {
      std::printf("%-29s %-5s   FAILED: %s\n", row.impl->name.c_str(), device.c_str(), row.failure.c_str());
      continue;
    }
    if (!row.verdict) {
      std::printf("%-29s %-5s   skipped: %s\n", row.impl->name.c_str(), device.c_str(), row.reason.c_str());
      continue;
    }
    char extra[32] = "n/a";
    if (row.m.extra_bytes >= 0) std::snprintf(extra, sizeof extra, "%.1f", row.m.extra_bytes / 1048576.0);
    std::printf("%-29s %-5s %10.2e %10.2e %5s ", row.impl->name.c_str(), device.c_str(),
                row.verdict->deviation.max_err_o, row.verdict->deviation.max_err_lse,
                row.verdict->passed() ? "yes" : "NO");
    if (!row.emulation.empty()) {
      any_emulated = true;
      std::printf("%10.1f* %9s %7s %11s  %s\n", row.m.median_ms, "-", "-", extra,
                  std::string(to_string(row.dtype)).c_str());
      continue;
    }
    std::printf("%11.3f %9.1f %6.1f%% %11s  %s\n", row.m.median_ms, row.rate,
                row.impl->device == Device::cpu ? 100.0 * row.rate / machine.fma_gflops_all : 0.0, extra,
                std::string(to_string(row.dtype)).c_str());
  }
  return any_emulated;
}

void print_legend(int64_t repeats, double budget_seconds, bool any_emulated) {
  std::printf(
      "\nerrors: max |out - ref64| / max(1, |ref64|); ok: within 2x the same-precision baseline's error + "
      "floor.\n");
  if (budget_seconds > 0)
    std::printf(
        "time: median of up to %lld runs after a warm-up (fewer once a stage's runs take %.0f s in all; "
        "--repeat N for N); extra: peak heap above inputs and outputs (a CPU stage's; n/a on the GPU's).\n",
        static_cast<long long>(repeats), budget_seconds);
  else
    std::printf(
        "time: median of %lld runs after a warm-up; extra: peak heap above inputs and outputs (a CPU "
        "stage's; "
        "n/a on the GPU's).\n",
        static_cast<long long>(repeats));
  if (any_emulated) print_emulated_legend();
}

// compare with no implementation and no problem flag: every stage of the ladder, each on the problem it is
// made for, a heading and a table per problem (tools/ladder.hpp). Without --repeat, each stage's timed runs
// stop after a second in all, so that the whole view takes seconds, not minutes, with the slow rungs in it.
int compare_ladder(const Args& args, int64_t repeats) {
  const double budget_seconds = args.has("--repeat") ? 0 : 1;
  const Ladder ladder = place_on_ladder(args.has("--emulate"));
  progress("measuring the machine's FMA peak ...");
  const MachineCeilings& machine = machine_ceilings();
  print_machine(machine);
  std::printf(
      "every stage on the problem it is made for (name stages or give problem flags for one table)\n");
  bool passed = true, any_emulated = false;
  for (const LadderSection& section : ladder.sections) {
    const ProblemSetup setup = problem_from_args(Args(section.flags, problem_flags(), problem_switches()));
    std::printf("\n== %s\n", section.title.c_str());
    print_problem(setup);
    print_header();
    std::vector<CompareRow> rows = compare_on(section.stages, setup, repeats, true, true, budget_seconds);
    any_emulated |= print_rows(rows, machine);
    passed &= all_passed(rows);
    if (!section.contrast.empty()) {
      std::printf("  for contrast, placed on another problem:\n");
      rows = compare_on(section.contrast, setup, repeats, true, true, budget_seconds);
      print_rows(rows, machine);
      passed &= all_passed(rows);
    }
  }
  if (!ladder.unplaced.empty()) {
    std::printf("\n== refused every problem of the ladder\n");
    for (const auto& [impl, reason] : ladder.unplaced)
      std::printf("%-29s %s\n", impl->name.c_str(), reason.c_str());
  }
  print_legend(repeats, budget_seconds, any_emulated);
  return passed ? 0 : 1;
}

int compare_command(const std::vector<std::string>& argv) {
  auto valued = problem_flags();
  valued.insert("--repeat");
  auto switches = problem_switches();
  switches.insert({"--json", "--backward"});
  const Args args(argv, valued, switches);
  if (args.has("--backward")) return compare_backward(args);
  const int64_t repeats = repeats_from_args(args, 5);
  // The JSON form keeps one problem (the default one without flags): scripts read one "results" array.
  if (!args.has("--json") && wants_ladder(args)) return compare_ladder(args, repeats);
  const std::vector<const Implementation*> chosen = implementations_from_args(args);
  const ProblemSetup setup = problem_from_args(args);
  const Problem& p = setup.problem;

  progress("measuring the machine's FMA peak ...");
  const MachineCeilings& machine = machine_ceilings();
  const bool emulation_asked = !args.positional().empty() || args.has("--emulate");
  const std::vector<CompareRow> rows =
      compare_on(chosen, setup, repeats, emulation_asked, args.has("--dtype"));
  require_one_can_run(!args.positional().empty(), rows, "this problem");

  if (args.has("--json")) {
    Json json;
    json.begin_object();
    problem_json(json, p, setup.input_source);
    machine_json(json, machine);
    json.key("results").begin_array();
    for (const CompareRow& row : rows) {
      json.begin_object().field("impl", row.impl->name).field("device", to_string(row.impl->device));
      json.field("dtype", to_string(row.dtype));
      json.field("available", row.reason.empty()).field("reason", row.reason);
      json.field("emulated", !row.emulation.empty());
      if (!row.failure.empty()) json.field("failure", row.failure);
      if (row.verdict) {
        json.field("time_ms", row.m.median_ms);
        if (row.emulation.empty())
          json.field("gflops", row.rate);
        else
          json.key("gflops").null();  // an emulated time is the CPU's: no rate, no comparison
        json.field("max_err_o", row.verdict->deviation.max_err_o);
        json.field("max_err_lse", row.verdict->deviation.max_err_lse);
        json.field("passed", row.verdict->passed());
        extra_bytes_json(json, row.m.extra_bytes);
      } else {
        json.key("time_ms").null().key("gflops").null().key("max_err_o").null().key("max_err_lse").null();
        json.key("peak_extra_bytes").null();
      }
      json.end_object();
    }
    std::cout << json.end_array().end_object().str();
    return all_passed(rows) ? 0 : 1;
  }

  print_problem(setup);
  print_machine(machine);
  std::printf("\n");
  print_header();
  print_legend(repeats, 0, print_rows(rows, machine));
  return all_passed(rows) ? 0 : 1;
}

const CommandRegistration list{{"list", "flashlab list [--json]", list_command}};
const CommandRegistration run{{"run",
                               "flashlab run IMPL [problem flags] [--q F --k F --v F] [--out F] [--lse F] "
                               "[--repeat N] [--no-check] [--json]",
                               run_command}};
const CommandRegistration compare{
    {"compare", "flashlab compare [IMPL...] [problem flags] [--repeat N] [--backward] [--json]",
     compare_command}};

}  // namespace

}  // namespace flashlab::cli
