#include "tests/harness.hpp"

#include <cstdio>
#include <cstdlib>
#include <regex>

#include "common/paged_kv.hpp"

namespace flashlab::testing {

std::vector<const Implementation*> selected_implementations() {
  const char* filter = std::getenv("FLASHLAB_IMPL");
  const char* device = std::getenv("FLASHLAB_DEVICE");
  std::vector<const Implementation*> selected;
  for (const Implementation& impl : implementations())
    if ((filter == nullptr || std::regex_search(impl.name, std::regex(filter))) &&
        (device == nullptr || to_string(impl.device) == device))
      selected.push_back(&impl);
  return selected;
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
  attach_paged_kv(prepared.problem, prepared.inputs, test_case.seed);
  prepared.reference = reference_attention(prepared.problem, prepared.inputs);
  return prepared;
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

}  // namespace flashlab::testing
