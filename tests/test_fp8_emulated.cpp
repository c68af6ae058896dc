// The emulated FP8 pipeline beyond the shared harness: with its roundings switched off it is exact attention
// (so the descale folding, the V-descale rebasing and the tiling are right for any tile size, with Hadamard
// and the outlier decomposition on or off); each rounding then costs what fp8 should; bad knobs are refused
// by name.
#include <doctest/doctest.h>

#include <cmath>

#include "common/error.hpp"
#include "common/inputs.hpp"
#include "common/reference.hpp"
#include "common/tolerance.hpp"
#include "cuda_v3_hopper/fp8_emulated.hpp"

namespace flashlab {

namespace {

using hopper::Fp8Config;

Problem fp8_problem(int64_t head_dim, bool causal) {
  Problem p;
  p.batch = 2;
  p.heads_q = 4;
  p.heads_kv = 2;
  p.seqlen_q = 150;
  p.seqlen_k = 203;
  p.head_dim = head_dim;
  p.causal = causal;
  p.seqlens_k = {203, 77};
  p.dtype = DType::e4m3;
  return p;
}

Deviation run_with(const Problem& p, const AttentionInputs& in, const ReferenceResult& ref,
                   const Fp8Config& c) {
  AttentionOutputs out = AttentionOutputs::poisoned(p);
  hopper::fp8_emulated_attention(p, in, out, c);
  return deviation(p, out, ref);
}

double rmse_o(const Problem& p, const AttentionInputs& in, const ReferenceResult& ref, const Fp8Config& c) {
  AttentionOutputs out = AttentionOutputs::poisoned(p);
  hopper::fp8_emulated_attention(p, in, out, c);
  double sum = 0.0;
  for (size_t n = 0; n < ref.o.size(); ++n) sum += (out.o.data[n] - ref.o[n]) * (out.o.data[n] - ref.o[n]);
  return std::sqrt(sum / static_cast<double>(ref.o.size()));
}

}  // namespace

TEST_CASE("fp8 pipeline with every rounding off is exact attention, for any tiles and pre-pass") {
  for (int64_t d : {64, 59}) {  // 59: not a power of two, so Hadamard is skipped
    for (bool causal : {false, true}) {
      const Problem p = fp8_problem(d, causal);
      const AttentionInputs in = random_inputs(p, Distribution::outliers, 3);
      const ReferenceResult ref = reference_attention(p, in);
      for (auto [block_q, block_k] : {std::pair<int64_t, int64_t>{1, 1}, {7, 13}, {128, 224}, {1000, 1000}})
        for (bool hadamard : {false, true})
          for (bool smooth_k : {false, true})
            for (float outliers : {0.0f, 4.0f}) {
              if (hadamard && outliers > 0.0f) continue;  // alternatives, refused together (checked below)
              Fp8Config c;
              c.block_q = block_q, c.block_k = block_k, c.hadamard = hadamard, c.smooth_k = smooth_k;
              c.qk_outlier_threshold = c.v_outlier_threshold = outliers;
              c.scaling = block_q == 7 ? hopper::Fp8Scaling::per_tensor : hopper::Fp8Scaling::per_block;
              c.quantize_qk = c.quantize_v = c.round_p = false;
              const Deviation dev = run_with(p, in, ref, c);
              INFO("d ", d, " causal ", causal, " tiles ", block_q, "x", block_k, " hadamard ", hadamard,
                   " smooth_k ", smooth_k, " outliers ", outliers, ": O ", dev.max_err_o, " LSE ",
                   dev.max_err_lse, "\n  ", dev.worst_o, "\n  ", dev.worst_lse);
              CHECK(dev.max_err_o <= 0x1p-8);  // the bf16 rounding of O, relative to max(1, |O|)
              CHECK(dev.max_err_lse <= 1e-5);  // fp32 arithmetic only
            }
    }
  }
}

TEST_CASE(
    "each fp8 rounding costs an fp8-sized error, and FA3's method beats per-tensor scales on outliers") {
  Problem p = fp8_problem(128, false);
  p.seqlens_k.clear();
  p.batch = 1, p.heads_q = p.heads_kv = 2, p.seqlen_q = p.seqlen_k = 512;
  Problem drawn = p;
  drawn.dtype = DType::bf16;
  const AttentionInputs in = random_inputs(drawn, Distribution::outliers, 11);
  const ReferenceResult ref = reference_attention(p, in);
  const Fp8Config fa3 = hopper::fa3_fp8_config(128);
  for (int which = 0; which < 3; ++which) {
    Fp8Config c = fa3;
    c.quantize_qk = which == 0, c.quantize_v = which == 1, c.round_p = which == 2;
    const double err = rmse_o(p, in, ref, c);
    INFO("rounding ", which, ": RMSE ", err);
    CHECK(err > 1e-4);  // it does round: well above what the bf16 output rounding alone costs
    CHECK(err < 2e-2);
  }
  Fp8Config per_tensor = fa3;
  per_tensor.scaling = hopper::Fp8Scaling::per_tensor;
  per_tensor.hadamard = false;
  const double baseline = rmse_o(p, in, ref, per_tensor), method = rmse_o(p, in, ref, fa3);
  INFO("per-tensor ", baseline, ", FA3 ", method);
  CHECK(method < baseline);
}

TEST_CASE("fp8 pipeline: a NaN reaches exactly the rows that see it, as in the reference") {
  Problem p = fp8_problem(64, true);
  p.seqlens_k.clear();
  p.seqlen_q = p.seqlen_k = 40;
  AttentionInputs in = random_inputs(p, Distribution::normal, 2);
  in.k.data[static_cast<size_t>(p.kv_offset(0, 25, 0) + 3)] = NAN;
  in.q.data[static_cast<size_t>(p.q_offset(0, 7, 1) + 9)] = NAN;
  const ReferenceResult ref = reference_attention(p, in);
  AttentionOutputs out = AttentionOutputs::poisoned(p);
  hopper::fp8_emulated_attention(p, in, out, hopper::registered_fp8_config(64));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        const int64_t row = (b * p.heads_q + h) * p.seqlen_q + i;
        INFO("b ", b, " h ", h, " i ", i);
        CHECK(std::isnan(out.lse.data[row]) == std::isnan(ref.lse[row]));
        CHECK(std::isnan(out.o_row(p, b, i, h)[0]) ==
              std::isnan(ref.o[static_cast<size_t>(p.q_offset(b, i, h))]));
      }
  CHECK(std::isnan(ref.lse[(0 * p.heads_q + 0) * p.seqlen_q + 30]));   // sees key 25 of kv head 0
  CHECK(!std::isnan(ref.lse[(0 * p.heads_q + 0) * p.seqlen_q + 20]));  // does not
}

TEST_CASE("fp8 pipeline refuses bad knobs by name") {
  const Problem p = fp8_problem(64, false);
  const AttentionInputs in = random_inputs(p, Distribution::normal, 1);
  AttentionOutputs out = AttentionOutputs::poisoned(p);
  Fp8Config c;
  c.block_k = 0;
  CHECK_THROWS_WITH_AS(hopper::fp8_emulated_attention(p, in, out, c), "block_k (0) must be >= 1", Error);
  c = {};
  c.p_scale = 300.0f;
  CHECK_THROWS_WITH_AS(hopper::fp8_emulated_attention(p, in, out, c),
                       "p_scale (300.000000) must be a power of two in (0, 256]", Error);
  c = {};
  c.qk_outlier_threshold = 4.0f;
  CHECK(hopper::why_invalid(c) ==
        "qk_outlier_threshold needs hadamard off: the sparse score terms are in the original basis");
  CHECK(hopper::fa3_fp8_config(128).block_k == 224);
  CHECK(hopper::registered_fp8_config(128).smooth_k);
}

}  // namespace flashlab
