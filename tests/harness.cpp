#include "tests/harness.hpp"

#include <cstdlib>
#include <regex>

#include "common/paged_kv.hpp"

namespace flashlab::testing {

std::vector<const Implementation*> selected_implementations() {
  const char* filter = std::getenv("FLASHLAB_IMPL");
  std::vector<const Implementation*> selected;
  for (const Implementation& impl : implementations())
    if (filter == nullptr || std::regex_search(impl.name, std::regex(filter))) selected.push_back(&impl);
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

}  // namespace flashlab::testing
