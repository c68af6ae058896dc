// Self-test of the FP8 pre-pass (fp8_prepass.cu) and main kernel (fp8.hpp) on an H100/H200, both driven
// through the registry entry's own device set-up (fp8_device.hpp).
//
//   fp8_selftest [--only TEXT]
//       bit-exactness: on random and awkward shapes (lengths not multiples of the tiles, GQA, padding, empty
//       batches, NaN and infinity in the inputs) every e4m3 code, tile descale and LSE shift of the pre-pass
//       equals the emulation's (fp8_emulated.hpp, fp8_prepass()); then the main kernel (fp8.hpp) against
//       fp8_emulated_attention within the bound derived at check_attention(), on awkward shapes, GQA, causal,
//       windows and padding; PASS/FAIL per case, exit 1 on any failure (--only: cases named with TEXT)
//   fp8_selftest --time [--head-dim D] [--seqlen N] [--causal] [--repeat R]
//       on FA3's setup (16k tokens, hidden 2048): the pre-pass alone, the main kernel in TFLOP/s, and the two
//       end to end
// Exit 2 without an sm_90 GPU (as hopper_ws_selftest).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "common/cuda/check.hpp"
#include "common/cuda/device.hpp"
#include "common/cuda/device_problem.hpp"
#include "common/flops.hpp"
#include "common/inputs.hpp"
#include "common/mask.hpp"
#include "common/number_format.hpp"
#include "common/problem.hpp"
#include "common/tensor.hpp"
#include "cuda_v3_hopper/fp8.hpp"
#include "cuda_v3_hopper/fp8_device.hpp"
#include "cuda_v3_hopper/fp8_emulated.hpp"
#include "cuda_v3_hopper/fp8_prepass.hpp"
#include "cuda_v3_hopper/fp8_stage.hpp"

namespace {

using flashlab::AttentionInputs;
using flashlab::Distribution;
using flashlab::DType;
using flashlab::Problem;
using flashlab::problem_shape;
using flashlab::cuda::DeviceProblem;
using flashlab::hopper::Fp8Config;
using flashlab::hopper::Fp8DeviceParams;
using flashlab::hopper::Fp8PrepassParams;

// A problem on the device (common/cuda/device_problem.hpp: bf16 Q, K, V, the lengths, the FP8 scratch as the
// registry allocates it) and the parameters of both kernels, set up by the registry's own path
// (fp8_device.hpp). The scratch, O and LSE are poisoned first (0xFF: NaN in e4m3, bf16 and fp32) so that an
// element a kernel does not write cannot match.
struct DevicePrepass {
  DeviceProblem device;
  Fp8DeviceParams params;

