// The decoding stage's own pieces, tested directly: the LSE combine (any split equals the unsplit result,
// empty splits weigh 0), the paged KV cache (paged equals contiguous, only the pages are read), and
// unified_max's fallback (it fires on huge scores, how often it fires on normal inputs).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>

#include "common/error.hpp"
#include "common/paged_kv.hpp"
#include "common/softmax_state.hpp"
#include "decoding/split_kv.hpp"
#include "decoding/unified_max.hpp"
#include "tests/harness.hpp"

namespace flashlab::testing {

namespace {

Problem decode_problem() {
  Problem p;
  p.batch = 3;
  p.heads_q = 6;
  p.heads_kv = 2;
  p.seqlen_q = 4;
  p.seqlen_k = 301;
  p.head_dim = 40;
  p.causal = true;
  p.seqlens_k = {301, 0, 37};
  return p;
}

// The keys [begin, end) of a problem without masks, as a problem of their own (a split of the key set).
std::pair<Problem, AttentionInputs> key_slice(const Problem& p, const AttentionInputs& in, int64_t begin,
                                              int64_t end) {
  Problem part = p;
  part.seqlen_k = end - begin;
  AttentionInputs sliced = empty_inputs(part);
  sliced.q = in.q;
  const int64_t row = p.heads_kv * p.head_dim;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t j = begin; j < end; ++j)
      for (int64_t e = 0; e < row; ++e) {
        sliced.k.data[(b * part.seqlen_k + j - begin) * row + e] = in.k.data[(b * p.seqlen_k + j) * row + e];
        sliced.v.data[(b * part.seqlen_k + j - begin) * row + e] = in.v.data[(b * p.seqlen_k + j) * row + e];
      }
  return {part, sliced};
}

bool same_outputs(const AttentionOutputs& a, const AttentionOutputs& b) {
  return same_bits(a.o, b.o) && same_bits(a.lse, b.lse);
}

}  // namespace

TEST_CASE("combine_partials: the partials of any split of the keys combine to the unsplit result") {
  Problem p;
  p.batch = 2;
  p.heads_q = 4;
  p.heads_kv = 2;
  p.seqlen_q = 3;
  p.seqlen_k = 257;
  p.head_dim = 24;
  const AttentionInputs in = random_inputs(p, Distribution::normal, 31);
  const ReferenceResult whole = reference_attention(p, in);
  Random random(77);
  for (int split = 0; split < 12; ++split) {
    // Random cut points, repeated ones included: some pieces are empty (LSE_j = -inf, weight 0).
    std::set<int64_t> cuts = {0, p.seqlen_k};
    const int pieces = 1 + split * 3;
    for (int n = 0; n < pieces; ++n) cuts.insert(static_cast<int64_t>(random.next() % (p.seqlen_k + 1)));
    std::vector<int64_t> bounds(cuts.begin(), cuts.end());
    if (split % 2 == 1) bounds.insert(bounds.begin() + 1, bounds[1]);  // an explicitly empty piece
    std::vector<ReferenceResult> parts;
    for (size_t n = 0; n + 1 < bounds.size(); ++n) {
      const auto [part, sliced] = key_slice(p, in, bounds[n], bounds[n + 1]);
      parts.push_back(reference_attention(part, sliced));
    }
    const int64_t count = static_cast<int64_t>(parts.size());
    double worst_double = 0, worst_float = 0;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t i = 0; i < p.seqlen_q; ++i)
        for (int64_t h = 0; h < p.heads_q; ++h) {
          const int64_t o_at = p.q_offset(b, i, h);
          const int64_t lse_at = (b * p.heads_q + h) * p.seqlen_q + i;
          // Gather this row's partials, in fp64 and rounded to fp32.
          std::vector<double> o64(static_cast<size_t>(count * p.head_dim)), lse64(static_cast<size_t>(count));
          std::vector<float> o32(o64.size()), lse32(lse64.size());
          for (int64_t j = 0; j < count; ++j) {
            lse64[j] = parts[j].lse[lse_at];
            lse32[j] = static_cast<float>(lse64[j]);
            for (int64_t c = 0; c < p.head_dim; ++c) {
              o64[j * p.head_dim + c] = parts[j].o[o_at + c];
              o32[j * p.head_dim + c] = static_cast<float>(o64[j * p.head_dim + c]);
            }
          }
          std::vector<double> acc64(static_cast<size_t>(p.head_dim)), out64(acc64.size());
          std::vector<float> acc32(acc64.size()), out32(acc64.size());
          const auto s64 =
              combine_partials(count, o64.data(), p.head_dim, lse64.data(), 1, acc64.data(), p.head_dim);
          const auto s32 =
              combine_partials(count, o32.data(), p.head_dim, lse32.data(), 1, acc32.data(), p.head_dim);
          s64.finalize(acc64.data(), out64.data(), p.head_dim);
          s32.finalize(acc32.data(), out32.data(), p.head_dim);
          worst_double = std::max(worst_double, std::abs(s64.lse() - whole.lse[lse_at]));
          worst_float = std::max(worst_float, std::abs(s32.lse() - whole.lse[lse_at]));
          for (int64_t c = 0; c < p.head_dim; ++c) {
            worst_double = std::max(worst_double, std::abs(out64[c] - whole.o[o_at + c]));
            worst_float = std::max(worst_float, std::abs(out32[c] - whole.o[o_at + c]));
          }
        }
    INFO(count, " pieces: worst deviation fp64 ", worst_double, ", fp32 ", worst_float);
    CHECK(worst_double < 1e-12);
    CHECK(worst_float < 2e-6);
  }
}

