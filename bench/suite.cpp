// flashlab_bench: the Google Benchmark suite generated from the registry (docs/conventions.md §10). Every
// available implementation over one grid:
//
//   prefill  seqlen_q = seqlen_k in 512, 1k, 2k, 4k, 8k, 16k; head_dim 64 and 128; causal off and on
//   decode   seqlen_q = 1, seqlen_k in 4k, 16k, 64k; head_dim 64 and 128
//
// (batch 1, --heads heads, default 8), shape by shape, each implementation in turn, with counters for FLOP/s,
// bytes/s (the implementation's traffic model) and the share of the machine's measured peak and bandwidth.
// Sizes an implementation refuses (a materialized S that would not fit) and sizes whose estimated time per
// run (from the last size of the same series) exceeds --max-seconds are skipped, and the output says so.
//
//   flashlab_bench [--filter=REGEX] [--json=FILE] [--max-seconds=S] [--heads=N] [--benchmark_... flags]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/flops.hpp"
#include "common/inputs.hpp"
#include "common/machine.hpp"
#include "common/registry.hpp"
#include "common/roofline.hpp"
#include "tools/command.hpp"
#include "tools/json.hpp"

namespace flashlab::bench {

namespace {

struct Options {
  std::string filter = ".*";
  std::string json_path;
  std::string command = "flashlab_bench";
  double max_seconds = 1.0;  // skip a size whose estimated time per run exceeds this
  int64_t heads = 8;
};

struct Shape {
  int64_t seqlen_q, seqlen_k, head_dim;
  bool causal;
  bool decode() const { return seqlen_q == 1; }
};

std::vector<Shape> grid() {
  std::vector<Shape> shapes;
  for (int64_t n : {512, 1024, 2048, 4096, 8192, 16384})
    for (int64_t d : {64, 128})
      for (bool causal : {false, true}) shapes.push_back({n, n, d, causal});
  // Decode: one new query against a long KV cache. Causal changes nothing here (bottom-right aligned, the one
  // query sees every key), so only the plain shape is run.
  for (int64_t kv : {4096, 16384, 65536})
    for (int64_t d : {64, 128}) shapes.push_back({1, kv, d, false});
  return shapes;
}

// A GPU implementation runs in bf16 (else fp16) when it offers it; any other in its first dtype (f32 on
// a CPU).
DType bench_dtype(const Implementation& impl) {
  for (DType preferred : {DType::bf16, DType::f16})
    for (DType offered : impl.dtypes)
      if (impl.device == Device::cuda && offered == preferred) return offered;
  return impl.dtypes.front();
}

Problem problem_of(const Shape& shape, const Implementation& impl, int64_t heads) {
  Problem p;
  p.batch = 1;
  p.heads_q = p.heads_kv = heads;
  p.seqlen_q = shape.seqlen_q;
  p.seqlen_k = shape.seqlen_k;
  p.head_dim = shape.head_dim;
  p.causal = shape.causal;
  p.dtype = bench_dtype(impl);
  p.validate();
  return p;
}

std::string benchmark_name(const Implementation& impl, const Shape& shape) {
  return impl.name + "/" + std::to_string(shape.seqlen_q) + "x" + std::to_string(shape.seqlen_k) + "/d" +
         std::to_string(shape.head_dim) + (shape.causal ? "/causal" : "");
}

// What one benchmark measured (its last invocation, the one Google Benchmark reports), or why it was skipped.
struct Result {
  const Implementation* impl = nullptr;
  Problem problem;
  std::string skipped;  // "" when it ran
  double seconds = 0;   // per run
  double flops = 0, bytes = 0;
  bool modeled = false;  // bytes from the implementation's traffic model (else the minimum)
  double peak_share = 0, bandwidth_share = 0;
};

struct Suite {
  Options options;
  const MachineCeilings* machine = nullptr;
  const GpuReport* gpus = nullptr;
  std::vector<std::string> order;             // benchmark names as registered
  std::map<std::string, Result> results;      // by benchmark name
  std::map<std::string, double> series_rate;  // FLOP/s at the last size of (impl, kind, head_dim, causal)
  std::map<std::string, int> started;         // benchmark name -> invocations so far
  // Inputs of the current shape, shared by every implementation of that shape (drawn once).
  std::string inputs_key;
  AttentionInputs inputs;
};

Suite& suite() {
  static Suite instance;
  return instance;
}

std::string series_key(const Implementation& impl, const Shape& shape) {
  return impl.name + (shape.decode() ? "/decode/" : "/prefill/") + std::to_string(shape.head_dim) +
         (shape.causal ? "/causal" : "");
}

const AttentionInputs& inputs_for(const Problem& p) {
  Suite& s = suite();
  const std::string key = std::to_string(p.seqlen_q) + "x" + std::to_string(p.seqlen_k) + "x" +
                          std::to_string(p.heads_q) + "x" + std::to_string(p.head_dim) +
                          std::string(to_string(p.dtype));
  if (key != s.inputs_key) {
    s.inputs = {};  // release the previous shape's inputs first
    s.inputs = random_inputs(p, Distribution::normal, 0);
    s.inputs_key = key;
  }
  return s.inputs;
}

// (peak GFLOP/s, bandwidth GB/s) of the device the implementation runs on.
std::pair<double, double> ceilings_of(const Implementation& impl) {
  const Suite& s = suite();
  if (impl.device == Device::cuda && !s.gpus->devices.empty())  // a GEMM not measured is NaN: no peak share
    return {1e3 * s.gpus->devices[0].bf16_gemm_tflops, s.gpus->devices[0].copy_gbps};
  return {s.machine->fma_gflops_all, s.machine->copy_gbps};
}

void skip(benchmark::State& state, Result& result, const std::string& reason) {
  result.skipped = reason;
  state.SkipWithError(reason.c_str());
  for (auto _ : state) {
  }
}

void run_benchmark(benchmark::State& state, const Implementation* impl, Shape shape) {
  Suite& s = suite();
  const std::string name = benchmark_name(*impl, shape);
  const int invocation = s.started[name]++;
  if (invocation == 0) {
    const size_t position = std::find(s.order.begin(), s.order.end(), name) - s.order.begin();
    cli::progress("[" + std::to_string(position + 1) + "/" + std::to_string(s.order.size()) + "] " + name +
                  " ...");
  }
  Result& result = s.results[name];
  // Google Benchmark calls this function again with more iterations while the total stays under its minimum
  // time: the decision to skip is taken once, on the first call.
  if (invocation > 0 && !result.skipped.empty()) return skip(state, result, result.skipped);
  result.impl = impl;
  result.problem = problem_of(shape, *impl, s.options.heads);
  const Problem& p = result.problem;
  if (const std::string reason = why_cannot_run(*impl, p); !reason.empty())
    return skip(state, result, reason);
  result.flops = forward_flops(p);
  const auto rate = s.series_rate.find(series_key(*impl, shape));
  if (invocation == 0 && rate != s.series_rate.end() && result.flops / rate->second > s.options.max_seconds) {
    char reason[160];
    std::snprintf(reason, sizeof reason,
                  "estimated %.1f s per run (from the last size measured) > --max-seconds %g",
                  result.flops / rate->second, s.options.max_seconds);
    return skip(state, result, reason);
  }

  const AttentionInputs& in = inputs_for(p);
  AttentionOutputs out = AttentionOutputs::poisoned(p);
  if (invocation == 0) impl->forward(p, in, out);  // warm-up: thread pool start, first-touch page faults
  double total = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    impl->forward(p, in, out);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(seconds);
    total += seconds;
  }
  const Traffic traffic = forward_traffic(*impl, p);
  const auto [peak, bandwidth] = ceilings_of(*impl);
  result.seconds = total / static_cast<double>(state.iterations());
  result.bytes = traffic.bytes;
  result.modeled = traffic.modeled;
  result.peak_share = result.flops / result.seconds / 1e9 / peak;
  result.bandwidth_share = result.bytes / result.seconds / 1e9 / bandwidth;
  s.series_rate[series_key(*impl, shape)] = result.flops / result.seconds;
  state.counters["FLOP/s"] = result.flops / result.seconds;
  state.counters["bytes/s"] = result.bytes / result.seconds;
  state.counters["peak%"] = 100 * result.peak_share;
  state.counters["bw%"] = 100 * result.bandwidth_share;
}

// The console table, with skipped benchmarks as one "skipped: reason" line each; clears the progress line.
class Reporter : public benchmark::ConsoleReporter {
 public:
  bool ReportContext(const Context& context) override {
    const Suite& s = suite();
    std::fprintf(stdout, "flashlab bench: batch 1, %lld heads, f32 on the CPU\n",
                 static_cast<long long>(s.options.heads));
    std::fprintf(stdout,
                 "ceilings (flashlab machine): FP32 FMA peak %.1f GFLOP/s on %d threads, copy %.1f GB/s%s\n",
                 s.machine->fma_gflops_all, s.machine->threads, s.machine->copy_gbps,
                 s.gpus->devices.empty() ? "" : "; GPU rows against the GPU's bf16 GEMM and copy");
    std::fprintf(stdout,
                 "FLOP/s: forward FLOPs per second; bytes/s: the implementation's traffic model per second; "
                 "peak%%, bw%%: shares of the ceilings\n\n");
    return ConsoleReporter::ReportContext(context);
  }

