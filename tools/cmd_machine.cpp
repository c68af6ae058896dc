// flashlab machine: the ceilings of this machine, measured here and now (common/machine.hpp), which
// `compare`, `bench` and `roofline` use for "share of peak".
#include <cstdio>
#include <iostream>

#include "common/error.hpp"
#include "common/machine.hpp"
#include "common/roofline.hpp"
#include "tools/args.hpp"
#include "tools/command.hpp"
#include "tools/json.hpp"

namespace flashlab::cli {

namespace {

std::string cache_size(int64_t bytes) {
  char text[32];
  if (bytes >= (int64_t{1} << 20) && bytes % (int64_t{1} << 20) == 0)
    std::snprintf(text, sizeof text, "%lld MiB", static_cast<long long>(bytes >> 20));
  else
    std::snprintf(text, sizeof text, "%lld KiB", static_cast<long long>(bytes >> 10));
  return text;
}

int machine_command(const std::vector<std::string>& argv) {
  const Args args(argv, {}, {"--json"});
  if (!args.positional().empty()) fail("machine takes no arguments (got '", args.positional()[0], "')");
  progress("measuring the FMA peak and the copy bandwidth ...");
  const MachineCeilings& m = machine_ceilings();
  progress("measuring the GPUs ...");
  const GpuReport& gpus = gpu_ceilings();
  progress("");
  if (args.has("--json")) {
    Json json;
    json.begin_object();
    machine_json(json, m);
    gpu_json(json, gpus);
    std::cout << json.end_object().str();
    return 0;
  }
  std::printf("cpu:     %s, %d threads, %d-bit FMA vectors\n", m.cpu.c_str(), m.threads, m.vector_bits);
  std::printf(
      "fp32 FMA peak:  %8.1f GFLOP/s one core, %8.1f GFLOP/s all %d threads (register-resident loop)\n",
      m.fma_gflops_1core, m.fma_gflops_all, m.threads);
  std::printf("copy bandwidth: %8.1f GB/s (256 MiB buffers, bytes read + written)\n", m.copy_gbps);
  std::printf("ridge point:    %8.1f FLOP/byte (all-core peak / copy bandwidth)\n",
              ridge_point(m.fma_gflops_all, m.copy_gbps));
  for (const CacheLevel& cache : m.caches)
    std::printf("L%d %-8s %9s, shared by %d thread%s\n", cache.level, cache.type.c_str(),
                cache_size(cache.bytes).c_str(), cache.shared_by_threads,
                cache.shared_by_threads == 1 ? "" : "s");
  if (m.caches.empty()) std::printf("caches:  not described by sysfs here\n");
  if (gpus.devices.empty()) std::printf("gpu:     none (%s)\n", gpus.absent_reason.c_str());
  for (const GpuCeilings& gpu : gpus.devices) {
    std::printf("gpu:     %s, %d SMs, %.1f GiB\n", gpu.name.c_str(), gpu.sm_count, gpu.memory_gib);
    std::printf("  device-to-device copy %8.1f GB/s, ", gpu.copy_gbps);
    if (gpu.gemm_unavailable.empty())
      std::printf("bf16 GEMM %8.1f TFLOP/s (cuBLAS)\n", gpu.bf16_gemm_tflops);
    else
      std::printf("bf16 GEMM not measured: %s\n", gpu.gemm_unavailable.c_str());
  }
  return 0;
}

const CommandRegistration machine{{"machine", "flashlab machine [--json]", machine_command}};

}  // namespace

}  // namespace flashlab::cli
