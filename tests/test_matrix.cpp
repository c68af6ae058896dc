// Every selected implementation against the fp64 reference on every case of the matrix, at every dtype it
// offers.
#include <doctest/doctest.h>

#include <cstdio>
#include <map>
#include <optional>

#include "common/error.hpp"
#include "tests/harness.hpp"

namespace flashlab::testing {

TEST_CASE("every implementation matches the fp64 reference on the case matrix") {
  struct Tally {
    int passed = 0, failed = 0;
    std::map<std::string, int> skipped;  // reason -> count
  };
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
        AttentionOutputs out;
        try {
          out = run_forward(*impl, slot->problem, slot->inputs);
        } catch (const Error& error) {  // e.g. what the emulator found wrong inside a kernel: a failed case
          const std::string what = error.what();
          INFO(impl->name, " [", to_string(dtype), "] on '", test_case.name, "' (", slot->problem.describe(),
               "): ", what);
          // Reported before the check: a run stopped at its first failure (--abort-after) still prints it.
          report_case(false, impl->name, dtype, "", test_case, slot->problem, what);
          ++tally[impl->name].failed;
          CHECK_MESSAGE(false, "the run failed");
          continue;
        }
        const Verdict verdict = judge(slot->problem, out, slot->reference, slot->tolerance(impl->rounds_p));
        INFO(impl->name, " [", to_string(dtype), "] on '", test_case.name, "' (", slot->problem.describe(),
             "): ", verdict.explain());
        report_case(verdict.passed(), impl->name, dtype, "", test_case, slot->problem, verdict.explain());
        ++(verdict.passed() ? tally[impl->name].passed : tally[impl->name].failed);
        CHECK(verdict.passed());
      }
    }
  }
  for (const auto& [name, counts] : tally) {
    std::printf("  %-28s %3d passed, %d failed", name.c_str(), counts.passed, counts.failed);
    int skipped = 0;
    for (const auto& [reason, count] : counts.skipped) skipped += count;
    if (skipped > 0) std::printf(", %d skipped", skipped);
    std::printf("\n");
    for (const auto& [reason, count] : counts.skipped)
      std::printf("      skipped %d: %s\n", count, reason.c_str());
  }
}

}  // namespace flashlab::testing