  void ReportRuns(const std::vector<Run>& runs) override {
    cli::progress("");
    for (Run run : runs) {
      const std::string& name = run.run_name.function_name;  // the name registered, without suffixes
      const auto found = suite().results.find(name);
      if (found != suite().results.end() && !found->second.skipped.empty()) {
        std::fprintf(stdout, "%-44s skipped: %s\n", name.c_str(), found->second.skipped.c_str());
        std::fflush(stdout);
        continue;
      }
      run.run_name.min_time.clear();  // every benchmark has the same settings: keep the names readable
      run.run_name.time_type.clear();
      ConsoleReporter::ReportRuns({run});
    }
  }
};

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return text;
}

// The source tree's commit ("+dirty" with uncommitted changes to tracked files), or "unknown".
std::string source_commit() {
  auto capture = [](const std::string& command) {
    std::string out;
    if (FILE* pipe = popen(command.c_str(), "r")) {
      char buffer[256];
      while (std::fgets(buffer, sizeof buffer, pipe)) out += buffer;
      pclose(pipe);
    }
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return out;
  };
  const std::string git = "git -C '" FLASHLAB_SOURCE_DIR "' ";
  std::string commit = capture(git + "rev-parse --short HEAD 2>/dev/null");
  if (commit.empty()) return "unknown";
  if (!capture(git + "status --porcelain --untracked-files=no 2>/dev/null").empty()) commit += "+dirty";
  return commit;
}

