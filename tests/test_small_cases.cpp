// A few small cases for every GPU implementation, forward and (where there is one) backward, each checked
// against the fp64 reference: what the GPU report runs under compute-sanitizer's memcheck and racecheck in
// one process (bench/gpu_report.py), small enough for the sanitizers' slowdown, and together touching what
// goes wrong at the edges: lengths that are not multiples of any tile, GQA, causal with seqlen_q != seqlen_k,
// a window, padding with a zero length (its padding poisoned), a decode-sized query, head dims 64, 128 and
// 256.
#include <doctest/doctest.h>

#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "tests/harness.hpp"

namespace flashlab::testing {

namespace {

std::vector<Case> small_cases() {
  std::vector<Case> cases;
  Problem gqa = problem_shape(2, 4, 2, 97, 203, 64);
  gqa.causal = true;
  cases.push_back({"GQA, causal, seqlen_q < seqlen_k, lengths off every tile", gqa});
  Problem decode = problem_shape(3, 8, 2, 4, 700, 128);
  decode.window_left = 300;
  decode.seqlens_k = {700, 0, 333};
  cases.push_back({"a decode-sized query, a window, padding with a zero length", decode});
  Problem wide = problem_shape(1, 2, 1, 130, 77, 256);
  wide.causal = true;
  cases.push_back({"MQA, d 256, causal with seqlen_q > seqlen_k (rows that see nothing)", wide});
  return cases;
}

}  // namespace

TEST_CASE("every GPU implementation on the small cases, forward and backward") {
  std::vector<const Implementation*> impls;
  for (const Implementation* impl : selected_implementations())
    if (impl->device == Device::cuda) impls.push_back(impl);
  if (impls.empty()) {  // FLASHLAB_DEVICE=cpu (the `harness` entry): the GPU stages run in the other entries
    MESSAGE("FLASHLAB_IMPL and FLASHLAB_DEVICE select no GPU implementation");
    return;
  }
  std::map<std::string, int> forward_runs, backward_runs;
  for (const Case& test_case : small_cases()) {
    std::map<DType, std::optional<PreparedCase>> prepared;
    for (const Implementation* impl : impls) {
      for (DType dtype : selected_dtypes(*impl)) {
        Problem problem = test_case.problem;
        problem.dtype = dtype;
        if (!why_cannot_run(*impl, problem).empty()) continue;
        auto& slot = prepared[dtype];
        if (!slot) slot = prepare(test_case, dtype);
        INFO(impl->name, " [", to_string(dtype), "] on '", test_case.name, "' (", slot->problem.describe(),
             ")");
        AttentionOutputs out;
        const std::string error = error_of([&] { out = run_forward(*impl, slot->problem, slot->inputs); });
        CHECK_MESSAGE(error.empty(), error);
        if (!error.empty()) continue;
        const Verdict verdict = judge(slot->problem, out, slot->reference, slot->tolerance(impl->rounds_p));
        CHECK_MESSAGE(verdict.passed(), verdict.explain());
        ++forward_runs[impl->name];
        if (!why_cannot_run_backward(*impl, slot->problem).empty()) continue;
        const PreparedBackward backward = prepare_backward(*slot, 5, impl->rounds_p);
        AttentionGradients gradients;
        const std::string backward_error = error_of(
            [&] { gradients = run_backward(*impl, slot->problem, slot->inputs, out, backward.d_out); });
        CHECK_MESSAGE(backward_error.empty(), backward_error);
        if (!backward_error.empty()) continue;
        const GradientVerdict gradient_verdict =
            judge_gradients(slot->problem, gradients, backward.reference, backward.tolerance);
        CHECK_MESSAGE(gradient_verdict.passed(), gradient_verdict.explain());
        ++backward_runs[impl->name];
      }
    }
  }
  for (const Implementation* impl : impls) {
    INFO(impl->name);
    CHECK_MESSAGE(forward_runs[impl->name] > 0, "runs none of the small cases: add one it takes");
    std::printf("  %-30s %d forward, %d backward\n", impl->name.c_str(), forward_runs[impl->name],
                backward_runs[impl->name]);
  }
}

}  // namespace flashlab::testing
