// The Hopper FP8 kernels (cuda_v3_hopper/fp8) against their specification, the CPU emulation
// (cuda_v3_hopper/fp8_emulated), in the emulator and, where there is one, on an sm_90 GPU:
//   the pre-pass (fp8_prepass.cu) bit for bit: every e4m3 code, tile descale and LSE shift equals the
//   emulation's, on random and awkward shapes (lengths off the tiles, GQA, padding, empty batches, NaN and
//   infinity in the inputs);
//   the pre-pass and main kernel together within the bound derived at check_attention() of the emulation's O
//   and LSE, on awkward shapes, GQA, causal, windows and padding (docs/06-fp8.md, "The GPU half").
// The registry entry's run over the case matrix is the harness's (test_matrix.cpp); this adds what only the
// FP8 pipeline has: the exact pre-pass and the derived bound.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "common/cuda/device.hpp"
#include "common/cuda/device_timing.hpp"
#include "common/cuda/gpu_stage.hpp"
#include "common/inputs.hpp"
#include "common/mask.hpp"
#include "common/number_format.hpp"
#include "common/problem.hpp"
#include "common/registry.hpp"
#include "common/tensor.hpp"
#include "cuda_v3_hopper/fp8_emulated.hpp"
#include "cuda_v3_hopper/fp8_prepass.hpp"
#include "cuda_v3_hopper/ws_stage.hpp"
#include "tests/hopper_fp8_device.hpp"