// The results schema (docs/conventions.md §11): {"device", "date", "commit", "command", "copy_gbps",
// "bf16_gemm_tflops", "rows"}, with the machine's ceilings and the skipped sizes added.
void write_json(const std::string& path) {
  const Suite& s = suite();
  cli::Json json;
  json.begin_object();
  json.field("device",
             s.gpus->devices.empty() ? s.machine->cpu : s.machine->cpu + " + " + s.gpus->devices[0].name);
  json.field("date", utc_now()).field("commit", source_commit()).field("command", s.options.command);
  if (s.gpus->devices.empty()) {
    json.field("copy_gbps", s.machine->copy_gbps).key("bf16_gemm_tflops").null();
  } else {
    json.field("copy_gbps", s.gpus->devices[0].copy_gbps);
    json.field("bf16_gemm_tflops", s.gpus->devices[0].bf16_gemm_tflops);
  }
  cli::machine_json(json, *s.machine);
  cli::gpu_json(json, *s.gpus);
  json.key("rows").begin_array();
  for (const std::string& name : s.order) {
    const auto found = s.results.find(name);
    if (found == s.results.end() || !found->second.skipped.empty()) continue;
    const Result& r = found->second;
    const Problem& p = r.problem;
    json.begin_object().field("impl", r.impl->name).field("device", to_string(r.impl->device));
    json.field("dtype", to_string(p.dtype)).field("batch", p.batch).field("heads", p.heads_q);
    json.field("kv_heads", p.heads_kv).field("seqlen_q", p.seqlen_q).field("seqlen_k", p.seqlen_k);
    json.field("head_dim", p.head_dim).field("causal", p.causal).field("time_ms", 1e3 * r.seconds);
    json.field("tflops", r.flops / r.seconds / 1e12).field("gbps", r.bytes / r.seconds / 1e9);
    json.field("bytes", r.bytes).field("bytes_model", r.modeled ? "declared" : "minimum");
    json.field("peak_share", r.peak_share).field("bandwidth_share", r.bandwidth_share);
    json.key("max_err_o").null();  // the suite times; correctness is the harness's and compare's
    json.end_object();
  }
  json.end_array();
  json.key("skipped").begin_array();
  for (const std::string& name : s.order) {
    const auto found = s.results.find(name);
    if (found == s.results.end() || found->second.skipped.empty()) continue;
    json.begin_object().field("benchmark", name).field("reason", found->second.skipped).end_object();
  }
  json.end_array();
  std::ofstream file(path, std::ios::binary);
  file << json.end_object().str();
  if (!file) fail("cannot write '", path, "'");
}

