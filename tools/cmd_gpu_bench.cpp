// flashlab gpu-bench: the GPU implementations timed on device pointers (no copies in the timing), shape by
// shape, over the benchmark shapes that bench/gpu_report.py and bench/peers_torch.py share. Rows follow the
// results schema (docs/conventions.md "Results").
//
//   flashlab gpu-bench [IMPL...] [--shapes SET | problem flags] [--pass forward|backward] [--seconds S]
//                      [--repeat N] [--max-seconds S] [--emulate] [--json | --json-lines]
//   flashlab gpu-bench --list-shapes [--shapes SET]      the shapes as JSON, with their FLOP and byte counts
//   flashlab gpu-bench --ceilings [--json]               the GPU's copy bandwidth and bf16 GEMM rate
//
// Shapes are the outer loop: a shape's inputs and its sampled fp64 reference are made once, then every named
// implementation (in the order named; else the registry's) runs on them. An implementation that refuses a
// shape gets a row that says why ("skipped"), as does one the shape is too large for (the GPU's memory ran
// out); one that fails as it runs, a row with its error ("failed"), and the exit code is then 1. One whose
// forward is a pre-pass and a main kernel (cuda_v3_hopper/fp8) gets a second row, "IMPL (main kernel)": the
// kernel alone, as FA3 reports its FP8 kernel, on the pre-pass's output; its O is checked like the whole
// forward's. Shape sets: "sweep" (FlashAttention's benchmark: batch * seqlen = 16k tokens, 2048 hidden,
// seqlen 1k..16k, head_dim 64 and 128, causal or not), "occupancy" (8 heads against 256 (batch, head) pairs
// at seqlen 4k), "decode" (one query row, 32/8 heads, head_dim 128, KV 8k to 128k at batch 1, 16k at batch 8,
// 4k at batch 64, and 64k again from a paged cache of 256-token pages), "all" (sweep + occupancy), "quick"
// (two small shapes), "report" (the GPU report's, headline shapes first: each goal of docs/results' GPU
// issue, then the rest of the sweep), "backward" (the backward's: d 128 and 64 at 8k) and "rehearse" (tiny
// shapes for the emulator). Problem flags instead of --shapes time one shape.
//
// --emulate runs the emulator's build of the same launchers on the same device-pointer path (the GPU report's
// rehearsal): its rows are marked "emulated" and carry no rate, since their time is the CPU's.
//
// --json prints one object at the end; --json-lines prints each row as it is made, one object a line, each
// measurement announced first ({"measuring": IMPL, "dtype": ...}), so that a caller that stops a run at its
// deadline keeps the rows made and knows which measurement did not finish (bench/gpu_report.py).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common/cuda/device.hpp"
#include "common/cuda/device_timing.hpp"
#include "common/cuda/gpu_stage.hpp"
#include "common/cuda/storage.hpp"
#include "common/error.hpp"
#include "common/flops.hpp"
#include "common/inputs.hpp"
#include "common/machine.hpp"
#include "common/paged_kv.hpp"
#include "common/reference.hpp"
#include "common/registry.hpp"
#include "common/tolerance.hpp"
#include "tools/args.hpp"
#include "tools/command.hpp"
#include "tools/json.hpp"

