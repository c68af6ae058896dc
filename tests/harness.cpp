#include "tests/harness.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <regex>

#include "common/cuda/device.hpp"
#include "common/error.hpp"
#include "common/inputs.hpp"
#include "common/paged_kv.hpp"

namespace flashlab::testing {

std::vector<const Implementation*> selected_implementations(bool any_device) {
  const char* filter = std::getenv("FLASHLAB_IMPL");
  const char* device = any_device ? nullptr : std::getenv("FLASHLAB_DEVICE");
  std::vector<const Implementation*> selected;
  for (const Implementation& impl : implementations())
    if ((filter == nullptr || std::regex_search(impl.name, std::regex(filter))) &&
        (device == nullptr || to_string(impl.device) == device))
      selected.push_back(&impl);
  return selected;
}

std::vector<DType> selected_dtypes(const Implementation& impl) {
  const char* which = std::getenv("FLASHLAB_DTYPES");
  if (which == nullptr || impl.dtypes.empty()) return impl.dtypes;
  const std::string setting = which;
  const bool first = setting == "first" || (setting.rfind("first:", 0) == 0 &&
                                            std::regex_search(impl.name, std::regex(setting.substr(6))));
  if (first) return {impl.dtypes.front()};
  return impl.dtypes;
}

Tolerance PreparedCase::tolerance(bool rounds_p) {
  auto found = tolerances_.find(rounds_p);
  if (found != tolerances_.end()) return found->second;
  const AttentionOutputs baseline = baseline_attention(problem, inputs, problem.dtype, rounds_p);
  const Tolerance tol = tolerance_from_baseline(problem.dtype, deviation(problem, baseline, reference));
  tolerances_.emplace(rounds_p, tol);
  return tol;
}

PreparedCase prepare(const Case& test_case, DType dtype) {
  PreparedCase prepared;
  prepared.problem = test_case.problem;
  prepared.problem.dtype = dtype;
  prepared.inputs = random_inputs(prepared.problem, test_case.distribution, test_case.seed);
  poison_padding(prepared.problem, prepared.inputs);
  attach_paged_kv(prepared.problem, prepared.inputs, test_case.seed);
  prepared.reference = reference_attention(prepared.problem, prepared.inputs);
  return prepared;
}

PreparedBackward prepare_backward(const PreparedCase& prepared, uint64_t seed, bool rounds_p) {
  PreparedBackward result;
  const Problem& p = prepared.problem;
  result.d_out = random_d_out(p, seed);
  result.reference = reference_backward(p, prepared.inputs, result.d_out);
  const AttentionGradients baseline = baseline_backward(p, prepared.inputs, result.d_out, p.dtype, rounds_p);
  result.tolerance =
      gradient_tolerance_from_baseline(p.dtype, gradient_deviation(p, baseline, result.reference));
  return result;
}

std::string error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

void poison_padding(const Problem& p, AttentionInputs& inputs) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (int64_t b = 0; b < p.batch; ++b) {  // packed batches have no padding: stored rows are real rows
    for (int64_t i = p.rows_q(b); i < p.stored_rows_q(b); ++i)
      for (int64_t x = 0; x < p.heads_q * p.head_dim; ++x)
        inputs.q.data[p.q_offset(b, i, 0) + x] = x % 2 ? nan : inf;
    for (int64_t j = p.rows_k(b); j < p.stored_rows_k(b); ++j)
      for (int64_t x = 0; x < p.heads_kv * p.head_dim; ++x) {
        const int64_t at = p.kv_offset(b, j, 0) + x;
        inputs.k.data[at] = x % 3 ? nan : -inf;
        inputs.v.data[at] = x % 3 ? nan : inf;
      }
  }
}

Problem shaped(int64_t heads, int64_t kv_heads, int64_t sq, int64_t sk, int64_t d, DType dtype, bool causal,
               int64_t batch) {
  Problem p = problem_shape(batch, heads, kv_heads, sq, sk, d);
  p.dtype = dtype;
  p.causal = causal;
  return p;
}

Problem windowed(Problem p, int64_t left, int64_t right) {
  p.window_left = left;
  p.window_right = right;
  return p;
}