namespace flashlab::testing {

namespace {

using hopper::Fp8Config;

// The builds that can run here: the emulator's always, the GPU's on an sm_90 device.
void on_each_target(const std::function<void(const char* target, decltype(&emulated::fp8_prepass_on_device),
                                             decltype(&emulated::fp8_attention_on_device))>& check) {
  SUBCASE("emulated") {
    check("emulated", emulated::fp8_prepass_on_device, emulated::fp8_attention_on_device);
  }
#if FLASHLAB_HAVE_CUDA
  if (hopper::needs_sm90a().empty()) {
    SUBCASE("gpu") {
      check("gpu", gpu::fp8_prepass_on_device, gpu::fp8_attention_on_device);
    }
  }
#endif
}

// Bit for bit: the same float bits, or NaN on both sides (the one e4m3 NaN code decodes to one NaN, but the
// emulation's NaN may carry another payload). -0 and +0 are different bits and count as a mismatch.
bool same(float got, float expected) {
  return (std::isnan(got) && std::isnan(expected)) ||
         std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(expected);
}

// Mismatches of one output, the first few described.
struct Mismatches {
  std::string what;
  int64_t count = 0;
  std::ostringstream first;
  void check(bool ok, int64_t index, float got, float expected) {
    if (ok) return;
    if (count++ < 3) first << " " << what << "[" << index << "]: " << got << " vs " << expected << ";";
  }
};

struct Case {
  std::string name;
  Problem problem;
  Fp8Config config;
  Distribution distribution = Distribution::normal;
  float k_offset = 0.0f;    // added to every key (what K smoothing removes)
  bool non_finite = false;  // NaN and infinities planted in Q, K and V
  // Keys 10 and 100 of every channel at +2^60 and -2^60: an fp64 sum that holds 2^60 drops the normal keys
  // added to it, so which keys survive in the mean depends on the order of its sums (kFp8MeanChunk).
  bool cancelling_keys = false;
};

std::vector<Case> prepass_cases() {
  using hopper::fa3_fp8_config;
  using hopper::registered_fp8_config;
  std::vector<Case> all;
  all.push_back({"d64 registered, lengths off the 192 x 160 tiles, GQA 2",
                 problem_shape(2, 4, 2, 300, 333, 64), registered_fp8_config(64)});
  all.push_back({"d128 registered, outliers, shifted keys, GQA 3", problem_shape(1, 6, 2, 129, 500, 128),
                 registered_fp8_config(128), Distribution::outliers, 3.0f});
  all.push_back({"d256 registered, large inputs, one key", problem_shape(2, 2, 1, 70, 1, 256),
                 registered_fp8_config(256), Distribution::large});
  Case padded{"d128 registered, padded batches (one empty in q, one in k)",
              problem_shape(3, 4, 4, 257, 300, 128), registered_fp8_config(128)};
  padded.problem.seqlens_q = {100, 0, 257};
  padded.problem.seqlens_k = {300, 5, 0};
  all.push_back(padded);
  all.push_back({"d128 FA3 config (no smoothing), NaN and infinity in the inputs",
                 problem_shape(1, 2, 1, 200, 230, 128), fa3_fp8_config(128), Distribution::normal, 0.0f,
                 true});
  Case plain{"d64 no Hadamard, smoothing, 64 x 64 tiles, single rows", problem_shape(2, 3, 1, 1, 65, 64),
             registered_fp8_config(64), Distribution::normal, -2.0f};
  plain.config.hadamard = false, plain.config.block_q = 64, plain.config.block_k = 64;
  all.push_back(plain);
  // 1100 keys: 18 chunks of the mean, more than one round of the GPU pre-pass's 8 warps.
  Case cancelling{"d128 registered, 1100 keys, two of them +-2^60", problem_shape(1, 2, 1, 5, 1100, 128),
                  registered_fp8_config(128)};
  cancelling.cancelling_keys = true;
  all.push_back(cancelling);
  Case tiny{"d256 1 x 1 tiles", problem_shape(1, 2, 2, 3, 3, 256), registered_fp8_config(256)};
  tiny.config.block_q = 1, tiny.config.block_k = 1;
  all.push_back(tiny);
  return all;
}

// One e4m3 rounding step at x >= 0: the spacing of the grid around x (3 mantissa bits; subnormals, below
// 2^-6, are multiples of 2^-9).
double e4m3_step(double x) {
  if (x < 0x1p-6) return 0x1p-9;
  int exponent = 0;
  std::frexp(x, &exponent);  // x = f * 2^exponent, f in [0.5, 1)
  return std::ldexp(1.0, exponent - 1 - 3);
}

// The kernel against fp8_emulated_attention. Both take the same e4m3 operands (the pre-pass is bit-exact,
// checked above) and sum the products as the tensor cores do (common/e4m3_block_sum.hpp), so S is the same,
// and they differ only where they round differently:
//   P     exp2 on an FMA against the emulation's exp(s - m): the fp32 P of the two differ by a relative
//         delta far below e4m3's step (2^-3 relative), so P * 2^8 rounds to the same e4m3 value or to a
//         neighbouring one: at most one step e4m3_step(2^8 P_j) apart. That is the term the bound is made of:
//           |O_kernel - O_emulated|_c <= sum_j step(2^8 P_j) |V_jc| / (2^8 l)          (one step of P)
//                                        + 2^-8 sum_j P_j |V_jc| / l                  (exp2, l, the cuts)
//                                        + 2^-7 |O_emulated,c|                        (the bf16 output
//                                        rounding)
//         with V_jc the dequantized V (e4m3 value times its tile's descale) and P_j, l recomputed here in
//         fp64 from the operands (the tiles' descales folded in as the emulation folds them). After a P that
//         rounds the other way, a block of 32 keys may cut its sum one unit of 2^-13 of O differently, and
//         the kernel's tiles past a row's last key (its 128-row block's, P = 0) rebase O and cut it again,
//         which the emulation, a row at a time, skips: up to 2^-8 of O over the 32 blocks these rows have at
//         most, the second term's size, which it shares with the other differences (docs/06-fp8.md: a check
//         here, no longer a proof).
//   LSE   m + log l: |delta| <= 2^-8 + 2^-16 |LSE| (l's relative delta, m's rounding); -inf exactly where the
//         emulation has -inf.
// Rows that see no key must give O = 0 and LSE = -inf in both.
// Returns the number of elements outside the bound, with the worst ones described in `report`.
int64_t check_attention(const Problem& p, const Fp8Config& config, const hopper::Fp8Prepass& ops,
                        const AttentionOutputs& expected, const std::vector<float>& o,
                        const std::vector<float>& lse, std::ostringstream& report) {
  const Visibility visibility(p);
  const int64_t d = p.head_dim, bc = config.block_k, bq = config.block_q;
  const int64_t tiles_q = hopper::fp8_tiles(p.seqlen_q, bq), tiles_k = hopper::fp8_tiles(p.seqlen_k, bc);
  const double scale = static_cast<float>(p.softmax_scale());
  int64_t failures = 0;
  double worst_ratio = 0.0, worst_step_share = 0.0;
  std::vector<double> probability(static_cast<size_t>(std::max<int64_t>(p.seqlen_k, 1)));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        const int64_t hk = p.kv_head(h);
        const float* q = ops.q.data() + p.q_offset(b, i, h);
        const double q_descale = ops.q_descale[(b * p.heads_q + h) * tiles_q + i / bq];
        const KeyRange keys = visibility.key_range(b, i);
        double m = -INFINITY;
        for (int64_t j = keys.begin; j < keys.end; ++j) {
          if (!visibility.mask_allows(i, j)) continue;
          const float* k = ops.k.data() + p.kv_offset(b, j, hk);
          double dot = 0.0;
          for (int64_t c = 0; c < d; ++c) dot += double(q[c]) * k[c];
          probability[j] = dot * q_descale * ops.k_descale[(b * p.heads_kv + hk) * tiles_k + j / bc] * scale;
          m = std::max(m, probability[j]);
        }
        double l = 0.0;
        for (int64_t j = keys.begin; j < keys.end; ++j)
          if (visibility.mask_allows(i, j)) l += probability[j] = std::exp(probability[j] - m);
        const float* want_o = expected.o.data.data() + p.q_offset(b, i, h);
        const float* got_o = o.data() + p.q_offset(b, i, h);
        for (int64_t c = 0; c < d; ++c) {
          double step = 0.0, mass = 0.0;
          for (int64_t j = keys.begin; j < keys.end; ++j) {
            if (!visibility.mask_allows(i, j)) continue;
            const double v = std::fabs(double(ops.v[p.kv_offset(b, j, hk) + c]) *
                                       ops.v_descale[(b * p.heads_kv + hk) * tiles_k + j / bc]);
            step += e4m3_step(config.p_scale * probability[j]) * v / config.p_scale;
            mass += probability[j] * v;
          }
          const double bound = l > 0.0 ? (step + 0x1p-8 * mass) / l + 0x1p-7 * std::fabs(want_o[c]) : 0.0;
          const double error = std::fabs(double(got_o[c]) - want_o[c]);
          const bool ok = error <= bound;  // false for NaN
          if (bound > 0.0) worst_ratio = std::max(worst_ratio, error / bound);
          if (l > 0.0 && step > 0.0) worst_step_share = std::max(worst_step_share, error / (step / l));
          if (!ok && failures++ < 5)
            report << " O[b " << b << ", i " << i << ", h " << h << ", c " << c << "]: kernel " << got_o[c]
                   << ", emulation " << want_o[c] << ", bound " << bound << ";";
        }
        const int64_t at = (b * p.heads_q + h) * p.seqlen_q + i;
        const double want_lse = expected.lse.data[at], got_lse = lse[at];
        const bool lse_ok = std::isinf(want_lse)
                                ? got_lse == want_lse
                                : std::fabs(got_lse - want_lse) <= 0x1p-8 + 0x1p-16 * std::fabs(want_lse);
        if (!lse_ok && failures++ < 5)
          report << " LSE[b " << b << ", h " << h << ", i " << i << "]: kernel " << got_lse << ", emulation "
                 << want_lse << ";";
      }
  report << " max |error| / bound " << worst_ratio << ", max |error| / (one e4m3 step of P) "
         << worst_step_share;
  return failures;
}

struct AttentionCase {
  std::string name;
  Problem problem;
  Distribution distribution = Distribution::normal;
};

std::vector<AttentionCase> attention_cases() {
  std::vector<AttentionCase> all;
  all.push_back({"attention d128 lengths off the tiles, GQA 2", problem_shape(2, 4, 2, 300, 333, 128)});
  all.push_back({"attention d256 outliers, one key block and a half", problem_shape(1, 2, 1, 129, 190, 256),
                 Distribution::outliers});
  Problem causal = problem_shape(1, 4, 1, 257, 700, 128);
  causal.causal = true;
  all.push_back({"attention d128 causal (bottom-right), GQA 4", causal});
  Problem window = problem_shape(2, 2, 2, 200, 200, 256);
  window.window_left = 50, window.window_right = 10;
  all.push_back({"attention d256 sliding window", window});
  Problem padded = problem_shape(3, 2, 1, 257, 450, 128);
  padded.seqlens_q = {100, 0, 257};
  padded.seqlens_k = {450, 5, 0};
  all.push_back({"attention d128 padded batches (empty rows and keys)", padded});
  all.push_back({"attention d128 large inputs, single query", problem_shape(1, 2, 2, 1, 1000, 128),
                 Distribution::large});
  return all;
}

}  // namespace

