// Every selected implementation that provides a backward pass, against the fp64 reference backward on every
// case of the matrix, with the gradient tolerance policy (common/tolerance.hpp). Gradients arrive poisoned.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "common/error.hpp"
#include "tests/harness.hpp"

namespace flashlab::testing {

TEST_CASE("every backward matches the fp64 reference backward on the case matrix") {
  std::vector<const Implementation*> impls;
  for (const Implementation* impl : selected_implementations())
    if (impl->backward) impls.push_back(impl);
  if (impls.empty()) {
    MESSAGE("FLASHLAB_IMPL selects no implementation with a backward pass");
    return;
  }
  std::map<std::string, Tally> tally;
  for (const Case& test_case : case_matrix()) {
    std::map<DType, std::optional<PreparedCase>> prepared;  // built lazily, once per dtype
    std::map<std::pair<DType, bool>, std::optional<PreparedBackward>> prepared_backward;
    for (const Implementation* impl : impls) {
      for (DType dtype : selected_dtypes(*impl)) {
        Problem problem = test_case.problem;
        problem.dtype = dtype;
        const std::string reason = why_cannot_run_backward(*impl, problem);
        if (!reason.empty()) {
          ++tally[impl->name].skipped[reason];
          continue;
        }
        if (dtype == DType::e4m3) {
          ++tally[impl->name].skipped["e4m3 has no backward check"];
          continue;
        }
        auto& slot = prepared[dtype];
        if (!slot) slot = prepare(test_case, dtype);
        auto& backward_slot = prepared_backward[{dtype, impl->rounds_p}];
        if (!backward_slot) backward_slot = prepare_backward(*slot, test_case.seed + 500, impl->rounds_p);
        check_backward_case(*impl, dtype, test_case, *slot, *backward_slot, tally[impl->name]);
      }
    }
  }
  print_tally(tally, "backward: ");
}

TEST_CASE("NaN and Inf in valid inputs reach exactly the gradients they reach in the reference backward") {
  // A hidden pair takes no part in the gradients (docs/08), so a non-finite element may reach only the
  // gradients of pairs that see it. A tile product multiplies a hidden pair's zero by its operand anyway, and
  // 0 x NaN is NaN: each placement below leaks through one of the products (dK through Q, dQ through K, dV
  // through dO) in a tile that holds both seen and hidden pairs, unless the backward prevents it. Two
  // problems: causal (row i sees keys j <= i + 32), and a sliding window with an explicit mask and per-batch
  // lengths whose padding holds NaN and Inf.
  Problem causal;
  causal.batch = 2;
  causal.heads_q = 4;
  causal.heads_kv = 2;
  causal.seqlen_q = 45;
  causal.seqlen_k = 77;
  causal.causal = true;
  Problem windowed = causal;
  windowed.causal = false;
  windowed.window_left = 24;
  windowed.window_right = 6;
  windowed.seqlens_q = {45, 40};
  windowed.seqlens_k = {77, 70};
  auto mask = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(45 * 77));
  for (size_t e = 0; e < mask->size(); ++e) (*mask)[e] = e % 7 != 3;
  windowed.mask = std::move(mask);
  for (const Implementation* impl : selected_implementations()) {
    if (!impl->backward) continue;
    for (Problem p : {causal, windowed}) {
      bool runnable = false;
      for (int64_t head_dim : {32, 64}) {
        p.head_dim = head_dim;
        for (DType dtype : selected_dtypes(*impl)) {
          p.dtype = dtype;
          if (dtype != DType::e4m3 && why_cannot_run_backward(*impl, p).empty()) {
            runnable = true;
            break;
          }
        }
        if (runnable) break;
      }
      if (!runnable) {
        MESSAGE(impl->name, ": cannot run ", p.describe(), " backward");
        continue;
      }
      const int64_t d = p.head_dim;
      AttentionInputs in = random_inputs(p, Distribution::normal, 41);
      poison_padding(p, in);
      const HostTensor clean_d_out = random_d_out(p, 42);
      // The tolerance from the same inputs without the special values.
      const ReferenceGradients clean = reference_backward(p, in, clean_d_out);
      const GradientTolerance tolerance = gradient_tolerance_from_baseline(
          p.dtype,
          gradient_deviation(p, baseline_backward(p, in, clean_d_out, p.dtype, impl->rounds_p), clean));
      const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
      auto q_at = [&](int64_t b, int64_t i, int64_t h, int64_t c) -> float& {
        return in.q.data[((b * p.seqlen_q + i) * p.heads_q + h) * d + c];
      };
      auto kv_at = [&](HostTensor& t, int64_t b, int64_t j, int64_t h, int64_t c) -> float& {
        return t.data[((b * p.seqlen_k + j) * p.heads_kv + h) * d + c];
      };
      HostTensor d_out = clean_d_out;
      q_at(0, 3, 0, 5) = nan;           // dK of keys in row 3's tiles that it does not see
      q_at(1, 10, 3, 0) = inf;          // the same through +-Inf scores
      kv_at(in.k, 1, 60, 0, 1) = -inf;  // dQ of rows in key 60's tile that do not see it
      kv_at(in.v, 1, 20, 1, 2) = inf;   // dP of every row, where the mask zeroes dS
      d_out.data[((0 * p.seqlen_q + 30) * p.heads_q + 2) * d + 7] = nan;  // dV of keys row 30 does not see
      const ReferenceGradients reference = reference_backward(p, in, d_out);
      const AttentionOutputs out = run_forward(*impl, p, in);
      const AttentionGradients grad = run_backward(*impl, p, in, out, d_out);
      const GradientVerdict verdict = judge_gradients(p, grad, reference, tolerance);
      INFO(impl->name, " [", to_string(p.dtype), "] on ", p.describe(), ": ", verdict.explain());
      CHECK(verdict.passed());  // NaN and Inf exactly where the reference has them, accurate elsewhere
    }
  }
}

