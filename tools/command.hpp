// The tool's commands. Each command registers itself from its own file (like implementations do), so adding
// one needs no change to main(): `flashlab help` lists them all.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/machine.hpp"
#include "common/problem.hpp"
#include "common/registry.hpp"
#include "common/tensor.hpp"
#include "common/timing.hpp"

namespace flashlab::cli {

struct Command {
  std::string name;   // the word after `flashlab`
  std::string usage;  // one or more lines for `flashlab help`, e.g. "flashlab list [--json]"
  std::function<int(const std::vector<std::string>& args)> run;  // returns the exit code
};

struct CommandRegistration {
  explicit CommandRegistration(Command command);
};

const std::vector<Command>& commands();  // in registration order, by name

// A timed, checked run of one implementation: the first run is checked and measured for extra memory, the
// time is the median of `repeats` further runs.
struct Measurement {
  AttentionOutputs outputs;
  double median_ms = 0;
  int runs = 0;              // the timed runs median_ms is the median of
  int64_t extra_bytes = -1;  // peak heap above inputs and outputs; -1 when not measured
};
// Runs once checked (outputs kept, peak memory measured; also the warm-up), then `repeats` timed runs, or
// fewer once they have taken `budget_seconds` in all (0: no budget; common/timing.hpp). An implementation
// that runs in the CPU emulator is timed on its one checked run.
Measurement measure(const Implementation& impl, const Problem& p, const AttentionInputs& in, int repeats,
                    double budget_seconds = 0);

// Whether a run's extra memory (its peak heap above inputs and outputs) is measured: for a CPU stage, where
// the heap is its workspace. A GPU stage's workspace is device memory, and an emulated one's heap is the
// emulator's (its device memory, its blocks' stacks): "n/a" in the tables, null in JSON.
bool heap_metered(const Implementation& impl);

// The problem `impl` takes in a side-by-side view: `p`, or, where the user named no dtype and `impl` does not
// offer p's, `p` in the implementation's own first dtype (the 16-bit GPU stages next to the f32 CPU stages on
// the same f32 inputs, each held to the tolerance of the dtype it ran in).
Problem in_own_dtype(const Implementation& impl, const Problem& p, bool dtype_given);

// The time of one implementation's pass. `checked` is its checked run, which is also the warm-up; for an
// implementation that runs in the CPU emulator that run alone is timed (its time says how long the emulator
// took, nothing about a GPU), else the median of up to `repeats` runs of `again` after it
// (common/timing.hpp).
template <typename Checked, typename Again>
Timing time_pass(const Implementation& impl, int repeats, double budget_seconds, Checked&& checked,
                 Again&& again) {
  const auto start = std::chrono::steady_clock::now();
  checked();
  if (!emulation_reason(impl).empty())
    return {std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1};
  return time_after_warm_up(repeats, budget_seconds, again);
}

// Where the user named the implementations (`named`) and every one refused the problem (each row's `reason`
// is why; "" when it ran): invalid input, exit 2, with each one's reason, not a table of skipped rows.
template <typename Row>
void require_one_can_run(bool named, const std::vector<Row>& rows, const char* what) {
  if (!named || std::any_of(rows.begin(), rows.end(), [](const Row& row) { return row.reason.empty(); }))
    return;
  std::string reasons;
  for (const Row& row : rows) reasons += (reasons.empty() ? "" : "; ") + row.impl->name + ": " + row.reason;
  fail("no named implementation can run ", what, " (", reasons, ")");
}

// After an implementation failed as it ran (an ExecutionError): whether the failure left the GPU unusable for
// this process (cuda::device_fault: an illegal address, say, after which every CUDA call here fails), and if
// so why each later stage that would run on it is not run. The state is the process's, as the CUDA context is
// (compare's ladder runs several tables); compare, compare --backward and gpu-bench share it.
void note_failure(const Implementation& impl, const std::string& name);  // `name` as its table names it
std::string refusal_after_failure(const Implementation& impl);           // "" when `impl` can still run here

// Fault drills, with no faulty kernel: the environment variable FLASHLAB_INJECT, "fault:IMPL", "hang:IMPL" or
// "oom:IMPL", makes IMPL's run throw as a GPU fault that leaves the device unusable would, never return, or
// throw as a device allocation too large for the GPU's memory does. The GPU report's rehearsal and the tool's
// tests use it to check what a kernel's failure costs (compare, compare --backward, gpu-bench call this
// before each run). Unset, it does nothing; check_injection() refuses a value not of that form (exit 2), and
// each of those commands calls it before anything runs.
void injected_before_run(const std::string& impl);
void check_injection();

// The legend under a table with emulated rows: their time is the CPU emulator's, marked with a `*` in the
// time column, and never a GPU time (compare, and compare --backward).
void print_emulated_legend();

// Writes a progress line to stderr when it is a terminal (erased by the next one; "" clears it).
void progress(const std::string& text);

// `flashlab compare --backward` (tools/cmd_grad.cpp): the backward passes side by side.
class Args;
int compare_backward(const Args& args);

class Json;
void problem_json(Json& json, const Problem& p, const std::string& source);
void extra_bytes_json(Json& json, int64_t extra_bytes);  // "peak_extra_bytes": null where not measured (< 0)
void machine_json(Json& json, const MachineCeilings& m);
void gpu_json(Json& json, const GpuReport& gpus);  // "gpus": [...], and why there are none

}  // namespace flashlab::cli