TEST_CASE("the FP8 pre-pass matches the emulation's bit for bit (e4m3 codes, descales, LSE shift)") {
  on_each_target([](const char* target, auto prepass_on_device, auto) {
    uint64_t seed = 12;
    for (const Case& c : prepass_cases()) {
      ++seed;
      INFO(std::string(target), ": ", c.name);
      Problem p = c.problem;
      p.dtype = DType::e4m3;  // bf16 in, e4m3 operands
      p.validate();
      AttentionInputs inputs = random_inputs(p, c.distribution, seed);
      for (float& x : inputs.k.data) x = round_to_bf16(x + c.k_offset);
      if (c.cancelling_keys)
        for (int64_t b = 0; b < p.batch; ++b)
          for (int64_t hk = 0; hk < p.heads_kv; ++hk)
            for (int64_t ch = 0; ch < p.head_dim; ++ch) {
              inputs.k.data[static_cast<size_t>(p.kv_offset(b, 10, hk) + ch)] = 0x1p60f;
              inputs.k.data[static_cast<size_t>(p.kv_offset(b, 100, hk) + ch)] = -0x1p60f;
            }
      if (c.non_finite) {
        for (HostTensor* t : {&inputs.q, &inputs.k, &inputs.v}) {
          t->data[3] = NAN;
          t->data[t->data.size() / 2] = INFINITY;
          t->data[t->data.size() - 1] = -INFINITY;
        }
      }
      const hopper::Fp8Prepass expected = hopper::fp8_prepass(p, inputs, c.config);
      const Fp8PrepassOutputs got = prepass_on_device(p, inputs, c.config);
      const int64_t d = p.head_dim, bc = c.config.block_k;
      std::vector<Mismatches> report(8);
      auto codes = [&](Mismatches& m, const char* what, const std::vector<uint8_t>& values,
                       const std::vector<float>& want) {
        m.what = what;
        for (size_t i = 0; i < want.size(); ++i)
          m.check(same(decode_e4m3(values[i]), want[i]), i, decode_e4m3(values[i]), want[i]);
      };
      codes(report[0], "q8", got.q8, expected.q);
      codes(report[1], "k8", got.k8, expected.k);
      // V k-major: every (b, j, hk, c) at fp8_v_offset, and what no key fills (the last tile's padding) is 0.
      Mismatches& v = report[2];
      v.what = "v8 (k-major)";
      std::vector<bool> visited(got.v8.size(), false);
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t j = 0; j < p.seqlen_k; ++j)
          for (int64_t hk = 0; hk < p.heads_kv; ++hk)
            for (int64_t ch = 0; ch < d; ++ch) {
              const int64_t at = hopper::fp8_v_offset(b, j, hk, ch, p.heads_kv, p.seqlen_k, d, bc);
              visited[static_cast<size_t>(at)] = true;
              const float want = expected.v[p.kv_offset(b, j, hk) + ch];
              v.check(same(decode_e4m3(got.v8[at]), want), at, decode_e4m3(got.v8[at]), want);
            }
      for (size_t at = 0; at < got.v8.size(); ++at)
        if (!visited[at]) v.check(got.v8[at] == 0, static_cast<int64_t>(at), decode_e4m3(got.v8[at]), 0.0f);
      auto floats = [&](Mismatches& m, const char* what, const std::vector<float>& values,
                        const std::vector<float>& want) {
        m.what = what;
        REQUIRE(values.size() == want.size());
        for (size_t i = 0; i < want.size(); ++i) m.check(same(values[i], want[i]), i, values[i], want[i]);
      };
      floats(report[3], "q_descale", got.q_descale, expected.q_descale);
      floats(report[4], "k_descale", got.k_descale, expected.k_descale);
      floats(report[5], "v_descale", got.v_descale, expected.v_descale);
      floats(report[6], "lse_shift", got.lse_shift, expected.lse_shift);
      for (const Mismatches& m : report) {
        if (m.what.empty()) continue;
        INFO(m.what, ": ", m.count, " mismatches:", m.first.str());
        CHECK(m.count == 0);
      }
    }
  });
}