TEST_CASE("combine_partials: empty partials weigh 0; all empty gives O = 0 and LSE = -inf without NaN") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), neg_inf = -INFINITY;
  const int64_t d = 3;
  {  // every partial empty: its O_j is never read, even when it holds NaN
    const std::vector<float> o = {nan, nan, nan, 0, 0, 0, nan, 1, 2};
    const std::vector<float> lse = {neg_inf, neg_inf, neg_inf};
    std::vector<float> acc(d, 7.0f), out(d, nan);
    const SoftmaxState<float> state = combine_partials(3, o.data(), d, lse.data(), 1, acc.data(), d);
    state.finalize(acc.data(), out.data(), d);
    CHECK(state.lse() == neg_inf);
    for (float value : out) CHECK(value == 0.0f);
  }
  {  // zero partials: the log of an empty sum
    std::vector<float> acc(d, 7.0f), out(d, nan);
    const SoftmaxState<float> state =
        combine_partials<float, float>(0, nullptr, d, nullptr, 1, acc.data(), d);
    state.finalize(acc.data(), out.data(), d);
    CHECK(state.lse() == neg_inf);
    for (float value : out) CHECK(value == 0.0f);
  }
  {  // empty partials around one real one change nothing
    const std::vector<float> o = {nan, nan, nan, 0.5f, -1.0f, 2.0f, nan, nan, nan};
    const std::vector<float> lse = {neg_inf, 3.25f, neg_inf};
    std::vector<float> acc(d), out(d);
    const SoftmaxState<float> state = combine_partials(3, o.data(), d, lse.data(), 1, acc.data(), d);
    state.finalize(acc.data(), out.data(), d);
    CHECK(state.lse() == 3.25f);
    CHECK(out == std::vector<float>{0.5f, -1.0f, 2.0f});
  }
}

TEST_CASE("split_kv and unified_max: every chunk count gives the reference result") {
  Problem p = decode_problem();
  p.mask = std::make_shared<const std::vector<uint8_t>>(tree_mask(p.seqlen_q, p.seqlen_k - p.seqlen_q, 3));
  PreparedCase c = prepare({"decode", p, Distribution::normal, 41}, DType::f32);
  const Tolerance tol = c.tolerance(false);
  AttentionOutputs one_chunk = AttentionOutputs::poisoned(p);
  decoding::split_kv_attention(p, c.inputs, one_chunk, 1);
  for (int64_t chunks : {1, 2, 3, 7, 64, 300, 1000}) {  // 1000 > seqlen_k: one key per chunk
    for (bool unified : {false, true}) {
      AttentionOutputs out = AttentionOutputs::poisoned(p);
      if (unified)
        decoding::unified_max_attention(p, c.inputs, out, chunks);
      else
        decoding::split_kv_attention(p, c.inputs, out, chunks);
      const Verdict verdict = judge(p, out, c.reference, tol);
      INFO((unified ? "unified_max" : "split_kv"), " with ", chunks, " chunks: ", verdict.explain());
      CHECK(verdict.passed());
      // Against the unsplit run: only the rounding of the combine differs.
      const ReferenceResult unsplit{{one_chunk.o.data.begin(), one_chunk.o.data.end()},
                                    {one_chunk.lse.data.begin(), one_chunk.lse.data.end()}};
      CHECK(judge(p, out, unsplit, {2e-6, 2e-6}).passed());
    }
  }
}

