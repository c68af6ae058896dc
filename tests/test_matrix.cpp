// Every selected implementation against the fp64 reference on every case of the matrix, at every dtype it
// offers.
#include <doctest/doctest.h>

#include <map>
#include <optional>

#include "tests/harness.hpp"

namespace flashlab::testing {

TEST_CASE("every implementation matches the fp64 reference on the case matrix") {
  const auto impls = selected_implementations();
  REQUIRE_MESSAGE(!impls.empty(), "FLASHLAB_IMPL selects no implementation");
  std::map<std::string, Tally> tally;
  for (const Case& test_case : case_matrix()) {
    std::map<DType, std::optional<PreparedCase>> prepared;  // built lazily, once per dtype
    for (const Implementation* impl : impls) {
      for (DType dtype : selected_dtypes(*impl)) {
        Problem problem = test_case.problem;
        problem.dtype = dtype;
        const std::string reason = why_cannot_run(*impl, problem);
        if (!reason.empty()) {
          ++tally[impl->name].skipped[reason];
          continue;
        }
        auto& slot = prepared[dtype];
        if (!slot) slot = prepare(test_case, dtype);
        check_case(*impl, dtype, test_case, *slot, tally[impl->name]);
      }
    }
  }
  print_tally(tally);
}

}  // namespace flashlab::testing
