// Self-test of cuda_v3_hopper/ws on an H100/H200, before the kernel joins the registry.
//
//   hopper_ws_selftest [--only TEXT]
//       correctness: awkward shapes, masks, GQA, padding, every ablation rung, against the fp64 reference
//       under the tolerance policy; PASS/FAIL per case, exit 1 on any failure (--only: cases named with TEXT)
//   hopper_ws_selftest --time [--head-dim D] [--causal] [--repeat R]
//       the ablation ladder in TFLOP/s over FA3's setup (16k tokens, hidden 2048, bf16), seqlens 512 to 16k
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "common/cuda/check.hpp"
#include "common/cuda/device.hpp"
#include "common/cuda/device_buffer.hpp"
#include "common/cuda/device_problem.hpp"
#include "common/flops.hpp"
#include "common/inputs.hpp"
#include "common/problem.hpp"
#include "common/reference.hpp"
#include "common/tensor.hpp"
#include "common/tolerance.hpp"
#include "cuda_v3_hopper/ws.hpp"

namespace {

using flashlab::AttentionInputs;
using flashlab::AttentionOutputs;
using flashlab::DType;
using flashlab::Problem;
using flashlab::problem_shape;
using flashlab::cuda::DeviceBuffer;
using flashlab::cuda::from_16bit;
using flashlab::cuda::to_16bit;
using flashlab::hopper::HopperAblation;
using flashlab::hopper::HopperParams;

// The problem's inputs on the device, with outputs poisoned (NaN everywhere) so an unwritten element fails.
struct DeviceProblem {
  DeviceBuffer<uint16_t> q, k, v, o;
  DeviceBuffer<float> lse;
  DeviceBuffer<int> seqlens_q, seqlens_k;
  HopperParams params;

  DeviceProblem(const Problem& p, const AttentionInputs& inputs, HopperAblation ablation)
      : q(p.q_elements()),
        k(std::max<int64_t>(p.kv_elements(), 1)),
        v(std::max<int64_t>(p.kv_elements(), 1)),
        o(p.q_elements()),
        lse(p.lse_elements()) {
    q.copy_from_host(to_16bit(inputs.q.data, p.dtype).data());
    if (p.kv_elements() > 0) {
      k.copy_from_host(to_16bit(inputs.k.data, p.dtype).data());
      v.copy_from_host(to_16bit(inputs.v.data, p.dtype).data());
    }
    params = flashlab::hopper::ws_params(p);  // the registry launcher's parameters
    params.q = q.get();
    params.k = k.get();
    params.v = v.get();
    params.o = o.get();
    params.lse = lse.get();
    if (!p.seqlens_q.empty()) {
      const std::vector<int> lengths(p.seqlens_q.begin(), p.seqlens_q.end());
      seqlens_q = DeviceBuffer<int>(lengths.size());
      seqlens_q.copy_from_host(lengths.data());
      params.seqlens_q = seqlens_q.get();
    }
    if (!p.seqlens_k.empty()) {
      const std::vector<int> lengths(p.seqlens_k.begin(), p.seqlens_k.end());
      seqlens_k = DeviceBuffer<int>(lengths.size());
      seqlens_k.copy_from_host(lengths.data());
      params.seqlens_k = seqlens_k.get();
    }
    params.ablation = ablation;
    poison();
  }

  void poison() {
    FLASHLAB_CUDA_CHECK(cudaMemset(o.get(), 0xFF, o.bytes()));  // 0xFFFF is a NaN in bf16 and fp16
    FLASHLAB_CUDA_CHECK(cudaMemset(lse.get(), 0xFF, lse.bytes()));
  }

