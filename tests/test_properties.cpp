// Properties every implementation must have beyond matching the reference: shift invariance, joint key/value
// permutation invariance, agreement between stages; and the harness's own guards (poisoned outputs are
// caught, unsupported problems are refused with a reason).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <tuple>

#include "common/error.hpp"
#include "tests/harness.hpp"

namespace flashlab::testing {

namespace {

// Inputs on a coarse grid (multiples of 1/8 in [-4, 4]) so that adding small integers to them stays exact in
// every dtype down to bf16: the shifted problem then differs from the original by the shift alone.
PreparedCase grid_case(Problem problem, DType dtype, uint64_t seed) {
  problem.dtype = dtype;
  PreparedCase prepared;
  prepared.problem = problem;
  prepared.inputs = random_inputs(problem, Distribution::normal, seed);
  for (HostTensor* tensor : {&prepared.inputs.q, &prepared.inputs.k, &prepared.inputs.v})
    for (float& x : tensor->data) x = std::clamp(std::round(x * 8.0f) / 8.0f, -4.0f, 4.0f);
  prepared.reference = reference_attention(problem, prepared.inputs);
  return prepared;
}

Problem property_problem(bool causal, int64_t head_dim = 32, int64_t seqlen_q = 45) {
  Problem p;
  p.batch = 2;
  p.heads_q = 4;
  p.heads_kv = 2;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = 77;
  p.head_dim = head_dim;
  p.causal = causal;
  return p;
}

// `base` (the property problem by default) as `impl` can run it here, with the first dtype it offers for it:
// head_dim 32, else 64 (the GPU stages' smallest tile), else 12 query rows (the decoding stages). Nothing
// when it can run none of them.
std::optional<Problem> runnable_problem(const Implementation& impl, bool causal,
                                        std::optional<Problem> base = std::nullopt) {
  for (const auto& [head_dim, seqlen_q] : {std::pair<int64_t, int64_t>{32, 45}, {64, 45}, {64, 12}}) {
    Problem p = base.value_or(property_problem(causal));
    p.head_dim = head_dim;
    p.seqlen_q = seqlen_q;
    for (DType dtype : selected_dtypes(impl)) {
      p.dtype = dtype;
      if (why_cannot_run(impl, p).empty()) return p;
    }
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("adding a constant to every score of a row leaves O unchanged and shifts LSE by it") {
  // Adding one vector u to every key adds c_i = scale * (q_i . u) to every score of row i: softmax does not
  // change, and log-sum-exp grows by c_i.
  for (const Implementation* impl : selected_implementations()) {
    const std::optional<Problem> runnable = runnable_problem(*impl, true);
    if (!runnable) continue;
    const Problem& p = *runnable;
    PreparedCase original = grid_case(p, p.dtype, 21);
    const Tolerance tol = original.tolerance(impl->rounds_p);
    AttentionInputs shifted = original.inputs;
    Random random(5);
    std::vector<float> u(static_cast<size_t>(p.head_dim));
    for (float& x : u) x = static_cast<float>(static_cast<int>(random.next() % 7) - 3);
    for (int64_t row = 0; row < p.batch * p.seqlen_k * p.heads_kv; ++row)
      for (int64_t c = 0; c < p.head_dim; ++c) shifted.k.data[row * p.head_dim + c] += u[c];

    AttentionOutputs out = run_forward(*impl, original.problem, shifted);
    for (int64_t b = 0; b < p.batch;
         ++b)  // undo the known shift of LSE, then compare with the unshifted truth
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t i = 0; i < p.seqlen_q; ++i) {
          double shift = 0.0;
          const float* q = original.inputs.q_row(p, b, i, h);
          for (int64_t c = 0; c < p.head_dim; ++c) shift += static_cast<double>(q[c]) * u[c];
          out.lse_at(p, b, h, i) -= static_cast<float>(shift * p.softmax_scale());
        }
    const Verdict verdict = judge(original.problem, out, original.reference, tol);
    INFO(impl->name, ": ", verdict.explain());
    CHECK(verdict.passed());
  }
}

TEST_CASE("permuting keys and values together leaves the output unchanged") {
  for (const Implementation* impl : selected_implementations()) {
    const std::optional<Problem> runnable = runnable_problem(*impl, false);  // no positional mask
    if (!runnable) continue;
    const Problem& p = *runnable;
    PreparedCase original = grid_case(p, p.dtype, 22);
    const Tolerance tol = original.tolerance(impl->rounds_p);
    std::vector<int64_t> order(static_cast<size_t>(p.seqlen_k));
    std::iota(order.begin(), order.end(), 0);
    Random random(9);
    for (int64_t j = p.seqlen_k - 1; j > 0; --j) std::swap(order[j], order[random.next() % (j + 1)]);
    AttentionInputs permuted = original.inputs;
    const int64_t row = p.heads_kv * p.head_dim;  // one token's K (or V) across kv heads
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t j = 0; j < p.seqlen_k; ++j)
        for (int64_t e = 0; e < row; ++e) {
          const int64_t to = (b * p.seqlen_k + j) * row + e, from = (b * p.seqlen_k + order[j]) * row + e;
          permuted.k.data[to] = original.inputs.k.data[from];
          permuted.v.data[to] = original.inputs.v.data[from];
        }
    const AttentionOutputs out = run_forward(*impl, original.problem, permuted);
    const Verdict verdict = judge(original.problem, out, original.reference, tol);
    INFO(impl->name, ": ", verdict.explain());
    CHECK(verdict.passed());
  }
}

TEST_CASE("every stage agrees with every other on the same inputs") {
  // Two implementations at the same dtype may each be off by their tolerance, so together by the sum.
  // Implementations that run the same variant of the problem (head dim, rows) at the same dtype are compared.
  for (bool causal : {false, true}) {
    Problem base = property_problem(causal);
    base.seqlens_k = {77, 30};
    using Variant = std::tuple<int64_t, int64_t, DType>;  // head_dim, seqlen_q, dtype
    std::map<Variant, std::vector<std::pair<const Implementation*, AttentionOutputs>>> by_variant;
    std::map<Variant, PreparedCase> prepared;
    for (const Implementation* impl : selected_implementations()) {
      const std::optional<Problem> runnable = runnable_problem(*impl, causal, base);
      if (!runnable) continue;
      const Problem& p = *runnable;
      const Variant variant{p.head_dim, p.seqlen_q, p.dtype};
      if (!prepared.count(variant)) prepared.emplace(variant, grid_case(p, p.dtype, 23));
      PreparedCase& c = prepared.at(variant);
      by_variant[variant].emplace_back(impl, run_forward(*impl, c.problem, c.inputs));
    }
    for (auto& [variant, runs] : by_variant) {
      const DType dtype = std::get<2>(variant);
      PreparedCase& c = prepared.at(variant);
      for (size_t a = 0; a < runs.size(); ++a)
        for (size_t b = a + 1; b < runs.size(); ++b) {
          // Compare b against a's output as if it were the reference.
          ReferenceResult as_reference{{runs[a].second.o.data.begin(), runs[a].second.o.data.end()},
                                       {runs[a].second.lse.data.begin(), runs[a].second.lse.data.end()}};
          const Tolerance ta = c.tolerance(runs[a].first->rounds_p),
                          tb = c.tolerance(runs[b].first->rounds_p);
          const Verdict verdict =
              judge(c.problem, runs[b].second, as_reference, {ta.o + tb.o, ta.lse + tb.lse});
          INFO(runs[a].first->name, " vs ", runs[b].first->name, " [", to_string(dtype),
               "]: ", verdict.explain());
          CHECK(verdict.passed());
        }
    }
  }
}

TEST_CASE("NaN and Inf inputs never crash and propagate to the affected rows like the reference") {
  for (const Implementation* impl : selected_implementations()) {
    // Causal: a poisoned key reaches only the rows that see it.
    const std::optional<Problem> runnable = runnable_problem(*impl, true);
    if (!runnable) continue;
    const Problem& p = *runnable;
    PreparedCase c = grid_case(p, p.dtype, 25);
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    c.inputs.q.data[(0 * p.seqlen_q + 3) * p.heads_q * p.head_dim + 5] =
        nan;  // query row 3 of batch 0, head 0
    c.inputs.k.data[((1 * p.seqlen_k) + 60) * p.heads_kv * p.head_dim + 1] =
        nan;  // key 60 of batch 1, kv head 0
    c.inputs.q.data[(1 * p.seqlen_q + 10) * p.heads_q * p.head_dim + 3 * p.head_dim] =
        inf;  // batch 1, row 10, head 3
    c.reference = reference_attention(c.problem, c.inputs);
    const AttentionOutputs out = run_forward(*impl, c.problem, c.inputs);
    const Verdict verdict = judge(c.problem, out, c.reference, c.tolerance(impl->rounds_p));
    INFO(impl->name, ": ", verdict.explain());
    CHECK(verdict.passed());  // NaN exactly where the reference has NaN, finite and accurate elsewhere
  }
}

TEST_CASE("NaN and Inf in a V row reach only the rows that see that key") {
  // O = P V as a tile product multiplies a hidden pair's weight, exactly 0, by its V row all the same, and
  // 0 x NaN is NaN. Causal with a window of 24: row i sees keys i + off - 24 .. i + off (off = seqlen_k -
  // seqlen_q), so the key off - 24 + sq / 2 (NaN in V) is seen by the first half of the rows only and the
  // key off + sq / 2 (+Inf) by the second half only, both within a tile of rows that do not see them. The
  // exact paths: common/special_values.hpp on the CPU, common/cuda/exact_rows.cuh on the GPU (docs/08, "NaN
  // and Inf").
  for (const Implementation* impl : selected_implementations()) {
    Problem base = property_problem(true);
    base.window_left = 24;
    const std::optional<Problem> runnable = runnable_problem(*impl, true, base);
    if (!runnable) continue;
    const Problem& p = *runnable;
    PreparedCase c = grid_case(p, p.dtype, 26);
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const int64_t off = p.seqlen_k - p.seqlen_q, seen_early = off - 24 + p.seqlen_q / 2,
                  seen_late = off + p.seqlen_q / 2;
    c.inputs.v.data[(1 * p.seqlen_k + seen_early) * p.heads_kv * p.head_dim + 2] = nan;   // kv head 0
    c.inputs.v.data[((1 * p.seqlen_k + seen_late) * p.heads_kv + 1) * p.head_dim] = inf;  // kv head 1
    c.reference = reference_attention(c.problem, c.inputs);
    const AttentionOutputs out = run_forward(*impl, c.problem, c.inputs);
    const Verdict verdict = judge(c.problem, out, c.reference, c.tolerance(impl->rounds_p));
    INFO(impl->name, " on ", p.describe(), ": ", verdict.explain());
    CHECK(verdict.passed());  // NaN and Inf exactly where the reference has them, accurate elsewhere
  }
}

TEST_CASE("NaN and Inf in the padding past the real lengths reach no visible row") {
  // Batch 0 has every row and key; batch 1 ends early in both. What lies past a batch's real lengths is
  // padding the caller may leave holding anything: here NaN and Inf in Q, K and V.
  for (const Implementation* impl : selected_implementations()) {
    std::optional<Problem> runnable = runnable_problem(*impl, false);
    if (!runnable) continue;
    Problem p = *runnable;
    p.seqlens_q = {p.seqlen_q, p.seqlen_q - p.seqlen_q / 3};
    p.seqlens_k = {p.seqlen_k, p.seqlen_k - 29};
    if (!why_cannot_run(*impl, p).empty()) p.seqlens_q.clear();  // padded keys only (the decoding stages)
    if (const std::string reason = why_cannot_run(*impl, p); !reason.empty()) {
      MESSAGE(impl->name, ": padding not supported: ", reason);
      continue;
    }
    PreparedCase c = grid_case(p, p.dtype, 27);
    poison_padding(c.problem, c.inputs);
    c.reference = reference_attention(c.problem, c.inputs);  // reads no padding: the same as without it
    const AttentionOutputs out = run_forward(*impl, c.problem, c.inputs);
    const Verdict verdict = judge(c.problem, out, c.reference, c.tolerance(impl->rounds_p));
    INFO(impl->name, " [", to_string(p.dtype), "] ", p.describe(), ": ", verdict.explain());
    CHECK(verdict.passed());
  }
}

TEST_CASE("packed batches give the padded batch's outputs and gradients") {
  // The same sequences twice: padded (seqlens_q/k, padding holding NaN and Inf) and packed one after another
  // (cu_seqlens_q/k). A stage that takes packed batches computes every real row from the same numbers in
  // both layouts. Bit for bit where its arithmetic does not depend on where an operand lies in memory (our
  // SIMD kernels, the GPU kernels); Eigen's products peel and block by alignment and size, so they may differ
  // in the last bit: held to the dtype's tolerance floor, far below any row or key taken from the wrong
  // place. The gradients too, for a CPU backward (a GPU backward's dQ gathers its shares through atomics
  // whose order the emulator's schedule may change; its packed cases are held to the reference on the case
  // matrix).
  Problem padded = problem_shape(3, 4, 2, 70, 90, 64);
  padded.causal = true;
  padded.seqlens_q = {70, 0, 33};
  padded.seqlens_k = {41, 90, 57};
  Problem packed = padded;
  packed.seqlens_q.clear();
  packed.seqlens_k.clear();
  packed.cu_seqlens_q = {0, 70, 70, 103};
  packed.cu_seqlens_k = {0, 41, 131, 188};
  int checked = 0, identical = 0;
  for (const Implementation* impl : selected_implementations()) {
    if (!impl->packed) continue;
    if (const std::string reason = unavailable_reason(*impl); !reason.empty()) {  // e.g. a handout's stage
      MESSAGE(impl->name, " not checked: ", reason);
      continue;
    }
    for (DType dtype : selected_dtypes(*impl)) {
      padded.dtype = packed.dtype = dtype;
      // An entry of the 128 tile width alone (cuda_v2/split_q_8warps) takes the same sequences at d 128.
      padded.head_dim = packed.head_dim = 64;
      if (contains(why_cannot_run(*impl, padded), "head_dim")) padded.head_dim = packed.head_dim = 128;
      REQUIRE_MESSAGE(why_cannot_run(*impl, padded).empty(), impl->name, ": ", why_cannot_run(*impl, padded));
      REQUIRE_MESSAGE(why_cannot_run(*impl, packed).empty(), impl->name, ": ", why_cannot_run(*impl, packed));
      AttentionInputs padded_in = random_inputs(padded, Distribution::normal, 29);
      poison_padding(padded, padded_in);
      AttentionInputs packed_in = empty_inputs(packed);
      for (int64_t b = 0; b < padded.batch; ++b) {  // each sequence's real rows, copied into its tokens
        const int64_t q_row = padded.heads_q * padded.head_dim, kv_row = padded.heads_kv * padded.head_dim;
        std::copy_n(padded_in.q.ptr() + padded.q_offset(b, 0, 0), padded.rows_q(b) * q_row,
                    packed_in.q.ptr() + packed.q_offset(b, 0, 0));
        for (auto [from, to] : {std::pair{&padded_in.k, &packed_in.k}, {&padded_in.v, &packed_in.v}})
          std::copy_n(from->ptr() + padded.kv_offset(b, 0, 0), padded.rows_k(b) * kv_row,
                      to->ptr() + packed.kv_offset(b, 0, 0));
      }
      const AttentionOutputs out_padded = run_forward(*impl, padded, padded_in);
      const AttentionOutputs out_packed = run_forward(*impl, packed, packed_in);
      const HostTensor padded_d_out = random_d_out(padded, 30);
      HostTensor packed_d_out(packed.q_shape());
      const bool backward = impl->device == Device::cpu && why_cannot_run_backward(*impl, packed).empty();
      std::optional<AttentionGradients> ga, gp;
      if (backward) {
        for (int64_t b = 0; b < padded.batch; ++b)
          std::copy_n(padded_d_out.ptr() + padded.q_offset(b, 0, 0),
                      padded.rows_q(b) * padded.heads_q * padded.head_dim,
                      packed_d_out.ptr() + packed.q_offset(b, 0, 0));
        ga = run_backward(*impl, padded, padded_in, out_padded, padded_d_out);
        gp = run_backward(*impl, packed, packed_in, out_packed, packed_d_out);
      }
      double worst = 0.0;  // the largest |padded - packed| / max(1, |packed|)
      bool bitwise = true;
      const auto same = [&](const float* x, const float* y, int64_t n) {
        bitwise &= std::memcmp(x, y, static_cast<size_t>(n) * sizeof(float)) == 0;
        for (int64_t e = 0; e < n; ++e) {
          if (x[e] == y[e] || (std::isnan(x[e]) && std::isnan(y[e]))) continue;  // -inf LSEs too
          const double gap = std::fabs(double{x[e]} - double{y[e]}) / std::max(1.0, std::fabs(double{y[e]}));
          worst = std::max(worst, std::isnan(gap) ? INFINITY : gap);
        }
      };
      const int64_t d = padded.head_dim;
      for (int64_t b = 0; b < padded.batch; ++b)
        for (int64_t h = 0; h < padded.heads_q; ++h) {
          for (int64_t i = 0; i < padded.rows_q(b); ++i) {
            same(out_padded.o_row(padded, b, i, h), out_packed.o_row(packed, b, i, h), d);
            same(&out_padded.lse.data[padded.lse_offset(b, h, i)],
                 &out_packed.lse.data[packed.lse_offset(b, h, i)], 1);
            if (backward)
              same(&ga->dq.data[padded.q_offset(b, i, h)], &gp->dq.data[packed.q_offset(b, i, h)], d);
          }
          for (int64_t j = 0; backward && h < padded.heads_kv && j < padded.rows_k(b); ++j) {
            same(&ga->dk.data[padded.kv_offset(b, j, h)], &gp->dk.data[packed.kv_offset(b, j, h)], d);
            same(&ga->dv.data[padded.kv_offset(b, j, h)], &gp->dv.data[packed.kv_offset(b, j, h)], d);
          }
        }
      INFO(impl->name, " [", to_string(dtype), "]",
           std::string(backward ? " forward and backward" : " forward"), ": largest difference ", worst);
      CHECK(worst <= tolerance_floor(dtype));
      checked += 1;
      identical += bitwise;
    }
  }
  MESSAGE(checked, " implementation and dtype pairs compared, ", identical, " of them bit for bit");
}

TEST_CASE("an output element left unwritten fails the check (outputs are poisoned)") {
  Implementation lazy{.name = "test/lazy", .summary = "writes everything but one element"};
  const Implementation* honest = find_implementation("naive/one_pass");
  REQUIRE(honest != nullptr);
  lazy.forward = [honest](const Problem& p, const AttentionInputs& in, AttentionOutputs& out) {
    AttentionOutputs full = AttentionOutputs::poisoned(p);
    honest->forward(p, in, full);
    const float skipped_o = out.o.data[7], skipped_lse = out.lse.data[3];
    out = full;
    out.o.data[7] = skipped_o;  // the poison (NaN) stays in these two places
    out.lse.data[3] = skipped_lse;
  };
  const Problem p = property_problem(false);
  PreparedCase c = grid_case(p, DType::f32, 24);
  const AttentionOutputs out = run_forward(lazy, c.problem, c.inputs);
  CHECK(std::isnan(out.o.data[7]));
  CHECK_FALSE(judge(c.problem, out, c.reference, c.tolerance(false)).passed());
}

TEST_CASE("an implementation refuses what it does not support, with a reason") {
  Implementation picky{.name = "test/picky", .summary = "head_dim 64 only"};
  picky.supports = [](const Problem& p) {
    return p.head_dim == 64 ? std::string() : "head_dim (" + std::to_string(p.head_dim) + ") must be 64";
  };
  picky.forward = [](const Problem&, const AttentionInputs&, AttentionOutputs&) {};
  Problem p = property_problem(false);
  CHECK(why_cannot_run(picky, p) == "head_dim (32) must be 64");
  const AttentionInputs in = random_inputs(p, Distribution::normal, 1);
  CHECK_THROWS_WITH_AS(run_forward(picky, p, in),
                       "test/picky cannot run this problem: head_dim (32) must be 64", Error);
  p.dtype = DType::bf16;
  p.head_dim = 64;
  CHECK(why_cannot_run(picky, p) == "dtype bf16 is not offered (f32)");
}

}  // namespace flashlab::testing