namespace flashlab::cli {

namespace {

Problem bench_shape(int64_t batch, int64_t heads, int64_t seqlen, int64_t head_dim, bool causal) {
  Problem p = problem_shape(batch, heads, heads, seqlen, seqlen, head_dim);
  p.causal = causal;
  return p;
}

Problem decode_shape(int64_t batch, int64_t seqlen_k, int64_t page_size) {
  Problem p = problem_shape(batch, 32, 8, 1, seqlen_k, 128);
  p.page_size = page_size;
  return p;
}

// FlashAttention's benchmark shape: batch * seqlen = 16k tokens, 2048 hidden.
Problem sweep_shape(int64_t seqlen, int64_t head_dim, bool causal) {
  return bench_shape(16384 / seqlen, 2048 / head_dim, seqlen, head_dim, causal);
}

void append(std::vector<Problem>& shapes, const Problem& p) {
  for (const Problem& q : shapes)
    if (q.describe() == p.describe()) return;
  shapes.push_back(p);
}

std::vector<Problem> shape_set(const std::string& name) {
  std::vector<Problem> shapes;
  if (name == "report") {
    // The goals first (the GPU-speed goals of docs/results), so that a run stopped at its budget has them:
    // ws and split_q at d 128, 8k; the decode at 64k; fp8 against ws at d 256; causal; d 64.
    append(shapes, sweep_shape(8192, 128, false));
    append(shapes, decode_shape(1, 65536, 0));
    append(shapes, sweep_shape(8192, 256, false));
    append(shapes, sweep_shape(8192, 128, true));
    append(shapes, sweep_shape(8192, 64, false));
    append(shapes, sweep_shape(8192, 64, true));
    for (int64_t seqlen : {4096, 16384})
      for (int64_t head_dim : {128, 64})
        for (bool causal : {false, true}) append(shapes, sweep_shape(seqlen, head_dim, causal));
    append(shapes, decode_shape(1, 131072, 0));
    append(shapes, decode_shape(1, 65536, 256));
    for (int64_t seqlen : {1024, 2048})
      for (int64_t head_dim : {128, 64})
        for (bool causal : {false, true}) append(shapes, sweep_shape(seqlen, head_dim, causal));
  }
  if (name == "backward") {
    append(shapes, sweep_shape(8192, 128, false));
    append(shapes, sweep_shape(8192, 128, true));
    append(shapes, sweep_shape(8192, 64, false));
  }
  if (name == "rehearse") {  // the emulator's: a few blocks each, every kind of shape the report has
    append(shapes, bench_shape(1, 2, 128, 128, false));
    append(shapes, bench_shape(1, 2, 96, 64, true));
    append(shapes, problem_shape(1, 4, 2, 1, 256, 128));
  }
  if (name == "decode") {
    for (int64_t seqlen_k : {8192, 65536, 131072}) shapes.push_back(decode_shape(1, seqlen_k, 0));
    shapes.push_back(decode_shape(8, 16384, 0));
    shapes.push_back(decode_shape(64, 4096, 0));
    shapes.push_back(decode_shape(1, 65536, 256));
  }
  if (name == "sweep" || name == "all")
    for (int64_t head_dim : {64, 128})
      for (bool causal : {false, true})
        for (int64_t seqlen : {1024, 2048, 4096, 8192, 16384})
          shapes.push_back(sweep_shape(seqlen, head_dim, causal));
  if (name == "occupancy" || name == "all")
    for (int64_t head_dim : {64, 128}) {
      shapes.push_back(bench_shape(1, 8, 4096, head_dim, false));    // 8 blocks for 132 SMs
      shapes.push_back(bench_shape(16, 16, 4096, head_dim, false));  // 256 blocks
    }
  if (name == "quick") {
    shapes.push_back(bench_shape(2, 4, 1024, 64, false));
    shapes.push_back(bench_shape(2, 4, 1024, 128, true));
  }
  if (shapes.empty())
    fail("--shapes (", name, ") must be report, backward, rehearse, sweep, occupancy, quick, all or decode");
  return shapes;
}

void shape_json(Json& json, const Problem& p) {
  json.field("batch", p.batch).field("heads", p.heads_q).field("kv_heads", p.heads_kv);
  json.field("seqlen_q", p.seqlen_q).field("seqlen_k", p.seqlen_k).field("head_dim", p.head_dim);
  json.field("causal", p.causal);
  if (p.page_size > 0) json.field("page_size", p.page_size);  // decode shapes read from a paged cache
}

struct BenchRow {
  std::string impl;
  Problem problem;
  bool backward = false;
  bool emulated = false;
  std::string skipped;  // why it did not run ("" when it did)
  std::string failed;   // the error it stopped with, a kernel's fault on the GPU ("" when it ran)
  double time_ms = 0, max_err_o = NAN;
  int repeats = 0;
};

void row_json(Json& json, const BenchRow& row) {
  json.begin_object().field("impl", row.impl).field("dtype", to_string(row.problem.dtype));
  json.field("pass", row.backward ? "backward" : "forward");
  shape_json(json, row.problem);
  if (!row.skipped.empty() || !row.failed.empty()) {
    json.key("time_ms").null().key("tflops").null().key("gbps").null().key("max_err_o").null();
    if (!row.skipped.empty()) json.field("skipped", row.skipped);
    if (!row.failed.empty()) json.field("failed", row.failed);
  } else {
    const double seconds = row.time_ms * 1e-3;
    const double flops = row.backward ? backward_flops(row.problem) : forward_flops(row.problem);
    const double bytes =
        forward_min_bytes(row.problem, static_cast<double>(cuda::storage_bytes(row.problem.dtype)));
    json.field("time_ms", row.time_ms);
    if (row.emulated) {  // the emulator's time is the CPU's: no rate derived from it
      json.key("tflops").null().key("gbps").null();
    } else {
      json.field("tflops", flops / seconds / 1e12);
      json.field("gbps", row.backward ? NAN : bytes / seconds / 1e9);
    }
    json.field("max_err_o", row.max_err_o).field("repeat", row.repeats);
  }
  if (row.emulated) json.field("emulated", true);
  json.end_object();
}

void row_text(const BenchRow& row) {
  const char* pass = row.backward ? "backward" : "forward";
  if (!row.skipped.empty() || !row.failed.empty()) {
    std::printf("%-34s %-8s %-44s %s: %s\n", row.impl.c_str(), pass, row.problem.describe().c_str(),
                row.failed.empty() ? "skipped" : "FAILED",
                (row.failed.empty() ? row.skipped : row.failed).c_str());
    return;
  }
  const double flops = row.backward ? backward_flops(row.problem) : forward_flops(row.problem);
  char rate[48] = "emulated: no rate";
  if (!row.emulated) std::snprintf(rate, sizeof rate, "%8.2f TFLOP/s", flops / (row.time_ms * 1e-3) / 1e12);
  std::printf("%-34s %-8s %-44s %10.3f ms %s  err O %.2e  (median of %d)\n", row.impl.c_str(), pass,
              row.problem.describe().c_str(), row.time_ms, rate, row.max_err_o, row.repeats);
}

// The timing plan: rotation past twice the L2 on a GPU; in the emulator one copy and the fewest repeats.
cuda::TimingPlan timing_plan(bool emulated, double seconds, int max_repeats) {
  cuda::TimingPlan plan;
  plan.seconds = seconds;
  plan.max_repeats = max_repeats;
  if (emulated) {
    plan.max_copies = 1;
    plan.min_repeats = plan.max_repeats = 1;
  } else if (const auto device = cuda::device_properties()) {
    plan.rotate_bytes = std::min<size_t>(2 * device->l2_bytes, size_t(4) << 30);
  }
  return plan;
}

// impl's forward in the build that runs here; with `main_kernel`, the forward's main kernel alone
// (DeviceBuild::forward_main), on workspaces the whole forward prepared.
cuda::Timing time_forward(const Implementation& impl, const Problem& p, const AttentionInputs& inputs,
                          const cuda::TimingPlan& plan, bool emulated, bool main_kernel,
                          AttentionOutputs& out) {
  if (emulated)
    return main_kernel ? cuda::emulated::time_forward_main(p, inputs, impl.emulated_build, plan, out)
                       : cuda::emulated::time_forward(p, inputs, impl.emulated_build, plan, out);
#if FLASHLAB_LINKS_GPU_BUILDS
  return main_kernel ? cuda::gpu::time_forward_main(p, inputs, impl.gpu_build, plan, out)
                     : cuda::gpu::time_forward(p, inputs, impl.gpu_build, plan, out);
#else
  fail("built without CUDA");
#endif
}

cuda::Timing time_backward(const Implementation& impl, const Problem& p, const AttentionInputs& inputs,
                           const AttentionOutputs& forward, const HostTensor& d_out,
                           const cuda::TimingPlan& plan, bool emulated, AttentionGradients& gradients) {
  if (emulated)
    return cuda::emulated::time_backward(p, inputs, forward, d_out, impl.emulated_build, plan, gradients);
#if FLASHLAB_LINKS_GPU_BUILDS
  return cuda::gpu::time_backward(p, inputs, forward, d_out, impl.gpu_build, plan, gradients);
#else
  fail("built without CUDA");
#endif
}

// One shape: its inputs drawn once, its sampled fp64 reference computed once (when a forward runs), then
// every implementation in turn. `started` and `max_seconds` stop the run between implementations.
class ShapeBench {
 public:
  ShapeBench(const Problem& shape, bool backward) : shape_(shape), backward_(backward) {}