TEST_CASE("the FP8 kernel stays within the derived bound of the emulation (docs/06-fp8.md)") {
  on_each_target([](const char* target, auto, auto attention_on_device) {
    uint64_t seed = 40;
    for (const AttentionCase& c : attention_cases()) {
      ++seed;
      Problem p = c.problem;
      p.dtype = DType::e4m3;
      p.validate();
      const Fp8Config config = hopper::registered_fp8_config(p.head_dim);
      const AttentionInputs inputs = random_inputs(p, c.distribution, seed);
      AttentionOutputs expected = AttentionOutputs::poisoned(p);
      hopper::fp8_emulated_attention(p, inputs, expected, config);
      const hopper::Fp8Prepass ops = hopper::fp8_prepass(p, inputs, config);
      const AttentionOutputs got = attention_on_device(p, inputs, config);
      std::ostringstream report;
      const int64_t failures = check_attention(p, config, ops, expected, got.o.data, got.lse.data, report);
      INFO(std::string(target), ": ", c.name, ":", report.str());
      CHECK(failures == 0);
      if (std::getenv("FLASHLAB_VERBOSE") != nullptr)
        MESSAGE(std::string(target), ": ", c.name, ":", report.str());
    }
  });
}

// The scores are the tensor cores' (common/e4m3_block_sum.hpp). In the case "large inputs, single query" one
// key dominates each row, so the LSE is that key's score, and one bit more or less of the 14 the tensor cores
// keep of it moves the LSE by about 2. These are the LSEs an H200 gave for it
// (docs/results/gpu-nvidia-h200-2026-11-28-second, printed to 3 decimals); an fp32 sum of the same products
// is off by up to 15.3. What remains is the fp32 arithmetic after the products (1 to 3 units in the last
// place), within 2^-20 of the LSE.
TEST_CASE("the FP8 kernel's LSE is an H200's where one key dominates: the tensor cores' sums") {
  struct Measured {
    uint64_t seed;
    float lse[2];
  };
  const Measured h200[] = {{46, {31106.418f, 31203.877f}},
                           {47, {30200.643f, 26150.453f}},
                           {48, {31922.010f, 39230.270f}},
                           {52, {42252.035f, 36229.711f}}};
  Problem p = problem_shape(1, 2, 2, 1, 1000, 128);
  p.dtype = DType::e4m3;
  p.validate();
  const Fp8Config config = hopper::registered_fp8_config(p.head_dim);
  on_each_target([&](const char* target, auto, auto attention_on_device) {
    for (const Measured& m : h200) {
      const AttentionInputs inputs = random_inputs(p, Distribution::large, m.seed);
      const AttentionOutputs got = attention_on_device(p, inputs, config);
      AttentionOutputs emulation = AttentionOutputs::poisoned(p);
      hopper::fp8_emulated_attention(p, inputs, emulation, config);
      for (int h = 0; h < 2; ++h) {
        INFO(target, ": seed ", m.seed, ", head ", h, ": H200 ", m.lse[h], ", kernel ", got.lse.data[h],
             ", emulation ", emulation.lse.data[h]);
        CHECK(std::fabs(got.lse.data[h] - m.lse[h]) <= 0x1p-20f * m.lse[h]);
        CHECK(std::fabs(emulation.lse.data[h] - m.lse[h]) <= 0x1p-20f * m.lse[h]);
      }
    }
  });
}