// Takes the suite's own flags out of argv (the rest goes to Google Benchmark).
Options parse_options(int& argc, char** argv) {
  Options options;
  int kept = 1;
  for (int a = 1; a < argc; ++a) {
    const std::string word = argv[a];
    auto value_of = [&](const char* flag) -> std::optional<std::string> {
      const std::string prefix = std::string(flag) + "=";
      if (word.rfind(prefix, 0) == 0) return word.substr(prefix.size());
      return std::nullopt;
    };
    if (auto v = value_of("--filter")) {
      options.filter = *v;
    } else if (auto j = value_of("--json")) {
      options.json_path = *j;
    } else if (auto c = value_of("--command")) {
      options.command = *c;
    } else if (auto m = value_of("--max-seconds")) {
      char* end = nullptr;
      options.max_seconds = std::strtod(m->c_str(), &end);
      if (m->empty() || *end != '\0' || !(options.max_seconds > 0))
        fail("--max-seconds '", *m, "' must be a number of seconds > 0");
    } else if (auto h = value_of("--heads")) {
      char* end = nullptr;
      options.heads = std::strtoll(h->c_str(), &end, 10);
      if (h->empty() || *end != '\0' || options.heads < 1) fail("--heads '", *h, "' must be an integer >= 1");
    } else {
      argv[kept++] = argv[a];
    }
  }
  argc = kept;
  if (options.command == "flashlab_bench")
    for (int a = 1; a < argc; ++a) options.command += std::string(" ") + argv[a];
  return options;
}

int run(int argc, char** argv) {
  Suite& s = suite();
  s.options = parse_options(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  std::regex filter;
  try {
    filter = std::regex(s.options.filter, std::regex::extended);
  } catch (const std::regex_error&) {
    fail("--filter '", s.options.filter, "' is not a valid regular expression");
  }

  cli::progress("measuring the machine's ceilings ...");
  s.machine = &machine_ceilings();
  s.gpus = &gpu_ceilings();
  cli::progress("");
  // A GPU stage that would run in the CPU emulator here is not benchmarked: an emulated time measures the
  // emulator, not the kernel.
  auto not_benchmarked = [](const Implementation& impl) {
    const std::string reason = unavailable_reason(impl);
    if (!reason.empty()) return "unavailable here: " + reason;
    const std::string emulation = emulation_reason(impl);
    if (!emulation.empty()) return "would run in the CPU emulator here (" + emulation + ")";
    return std::string();
  };
  for (const Implementation& impl : implementations()) {
    const std::string reason = not_benchmarked(impl);
    if (!reason.empty() && std::regex_search(impl.name, filter))
      std::printf("%-44s not benchmarked: %s\n", impl.name.c_str(), reason.c_str());
  }
  for (const Implementation& impl : implementations())
    if (!impl.bytes_moved && std::regex_search(impl.name, filter))
      std::printf(
          "%-44s declares no traffic model: its bytes/s and bw%% count the minimum bytes (inputs read "
          "once, outputs written once)\n",
          impl.name.c_str());
  for (const Shape& shape : grid()) {
    for (const Implementation& impl : implementations()) {
      if (!not_benchmarked(impl).empty()) continue;
      const std::string name = benchmark_name(impl, shape);
      if (!std::regex_search(name, filter)) continue;
      s.order.push_back(name);
      benchmark::RegisterBenchmark(name.c_str(), run_benchmark, &impl, shape)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond)
          ->MinTime(0.2);
    }
  }
  if (s.order.empty())
    fail("--filter '", s.options.filter, "' matches no benchmark (names look like ",
         "naive/one_pass/1024x1024/d64/causal)");
  Reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  cli::progress("");
  if (!s.options.json_path.empty()) {
    write_json(s.options.json_path);
    std::printf("wrote %s\n", s.options.json_path.c_str());
  }
  return 0;
}

}  // namespace

}  // namespace flashlab::bench

int main(int argc, char** argv) {
  try {
    return flashlab::bench::run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "flashlab bench: %s\n", error.what());
    return 2;
  }
}
