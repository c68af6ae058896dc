// flashlab fp8-accuracy: FlashAttention-3's Table 3 reproduced with the exact fp8 emulation
// (cuda_v3_hopper/fp8_emulated), plus our own steps beyond it. Inputs: every entry N(0, 1) plus N(0, 10^2)
// with probability 0.001 (Distribution::outliers, the paper's inputs); the figure is the RMSE of O against
// the fp64 reference, pooled over --heads independent heads (16 by default: one 2048 x 2048 head holds only a
// few hundred outlier rows, and its RMSE moves by 10-20% from seed to seed). With --device cuda the FP8 rows
// the Hopper kernel computes (block scales, with and without incoherent processing, and the registered K
// smoothing) come from cuda_v3_hopper/fp8: on the GPU, or in the emulator where there is none (its "run on"
// column says which; the emulated kernel is slow, so try it on a small --seqlen and --heads).
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <optional>
#include <vector>

#include "common/cuda/device.hpp"
#include "common/error.hpp"
#include "common/inputs.hpp"
#include "common/number_format.hpp"
#include "common/reference.hpp"
#include "common/tolerance.hpp"
#include "cuda_v3_hopper/fp8_emulated.hpp"
#include "cuda_v3_hopper/fp8_stage.hpp"
#include "tools/args.hpp"
#include "tools/command.hpp"
#include "tools/json.hpp"