// gpu-bench's row "cuda_v3_hopper/fp8 (main kernel)" (DeviceBuild::forward_main, cuda::time_forward_main):
// the main kernel alone, on the workspace the whole pass prepared, must write the whole pass's O and LSE, bit
// for bit, over O and LSE poisoned first. An entry without a main kernel of its own is refused by name.
TEST_CASE("the FP8 main kernel alone, on the pre-pass's output, gives the whole pass's O and LSE") {
  const Implementation* fp8 = find_implementation("cuda_v3_hopper/fp8");
  REQUIRE(fp8 != nullptr);
  Problem p = problem_shape(2, 2, 1, 130, 160, 128);  // GQA, lengths off the tiles, padding
  p.dtype = DType::e4m3;
  p.seqlens_q = {130, 40};
  p.seqlens_k = {160, 70};
  p.causal = true;
  p.validate();
  const AttentionInputs inputs = random_inputs(p, Distribution::normal, 3);
  cuda::TimingPlan plan;
  plan.max_copies = 2, plan.rotate_bytes = size_t(1) << 40;  // two copies, each prepared by the whole pass
  plan.min_repeats = plan.max_repeats = 1;
  auto check = [&](const char* target, auto time_forward, auto time_forward_main, const DeviceBuild& build) {
    AttentionOutputs whole = AttentionOutputs::poisoned(p), main = AttentionOutputs::poisoned(p);
    time_forward(p, inputs, build, plan, whole);
    time_forward_main(p, inputs, build, plan, main);
    INFO(target);
    CHECK(std::memcmp(whole.o.data.data(), main.o.data.data(), whole.o.data.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(whole.lse.data.data(), main.lse.data.data(), whole.lse.data.size() * sizeof(float)) ==
          0);
    CHECK(std::isfinite(main.lse.data[0]));
  };
  check("emulated", cuda::emulated::time_forward, cuda::emulated::time_forward_main, fp8->emulated_build);
#if FLASHLAB_LINKS_GPU_BUILDS
  if (hopper::needs_sm90a().empty())
    check("gpu", cuda::gpu::time_forward, cuda::gpu::time_forward_main, fp8->gpu_build);
#endif
  const Implementation* ws = find_implementation("cuda_v3_hopper/ws");
  REQUIRE(ws != nullptr);
  CHECK(!ws->emulated_build.forward_main);
  Problem bf16 = p;
  bf16.dtype = DType::bf16;
  AttentionOutputs out = AttentionOutputs::poisoned(bf16);
  CHECK_THROWS_WITH(cuda::emulated::time_forward_main(bf16, inputs, ws->emulated_build, plan, out),
                    doctest::Contains("no main kernel of its own"));
}

}  // namespace flashlab::testing
