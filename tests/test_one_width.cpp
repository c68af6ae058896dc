// The entries built for one tile width on the case matrix's kinds of case, at that width.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <string>

#include "tests/harness.hpp"

namespace flashlab::testing {

// The entries built for one tile width meet only some of the matrix's kinds of case. split_q_4warps and
// ws_bc176 (the 128 width) meet few, for the matrix is mostly at d 64: no explicit mask, window or poisoned
// padding. ws_m192 (the 64 width) misses those at d 128, among them the awkward lengths 203 x 203 (a second
// 192-row tile of 11 rows), MQA under a causal mask and large magnitudes. Each case such an entry refuses for
// its head dim alone runs again here at a head dim it takes, in the entry's first dtype (its dtypes are one
// kernel template). In order only (tests/CMakeLists.txt): the shuffled schedule runs the same kernels'
// synchronization on the matrix itself.
TEST_CASE("one-width entries meet the matrix's kinds of case at their width") {
  const std::map<std::string, int64_t> widths = {
      {"cuda_v2/split_q_4warps", 128}, {"cuda_v3_hopper/ws_bc176", 128}, {"cuda_v3_hopper/ws_m192", 64}};
  std::map<std::string, Tally> tally;
  for (const Case& original : case_matrix()) {
    for (const Implementation* impl : selected_implementations()) {
      const auto width = widths.find(impl->name);
      if (width == widths.end()) continue;
      for (DType dtype : {selected_dtypes(*impl).front()}) {
        Problem problem = original.problem;
        problem.dtype = dtype;
        const std::string as_it_is = why_cannot_run(*impl, problem);
        if (as_it_is.empty() || !contains(as_it_is, "head_dim"))
          continue;  // the matrix runs it as it is, or it is refused for something else
        Case test_case = original;
        test_case.name += ", at d " + std::to_string(width->second);
        test_case.problem.head_dim = problem.head_dim = width->second;
        const std::string reason = why_cannot_run(*impl, problem);
        if (!reason.empty()) {
          ++tally[impl->name].skipped[reason];
          continue;
        }
        PreparedCase prepared = prepare(test_case, dtype);
        check_case(*impl, dtype, test_case, prepared, tally[impl->name]);
      }
    }
  }
  print_tally(tally);
  // Not vacuous: each listed entry that is selected ran cases here, and passed them.
  for (const Implementation* impl : selected_implementations())
    if (widths.count(impl->name) != 0) {
      INFO(impl->name, " ran no case at its width here");
      CHECK(tally[impl->name].passed > 0);
    }
}

// The same for the backward: cuda_v2/split_q_bwd128's backward takes d 64 and 128 only. Each case of the
// matrix it refuses for its head dim alone runs here at d 64, among them three kinds that the matrix has at
// d 32 only (causal square, the window (-1, 5), padding with a window and GQA).
TEST_CASE("one-width entries meet the backward matrix's kinds of case at their width") {
  const std::map<std::string, int64_t> widths = {{"cuda_v2/split_q_bwd128", 64}};
  std::map<std::string, Tally> tally;
  for (const Case& original : case_matrix()) {
    for (const Implementation* impl : selected_implementations()) {
      const auto width = widths.find(impl->name);
      if (width == widths.end() || !impl->backward) continue;
      const DType dtype = selected_dtypes(*impl).front();
      Problem problem = original.problem;
      problem.dtype = dtype;
      const std::string as_it_is = why_cannot_run_backward(*impl, problem);
      if (as_it_is.empty() || !contains(as_it_is, "head_dim")) continue;
      Case test_case = original;
      test_case.name += ", at d " + std::to_string(width->second);
      test_case.problem.head_dim = problem.head_dim = width->second;
      const std::string reason = why_cannot_run_backward(*impl, problem);
      if (!reason.empty()) {
        ++tally[impl->name].skipped[reason];
        continue;
      }
      const PreparedCase prepared = prepare(test_case, dtype);
      const PreparedBackward prepared_backward =
          prepare_backward(prepared, test_case.seed + 500, impl->rounds_p);
      const AttentionOutputs out = run_forward(*impl, prepared.problem, prepared.inputs);
      const AttentionGradients grad =
          run_backward(*impl, prepared.problem, prepared.inputs, out, prepared_backward.d_out);
      const GradientVerdict verdict =
          judge_gradients(prepared.problem, grad, prepared_backward.reference, prepared_backward.tolerance);
      INFO(impl->name, " [", to_string(dtype), "] backward on '", test_case.name, "' (",
           prepared.problem.describe(), "): ", verdict.explain());
      report_case(verdict.passed(), impl->name, dtype, "backward ", test_case, prepared.problem,
                  verdict.explain());
      ++(verdict.passed() ? tally[impl->name].passed : tally[impl->name].failed);
      CHECK(verdict.passed());
    }
  }
  print_tally(tally, "backward: ");
  for (const Implementation* impl : selected_implementations())
    if (widths.count(impl->name) != 0) {
      INFO(impl->name, " ran no backward case at its width here");
      CHECK(tally[impl->name].passed > 0);
    }
}

}  // namespace flashlab::testing