emulator::Counters counted_forward(const Implementation& impl, const Problem& p) {
  REQUIRE(why_cannot_run(impl, p).empty());
  const bool forced = cuda::emulation_forced();
  cuda::force_emulation(true);
  const AttentionInputs inputs = random_inputs(p, Distribution::normal, 7);
  emulator::start_counting();
  run_forward(impl, p, inputs);
  const emulator::Counters counted = emulator::stop_counting();
  cuda::force_emulation(forced);
  return counted;
}

double counted_forward_bytes(const Implementation& impl, const Problem& p) {
  const emulator::Counters counted = counted_forward(impl, p);
  return static_cast<double>(counted.global_read_bytes + counted.global_write_bytes);
}

void report_case(bool passed, const std::string& impl, DType dtype, const char* pass, const Case& test_case,
                 const Problem& problem, const std::string& explanation) {
  if (std::getenv("FLASHLAB_VERBOSE") == nullptr) return;
  std::printf("  %s %s [%s] %son '%s' (%s)\n", passed ? "PASS" : "FAIL", impl.c_str(),
              std::string(to_string(dtype)).c_str(), pass, test_case.name.c_str(),
              problem.describe().c_str());
  if (passed) return;
  std::string detail = "    " + explanation;
  for (size_t at = detail.find('\n'); at != std::string::npos; at = detail.find('\n', at + 1))
    detail.insert(at + 1, "  ");
  std::printf("%s\n", detail.c_str());
}

void check_case(const Implementation& impl, DType dtype, const Case& test_case, PreparedCase& prepared,
                Tally& tally) {
  AttentionOutputs out;
  try {
    out = run_forward(impl, prepared.problem, prepared.inputs);
  } catch (const Error& error) {  // e.g. what the emulator found wrong inside a kernel: a failed case
    const std::string what = error.what();
    INFO(impl.name, " [", to_string(dtype), "] on '", test_case.name, "' (", prepared.problem.describe(),
         "): ", what);
    // Reported before the check: a run stopped at its first failure (--abort-after) still prints it.
    report_case(false, impl.name, dtype, "", test_case, prepared.problem, what);
    ++tally.failed;
    CHECK_MESSAGE(false, "the run failed");
    return;
  }
  const Verdict verdict = judge(prepared.problem, out, prepared.reference, prepared.tolerance(impl.rounds_p));
  INFO(impl.name, " [", to_string(dtype), "] on '", test_case.name, "' (", prepared.problem.describe(),
       "): ", verdict.explain());
  report_case(verdict.passed(), impl.name, dtype, "", test_case, prepared.problem, verdict.explain());
  ++(verdict.passed() ? tally.passed : tally.failed);
  CHECK(verdict.passed());
}

void check_backward_case(const Implementation& impl, DType dtype, const Case& test_case,
                         const PreparedCase& prepared, const PreparedBackward& backward, Tally& tally) {
  const AttentionOutputs out = run_forward(impl, prepared.problem, prepared.inputs);
  const AttentionGradients grad = run_backward(impl, prepared.problem, prepared.inputs, out, backward.d_out);
  const GradientVerdict verdict =
      judge_gradients(prepared.problem, grad, backward.reference, backward.tolerance);
  INFO(impl.name, " [", to_string(dtype), "] backward on '", test_case.name, "' (",
       prepared.problem.describe(), "): ", verdict.explain());
  // Reported before the check: a run stopped at its first failure still prints it.
  report_case(verdict.passed(), impl.name, dtype, "backward ", test_case, prepared.problem,
              verdict.explain());
  ++(verdict.passed() ? tally.passed : tally.failed);
  CHECK(verdict.passed());
}

void print_tally(const std::map<std::string, Tally>& tally, const char* pass) {
  for (const auto& [name, counts] : tally) {
    std::printf("  %-28s %s%3d passed, %d failed", name.c_str(), pass, counts.passed, counts.failed);
    int skipped = 0;
    for (const auto& [reason, count] : counts.skipped) skipped += count;
    if (skipped > 0) std::printf(", %d skipped", skipped);
    std::printf("\n");
    for (const auto& [reason, count] : counts.skipped)
      std::printf("      skipped %d: %s\n", count, reason.c_str());
  }
}

}  // namespace flashlab::testing
