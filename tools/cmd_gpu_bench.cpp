// flashlab gpu-bench: the GPU implementations timed on device pointers (no copies in the timing), over the
// benchmark shapes that bench/gpu_report.sh and bench/peers_torch.py share. Rows follow the results schema of
// SPEC "Measuring".
//
//   flashlab gpu-bench --list-shapes [--shapes SET]      the shapes as JSON (the peers script reads them)
//   flashlab gpu-bench [IMPL...] [--shapes SET] [--repeat N] [--max-seconds S] [--json]
//
// Shape sets: "sweep" (FlashAttention's benchmark: batch * seqlen = 16k tokens, 2048 hidden, seqlen 1k..16k,
// head_dim 64 and 128, causal or not), "occupancy" (8 heads against 256 (batch, head) pairs at seqlen 4k),
// "quick" (two small shapes, for trying the command), "all" (sweep + occupancy), "decode" (one query row,
// 32/8 heads, head_dim 128, KV 8k to 128k at batch 1, 16k at batch 8, 4k at batch 64, and the 64k one again
// from a paged cache of 256-token pages: the decoding stages' bandwidth). With --json the output also holds
// the GPU's measured ceilings (gpu_ceilings() of common/machine.hpp).
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "common/cuda/device.hpp"
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

#if FLASHLAB_HAVE_CUDA
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "common/cuda/device_problem.hpp"
#include "common/cuda/event_timer.hpp"
#endif