  DevicePrepass(const Problem& p, const AttentionInputs& inputs, const Fp8Config& config)
      : device(p, inputs, flashlab::hopper::fp8_workspace(p, config).bytes) {
    const flashlab::DeviceTensors& t = device.tensors();
    FLASHLAB_CUDA_CHECK(cudaMemset(t.workspace, 0xFF, flashlab::hopper::fp8_workspace(p, config).bytes));
    if (p.q_elements() > 0)  // O in bf16: 2 bytes an element; 0xFFFF is a bf16 NaN
      FLASHLAB_CUDA_CHECK(cudaMemset(t.o, 0xFF, static_cast<size_t>(p.q_elements()) * sizeof(uint16_t)));
    if (p.lse_elements() > 0)
      FLASHLAB_CUDA_CHECK(cudaMemset(t.lse, 0xFF, static_cast<size_t>(p.lse_elements()) * sizeof(float)));
    params = flashlab::hopper::fp8_device_params(p, t, config);
  }
};

template <typename T>
std::vector<T> to_host(const T* device, int64_t count) {
  std::vector<T> host(static_cast<size_t>(count));
  if (count > 0)
    FLASHLAB_CUDA_CHECK(cudaMemcpy(host.data(), device, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

// Bit for bit: the same float bits, or NaN on both sides (the one e4m3 NaN code decodes to one NaN, but the
// emulation's NaN may carry another payload). -0 and +0 are different bits and count as a mismatch.
bool same(float got, float expected) {
  return (std::isnan(got) && std::isnan(expected)) ||
         std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(expected);
}

struct Mismatches {
  std::string what;
  int64_t count = 0;
  void check(bool ok, int64_t index, float got, float expected) {
    if (ok) return;
    if (count++ < 5)
      std::printf("    %s[%lld]: got %.9g (0x%08x), expected %.9g (0x%08x)\n", what.c_str(),
                  static_cast<long long>(index), got, std::bit_cast<uint32_t>(got), expected,
                  std::bit_cast<uint32_t>(expected));
  }
};

struct Case {
  std::string name;
  Problem problem;
  Fp8Config config;
  Distribution distribution = Distribution::normal;
  float k_offset = 0.0f;    // added to every key (what K smoothing removes)
  bool non_finite = false;  // NaN and infinities planted in Q, K and V
};

std::vector<Case> cases() {
  using flashlab::hopper::fa3_fp8_config;
  using flashlab::hopper::registered_fp8_config;
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
  Case tiny{"d256 1 x 1 tiles", problem_shape(1, 2, 2, 3, 3, 256), registered_fp8_config(256)};
  tiny.config.block_q = 1, tiny.config.block_k = 1;
  all.push_back(tiny);
  return all;
}

bool run_case(const Case& c, uint64_t seed) {
  const Problem& p = c.problem;
  p.validate();
  AttentionInputs inputs = flashlab::random_inputs(p, c.distribution, seed);
  for (float& x : inputs.k.data) x = flashlab::round_to_bf16(x + c.k_offset);
  if (c.non_finite) {
    for (flashlab::HostTensor* t : {&inputs.q, &inputs.k, &inputs.v}) {
      t->data[3] = NAN;
      t->data[t->data.size() / 2] = INFINITY;
      t->data[t->data.size() - 1] = -INFINITY;
    }
  }
  const flashlab::hopper::Fp8Prepass expected = flashlab::hopper::fp8_prepass(p, inputs, c.config);

  DevicePrepass device(p, inputs, c.config);
  const Fp8PrepassParams& pre = device.params.prepass;
  flashlab::hopper::launch_fp8_prepass(pre, nullptr);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());

  const int64_t d = p.head_dim, bc = c.config.block_k;
  const int64_t tiles_q = flashlab::hopper::fp8_tiles(p.seqlen_q, c.config.block_q);
  const int64_t tiles_k = flashlab::hopper::fp8_tiles(p.seqlen_k, bc);
  std::vector<Mismatches> report;
  auto compare_codes = [&](const char* what, const std::vector<uint8_t>& codes,
                           const std::vector<float>& values) {
    Mismatches m{what};
    for (size_t i = 0; i < values.size(); ++i) {
      const float got = flashlab::decode_e4m3(codes[i]);
      m.check(same(got, values[i]), static_cast<int64_t>(i), got, values[i]);
    }
    report.push_back(m);
  };
  compare_codes("q8", to_host(pre.q8, p.q_elements()), expected.q);
  compare_codes("k8", to_host(pre.k8, p.kv_elements()), expected.k);
  {
    // V k-major: every (b, j, hk, c) at fp8_v_offset, and the last tile's keys past seqlen_k hold 0.
    const std::vector<uint8_t> v8 = to_host(pre.v8, p.batch * p.heads_kv * tiles_k * d * bc);
    Mismatches m{"v8 (k-major)"};
    std::vector<bool> visited(v8.size(), false);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t j = 0; j < p.seqlen_k; ++j)
        for (int64_t hk = 0; hk < p.heads_kv; ++hk)
          for (int64_t ch = 0; ch < d; ++ch) {
            const int64_t at = flashlab::hopper::fp8_v_offset(b, j, hk, ch, p.heads_kv, p.seqlen_k, d, bc);
            visited[at] = true;
            const float got = flashlab::decode_e4m3(v8[at]);
            const float want = expected.v[flashlab::bshd_offset(b, j, hk, p.seqlen_k, p.heads_kv, d)];
            m.check(same(got, want), at, got, want);
          }
    for (size_t at = 0; at < v8.size(); ++at)
      if (!visited[at]) m.check(v8[at] == 0, static_cast<int64_t>(at), flashlab::decode_e4m3(v8[at]), 0.0f);
    report.push_back(m);
  }
  auto compare_floats = [&](const char* what, const std::vector<float>& got, const std::vector<float>& want) {
    Mismatches m{what};
    for (size_t i = 0; i < got.size(); ++i)
      m.check(same(got[i], want[i]), static_cast<int64_t>(i), got[i], want[i]);
    report.push_back(m);
  };
  compare_floats("q_descale", to_host(pre.q_descale, p.batch * p.heads_q * tiles_q), expected.q_descale);
  compare_floats("k_descale", to_host(pre.k_descale, p.batch * p.heads_kv * tiles_k), expected.k_descale);
  compare_floats("v_descale", to_host(pre.v_descale, p.batch * p.heads_kv * tiles_k), expected.v_descale);
  compare_floats("lse_shift", to_host(pre.lse_shift, p.lse_elements()), expected.lse_shift);

  int64_t failures = 0;
  for (const Mismatches& m : report) failures += m.count;
  std::printf("%s  %s\n", failures == 0 ? "PASS" : "FAIL", c.name.c_str());
  for (const Mismatches& m : report)
    if (m.count > 0)
      std::printf("    %s: %lld mismatches\n", m.what.c_str(), static_cast<long long>(m.count));
  return failures == 0;
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
// checked above), so they differ only where they round differently:
//   S     the order of the fp32 additions of exact e4m3 products (the tensor core's), and exp2 on an FMA
//         against the emulation's exp(s - m): the fp32 P of the two differ by a relative delta far below
//         e4m3's step (2^-3 relative), so P * 2^8 rounds to the same e4m3 value or to a neighbouring one: at
//         most one step e4m3_step(2^8 P_j) apart. That is the term the bound is made of:
//           |O_kernel - O_emulated|_c <= sum_j step(2^8 P_j) |V_jc| / (2^8 l)          (one step of P)
//                                        + 2^-8 sum_j P_j |V_jc| / l                  (fp32 order, exp2, l)
//                                        + 2^-7 |O_emulated,c|                        (the bf16 output
//                                        rounding)
//         with V_jc the dequantized V (e4m3 value times its tile's descale) and P_j, l recomputed here in
//         fp64 from the operands (the tiles' descales folded in as the emulation folds them).
//   LSE   m + log l: |delta| <= 2^-8 + 2^-16 |LSE| (l's relative delta, m's rounding); -inf exactly where the
//         emulation has -inf.
// Rows that see no key must give O = 0 and LSE = -inf in both.
bool check_attention(const Problem& p, const Fp8Config& config, const flashlab::hopper::Fp8Prepass& ops,
                     const flashlab::AttentionOutputs& expected, const std::vector<float>& o,
                     const std::vector<float>& lse) {
  const flashlab::Visibility visibility(p);
  const int64_t d = p.head_dim, bc = config.block_k, bq = config.block_q;
  const int64_t tiles_q = flashlab::hopper::fp8_tiles(p.seqlen_q, bq),
                tiles_k = flashlab::hopper::fp8_tiles(p.seqlen_k, bc);
  const double scale = static_cast<float>(p.softmax_scale());
  int64_t failures = 0;
  double worst_ratio = 0.0, worst_step_share = 0.0;
  std::vector<double> probability(static_cast<size_t>(std::max<int64_t>(p.seqlen_k, 1)));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        const int64_t hk = p.kv_head(h);
        const float* q = ops.q.data() + flashlab::bshd_offset(b, i, h, p.seqlen_q, p.heads_q, d);
        const double q_descale = ops.q_descale[(b * p.heads_q + h) * tiles_q + i / bq];
        const flashlab::KeyRange keys = visibility.key_range(b, i);
        double m = -INFINITY;
        for (int64_t j = keys.begin; j < keys.end; ++j) {
          if (!visibility.mask_allows(i, j)) continue;
          const float* k = ops.k.data() + flashlab::bshd_offset(b, j, hk, p.seqlen_k, p.heads_kv, d);
          double dot = 0.0;
          for (int64_t c = 0; c < d; ++c) dot += double(q[c]) * k[c];
          probability[j] = dot * q_descale * ops.k_descale[(b * p.heads_kv + hk) * tiles_k + j / bc] * scale;
          m = std::max(m, probability[j]);
        }
        double l = 0.0;
        for (int64_t j = keys.begin; j < keys.end; ++j)
          if (visibility.mask_allows(i, j)) l += probability[j] = std::exp(probability[j] - m);
        const float* want_o =
            expected.o.data.data() + flashlab::bshd_offset(b, i, h, p.seqlen_q, p.heads_q, d);
        const float* got_o = o.data() + flashlab::bshd_offset(b, i, h, p.seqlen_q, p.heads_q, d);
        for (int64_t c = 0; c < d; ++c) {
          double step = 0.0, mass = 0.0;
          for (int64_t j = keys.begin; j < keys.end; ++j) {
            if (!visibility.mask_allows(i, j)) continue;
            const double v =
                std::fabs(double(ops.v[flashlab::bshd_offset(b, j, hk, p.seqlen_k, p.heads_kv, d)]) *
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
            std::printf("    O[b %lld, i %lld, h %lld, c %lld]: kernel %.7g, emulation %.7g, bound %.3g\n",
                        static_cast<long long>(b), static_cast<long long>(i), static_cast<long long>(h),
                        static_cast<long long>(c), got_o[c], want_o[c], bound);
        }
        const int64_t at = (b * p.heads_q + h) * p.seqlen_q + i;
        const double want_lse = expected.lse.data[at], got_lse = lse[at];
        const bool lse_ok = std::isinf(want_lse)
                                ? got_lse == want_lse
                                : std::fabs(got_lse - want_lse) <= 0x1p-8 + 0x1p-16 * std::fabs(want_lse);
        if (!lse_ok && failures++ < 5)
          std::printf("    LSE[b %lld, h %lld, i %lld]: kernel %.7g, emulation %.7g\n",
                      static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(i),
                      got_lse, want_lse);
      }
  std::printf("    max |error| / bound %.3f; max |error| / (one e4m3 step of P) %.3f\n", worst_ratio,
              worst_step_share);
  return failures == 0;
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

bool run_attention_case(const AttentionCase& c, uint64_t seed) {
  const Problem& p = c.problem;
  p.validate();
  const Fp8Config config = flashlab::hopper::registered_fp8_config(p.head_dim);
  const AttentionInputs inputs = flashlab::random_inputs(p, c.distribution, seed);
  flashlab::AttentionOutputs expected = flashlab::AttentionOutputs::poisoned(p);
  flashlab::hopper::fp8_emulated_attention(p, inputs, expected, config);
  const flashlab::hopper::Fp8Prepass ops = flashlab::hopper::fp8_prepass(p, inputs, config);
  DevicePrepass device(p, inputs, config);
  flashlab::hopper::run_fp8(device.params, nullptr);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  flashlab::AttentionOutputs got = flashlab::AttentionOutputs::poisoned(p);
  device.device.download(got);  // O from bf16, exactly
  const bool ok = check_attention(p, config, ops, expected, got.o.data, got.lse.data);
  std::printf("%s  %s\n", ok ? "PASS" : "FAIL", c.name.c_str());
  return ok;
}

int run_correctness(const std::string& only) {
  int failed = 0, run = 0;
  uint64_t seed = 12;
  for (const Case& c : cases()) {
    ++seed;
    if (!only.empty() && c.name.find(only) == std::string::npos) continue;
    ++run;
    failed += run_case(c, seed) ? 0 : 1;
  }
  for (const AttentionCase& c : attention_cases()) {
    ++seed;
    if (!only.empty() && c.name.find(only) == std::string::npos) continue;
    ++run;
    failed += run_attention_case(c, seed) ? 0 : 1;
  }
  std::printf("%d of %d cases passed\n", run - failed, run);
  return failed == 0 && run > 0 ? 0 : 1;
}

// FA3's benchmark setup: 16k tokens (batch = 16384 / seqlen), hidden 2048 (heads = 2048 / head_dim), the
// registered configuration. Times the pre-pass, the main kernel and both back to back; TFLOP/s count the
// attention FLOPs (common/flops.hpp), so the end-to-end figure includes the pre-pass's time at no FLOPs.
int run_timing(int64_t head_dim, int64_t seqlen, bool causal, int repeats) {
  const int64_t heads = 2048 / head_dim;
  Problem p = problem_shape(std::max<int64_t>(1, 16384 / seqlen), heads, heads, seqlen, seqlen, head_dim);
  p.causal = causal;
  p.validate();
  const Fp8Config config = flashlab::hopper::registered_fp8_config(head_dim);
  const AttentionInputs inputs = flashlab::random_inputs(p, Distribution::normal, 1);
  const DevicePrepass device(p, inputs, config);
  cudaEvent_t start, stop;
  FLASHLAB_CUDA_CHECK(cudaEventCreate(&start));
  FLASHLAB_CUDA_CHECK(cudaEventCreate(&stop));
  auto seconds = [&](auto&& work) {
    work();  // warm-up
    FLASHLAB_CUDA_CHECK(cudaEventRecord(start));
    for (int r = 0; r < repeats; ++r) work();
    FLASHLAB_CUDA_CHECK(cudaEventRecord(stop));
    FLASHLAB_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms / 1e3 / repeats;
  };
  const double prepass =
      seconds([&] { flashlab::hopper::launch_fp8_prepass(device.params.prepass, nullptr); });
  const double kernel =
      seconds([&] { flashlab::hopper::launch_fp8_attention(device.params.attention, nullptr); });
  const double both = seconds([&] { flashlab::hopper::run_fp8(device.params, nullptr); });
  const double flops = flashlab::forward_flops(p);
  // Compulsory pre-pass traffic: bf16 Q, K, V read once, e4m3 written once.
  const double bytes = 3.0 * (p.q_elements() + 2.0 * p.kv_elements());
  std::printf("fp8  batch %lld, heads %lld, seqlen %lld, head_dim %lld, %s\n",
              static_cast<long long>(p.batch), static_cast<long long>(heads), static_cast<long long>(seqlen),
              static_cast<long long>(head_dim), causal ? "causal" : "non-causal");
  std::printf("  pre-pass     %9.1f us  %7.0f GB/s compulsory\n", prepass * 1e6, bytes / prepass / 1e9);
  std::printf("  main kernel  %9.1f us  %7.1f TFLOP/s\n", kernel * 1e6, flops / kernel * 1e-12);
  std::printf("  end to end   %9.1f us  %7.1f TFLOP/s\n", both * 1e6, flops / both * 1e-12);
  FLASHLAB_CUDA_CHECK(cudaEventDestroy(start));
  FLASHLAB_CUDA_CHECK(cudaEventDestroy(stop));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool timing = false, causal = false;
  int64_t head_dim = 128, seqlen = 8192;
  int repeats = 20;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--time") {
      timing = true;
    } else if (arg == "--causal") {
      causal = true;
    } else if (arg == "--head-dim" && i + 1 < argc) {
      head_dim = std::atoll(argv[++i]);
    } else if (arg == "--seqlen" && i + 1 < argc) {
      seqlen = std::max<int64_t>(1, std::atoll(argv[++i]));
    } else if (arg == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (arg == "--repeat" && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--only TEXT] | [--time [--head-dim 128|256] [--seqlen N] [--causal] [--repeat R]]\n",
          argv[0]);
      return 2;
    }
  }
  try {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      std::fprintf(stderr, "no CUDA device: nothing to test here\n");
      return 2;
    }
    cudaDeviceProp prop{};
    FLASHLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    // The registry's check: sm_90a code runs on compute capability 9.0 only.
    if (const std::string reason = flashlab::cuda::needs_compute_capability(9, 0, "sm_90a");
        !reason.empty()) {
      std::fprintf(stderr, "cuda_v3_hopper/fp8: %s\n", reason.c_str());
      return 2;
    }
    return timing ? run_timing(head_dim, seqlen, causal, repeats) : run_correctness(only);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