TEST_CASE(
    "split_kv and unified_max: a NaN in the V of a hidden key stays out of the rows that do not see it") {
  // GQA 4/2 with 4 draft rows: each kv head's rows are taken four at a time, two heads of two query rows,
  // so a key can be visible to some rows of a tile and hidden from others.
  Problem p = problem_shape(1, 4, 2, 4, 300, 64);
  p.causal = true;  // row i sees keys j <= i + 296: key 299 only row 3, key 298 rows 2 and 3
  PreparedCase c = prepare({"hidden NaN", p, Distribution::normal, 43}, DType::f32);
  const int64_t row = p.heads_kv * p.head_dim;
  c.inputs.v.data[static_cast<size_t>(299 * row + 0 * p.head_dim + 5)] =
      std::numeric_limits<float>::quiet_NaN();
  c.inputs.v.data[static_cast<size_t>(298 * row + 1 * p.head_dim + 7)] =
      std::numeric_limits<float>::quiet_NaN();
  c.reference = reference_attention(p, c.inputs);
  for (const char* name : {"decoding/split_kv", "decoding/unified_max"}) {
    const Implementation* impl = find_implementation(name);
    REQUIRE(impl != nullptr);
    const AttentionOutputs out = run_forward(*impl, p, c.inputs);
    const Verdict verdict = judge(p, out, c.reference, c.tolerance(false));
    INFO(name, ": ", verdict.explain());
    CHECK(verdict.passed());  // NaN exactly where the reference has it
    CHECK(std::isfinite(out.o.data[static_cast<size_t>(p.q_offset(0, 1, 0) + 5)]));
    CHECK(std::isnan(out.o.data[static_cast<size_t>(p.q_offset(0, 3, 0) + 5)]));
  }
}

TEST_CASE("plan_split: chunks cover the keys, several work items per core, none past seqlen_k") {
  Problem p;
  p.seqlen_k = 131072;
  const decoding::SplitPlan plan = decoding::plan_split(p, 0, 2);
  CHECK(plan.chunks >= 8);
  CHECK(plan.chunks * plan.chunk_keys >= p.seqlen_k);
  CHECK((plan.chunks - 1) * plan.chunk_keys < p.seqlen_k);
  p.seqlen_k = 700;  // short: one chunk (a chunk must amortize its partial)
  CHECK(decoding::plan_split(p, 0, 2).chunks == 1);
  p.seqlen_k = 0;
  CHECK(decoding::plan_split(p, 0, 2).chunks == 1);
  p.seqlen_k = 10;
  const decoding::SplitPlan many = decoding::plan_split(p, 64, 2);
  CHECK(many.chunks == 10);
  CHECK(many.chunk_keys == 1);
}

TEST_CASE("make_paged_kv: every token is found through a shuffled block table; slots past the end hold NaN") {
  Problem p = decode_problem();
  p.page_size = 16;
  const AttentionInputs in = random_inputs(p, Distribution::normal, 5);
  const PagedKV paged = make_paged_kv(p, in.k, in.v, 99);
  CHECK(paged.pages() == (301 + 15) / 16 + 0 + (37 + 15) / 16);
  bool shuffled = false;
  for (int64_t b = 0; b < p.batch; ++b) {
    CHECK(static_cast<int64_t>(paged.block_table[b].size()) == (p.rows_k(b) + 15) / 16);
    for (size_t n = 1; n < paged.block_table[b].size(); ++n)
      shuffled |= paged.block_table[b][n] != paged.block_table[b][n - 1] + 1;
    for (int64_t j = 0; j < p.rows_k(b); ++j)
      for (int64_t e = 0; e < paged.token_elements; ++e) {
        REQUIRE(paged.k_token(b, j)[e] == in.k_row(p, b, j, 0)[e]);
        REQUIRE(paged.v_token(b, j)[e] == in.v_row(p, b, j, 0)[e]);
      }
  }
  CHECK(shuffled);
  CHECK(std::isnan(paged.k_token(0, 301)[0]));  // token 301 would be slot 13 of page 18: never written
  p.page_size = 0;
  CHECK_THROWS_AS(make_paged_kv(p, in.k, in.v, 1), Error);
}