  // `main_kernel`: the forward's main kernel alone (an entry whose forward has one:
  // DeviceBuild::forward_main), in a row of its own named "IMPL (main kernel)".
  BenchRow run(const Implementation& impl, std::optional<DType> dtype, const cuda::TimingPlan& gpu_plan,
               const cuda::TimingPlan& emulated_plan, bool main_kernel = false) {
    BenchRow row{impl.name, shape_, backward_};
    row.problem.dtype = dtype.value_or(impl.dtypes.front());
    const std::string emulation = emulation_reason(impl);
    row.emulated = !emulation.empty();
    row.skipped = backward_ ? why_cannot_run_backward(impl, row.problem) : why_cannot_run(impl, row.problem);
    // Without --emulate, a stage this GPU cannot run is not timed in the emulator in its place.
    if (row.skipped.empty() && row.emulated && !cuda::emulation_forced())
      row.skipped = "runs only in the emulator here: " + emulation;
    if (!row.skipped.empty()) return row;
    injected_before_run(impl.name);
    const AttentionInputs& in = inputs(row.problem.dtype);
    const cuda::TimingPlan& plan = row.emulated ? emulated_plan : gpu_plan;
    if (backward_) {
      // The forward's O and LSE from the registry's adapter (not timed), then the backward on device
      // pointers.
      const AttentionOutputs forward = run_forward(impl, row.problem, in);
      if (!d_out_) d_out_ = random_d_out(row.problem, 8);
      AttentionGradients gradients = AttentionGradients::poisoned(row.problem);
      const cuda::Timing timing =
          time_backward(impl, row.problem, in, forward, *d_out_, plan, row.emulated, gradients);
      row.time_ms = timing.median_ms;
      row.repeats = timing.repeats;
      return row;
    }
    AttentionOutputs out = AttentionOutputs::poisoned(row.problem);
    if (main_kernel) row.impl += " (main kernel)";
    const cuda::Timing timing = time_forward(impl, row.problem, in, plan, row.emulated, main_kernel, out);
    row.time_ms = timing.median_ms;
    row.repeats = timing.repeats;
    row.max_err_o = sampled_error(row.problem, out);
    return row;
  }

