// The score modifications (common/score_mod.hpp) against what their definitions say, computed by hand: the
// ALiBi paper's slopes, the fp64 reference on a row of two keys in closed form, ALiBi's bottom-right distance
// with per-batch lengths, the problem's validation naming the field, and the refusal of a stage without them.
// Dropout (common/dropout.hpp): Philox4x32-10 against the published known answers, the keep rate, the LSE
// left alone, p = 0 bit for bit.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/dropout.hpp"
#include "common/error.hpp"
#include "common/inputs.hpp"
#include "common/reference.hpp"
#include "common/registry.hpp"
#include "common/score_mod.hpp"
#include "tests/harness.hpp"

namespace flashlab::testing {

TEST_CASE("ALiBi slopes are the ALiBi paper's") {
  // n a power of two: 2^(-8k/n), k = 1..n.
  const std::vector<float> eight = alibi_slopes(8);
  REQUIRE(eight.size() == 8);
  for (int k = 1; k <= 8; ++k) CHECK(eight[static_cast<size_t>(k - 1)] == std::ldexp(1.0f, -k));
  // n = 6: the four of n = 4 (2^-2, 2^-4, 2^-6, 2^-8), then every other of n = 8 (2^-1, 2^-3).
  CHECK(alibi_slopes(6) == std::vector<float>{0.25f, 0.0625f, 0.015625f, 0.00390625f, 0.5f, 0.125f});
  CHECK(alibi_slopes(1) == std::vector<float>{0.00390625f});
}

TEST_CASE("the reference applies soft-capping and ALiBi as defined: one row, two keys, in closed form") {
  // q = (1, 0), k_0 = (3, 0), k_1 = (-1, 0), scale 1: raw scores 3 and -1; V rows (1, 0) and (0, 1).
  Problem p = problem_shape(1, 1, 1, 1, 2, 2);
  p.scale = 1.0;
  AttentionInputs in{HostTensor({1, 1, 1, 2}), HostTensor({1, 2, 1, 2}), HostTensor({1, 2, 1, 2}), nullptr};
  in.q.data = {1, 0};
  in.k.data = {3, 0, -1, 0};
  in.v.data = {1, 0, 0, 1};
  const auto expect = [&](double s0, double s1) {
    const ReferenceResult r = reference_attention(p, in);
    const double m = std::max(s0, s1), l = std::exp(s0 - m) + std::exp(s1 - m);
    INFO(p.describe(), ": scores ", s0, ", ", s1);
    CHECK(r.o[0] == doctest::Approx(std::exp(s0 - m) / l).epsilon(1e-14));
    CHECK(r.o[1] == doctest::Approx(std::exp(s1 - m) / l).epsilon(1e-14));
    CHECK(r.lse[0] == doctest::Approx(m + std::log(l)).epsilon(1e-14));
  };
  expect(3.0, -1.0);
  p.softcap = 2.0;  // s -> 2 tanh(s / 2)
  expect(2.0 * std::tanh(1.5), 2.0 * std::tanh(-0.5));
  p.softcap = 0.0;
  p.alibi_slopes = {0.5f};  // one query row, two keys: bottom-right, row 0 stands at key 1: distances 1, 0
  expect(3.0 - 0.5, -1.0);
  p.softcap = 2.0;  // soft-capping first, then ALiBi
  expect(2.0 * std::tanh(1.5) - 0.5, 2.0 * std::tanh(-0.5));
  p.softcap = 0.0;
  p.alibi_slopes.clear();
  p.bias = std::make_shared<const std::vector<float>>(std::vector<float>{0.25f, -1.5f});  // [1, 1, 1, 2]
  expect(3.0 + 0.25, -1.0 - 1.5);
  // A -inf bias hides its key like a mask; a row it hides entirely is a fully masked row: O = 0, LSE = -inf.
  p.bias = std::make_shared<const std::vector<float>>(std::vector<float>{-INFINITY, 0.0f});
  const ReferenceResult one = reference_attention(p, in);
  CHECK(one.o[0] == 0.0);
  CHECK(one.o[1] == 1.0);
  CHECK(one.lse[0] == doctest::Approx(-1.0).epsilon(1e-14));
  p.bias = std::make_shared<const std::vector<float>>(std::vector<float>{-INFINITY, -INFINITY});
  const ReferenceResult none = reference_attention(p, in);
  CHECK(none.o[0] == 0.0);
  CHECK(none.o[1] == 0.0);
  CHECK(none.lse[0] == -INFINITY);
}

TEST_CASE("ALiBi's distance is bottom-right aligned with each batch element's own lengths") {
  Problem p = problem_shape(2, 1, 1, 4, 6, 8);
  p.alibi_slopes = {1.0f};
  p.seqlens_q = {4, 2};
  p.seqlens_k = {6, 5};
  const ScoreMod mod(p);
  CHECK(mod.distance(0, 3, 5) == 0);  // the last row stands at the last key
  CHECK(mod.distance(0, 0, 2) == 0);  // row 0 stands at key 6 - 4 = 2
  CHECK(mod.distance(0, 0, 5) == 3);  // keys after it count too (non-causal)
  CHECK(mod.distance(1, 1, 4) == 0);  // batch 1: 2 rows, 5 keys
  CHECK(mod.distance(1, 0, 0) == 3);
  CHECK(mod.apply(2.0f, 1, 0, 0, 0) == -1.0f);
}

TEST_CASE("bad score modifications are refused naming the field; stages without them refuse by name") {
  Problem p = problem_shape(1, 2, 1, 8, 8, 16);
  p.softcap = -1.0;
  CHECK(contains(error_of([&] { p.validate(); }), "softcap (-1)"));
  p.softcap = 30.0;
  p.alibi_slopes = {0.5f};
  CHECK(contains(error_of([&] { p.validate(); }), "alibi_slopes has 1 entries but heads_q is 2"));
  p.alibi_slopes = {0.5f, NAN};
  CHECK(contains(error_of([&] { p.validate(); }), "alibi_slopes[1]"));
  p.alibi_slopes = {0.5f, 0.25f};
  p.validate();
  const Implementation* three_pass = find_implementation("naive/three_pass");
  REQUIRE(three_pass != nullptr);
  CHECK(why_cannot_run(*three_pass, p) == "softcap (30) is not supported by naive/three_pass");
  p.softcap = 0.0;
  CHECK(why_cannot_run(*three_pass, p) == "alibi_slopes (ALiBi) are not supported by naive/three_pass");
  Problem biased = problem_shape(2, 2, 1, 8, 8, 16);
  biased.bias = std::make_shared<const std::vector<float>>(static_cast<size_t>(3 * 64), 0.0f);
  biased.bias_heads = 3;
  CHECK(contains(error_of([&] { biased.validate(); }), "bias heads extent (3) must be 1 or heads_q (2)"));
  biased.bias_heads = 2;
  CHECK(contains(error_of([&] { biased.validate(); }), "bias has 192 entries but must be [1, 2"));
  biased.bias = std::make_shared<const std::vector<float>>(std::vector<float>(128, INFINITY));
  CHECK(contains(error_of([&] { biased.validate(); }), "bias holds inf"));
  biased.bias = std::make_shared<const std::vector<float>>(std::vector<float>(128, -INFINITY));
  biased.validate();
  CHECK(why_cannot_run(*three_pass, biased) ==
        "bias (an additive score bias) is not supported by naive/three_pass");
  const Implementation* tiled = find_implementation("cpu_tiled/forward");
  REQUIRE(tiled != nullptr);
  CHECK(why_cannot_run(*tiled, p) == "");
}

// Random123's known-answer vectors for Philox4x32-10 (its kat_vectors file: counter, key, output).
TEST_CASE("Philox4x32-10 gives the published known answers") {
  CHECK(philox4x32({0, 0, 0, 0}, {0, 0}) == PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
        PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("dropout keeps 1 - p of the weights, scaled by 1 / (1 - p), as a pure function of its counter") {
  Problem p = problem_shape(2, 4, 2, 64, 64, 16);
  p.dropout_p = 0.3;
  p.dropout_seed = 99;
  const Dropout dropout(p);
  int64_t kept = 0, total = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t i = 0; i < 64; ++i)
        for (int64_t j = 0; j < 64; ++j) {
          const float z = dropout.factor<float>(b, h, i, j);
          CHECK((z == 0.0f || z == static_cast<float>(1.0 / 0.7)));
          CHECK(z == dropout.factor<float>(b, h, i, j));  // the same answer every time: recomputable
          kept += z != 0.0f;
          ++total;
        }
  // 32768 Bernoulli(0.7) draws: the standard deviation of the kept share is 0.0025.
  CHECK(static_cast<double>(kept) / static_cast<double>(total) == doctest::Approx(0.7).epsilon(0.015));
  p.dropout_seed = 100;  // another seed, another mask
  const Dropout other(p);
  int64_t differ = 0;
  for (int64_t j = 0; j < 64; ++j)
    differ += other.factor<float>(0, 0, 0, j) != dropout.factor<float>(0, 0, 0, j);
  CHECK(differ > 10);
  p.dropout_p = 0.0;
  CHECK(Dropout(p).factor<float>(0, 0, 0, 0) == 1.0f);
}

TEST_CASE("dropout leaves the LSE alone and changes O; p = 0 is no dropout, bit for bit, on every stage") {
  // At d 128, where cuda_v2/split_q's kernels with and without dropout walk the same 64-key tiles (4 warps or
  // 8 a block, each row in one warp either way). At d 64 the kernel without takes 128 keys a tile and the one
  // with dropout 64 (split_q.cu): O's and the LSE's rescales then round at other points.
  Problem p = problem_shape(1, 4, 2, 70, 90, 128);
  p.causal = true;
  const AttentionInputs in = random_inputs(p, Distribution::normal, 3);
  // Every stage with dropout (cuda_v2/split_q in the emulator where there is no GPU), each in its own dtype.
  for (const char* name :
       {"cpu_tiled/forward", "naive/standard_gemm", "cpu_tiled/backward", "cuda_v2/split_q"}) {
    INFO(std::string(name));
    const Implementation* impl = find_implementation(name);
    REQUIRE(impl != nullptr);
    if (const std::string reason = unavailable_reason(*impl); !reason.empty()) {  // e.g. no CUDA in the build
      MESSAGE(name, " not checked: ", reason);
      continue;
    }
    p.dtype = impl->dtypes.front();
    const AttentionOutputs plain = run_forward(*impl, p, in);
    Problem zero = p;
    zero.dropout_seed = 12345;  // p = 0: the seed changes nothing
    const AttentionOutputs with_zero = run_forward(*impl, zero, in);
    CHECK(plain.o.data == with_zero.o.data);
    CHECK(plain.lse.data == with_zero.lse.data);
    Problem dropped = p;
    dropped.dropout_p = 0.5;
    dropped.dropout_seed = 7;
    const AttentionOutputs with_dropout = run_forward(*impl, dropped, in);
    CHECK(plain.lse.data == with_dropout.lse.data);
    CHECK(plain.o.data != with_dropout.o.data);
  }
  p.dtype = DType::f32;
  p.dropout_p = 1.0;
  CHECK(contains(error_of([&] { p.validate(); }), "dropout_p (1) must be in [0, 1)"));
  p.dropout_p = 0.1;
  const Implementation* one_pass = find_implementation("naive/one_pass");
  REQUIRE(one_pass != nullptr);
  CHECK(why_cannot_run(*one_pass, p) == "dropout_p (0.1) is not supported by naive/one_pass");
}

}  // namespace flashlab::testing
