#include "common/registry.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/error.hpp"
#include "common/score_mod.hpp"

// A program may rename everything it registers by defining this function: the course exercises register a
// student's copy of a stage as "exercise/ID/<name>" (tools/exercise.py). Ordinary programs do not define it.
extern "C" const char* flashlab_registration_prefix() __attribute__((weak));

namespace flashlab {

std::string_view to_string(Device device) {
  return device == Device::cpu ? "cpu" : "cuda";
}

namespace {
std::vector<Implementation>& mutable_registry() {
  static std::vector<Implementation> registry;  // constructed on first use: safe from any static initializer
  return registry;
}
}  // namespace

namespace {
// Why a stage's implementations cannot run in a handout where the stage's exercises are not done, or "".
std::string exercise_not_done(std::string_view name) {
  const std::string_view stage = name.substr(0, name.find('/'));
  for (const UnfinishedStage& unfinished : unfinished_stages()) {
    if (stage != unfinished.stage) continue;
    const std::string ids = unfinished.exercises, first = ids.substr(0, ids.find(','));
    return "exercise not done: " + ids + " (yours to write: ./flashlab exercise start " + first + ")";
  }
  return "";
}
}  // namespace

Registration::Registration(Implementation implementation) {
  if (flashlab_registration_prefix != nullptr) {
    implementation.name = flashlab_registration_prefix() + implementation.name;  // a student's copy: it runs
  } else if (std::string reason = exercise_not_done(implementation.name); !reason.empty()) {
    implementation.availability = [reason] { return reason; };
    if (implementation.emulation) implementation.emulation = [] { return std::string(); };  // it runs nowhere
  }
  auto& registry = mutable_registry();
  if (find_implementation(implementation.name) != nullptr) {
    std::fprintf(stderr, "flashlab: implementation '%s' registered twice\n", implementation.name.c_str());
    std::abort();
  }
  const auto position = std::lower_bound(
      registry.begin(), registry.end(), implementation.name,
      [](const Implementation& existing, const std::string& name) { return existing.name < name; });
  registry.insert(position, std::move(implementation));
}

const std::vector<Implementation>& implementations() {
  return mutable_registry();
}

const Implementation* find_implementation(std::string_view name) {
  for (const Implementation& impl : mutable_registry())
    if (impl.name == name) return &impl;
  return nullptr;
}

const DeviceBuild& device_build(const Implementation& impl) {
  return emulation_reason(impl).empty() ? impl.gpu_build : impl.emulated_build;
}

std::string unavailable_reason(const Implementation& impl) {
  return impl.availability ? impl.availability() : "";
}

std::string emulation_reason(const Implementation& impl) {
  return impl.emulation ? impl.emulation() : "";
}

bool offers(const Implementation& impl, DType dtype) {
  return std::find(impl.dtypes.begin(), impl.dtypes.end(), dtype) != impl.dtypes.end();
}

std::string why_cannot_run(const Implementation& impl, const Problem& problem) {
  if (std::string reason = unavailable_reason(impl); !reason.empty()) return reason;
  if (!offers(impl, problem.dtype)) {
    std::string offered;
    for (DType dtype : impl.dtypes) offered += (offered.empty() ? "" : ", ") + std::string(to_string(dtype));
    return "dtype " + std::string(to_string(problem.dtype)) + " is not offered (" + offered + ")";
  }
  if (std::string reason = score_mod_refusal(problem, impl.score_mods, impl.name); !reason.empty())
    return reason;
  if (std::string reason = dropout_refusal(problem, impl.dropout, impl.name); !reason.empty()) return reason;
  if (problem.packed() && !impl.packed)
    return "cu_seqlens_q/k (packed variable-length batches) are not supported by " + impl.name;
  if (problem.mask && !impl.explicit_mask)
    return "mask: an explicit mask is not supported by " + impl.name + " (causal, window and padding are)";
  if (impl.supports) return impl.supports(problem);
  return "";
}

AttentionOutputs run_forward(const Implementation& impl, const Problem& problem,
                             const AttentionInputs& inputs) {
  problem.validate();
  require_can_run(impl, problem);
  AttentionOutputs outputs = AttentionOutputs::poisoned(problem);
  impl.forward(problem, inputs, outputs);
  return outputs;
}

std::string why_cannot_run_backward(const Implementation& impl, const Problem& problem) {
  if (!impl.backward) return "no backward pass";
  std::string reason = why_cannot_run(impl, problem);
  if (reason.empty() && impl.supports_backward) reason = impl.supports_backward(problem);
  return reason;
}

void require_can_run(const Implementation& impl, const Problem& problem, bool backward) {
  const std::string reason =
      backward ? why_cannot_run_backward(impl, problem) : why_cannot_run(impl, problem);
  if (!reason.empty()) fail(impl.name, " cannot run this problem", backward ? " backward: " : ": ", reason);
}

AttentionGradients run_backward(const Implementation& impl, const Problem& problem,
                                const AttentionInputs& inputs, const AttentionOutputs& forward,
                                const HostTensor& d_out) {
  problem.validate();
  require_can_run(impl, problem, true);
  if (d_out.size() != problem.q_elements())
    fail("dO must have the shape of O ",
         problem.packed() ? "[total_q, heads_q, head_dim]" : "[batch, seqlen_q, heads_q, head_dim]");
  AttentionGradients gradients = AttentionGradients::poisoned(problem);
  impl.backward(problem, inputs, forward, d_out, gradients);
  return gradients;
}

}  // namespace flashlab