TEST_CASE("the gradient check catches unwritten and wrong elements") {
  Problem p;
  p.heads_q = 2;
  p.seqlen_q = 9;
  p.seqlen_k = 11;
  p.head_dim = 8;
  p.heads_kv = 1;
  const AttentionInputs in = random_inputs(p, Distribution::normal, 3);
  const HostTensor d_out = random_d_out(p, 4);
  const ReferenceGradients ref = reference_backward(p, in, d_out);
  const AttentionGradients baseline = baseline_backward(p, in, d_out, DType::f32);
  const GradientTolerance tol =
      gradient_tolerance_from_baseline(DType::f32, gradient_deviation(p, baseline, ref));
  CHECK(judge_gradients(p, baseline, ref, tol).passed());
  CHECK_FALSE(judge_gradients(p, AttentionGradients::poisoned(p), ref, tol).passed());
  for (HostTensor AttentionGradients::*tensor :
       {&AttentionGradients::dq, &AttentionGradients::dk, &AttentionGradients::dv}) {
    AttentionGradients unwritten = baseline;
    (unwritten.*tensor).data[5] = NAN;
    CHECK_FALSE(judge_gradients(p, unwritten, ref, tol).passed());
    AttentionGradients wrong = baseline;
    (wrong.*tensor).data[7] += 1e-3f;
    CHECK_FALSE(judge_gradients(p, wrong, ref, tol).passed());
  }
}

TEST_CASE("a failing gradient verdict names the first wrong element of the failing tensor") {
  Problem p;
  p.seqlen_q = 5;
  p.seqlen_k = 6;
  p.head_dim = 8;
  const AttentionInputs in = random_inputs(p, Distribution::normal, 5);
  const HostTensor d_out = random_d_out(p, 6);
  const ReferenceGradients ref = reference_backward(p, in, d_out);
  const AttentionGradients baseline = baseline_backward(p, in, d_out, DType::f32);
  const GradientTolerance tol =
      gradient_tolerance_from_baseline(DType::f32, gradient_deviation(p, baseline, ref));
  AttentionGradients wrong = baseline;
  wrong.dk.data[11] += 1.0f;  // dK[b=0, j=1, h=0, c=3]
  wrong.dk.data[40] += 2.0f;  // dK[b=0, j=5, h=0, c=0], the worst
  const GradientVerdict verdict = judge_gradients(p, wrong, ref, tol);
  REQUIRE_FALSE(verdict.passed());
  const std::string text = verdict.explain();
  CHECK(text.find("first wrong: dK[b=0, j=1, h=0, c=3]") != std::string::npos);
  CHECK(text.find("worst:       dK[b=0, j=5, h=0, c=0]") != std::string::npos);
  CHECK(text.find("dQ[") == std::string::npos);  // dQ and dV are right: not named
  CHECK(text.find("dV[") == std::string::npos);
}

TEST_CASE("run_backward refuses what it cannot run, naming the reason") {
  Problem p;
  p.seqlen_q = 4;
  p.seqlen_k = 4;
  p.head_dim = 8;
  const AttentionInputs in = random_inputs(p, Distribution::normal, 1);
  const AttentionOutputs out = AttentionOutputs::poisoned(p);
  for (const Implementation& impl : implementations()) {
    if (impl.backward || !why_cannot_run(impl, p).empty()) continue;
    CHECK_THROWS_WITH_AS(run_backward(impl, p, in, out, random_d_out(p, 2)),
                         (impl.name + " cannot run this problem backward: no backward pass").c_str(), Error);
    break;
  }
  for (const Implementation& impl : implementations()) {
    if (!impl.backward || !why_cannot_run_backward(impl, p).empty()) continue;
    CHECK_THROWS_WITH_AS(run_backward(impl, p, in, out, HostTensor({1, 3, 1, 8})),
                         "dO must have the shape of O [batch, seqlen_q, heads_q, head_dim]", Error);
  }
}

}  // namespace flashlab::testing
