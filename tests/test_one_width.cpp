// The entries built for one tile width on the case matrix's kinds of case, at that width.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "tests/harness.hpp"

namespace flashlab::testing {

namespace {

using Widths = std::map<std::string, int64_t>;

// `original` at head dim `width`, in `dtype`, when `why` (why_cannot_run or why_cannot_run_backward) refuses
// it as it is for its head dim alone; none when the matrix runs it as it is, or refuses it for something
// else. A refusal at `width` too is counted in `tally` as a skip.
std::optional<Case> at_width(const Case& original, const Implementation& impl, DType dtype, int64_t width,
                             std::string (*why)(const Implementation&, const Problem&), Tally& tally) {
  Problem problem = original.problem;
  problem.dtype = dtype;
  const std::string as_it_is = why(impl, problem);
  if (as_it_is.empty() || !contains(as_it_is, "head_dim")) return std::nullopt;
  Case test_case = original;
  test_case.name += ", at d " + std::to_string(width);
  test_case.problem.head_dim = problem.head_dim = width;
  if (const std::string reason = why(impl, problem); !reason.empty()) {
    ++tally.skipped[reason];
    return std::nullopt;
  }
  return test_case;
}

// Not vacuous: each listed entry that is selected ran cases here, and passed them.
void check_each_ran(const Widths& widths, std::map<std::string, Tally>& tally) {
  for (const Implementation* impl : selected_implementations())
    if (widths.count(impl->name) != 0) {
      INFO(impl->name, " ran no case at its width here");
      CHECK(tally[impl->name].passed > 0);
    }
}

}  // namespace

// The entries built for one tile width meet only some of the matrix's kinds of case. split_q_8warps and
// ws_bc176 (the 128 width) meet few, for the matrix is mostly at d 64: no explicit mask, window or poisoned
// padding. split_q_bc64 and ws_m192 (the 64 width) miss those at d 128, among them the awkward lengths 203 x
// 203 (a second 192-row tile of 11 rows), MQA under a causal mask and large magnitudes. Each case such an
// entry refuses for its head dim alone runs again here at a head dim it takes, in the entry's first dtype
// (its dtypes are one kernel template). In order only (tests/CMakeLists.txt): the shuffled schedule runs the
// same kernels' synchronization on the matrix itself.
TEST_CASE("one-width entries meet the matrix's kinds of case at their width") {
  const Widths widths = {{"cuda_v2/split_q_8warps", 128},
                         {"cuda_v2/split_q_bc64", 64},
                         {"cuda_v3_hopper/ws_bc176", 128},
                         {"cuda_v3_hopper/ws_m192", 64}};
  std::map<std::string, Tally> tally;
  for (const Case& original : case_matrix())
    for (const Implementation* impl : selected_implementations()) {
      const auto width = widths.find(impl->name);
      if (width == widths.end()) continue;
      const DType dtype = selected_dtypes(*impl).front();
      const std::optional<Case> test_case =
          at_width(original, *impl, dtype, width->second, why_cannot_run, tally[impl->name]);
      if (!test_case) continue;
      PreparedCase prepared = prepare(*test_case, dtype);
      check_case(*impl, dtype, *test_case, prepared, tally[impl->name]);
    }
  print_tally(tally);
  check_each_ran(widths, tally);
}

// The same for the backward: cuda_v2/split_q_bwd128's and split_q_bwd64x128's backwards take d 64 and 128
// only. Each case of the
// matrix it refuses for its head dim alone runs here at d 64, among them three kinds that the matrix has at
// d 32 only (causal square, the window (-1, 5), padding with a window and GQA).
TEST_CASE("one-width entries meet the backward matrix's kinds of case at their width") {
  const Widths widths = {{"cuda_v2/split_q_bwd128", 64}, {"cuda_v2/split_q_bwd64x128", 64}};
  std::map<std::string, Tally> tally;
  for (const Case& original : case_matrix())
    for (const Implementation* impl : selected_implementations()) {
      const auto width = widths.find(impl->name);
      if (width == widths.end() || !impl->backward) continue;
      const DType dtype = selected_dtypes(*impl).front();
      const std::optional<Case> test_case =
          at_width(original, *impl, dtype, width->second, why_cannot_run_backward, tally[impl->name]);
      if (!test_case) continue;
      const PreparedCase prepared = prepare(*test_case, dtype);
      check_backward_case(*impl, dtype, *test_case, prepared,
                          prepare_backward(prepared, test_case->seed + 500, impl->rounds_p),
                          tally[impl->name]);
    }
  print_tally(tally, "backward: ");
  check_each_ran(widths, tally);
}

}  // namespace flashlab::testing