TEST_CASE("paged KV gives the contiguous result exactly, for any page size, reading only the pages") {
  Problem p = decode_problem();
  p.mask = std::make_shared<const std::vector<uint8_t>>(tree_mask(p.seqlen_q, p.seqlen_k - p.seqlen_q, 4));
  const AttentionInputs contiguous = random_inputs(p, Distribution::normal, 6);
  for (const char* name : {"decoding/split_kv", "decoding/unified_max"}) {
    const Implementation* impl = find_implementation(name);
    REQUIRE(impl != nullptr);
    const AttentionOutputs expected = run_forward(*impl, p, contiguous);
    for (int64_t page_size : {1, 3, 16, 100, 256, 1000}) {
      Problem paged_problem = p;
      paged_problem.page_size = page_size;
      AttentionInputs paged = contiguous;
      attach_paged_kv(paged_problem, paged, static_cast<uint64_t>(page_size));
      // The contiguous copy is poisoned: a stage that read it instead of the pages would write NaN.
      std::fill(paged.k.data.begin(), paged.k.data.end(), std::numeric_limits<float>::quiet_NaN());
      std::fill(paged.v.data.begin(), paged.v.data.end(), std::numeric_limits<float>::quiet_NaN());
      INFO(name, " with page size ", page_size);
      CHECK(same_outputs(run_forward(*impl, paged_problem, paged), expected));
    }
  }
}

TEST_CASE("decoding stages refuse seqlen_q > 16, naming the field") {
  Problem p = decode_problem();
  p.seqlen_q = 17;
  for (const char* name : {"decoding/split_kv", "decoding/unified_max"}) {
    const Implementation* impl = find_implementation(name);
    REQUIRE(impl != nullptr);
    const std::string reason = why_cannot_run(*impl, p);
    CHECK(reason.rfind("seqlen_q (17) must be <= 16", 0) == 0);
  }
}

TEST_CASE("unified_max: the fallback fires on huge scores, and the results still match the reference") {
  Problem p;
  p.batch = 2;
  p.heads_q = 4;
  p.heads_kv = 2;
  p.seqlen_q = 2;
  p.seqlen_k = 1500;
  p.head_dim = 64;
  p.causal = true;
  {  // scores ~ 1e4: every row leaves [phi + a, phi + b]
    PreparedCase c = prepare({"large", p, Distribution::large, 51}, DType::f32);
    AttentionOutputs out = AttentionOutputs::poisoned(p);
    const decoding::UnifiedMaxStats stats = decoding::unified_max_attention(p, c.inputs, out);
    CHECK(stats.rows == p.batch * p.heads_q * p.seqlen_q);
    CHECK(stats.fallback_rows == stats.rows);
    const Verdict verdict = judge(p, out, c.reference, c.tolerance(false));
    INFO(verdict.explain());
    CHECK(verdict.passed());
  }
  {  // normal inputs, but one query row of one head scaled up by 100: that row alone falls back
    PreparedCase c = prepare({"one hot row", p, Distribution::normal, 52}, DType::f32);
    float* q = c.inputs.q.ptr() + p.q_offset(1, 1, 2);
    for (int64_t e = 0; e < p.head_dim; ++e) q[e] *= 100.0f;
    c.reference = reference_attention(p, c.inputs);
    AttentionOutputs out = AttentionOutputs::poisoned(p);
    const decoding::UnifiedMaxStats stats = decoding::unified_max_attention(p, c.inputs, out, 5);
    CHECK(stats.fallback_rows == 1);
    const Verdict verdict = judge(p, out, c.reference, c.tolerance(false));
    INFO(verdict.explain());
    CHECK(verdict.passed());
  }
}

TEST_CASE("unified_max: how often the fallback fires on the case matrix (never on normal inputs)") {
  std::map<Distribution, decoding::UnifiedMaxStats> by_distribution;
  const Implementation* impl = find_implementation("decoding/unified_max");
  REQUIRE(impl != nullptr);
  for (const Case& test_case : case_matrix()) {
    if (!why_cannot_run(*impl, test_case.problem).empty()) continue;
    PreparedCase c = prepare(test_case, DType::f32);
    AttentionOutputs out = AttentionOutputs::poisoned(c.problem);
    const decoding::UnifiedMaxStats stats = decoding::unified_max_attention(c.problem, c.inputs, out);
    by_distribution[test_case.distribution].rows += stats.rows;
    by_distribution[test_case.distribution].fallback_rows += stats.fallback_rows;
  }
  for (const auto& [distribution, stats] : by_distribution)
    std::printf("  unified_max fallback on %-8s inputs: %lld of %lld rows\n",
                std::string(to_string(distribution)).c_str(), static_cast<long long>(stats.fallback_rows),
                static_cast<long long>(stats.rows));
  REQUIRE(by_distribution.count(Distribution::normal));
  CHECK(by_distribution[Distribution::normal].rows > 500);
  CHECK(by_distribution[Distribution::normal].fallback_rows == 0);
  CHECK(by_distribution[Distribution::large].fallback_rows == by_distribution[Distribution::large].rows);
}

}  // namespace flashlab::testing