namespace flashlab::cli {

namespace {

Problem bench_shape(int64_t batch, int64_t heads, int64_t seqlen, int64_t head_dim, bool causal) {
  Problem p;
  p.batch = batch;
  p.heads_q = p.heads_kv = heads;
  p.seqlen_q = p.seqlen_k = seqlen;
  p.head_dim = head_dim;
  p.causal = causal;
  return p;
}

Problem decode_shape(int64_t batch, int64_t seqlen_k, int64_t page_size) {
  Problem p = problem_shape(batch, 32, 8, 1, seqlen_k, 128);
  p.page_size = page_size;
  return p;
}

std::vector<Problem> shape_set(const std::string& name) {
  std::vector<Problem> shapes;
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
          shapes.push_back(bench_shape(16384 / seqlen, 2048 / head_dim, seqlen, head_dim, causal));
  if (name == "occupancy" || name == "all")
    for (int64_t head_dim : {64, 128}) {
      shapes.push_back(bench_shape(1, 8, 4096, head_dim, false));    // 8 blocks for 132 SMs
      shapes.push_back(bench_shape(16, 16, 4096, head_dim, false));  // 256 blocks
    }
  if (name == "quick") {
    shapes.push_back(bench_shape(2, 4, 1024, 64, false));
    shapes.push_back(bench_shape(2, 4, 1024, 128, true));
  }
  if (shapes.empty()) fail("--shapes (", name, ") must be sweep, occupancy, quick, all or decode");
  return shapes;
}

void shape_json(Json& json, const Problem& p) {
  json.field("batch", p.batch).field("heads", p.heads_q).field("kv_heads", p.heads_kv);
  json.field("seqlen_q", p.seqlen_q).field("seqlen_k", p.seqlen_k).field("head_dim", p.head_dim);
  json.field("causal", p.causal);
  if (p.page_size > 0) json.field("page_size", p.page_size);  // decode shapes read from a paged cache
}

#if FLASHLAB_HAVE_CUDA
struct BenchRow {
  std::string impl;
  Problem problem;
  double time_ms = 0, tflops = 0, gbps = 0, max_err_o = 0;
  int repeats = 0;
};

// One implementation on one shape: inputs uploaded once per copy, enough copies that rotating through them
// defeats the L2 cache; warm-up, then the median of CUDA-event timings; then a sampled fp64 check of copy 0.
BenchRow bench_one(const Implementation& impl, const Problem& p, int max_repeats) {
  const cuda::DeviceProperties device = *cuda::device_properties();
  AttentionInputs inputs = random_inputs(p, Distribution::normal, 7);
  attach_paged_kv(p, inputs);  // K and V in pages too, when the shape has a page size
  const size_t workspace = impl.device_workspace_bytes ? impl.device_workspace_bytes(p) : 0;
  std::vector<std::unique_ptr<cuda::DeviceProblem>> copies;
  copies.push_back(std::make_unique<cuda::DeviceProblem>(p, inputs, workspace));
  // Twice the L2 in rotation, within 4 GiB and 16 copies.
  const size_t per_copy = copies[0]->tensor_bytes();
  const size_t wanted =
      std::min<size_t>({16, 2 * device.l2_bytes / per_copy + 1, (size_t(4) << 30) / per_copy});
  while (copies.size() < std::max<size_t>(1, wanted))
    copies.push_back(std::make_unique<cuda::DeviceProblem>(p, inputs, workspace));
  auto run = [&](int n) { impl.forward_device(p, copies[n % copies.size()]->tensors()); };

  // Repeats: as many as fit about 1 s of GPU time, at least 3 (the slow baseline stages take a second at
  // 16k).
  const double first_ms = cuda::median_event_ms(1, 1, run);
  const int repeats = std::clamp(static_cast<int>(1000.0 / std::max(first_ms, 1e-3)), 3, max_repeats);
  BenchRow row{impl.name, p};
  row.repeats = repeats;
  row.time_ms = cuda::median_event_ms(0, repeats, run);
  row.tflops = forward_flops(p) / (row.time_ms * 1e-3) / 1e12;
  row.gbps =
      forward_min_bytes(p, static_cast<double>(cuda::storage_bytes(p.dtype))) / (row.time_ms * 1e-3) / 1e9;

  // Error of O against the fp64 reference on every row_step-th query row (about 2 GFLOP of fp64 work at
  // most); the rows not sampled are set to the reference's defaults so that deviation() measures the sampled
  // ones.
  AttentionOutputs out = AttentionOutputs::poisoned(p);
  run(0);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  copies[0]->download(out);
  const double work =
      static_cast<double>(p.batch * p.heads_q * p.seqlen_q) * static_cast<double>(p.seqlen_k * p.head_dim);
  const int64_t row_step = std::max<int64_t>(1, static_cast<int64_t>(work / 1e9));
  const ReferenceResult ref = reference_attention(p, inputs, row_step);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t i = 0; i < p.seqlen_q; ++i)
      if (i % row_step != 0)
        for (int64_t h = 0; h < p.heads_q; ++h) {
          std::fill_n(out.o_row(p, b, i, h), p.head_dim, 0.0f);
          out.lse_at(p, b, h, i) = -INFINITY;
        }
  row.max_err_o = deviation(p, out, ref).max_err_o;
  return row;
}
#endif

int gpu_bench_command(const std::vector<std::string>& argv) {
  const Args args(argv, {"--shapes", "--repeat", "--max-seconds"}, {"--json", "--list-shapes"});
  const std::vector<Problem> shapes = shape_set(args.get("--shapes").value_or("all"));
  if (args.has("--list-shapes")) {
    Json json;
    json.begin_array();
    for (const Problem& p : shapes) {
      json.begin_object();
      shape_json(json, p);
      json.end_object();
    }
    std::cout << json.end_array().str();
    return 0;
  }
  // Read and checked in every build, so that a bad flag is reported the same way with or without CUDA.
  [[maybe_unused]] const int64_t max_repeats = repeats_from_args(args, 20, 3);
  // A time budget: once spent, the remaining shapes are skipped (and named on stderr), so that a caller with
  // a deadline still gets the rows measured so far.
  const double max_seconds = args.get_double("--max-seconds", 1e30);
  if (!(max_seconds > 0)) fail("--max-seconds (", max_seconds, ") must be > 0");
  const std::vector<const Implementation*> chosen =
      implementations_from_args(args, [](const Implementation& impl) { return impl.device == Device::cuda; });
  for (const Implementation* impl : chosen)
    if (impl->device != Device::cuda) fail(impl->name, " is not a GPU implementation");
  if (const std::string& reason = cuda::unavailable_reason(); !reason.empty())
    fail("gpu-bench needs a GPU: ", reason);
#if FLASHLAB_HAVE_CUDA
  const auto start = std::chrono::steady_clock::now();
  std::vector<BenchRow> rows;
  for (const Implementation* impl : chosen) {
    for (Problem p : shapes) {
      p.dtype = impl->dtypes.front();
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > max_seconds) {
        std::fprintf(stderr, "gpu-bench: --max-seconds %g spent, %s not measured on %s\n", max_seconds,
                     impl->name.c_str(), p.describe().c_str());
        continue;
      }
      if (const std::string reason = why_cannot_run(*impl, p); !reason.empty()) {
        std::fprintf(stderr, "gpu-bench: %s skips %s: %s\n", impl->name.c_str(), p.describe().c_str(),
                     reason.c_str());
        continue;
      }
      progress(impl->name + " on " + p.describe() + " ...");
      rows.push_back(bench_one(*impl, p, static_cast<int>(max_repeats)));
      const BenchRow& row = rows.back();
      if (!args.has("--json"))
        std::printf("%-22s %-40s %10.3f ms %8.2f TFLOP/s %8.1f GB/s  err O %.2e  (median of %d)\n",
                    row.impl.c_str(), p.describe().c_str(), row.time_ms, row.tflops, row.gbps, row.max_err_o,
                    row.repeats);
    }
  }
  progress("");
  if (args.has("--json")) {
    Json json;
    progress("measuring the GPU's copy bandwidth and bf16 GEMM rate ...");
    const GpuReport& report = gpu_ceilings();  // common/machine.hpp, measured by common/cuda/machine_gpu.cu
    if (report.devices.empty()) fail("gpu-bench: no GPU ceilings: ", report.absent_reason);
    const GpuCeilings& ceilings = report.devices.front();
    progress("");
    json.begin_object().field("device", ceilings.name).field("sm_count", ceilings.sm_count);
    json.field("copy_gbps", ceilings.copy_gbps).field("bf16_gemm_tflops", ceilings.bf16_gemm_tflops);
    json.key("rows").begin_array();
    for (const BenchRow& row : rows) {
      json.begin_object().field("impl", row.impl).field("dtype", to_string(row.problem.dtype));
      shape_json(json, row.problem);
      json.field("time_ms", row.time_ms).field("tflops", row.tflops).field("gbps", row.gbps);
      json.field("max_err_o", row.max_err_o).field("repeat", row.repeats).end_object();
    }
    std::cout << json.end_array().end_object().str();
  }
#endif
  return 0;
}

const CommandRegistration gpu_bench{
    {"gpu-bench",
     "flashlab gpu-bench [IMPL...] [--shapes sweep|occupancy|quick|all|decode] [--repeat N] [--max-seconds "
     "S] "
     "[--json]\n"
     "flashlab gpu-bench --list-shapes [--shapes SET]   (the benchmark shapes as JSON)",
     gpu_bench_command}};

}  // namespace

}  // namespace flashlab::cli