 private:
  // Drawn once per shape, in float32; the upload rounds them to each implementation's dtype.
  const AttentionInputs& inputs(DType dtype) {
    if (!inputs_) {
      Problem p = shape_;
      p.dtype = dtype;
      inputs_ = random_inputs(p, Distribution::normal, 7);
      attach_paged_kv(p, *inputs_);  // K and V in pages too, when the shape has a page size
    }
    return *inputs_;
  }

  // Error of O against the fp64 reference on every row_step-th query row (about 2 GFLOP of fp64 work at
  // most, computed once per shape); the rows not sampled are set to the reference's defaults so that
  // deviation() measures the sampled ones.
  double sampled_error(const Problem& p, AttentionOutputs& out) {
    const double work =
        static_cast<double>(p.batch * p.heads_q * p.seqlen_q) * static_cast<double>(p.seqlen_k * p.head_dim);
    const int64_t row_step = std::max<int64_t>(1, static_cast<int64_t>(work / 1e9));
    if (!reference_) reference_ = reference_attention(p, *inputs_, row_step);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t i = 0; i < p.seqlen_q; ++i)
        if (i % row_step != 0)
          for (int64_t h = 0; h < p.heads_q; ++h) {
            std::fill_n(out.o_row(p, b, i, h), p.head_dim, 0.0f);
            out.lse_at(p, b, h, i) = -INFINITY;
          }
    return deviation(p, out, *reference_).max_err_o;
  }