namespace flashlab::cli {

namespace {

using hopper::Fp8Config;
using hopper::Fp8Scaling;

// Standard attention as a framework runs it in fp16 (FA3 Table 3 "Baseline FP16"): every tensor between the
// operations is stored in fp16: S = Q K^T rounded, P = softmax(S) normalized and rounded, O = P V rounded;
// the products accumulate in fp32 and the softmax computes in fp32, as fp16 GEMMs and softmax kernels do.
AttentionOutputs standard_attention_fp16(const Problem& p, const AttentionInputs& given) {
  AttentionInputs in = given;  // Q, K and V stored in fp16
  for (HostTensor* tensor : {&in.q, &in.k, &in.v})
    for (float& x : tensor->data) x = round_to_fp16(x);
  AttentionOutputs out = AttentionOutputs::poisoned(p);
  const int64_t d = p.head_dim, sk = p.seqlen_k;
  const float scale = round_to_fp16(static_cast<float>(p.softmax_scale()));
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t h = 0; h < p.heads_q; ++h)
    for (int64_t i = 0; i < p.seqlen_q; ++i) {
      std::vector<float> s(static_cast<size_t>(sk));
      const float* q = in.q_row(p, 0, i, h);
      float row_max = -INFINITY;
      for (int64_t j = 0; j < sk; ++j) {
        const float* k = in.k_row(p, 0, j, p.kv_head(h));
        float dot = 0.0f;
        for (int64_t c = 0; c < d; ++c) dot += q[c] * k[c];
        s[j] = round_to_fp16(round_to_fp16(dot) * scale);  // S stored in fp16, then scaled in fp16
        row_max = std::max(row_max, s[j]);
      }
      float row_sum = 0.0f;
      for (int64_t j = 0; j < sk; ++j) row_sum += std::exp(s[j] - row_max);
      std::vector<float> o(static_cast<size_t>(d), 0.0f);
      for (int64_t j = 0; j < sk; ++j) {
        const float weight = round_to_fp16(std::exp(s[j] - row_max) / row_sum);  // P stored in fp16
        const float* v = in.v_row(p, 0, j, p.kv_head(h));
        for (int64_t c = 0; c < d; ++c) o[c] += weight * v[c];
      }
      float* out_row = out.o_row(p, 0, i, h);
      for (int64_t c = 0; c < d; ++c) out_row[c] = round_to_fp16(o[c]);
      out.lse_at(p, 0, h, i) = row_max + std::log(row_sum);
    }
  return out;
}

struct Method {
  std::string name;
  std::optional<double> paper;  // FA3 Table 3's figure, where the paper has one
  std::function<AttentionOutputs(const Problem&, const AttentionInputs&)> run;
  // The configuration, for the FP8 rows the Hopper kernel computes too (block scales, every rounding on, no
  // outlier extraction): with --device cuda those rows come from cuda_v3_hopper/fp8 instead of the emulation.
  std::optional<Fp8Config> kernel_config;
};

// The row's outputs from cuda_v3_hopper/fp8 (the GPU pre-pass and kernel, fed the same bf16 inputs).
AttentionOutputs run_on_gpu(const Problem& p, const AttentionInputs& in, const Fp8Config& config) {
  Problem e4m3 = p;
  e4m3.dtype = DType::e4m3;
  AttentionOutputs out = AttentionOutputs::poisoned(e4m3);
  hopper::fp8_cuda_attention(e4m3, in, out, config);
  return out;
}

Fp8Config with(Fp8Config config, Fp8Scaling scaling, bool hadamard) {
  config.scaling = scaling;
  config.hadamard = hadamard;
  return config;
}

std::vector<Method> methods(int64_t head_dim) {
  auto fp8 = [](Fp8Config config) {
    return [config](const Problem& p, const AttentionInputs& in) {
      AttentionOutputs out = AttentionOutputs::poisoned(p);
      hopper::fp8_emulated_attention(p, in, out, config);
      return out;
    };
  };
  const Fp8Config fa3 = hopper::fa3_fp8_config(head_dim);
  auto variant = [&fa3](auto change) {
    Fp8Config config = fa3;
    change(config);
    return config;
  };
  const Fp8Config smooth_k = variant([](Fp8Config& c) { c.smooth_k = true; });
  const Fp8Config outliers = variant([](Fp8Config& c) {
    c.hadamard = false;
    c.qk_outlier_threshold = c.v_outlier_threshold = 4.0f;
  });
  return {
      {"standard attention, fp16", 3.2e-4, standard_attention_fp16},
      {"flash attention, fp16 (fp32 softmax)", 1.9e-4,
       [](const Problem& p, const AttentionInputs& in) {
         return baseline_attention(p, in, DType::f16, true);
       }},
      {"fp8 per-tensor (the baseline)", 2.4e-2, fp8(with(fa3, Fp8Scaling::per_tensor, false))},
      {"fp8 block quantization only", std::nullopt, fp8(with(fa3, Fp8Scaling::per_block, false)),
       with(fa3, Fp8Scaling::per_block, false)},
      {"fp8 incoherent processing only", std::nullopt, fp8(with(fa3, Fp8Scaling::per_tensor, true))},
      {"fp8 block + incoherent (FA3)", 9.1e-3, fp8(fa3), fa3},
      {"ours: FA3 + K smoothing (registered)", std::nullopt, fp8(smooth_k), smooth_k},
      {"ours: outlier decomposition, 4 RMS", std::nullopt, fp8(outliers)},
      {"budget: FA3, only Q and K in fp8", std::nullopt,
       fp8(variant([](Fp8Config& c) { c.quantize_v = c.round_p = false; }))},
      {"budget: FA3, only V in fp8", std::nullopt,
       fp8(variant([](Fp8Config& c) { c.quantize_qk = c.round_p = false; }))},
      {"budget: FA3, only P in fp8", std::nullopt,
       fp8(variant([](Fp8Config& c) { c.quantize_qk = c.quantize_v = false; }))},
      {"budget: FA3, products summed in fp32", std::nullopt,
       fp8(variant([](Fp8Config& c) { c.tensor_core_sums = false; }))},
  };
}

double rmse(const std::vector<float>& out, const std::vector<double>& ref) {
  double sum = 0.0;
  for (size_t n = 0; n < ref.size(); ++n) sum += (out[n] - ref[n]) * (out[n] - ref[n]);
  return std::sqrt(sum / static_cast<double>(ref.size()));
}

int fp8_accuracy_command(const std::vector<std::string>& argv) {
  const Args args(argv, {"--seqlen", "--head-dim", "--heads", "--seed", "--device"}, {"--json", "--emulate"});
  if (args.has("--emulate")) cuda::force_emulation(true);  // --device cuda's rows from the emulated kernel
  if (!args.positional().empty()) fail("fp8-accuracy takes no arguments (got '", args.positional()[0], "')");
  Problem p;
  p.seqlen_q = p.seqlen_k = args.get_int("--seqlen", 2048);
  p.head_dim = args.get_int("--head-dim", 128);
  p.heads_q = p.heads_kv = args.get_int("--heads", 16);
  if (p.seqlen_q < 1) fail("--seqlen (", p.seqlen_q, ") must be >= 1");
  if (p.heads_q < 1) fail("--heads (", p.heads_q, ") must be >= 1");
  p.validate();
  const std::string device = args.get("--device").value_or("cpu");
  if (device != "cpu" && device != "cuda") fail("--device (", device, ") must be cpu or cuda");
  const bool gpu = device == "cuda";
  const char* kernel_source = "cuda";
  if (gpu) {
    if (p.head_dim != 128 && p.head_dim != 256)
      fail("--head-dim (", p.head_dim, ") must be 128 or 256 with --device cuda (the kernel's head dims)");
    if (const std::string reason = hopper::fp8_emulation(); !reason.empty()) {
      kernel_source = "emulated";
      std::fprintf(stderr, "cuda_v3_hopper/fp8 runs in the emulator: %s\n", reason.c_str());
    }
  }
  const uint64_t seed = static_cast<uint64_t>(args.get_int("--seed", 0));
  // Drawn in bf16, the format FP8 kernels are fed (and exact in fp16 too at these magnitudes), so that the
  // table measures the attention arithmetic and not the conversion of fp32 inputs.
  Problem drawn = p;
  drawn.dtype = DType::bf16;
  const AttentionInputs inputs = random_inputs(drawn, Distribution::outliers, seed);
  progress("computing the fp64 reference ...");
  const ReferenceResult ref = reference_attention(p, inputs);

  struct Row {
    const Method* method;
    double rmse_o, rmse_lse;
    const char* source;  // where the row was computed: "cpu" (the emulation or a CPU baseline), "cuda" (the
                         // kernel on the GPU) or "emulated" (the kernel in the emulator)
  };
  const std::vector<Method> table = methods(p.head_dim);
  std::vector<Row> rows;
  for (const Method& method : table) {
    const bool on_gpu = gpu && method.kernel_config.has_value();
    progress("running " + method.name + (on_gpu ? " on the GPU ..." : " ..."));
    const AttentionOutputs out =
        on_gpu ? run_on_gpu(p, inputs, *method.kernel_config) : method.run(p, inputs);
    rows.push_back(
        {&method, rmse(out.o.data, ref.o), rmse(out.lse.data, ref.lse), on_gpu ? kernel_source : "cpu"});
  }
  progress("");
  auto figure = [&](const char* name) -> double {
    for (const Row& row : rows)
      if (row.method->name == name) return row.rmse_o;
    return NAN;
  };
  const double fa3 = figure("fp8 block + incoherent (FA3)"),
               baseline = figure("fp8 per-tensor (the baseline)");
  double best_ours = INFINITY;
  for (const Row& row : rows)
    if (row.method->name.rfind("ours", 0) == 0) best_ours = std::min(best_ours, row.rmse_o);
  // The goals, stated for FA3's Table 3 setup: the default seqlen 2048 at head_dim 128 (a smaller problem
  // holds too few outlier rows for the ratios to mean anything).
  struct Goal {
    std::string text;
    bool met;
  };
  std::vector<Goal> goals;
  if (p.head_dim == 128 && p.seqlen_q == 2048)
    goals = {{"FA3 method RMSE <= 9.1e-3", fa3 <= 9.1e-3},
             {"per-tensor baseline >= 1.6x the FA3 method", baseline >= 1.6 * fa3},
             {"our best RMSE <= 8e-3", best_ours <= 8e-3}};

  if (args.has("--json")) {
    Json json;
    json.begin_object().field("seqlen", p.seqlen_q).field("head_dim", p.head_dim).field("heads", p.heads_q);
    json.field("seed", static_cast<int64_t>(seed)).field("distribution", to_string(Distribution::outliers));
    json.key("rows").begin_array();
    for (const Row& row : rows) {
      json.begin_object().field("method", row.method->name).field("rmse_o", row.rmse_o);
      if (gpu) json.field("device", std::string(row.source));
      json.field("rmse_lse", row.rmse_lse);
      json.key("paper_rmse_o");
      if (row.method->paper)
        json.value(*row.method->paper);
      else
        json.null();
      json.end_object();
    }
    json.end_array().key("goals").begin_array();
    for (const Goal& goal : goals)
      json.begin_object().field("goal", goal.text).field("met", goal.met).end_object();
    std::cout << json.end_array().end_object().str();
  } else {
    std::printf(
        "FA3 Table 3 on %s: seqlen %lld, head_dim %lld, %lld head%s, seed %llu; RMSE of O against fp64\n\n",
        std::string(to_string(Distribution::outliers)).c_str(), static_cast<long long>(p.seqlen_q),
        static_cast<long long>(p.head_dim), static_cast<long long>(p.heads_q), p.heads_q == 1 ? "" : "s",
        static_cast<unsigned long long>(seed));
    std::printf("%-38s %10s %10s %12s%s\n", "method", "RMSE O", "FA3 paper", "RMSE LSE",
                gpu ? "  run on" : "");
    for (const Row& row : rows) {
      char paper[16] = "-";
      if (row.method->paper) std::snprintf(paper, sizeof paper, "%.1e", *row.method->paper);
      std::printf("%-38s %10.2e %10s %12.2e", row.method->name.c_str(), row.rmse_o, paper, row.rmse_lse);
      // With --device cuda the rows the kernel computes say so; the others are the CPU's (no GPU form).
      if (gpu) std::printf("  %s", row.source);
      std::printf("\n");
    }
    std::printf("\nper-tensor / FA3: %.2fx\n", baseline / fa3);
    for (const Goal& goal : goals)
      std::printf("goal: %-45s %s\n", goal.text.c_str(), goal.met ? "met" : "NOT met");
  }
  for (const Goal& goal : goals)
    if (!goal.met) return 1;
  return 0;
}

const CommandRegistration fp8_accuracy{{"fp8-accuracy",
                                        "flashlab fp8-accuracy [--seqlen N] [--head-dim D] [--heads N] "
                                        "[--seed S] [--device cpu|cuda] [--emulate] "
                                        "[--json]",
                                        fp8_accuracy_command}};

}  // namespace

}  // namespace flashlab::cli
