#include "tools/command.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <utility>

#include "common/cuda/device.hpp"
#include "common/flops.hpp"
#include "common/memory_meter.hpp"
#include "common/roofline.hpp"
#include "common/timing.hpp"
#include "tools/json.hpp"

namespace flashlab::cli {

namespace {
std::vector<Command>& mutable_commands() {
  static std::vector<Command> registry;
  return registry;
}
}  // namespace

CommandRegistration::CommandRegistration(Command command) {
  auto& registry = mutable_commands();
  const auto position =
      std::lower_bound(registry.begin(), registry.end(), command.name,
                       [](const Command& c, const std::string& name) { return c.name < name; });
  registry.insert(position, std::move(command));
}

const std::vector<Command>& commands() {
  return mutable_commands();
}

Problem in_own_dtype(const Implementation& impl, const Problem& p, bool dtype_given) {
  Problem own = p;
  if (!dtype_given && !impl.dtypes.empty() && !offers(impl, p.dtype)) own.dtype = impl.dtypes.front();
  return own;
}

bool heap_metered(const Implementation& impl) {
  return memory_meter::active() && impl.device == Device::cpu;
}

Measurement measure(const Implementation& impl, const Problem& p, const AttentionInputs& in, int repeats,
                    double budget_seconds) {
  Measurement m;
  m.outputs = AttentionOutputs::poisoned(p);
  memory_meter::reset_peak();
  const int64_t before = memory_meter::in_use();
  const Timing timing = time_pass(
      impl, repeats, budget_seconds,
      [&] {
        impl.forward(p, in, m.outputs);  // the checked run, which also warms up
        if (heap_metered(impl)) m.extra_bytes = memory_meter::peak() - before;
      },
      [&] {
        AttentionOutputs scratch = AttentionOutputs::poisoned(p);
        impl.forward(p, in, scratch);
      });
  m.median_ms = 1e3 * timing.median_seconds;
  m.runs = timing.runs;
  return m;
}

namespace {
// FLASHLAB_INJECT, read once: {kind, implementation}, or two empty strings.
const std::pair<std::string, std::string>& injected() {
  static const std::pair<std::string, std::string> drill = [] {
    const char* value = std::getenv("FLASHLAB_INJECT");
    if (value == nullptr || *value == '\0') return std::pair<std::string, std::string>();
    const std::string text(value);
    const size_t colon = text.find(':');
    const std::string kind = text.substr(0, colon);
    if (colon == std::string::npos || (kind != "fault" && kind != "hang" && kind != "oom"))
      fail("FLASHLAB_INJECT (", text, ") must be fault:IMPL, hang:IMPL or oom:IMPL");
    return std::pair{kind, text.substr(colon + 1)};
  }();
  return drill;
}

struct LostDevice {
  std::string why;     // what left the GPU unusable, and whose failure ("" while it is usable)
  bool drill = false;  // an injected fault: the emulated stages count as lost too, so that tests see it
};
LostDevice& lost_device() {
  static LostDevice lost;
  return lost;
}
}  // namespace

void injected_before_run(const std::string& impl) {
  const auto& [kind, target] = injected();
  if (kind.empty() || impl != target) return;
  if (kind == "hang")
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  if (kind == "oom")  // as common/cuda/check.hpp throws where a device allocation fails
    throw DeviceMemoryError("an injected allocation failure (FLASHLAB_INJECT=oom:" + impl +
                            "): the problem is too large for this device's memory");
  throw ExecutionError("an injected fault (FLASHLAB_INJECT=fault:" + impl + ")");
}

void check_injection() {
  (void)injected();
}

void note_failure(const Implementation& impl, const std::string& name) {
  LostDevice& lost = lost_device();
  if (!lost.why.empty()) return;
  lost.drill = injected().first == "fault" && injected().second == impl.name;
  const std::string fault = lost.drill ? "an injected fault" : cuda::device_fault();
  // bench/gpu_report.py finds the rows this refuses by "was left unusable by": keep the words.
  if (!fault.empty()) lost.why = "the GPU was left unusable by " + name + "'s failure (" + fault + ")";
}

std::string refusal_after_failure(const Implementation& impl) {
  const LostDevice& lost = lost_device();
  if (lost.why.empty() || impl.device != Device::cuda) return "";
  if (!lost.drill && !emulation_reason(impl).empty()) return "";  // the emulator never touches the GPU
  return "not run: " + lost.why + "; a new process can run it";
}

// Writes progress to stderr when it is a terminal; erased by the next line.
void progress(const std::string& text) {
  static const bool terminal = isatty(STDERR_FILENO);
  if (terminal) std::fprintf(stderr, "\r\033[K%s", text.c_str());
}

void extra_bytes_json(Json& json, int64_t extra_bytes) {
  if (extra_bytes >= 0)
    json.field("peak_extra_bytes", extra_bytes);
  else
    json.key("peak_extra_bytes").null();
}

void problem_json(Json& json, const Problem& p, const std::string& source) {
  json.key("problem").begin_object();
  json.field("batch", p.batch).field("heads", p.heads_q).field("kv_heads", p.heads_kv);
  json.field("seqlen_q", p.seqlen_q).field("seqlen_k", p.seqlen_k).field("head_dim", p.head_dim);
  json.field("scale", p.softmax_scale()).field("causal", p.causal);
  json.field("window_left", p.window_left).field("window_right", p.window_right);
  json.field("padded", !p.seqlens_q.empty() || !p.seqlens_k.empty()).field("mask", p.mask != nullptr);
  json.field("page_size", p.page_size).field("dtype", to_string(p.dtype)).field("inputs", source);
  json.field("softcap", p.softcap).field("alibi", !p.alibi_slopes.empty()).field("dropout", p.dropout_p);
  json.field("bias", p.bias != nullptr).field("packed", p.packed());
  if (p.packed()) json.field("total_q", p.tokens_q()).field("total_k", p.tokens_k());
  json.field("gflop", forward_flops(p) / 1e9);
  // Inputs read once, outputs written once (a whole number, written as one).
  json.field("min_bytes", static_cast<int64_t>(forward_min_bytes(p, element_bytes(p.dtype))));
  json.end_object();
}

void machine_json(Json& json, const MachineCeilings& m) {
  json.key("machine").begin_object();
  json.field("cpu", m.cpu).field("threads", m.threads).field("vector_bits", m.vector_bits);
  json.field("fma_gflops_1core", m.fma_gflops_1core).field("fma_gflops_all", m.fma_gflops_all);
  json.field("copy_gbps", m.copy_gbps);
  json.key("caches").begin_array();
  for (const CacheLevel& cache : m.caches) {
    json.begin_object().field("level", cache.level).field("type", cache.type).field("bytes", cache.bytes);
    json.field("shared_by_threads", cache.shared_by_threads).end_object();
  }
  json.end_array();
  json.end_object();
}

void gpu_json(Json& json, const GpuReport& gpus) {
  json.key("gpus").begin_array();
  for (const GpuCeilings& gpu : gpus.devices) {
    json.begin_object().field("name", gpu.name).field("sm_count", gpu.sm_count);
    json.field("memory_gib", gpu.memory_gib).field("copy_gbps", gpu.copy_gbps);
    json.field("bf16_gemm_tflops", gpu.bf16_gemm_tflops);  // null when not measured (NaN)
    if (!gpu.gemm_unavailable.empty()) json.field("gemm_unavailable", gpu.gemm_unavailable);
    json.end_object();
  }
  json.end_array();
  if (gpus.devices.empty()) json.field("gpu_absent_reason", gpus.absent_reason);
}

}  // namespace flashlab::cli