  Problem shape_;
  bool backward_;
  std::optional<AttentionInputs> inputs_;
  std::optional<ReferenceResult> reference_;
  std::optional<HostTensor> d_out_;
};

int ceilings_command(const Args& args) {
  if (const std::string& reason = cuda::unavailable_reason(); !reason.empty())
    fail("gpu-bench --ceilings needs a GPU: ", reason);
  progress("measuring the GPU's copy bandwidth and bf16 GEMM rate ...");
  const GpuReport& report = gpu_ceilings();  // common/machine.hpp, measured by common/cuda/machine_gpu.cu
  progress("");
  if (report.devices.empty()) fail("gpu-bench: no GPU ceilings: ", report.absent_reason);
  const GpuCeilings& ceilings = report.devices.front();
  if (!args.has("--json")) {
    std::printf("%s: device-to-device copy %.1f GB/s, bf16 GEMM ", ceilings.name.c_str(), ceilings.copy_gbps);
    if (ceilings.gemm_unavailable.empty())
      std::printf("%.1f TFLOP/s\n", ceilings.bf16_gemm_tflops);
    else
      std::printf("not measured: %s\n", ceilings.gemm_unavailable.c_str());
    return 0;
  }
  Json json;
  json.begin_object().field("device", ceilings.name).field("sm_count", ceilings.sm_count);
  json.field("copy_gbps", ceilings.copy_gbps).field("bf16_gemm_tflops", ceilings.bf16_gemm_tflops);
  if (!ceilings.gemm_unavailable.empty()) json.field("gemm_unavailable", ceilings.gemm_unavailable);
  std::cout << json.end_object().str();
  return 0;
}

bool has_problem_flag(const Args& args) {
  for (const std::string& flag : problem_flags())
    if (flag != "--dtype" && flag != "--seed" && args.has(flag)) return true;
  return args.has("--causal");
}

int gpu_bench_command(const std::vector<std::string>& argv) {
  auto valued = problem_flags();
  valued.insert({"--shapes", "--repeat", "--max-seconds", "--seconds", "--pass"});
  auto switches = problem_switches();
  switches.insert({"--json", "--json-lines", "--list-shapes", "--ceilings"});
  const Args args(argv, valued, switches);
  if (args.has("--ceilings")) return ceilings_command(args);
  if (args.has("--shapes") && has_problem_flag(args))
    fail("--shapes and problem flags: give one or the other");
  std::vector<Problem> shapes;
  std::optional<DType> dtype;
  if (has_problem_flag(args)) {
    shapes.push_back(problem_from_args(args, /*with_inputs=*/false).problem);
  } else {
    shapes = shape_set(args.get("--shapes").value_or("all"));
    if (args.has("--emulate")) cuda::force_emulation(true);
  }
  // Each implementation runs in its first dtype unless --dtype names one (then one that lacks it is skipped).
  if (auto text = args.get("--dtype")) dtype = parse_dtype(*text);
  if (args.has("--list-shapes")) {
    Json json;
    json.begin_array();
    for (const Problem& p : shapes) {
      json.begin_object();
      shape_json(json, p);
      // The counts a peer's rates divide by (bench/peers_torch.py), from the one place that makes them.
      json.key("counts").begin_object();
      // Whole numbers, written as such (tools/json.hpp writes a double to 9 significant digits).
      json.field("forward_flops", static_cast<int64_t>(forward_flops(p)));
      json.field("backward_flops", static_cast<int64_t>(backward_flops(p)));
      json.key("forward_min_bytes").begin_object();
      for (const DType stored : {DType::bf16, DType::f16, DType::f32}) {
        const double bytes = forward_min_bytes(p, static_cast<double>(cuda::storage_bytes(stored)));
        json.field(to_string(stored), static_cast<int64_t>(bytes));
      }
      json.end_object().end_object();
      json.end_object();
    }
    std::cout << json.end_array().str();
    return 0;
  }
  const std::string pass = args.get("--pass").value_or("forward");
  if (pass != "forward" && pass != "backward") fail("--pass (", pass, ") must be forward or backward");
  const int max_repeats = static_cast<int>(repeats_from_args(args, 20, 3));
  const double seconds = args.get_double("--seconds", 1.0);
  if (!(seconds > 0)) fail("--seconds (", seconds, ") must be > 0");
  // A time budget: once spent, the remaining measurements are skipped (each a row that says so, and named on
  // stderr), so that a caller with a deadline still gets the rows measured so far.
  const double max_seconds = args.get_double("--max-seconds", 1e30);
  if (!(max_seconds > 0)) fail("--max-seconds (", max_seconds, ") must be > 0");
  const std::vector<const Implementation*> chosen =
      implementations_from_args(args, [](const Implementation& impl) { return impl.device == Device::cuda; });
  for (const Implementation* impl : chosen)
    if (impl->device != Device::cuda) fail(impl->name, " is not a GPU implementation");
  if (const std::string& reason = cuda::unavailable_reason(); !reason.empty() && !cuda::emulation_forced())
    fail("gpu-bench needs a GPU (or --emulate): ", reason);

  const cuda::TimingPlan gpu_plan = timing_plan(false, seconds, max_repeats);
  const cuda::TimingPlan emulated_plan = timing_plan(true, seconds, max_repeats);
  const bool json_lines = args.has("--json-lines");
  if (json_lines && args.has("--json")) fail("--json and --json-lines: give one or the other");
  const auto start = std::chrono::steady_clock::now();
  std::vector<BenchRow> rows;
  auto emit = [&](BenchRow row) {
    rows.push_back(std::move(row));
    if (json_lines) {
      Json json;
      row_json(json, rows.back());
      std::cout << json.str() << std::flush;  // a caller that stops the run keeps the rows so far
    } else if (!args.has("--json")) {
      row_text(rows.back());
    }
  };
  // A measurement that fails (a kernel's fault on the GPU, or what the emulator finds wrong in one) gets a
  // row that says so, and the run goes on. A fault that leaves this process's CUDA context unusable (an
  // illegal address, say) leaves every later call here failing too: the measurements left each get a row
  // that says why, and a new process can run them (bench/gpu_report.py does).
  check_injection();
  // Why a measurement is not made: the device lost, or --max-seconds spent ("" when it is made).
  auto left_out = [&](const std::string& name, const Problem& shape, const Implementation& impl) {
    if (std::string refusal = refusal_after_failure(impl); !refusal.empty()) return refusal;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <= max_seconds)
      return std::string();
    std::fprintf(stderr, "gpu-bench: --max-seconds %g spent, %s not measured on %s\n", max_seconds,
                 name.c_str(), shape.describe().c_str());
    char reason[80];
    std::snprintf(reason, sizeof reason, "not measured: the run's --max-seconds (%g) was spent", max_seconds);
    return std::string(reason);
  };
  // One measurement, or its row that says why it was not made or how it failed.
  auto measure = [&](ShapeBench& bench, const Problem& shape, const Implementation& impl, bool main_kernel) {
    const std::string name = impl.name + (main_kernel ? " (main kernel)" : "");
    auto unmeasured = [&] {  // a row without figures
      BenchRow row{name, shape, pass == "backward"};
      row.problem.dtype = dtype.value_or(impl.dtypes.front());
      row.emulated = !emulation_reason(impl).empty();
      return row;
    };
    if (const std::string reason = left_out(name, shape, impl); !reason.empty()) {
      BenchRow row = unmeasured();
      row.skipped = reason;
      emit(row);
      return false;
    }
    progress(name + " on " + shape.describe() + " ...");
    if (json_lines) {  // which measurement was running, for a caller that has to stop one that hangs
      Json json;
      json.begin_object().field("measuring", name);
      std::cout << json.field("dtype", to_string(unmeasured().problem.dtype)).end_object().str()
                << std::flush;
    }
    try {
      emit(bench.run(impl, dtype, gpu_plan, emulated_plan, main_kernel));
      return rows.back().skipped.empty();
    } catch (const DeviceMemoryError& error) {  // the shape's size: a row that says so, as a refusal's
      BenchRow row = unmeasured();
      row.skipped = error.what();
      emit(row);
      return false;
    } catch (const ExecutionError& error) {  // a kernel's fault, or what the emulator found wrong in one
      BenchRow row = unmeasured();
      row.failed = error.what();
      std::fprintf(stderr, "gpu-bench: %s failed on %s: %s\n", name.c_str(), row.problem.describe().c_str(),
                   error.what());
      emit(row);  // first: the device's check below waits for the GPU
      note_failure(impl, name);
      return false;
    }
  };
  for (const Problem& shape : shapes) {
    ShapeBench bench(shape, pass == "backward");
    for (const Implementation* impl : chosen) {
      // A forward of a pre-pass and a main kernel: the kernel alone too, when the whole forward ran.
      if (measure(bench, shape, *impl, false) && pass == "forward" && device_build(*impl).forward_main)
        measure(bench, shape, *impl, true);
    }
  }
  progress("");
  if (args.has("--json")) {
    const auto device = cuda::device_properties();
    const bool all_emulated =
        std::all_of(rows.begin(), rows.end(), [](const BenchRow& row) { return row.emulated; });
    Json json;
    json.begin_object();
    json.field("device",
               device && !all_emulated ? device->name : "the CPU emulator of the CUDA execution model");
    json.key("rows").begin_array();
    for (const BenchRow& row : rows) row_json(json, row);
    std::cout << json.end_array().end_object().str();
  }
  const bool any_failed =
      std::any_of(rows.begin(), rows.end(), [](const BenchRow& row) { return !row.failed.empty(); });
  return any_failed ? 1 : 0;  // an implementation failed, as a wrong result does (exit 1)
}

const CommandRegistration gpu_bench{
    {"gpu-bench",
     "flashlab gpu-bench [IMPL...] [--shapes report|backward|rehearse|sweep|occupancy|quick|all|decode | "
     "problem flags]\n"
     "                   [--pass forward|backward] [--seconds S] [--repeat N] [--max-seconds S] [--emulate] "
     "[--json | --json-lines]\n"
     "flashlab gpu-bench --list-shapes [--shapes SET]   (the benchmark shapes as JSON)\n"
     "flashlab gpu-bench --ceilings [--json]            (the GPU's copy bandwidth and bf16 GEMM rate)",
     gpu_bench_command}};

}  // namespace

}  // namespace flashlab::cli