  AttentionOutputs outputs(const Problem& p) const {
    AttentionOutputs out = AttentionOutputs::poisoned(p);
    std::vector<uint16_t> bits(o.size());
    o.copy_to_host(bits.data());
    out.o.data = from_16bit(bits, p.dtype);
    lse.copy_to_host(out.lse.data.data());
    return out;
  }
};

struct Case {
  std::string name;
  Problem problem;
  flashlab::Distribution distribution = flashlab::Distribution::normal;
  HopperAblation ablation{};
};

std::vector<Case> correctness_cases() {
  std::vector<Case> cases;
  for (DType dtype : {DType::bf16, DType::f16}) {
    const std::string t = dtype == DType::bf16 ? "bf16" : "fp16";
    for (int64_t d : {64, 128, 256}) {
      const std::string dim = " d" + std::to_string(d);
      cases.push_back({t + dim + " one row, one key", problem_shape(1, 1, 1, 1, 1, d, dtype)});
      cases.push_back({t + dim + " 97 x 97", problem_shape(2, 3, 3, 97, 97, d, dtype)});
      cases.push_back({t + dim + " 113 x 203 (ragged tails)", problem_shape(1, 2, 2, 113, 203, d, dtype)});
      Problem causal_long = problem_shape(1, 2, 1, 1025, 1023, d, dtype);
      causal_long.causal = true;
      cases.push_back({t + dim + " causal 1025 x 1023 GQA 2/1", causal_long});
      Problem causal_short =
          problem_shape(2, 4, 2, 203, 113, d, dtype);  // sq > sk: the first rows see nothing
      causal_short.causal = true;
      cases.push_back({t + dim + " causal 203 x 113 (fully masked rows)", causal_short});
    }
    Problem causal_wide = problem_shape(1, 2, 2, 113, 1025, 128, dtype);
    causal_wide.causal = true;
    cases.push_back({t + " d128 causal 113 x 1025", causal_wide});
    Problem window = problem_shape(1, 2, 2, 700, 650, 128, dtype);
    window.window_left = 100;
    window.window_right = 37;
    cases.push_back({t + " d128 window (100, 37) 700 x 650", window});
    Problem local_causal = problem_shape(1, 1, 1, 1023, 1023, 64, dtype);
    local_causal.causal = true;
    local_causal.window_left = 200;
    cases.push_back({t + " d64 causal + window left 200, 1023", local_causal});
    Problem padded = problem_shape(3, 4, 1, 300, 260, 128, dtype);  // MQA
    padded.seqlens_q = {300, 0, 131};
    padded.seqlens_k = {17, 200, 0};
    cases.push_back({t + " d128 padding (lengths 0 included) MQA 4/1", padded});
    Problem padded_causal = problem_shape(2, 2, 2, 257, 400, 256, dtype);
    padded_causal.causal = true;
    padded_causal.seqlens_q = {129, 257};
    padded_causal.seqlens_k = {400, 255};
    cases.push_back({t + " d256 padding + causal", padded_causal});
    Problem no_keys = problem_shape(1, 2, 2, 70, 0, 128, dtype);
    cases.push_back({t + " d128 no keys at all", no_keys});
    cases.push_back({t + " d128 large scores (+-1e4)", problem_shape(1, 2, 2, 333, 333, 128, dtype),
                     flashlab::Distribution::large});
    cases.push_back({t + " d128 0.1% outliers", problem_shape(1, 2, 2, 1000, 1000, 128, dtype),
                     flashlab::Distribution::outliers});
  }
  // Every rung of the ablation ladder computes the same thing.
  const HopperAblation rungs[] = {{false, false, false}, {true, false, false}, {true, true, false}};
  const char* rung_names[] = {"plain TMA + wgmma", "+ warp specialization", "+ ping-pong"};
  for (int r = 0; r < 3; ++r)
    for (int64_t d : {64, 128, 256}) {
      Problem causal = problem_shape(2, 2, 1, 517, 389, d, DType::bf16);
      causal.causal = true;
      cases.push_back({std::string("bf16 d") + std::to_string(d) + " " + rung_names[r] + ", causal 517 x 389",
                       causal, flashlab::Distribution::normal, rungs[r]});
      Problem plain = problem_shape(1, 3, 3, 300, 1000, d, DType::bf16);
      cases.push_back({std::string("bf16 d") + std::to_string(d) + " " + rung_names[r] + ", 300 x 1000",
                       plain, flashlab::Distribution::normal, rungs[r]});
    }
  return cases;
}

int run_correctness(const std::string& only) {
  int failures = 0;
  uint64_t seed = 2024;
  for (const Case& c : correctness_cases()) {
    ++seed;  // each case keeps its inputs whether or not others are filtered out
    if (!only.empty() && c.name.find(only) == std::string::npos) continue;
    c.problem.validate();
    const AttentionInputs inputs = flashlab::random_inputs(c.problem, c.distribution, seed);
    DeviceProblem device(c.problem, inputs, c.ablation);
    flashlab::hopper::hopper_ws_forward(device.params, nullptr);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    const AttentionOutputs out = device.outputs(c.problem);
    const flashlab::ReferenceResult ref = flashlab::reference_attention(c.problem, inputs);
    // The yardstick: naive attention at the kernel's precision, P rounded as the tensor cores take it.
    const AttentionOutputs baseline = flashlab::baseline_attention(c.problem, inputs, c.problem.dtype, true);
    const flashlab::Tolerance tol =
        flashlab::tolerance_from_baseline(c.problem.dtype, flashlab::deviation(c.problem, baseline, ref));
    const flashlab::Verdict verdict = flashlab::judge(c.problem, out, ref, tol);
    std::printf("%s  %-58s %s\n", verdict.passed() ? "PASS" : "FAIL", c.name.c_str(),
                verdict.explain().c_str());
    failures += verdict.passed() ? 0 : 1;
  }
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}

// FA3's benchmark setup: 16k tokens in all, hidden dimension 2048 (heads = 2048 / d), bf16.
int run_timing(int head_dim, bool causal, int repeats) {
  const HopperAblation rungs[] = {{false, false, false}, {true, false, false}, {true, true, false}, {}};
  const char* rung_names[] = {"plain TMA + wgmma", "+ warp specialization", "+ ping-pong",
                              "+ intra-warpgroup overlap"};
  std::printf("head_dim %d, %s, bf16, TFLOP/s (median of %d)\n", head_dim, causal ? "causal" : "non-causal",
              repeats);
  std::printf("%-8s", "seqlen");
  for (const char* name : rung_names) std::printf(" %26s", name);
  std::printf("\n");
  for (int64_t seqlen : {512, 1024, 2048, 4096, 8192, 16384}) {
    Problem p = problem_shape(16384 / seqlen, 2048 / head_dim, 2048 / head_dim, seqlen, seqlen, head_dim,
                              DType::bf16);
    p.causal = causal;
    const AttentionInputs inputs = flashlab::random_inputs(p, flashlab::Distribution::normal, 7);
    std::printf("%-8lld", static_cast<long long>(seqlen));
    for (const HopperAblation& rung : rungs) {
      DeviceProblem device(p, inputs, rung);
      cudaEvent_t start, stop;
      FLASHLAB_CUDA_CHECK(cudaEventCreate(&start));
      FLASHLAB_CUDA_CHECK(cudaEventCreate(&stop));
      flashlab::hopper::hopper_ws_forward(device.params, nullptr);  // warm-up
      // Each sample times a burst of launches, so the host's per-launch work (tensor maps) stays hidden.
      constexpr int kBurst = 10;
      std::vector<float> ms;
      for (int r = 0; r < repeats; ++r) {
        FLASHLAB_CUDA_CHECK(cudaEventRecord(start));
        for (int launch = 0; launch < kBurst; ++launch)
          flashlab::hopper::hopper_ws_forward(device.params, nullptr);
        FLASHLAB_CUDA_CHECK(cudaEventRecord(stop));
        FLASHLAB_CUDA_CHECK(cudaEventSynchronize(stop));
        float elapsed = 0.0f;
        FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&elapsed, start, stop));
        ms.push_back(elapsed / kBurst);
      }
      std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
      const double seconds = ms[ms.size() / 2] * 1e-3;
      std::printf(" %26.1f", flashlab::forward_flops(p) / seconds * 1e-12);
      FLASHLAB_CUDA_CHECK(cudaEventDestroy(start));
      FLASHLAB_CUDA_CHECK(cudaEventDestroy(stop));
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool timing = false, causal = false;
  int head_dim = 128, repeats = 10;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--time") {
      timing = true;
    } else if (arg == "--causal") {
      causal = true;
    } else if (arg == "--head-dim" && i + 1 < argc) {
      head_dim = std::atoi(argv[++i]);
    } else if (arg == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (arg == "--repeat" && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr,
                   "usage: %s [--only TEXT] | [--time [--head-dim 64|128|256] [--causal] [--repeat N]]\n",
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
      std::fprintf(stderr, "cuda_v3_hopper/ws: %s\n", reason.c_str());
      return 2;
    }
    return timing ? run_timing(head_dim, causal, repeats) : run_correctness(only);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
