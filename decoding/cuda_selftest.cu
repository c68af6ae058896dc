// Self-test of decoding/cuda_split_kv on a GPU (sm_80 or newer), before the kernel joins the registry.
//
//   decoding_cuda_selftest [--only TEXT]
//       correctness: decode shapes (seqlen_q 1 to 16), KV 1 to 65536, ragged lengths with 0, GQA/MQA, paged
//       caches with shuffled block tables, tree masks, causal, forced split counts; against the fp64
//       reference under the tolerance policy; PASS/FAIL per case, exit 1 on any failure (--only: cases named
//       with TEXT)
//   decoding_cuda_selftest --time [--batch B] [--repeat R]
//       effective bandwidth (K and V bytes read once / time), bf16, 32 query heads, 8 kv heads, d 128,
//       seqlen_q 1, KV 8192 and 65536, contiguous and paged (page 256); and the device-to-device copy
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "common/cuda/check.hpp"
#include "common/cuda/device_buffer.hpp"
#include "common/cuda/device_problem.hpp"
#include "common/inputs.hpp"
#include "common/problem.hpp"
#include "common/reference.hpp"
#include "common/tensor.hpp"
#include "common/tolerance.hpp"
#include "decoding/cuda_split_kv.hpp"

namespace {

using flashlab::AttentionInputs;
using flashlab::AttentionOutputs;
using flashlab::DType;
using flashlab::Problem;
using flashlab::problem_shape;
using flashlab::Random;
using flashlab::cuda::DeviceBuffer;
using flashlab::cuda::from_16bit;
using flashlab::cuda::to_16bit;
using flashlab::decoding::SplitKvDType;
using flashlab::decoding::SplitKvParams;

template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& host) {
  DeviceBuffer<T> buffer(std::max<size_t>(host.size(), 1));
  if (!host.empty())
    FLASHLAB_CUDA_CHECK(
        cudaMemcpy(buffer.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return buffer;
}

struct Case {
  std::string name;
  Problem problem;
  int page_size = 0;   // 0: contiguous K/V; else a paged cache with a shuffled block table
  int num_splits = 0;  // 0: the heuristic
  flashlab::Distribution distribution = flashlab::Distribution::normal;
};

// The problem's inputs on the device, outputs poisoned (NaN everywhere) so an unwritten element fails. A
// paged cache gets a pool with pages in shuffled order and spare pages filled with NaN, so a wrong page
// lookup shows.
struct DeviceProblem {
  DeviceBuffer<uint16_t> q, k, v, o;
  DeviceBuffer<float> lse;
  DeviceBuffer<int> seqlens_k, block_table;
  DeviceBuffer<uint8_t> mask;
  DeviceBuffer<unsigned char> workspace;
  SplitKvParams params;

  DeviceProblem(const Case& c, const AttentionInputs& inputs, uint64_t seed) {
    const Problem& p = c.problem;
    params = flashlab::decoding::split_kv_params(p);  // the registry launcher's parameters
    params.page_size = c.page_size;
    flashlab::decoding::set_packed_strides(params);  // again, for the page pool's strides
    params.num_splits = c.num_splits;

    q = upload(to_16bit(inputs.q.data, p.dtype));
    if (c.page_size == 0) {
      k = upload(to_16bit(inputs.k.data, p.dtype));
      v = upload(to_16bit(inputs.v.data, p.dtype));
    } else {
      upload_paged(p, inputs, c.page_size, seed);
    }
    o = DeviceBuffer<uint16_t>(p.q_elements());
    lse = DeviceBuffer<float>(p.lse_elements());
    if (!p.seqlens_k.empty()) {
      seqlens_k = upload(std::vector<int>(p.seqlens_k.begin(), p.seqlens_k.end()));
      params.seqlens_k = seqlens_k.get();
    }
    if (p.mask) {
      mask = upload(*p.mask);
      params.mask = mask.get();
    }
    params.q = q.get();
    params.k = k.get();
    params.v = v.get();
    params.o = o.get();
    params.lse = lse.get();
    params.workspace_bytes = flashlab::decoding::cuda_split_kv_workspace_bytes(params);
    if (params.workspace_bytes > 0) {
      workspace = DeviceBuffer<unsigned char>(params.workspace_bytes);
      FLASHLAB_CUDA_CHECK(cudaMemset(workspace.get(), 0xFF, workspace.bytes()));  // poisoned partials too
      params.workspace = workspace.get();
    }
    FLASHLAB_CUDA_CHECK(cudaMemset(o.get(), 0xFF, o.bytes()));  // 0xFFFF is a NaN in bf16 and fp16
    FLASHLAB_CUDA_CHECK(cudaMemset(lse.get(), 0xFF, lse.bytes()));
  }

  // Pool [num_pages, page_size, heads_kv, head_dim]: every sequence's pages at shuffled places, plus spare
  // NaN pages that no table entry names.
  void upload_paged(const Problem& p, const AttentionInputs& inputs, int page_size, uint64_t seed) {
    const int64_t pages_per_seq = (p.seqlen_k + page_size - 1) / page_size;
    const int64_t used = p.batch * pages_per_seq, num_pages = used + 3;
    const int64_t row = p.heads_kv * p.head_dim, page_elems = page_size * row;
    std::vector<int> order(static_cast<size_t>(num_pages));
    std::iota(order.begin(), order.end(), 0);
    Random random(seed ^ 0x9e3779b97f4a7c15ull);
    for (int64_t i = num_pages - 1; i > 0; --i)
      std::swap(order[i], order[random.next() % static_cast<uint64_t>(i + 1)]);
    const uint16_t nan_bits = 0xFFFF;
    std::vector<uint16_t> k_pool(static_cast<size_t>(num_pages * page_elems), nan_bits), v_pool = k_pool;
    std::vector<int> table(static_cast<size_t>(std::max<int64_t>(used, 1)), 0);
    const std::vector<uint16_t> k16 = to_16bit(inputs.k.data, p.dtype),
                                v16 = to_16bit(inputs.v.data, p.dtype);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t page = 0; page < pages_per_seq; ++page) {
        const int physical = order[static_cast<size_t>(b * pages_per_seq + page)];
        table[static_cast<size_t>(b * pages_per_seq + page)] = physical;
        for (int64_t r = 0; r < page_size; ++r) {
          const int64_t j = page * page_size + r;
          if (j >= p.seqlen_k) break;
          const int64_t src = (b * p.seqlen_k + j) * row, dst = physical * page_elems + r * row;
          for (int64_t e = 0; e < row; ++e) {
            k_pool[dst + e] = k16[src + e];
            v_pool[dst + e] = v16[src + e];
          }
        }
      }
    k = upload(k_pool);
    v = upload(v_pool);
    block_table = upload(table);
    params.block_table = block_table.get();
    params.block_table_stride = static_cast<int>(pages_per_seq);
  }

  AttentionOutputs outputs(const Problem& p) const {
    AttentionOutputs out = AttentionOutputs::poisoned(p);
    std::vector<uint16_t> bits(static_cast<size_t>(p.q_elements()));
    FLASHLAB_CUDA_CHECK(cudaMemcpy(bits.data(), o.get(), bits.size() * 2, cudaMemcpyDeviceToHost));
    out.o.data = from_16bit(bits, p.dtype);
    FLASHLAB_CUDA_CHECK(
        cudaMemcpy(out.lse.data.data(), lse.get(), out.lse.data.size() * 4, cudaMemcpyDeviceToHost));
    return out;
  }
};

// A speculative-decoding tree over the last sq keys: every draft token sees the whole prefix, itself and its
// ancestors (parent drawn among the earlier drafts). Row `blind` (if >= 0) sees nothing at all.
std::shared_ptr<const std::vector<uint8_t>> tree_mask(int64_t sq, int64_t sk, uint64_t seed, int64_t blind) {
  std::vector<uint8_t> mask(static_cast<size_t>(sq * sk), 0);
  std::vector<int64_t> parent(static_cast<size_t>(sq), -1);
  Random random(seed);
  for (int64_t i = 1; i < sq; ++i) parent[i] = static_cast<int64_t>(random.next() % static_cast<uint64_t>(i));
  for (int64_t i = 0; i < sq; ++i) {
    if (i == blind) continue;
    for (int64_t j = 0; j < sk - sq; ++j) mask[i * sk + j] = 1;
    for (int64_t a = i; a >= 0; a = parent[a]) mask[i * sk + (sk - sq + a)] = 1;
  }
  return std::make_shared<const std::vector<uint8_t>>(std::move(mask));
}

std::vector<Case> correctness_cases() {
  std::vector<Case> cases;
  for (DType dtype : {DType::bf16, DType::f16}) {
    const std::string t = dtype == DType::bf16 ? "bf16" : "fp16";
    for (int64_t d : {64, 128}) {
      const std::string dim = " d" + std::to_string(d);
      cases.push_back({t + dim + " decode, one key", problem_shape(1, 8, 8, 1, 1, d, dtype)});
      cases.push_back({t + dim + " decode KV 97 GQA 32/8", problem_shape(2, 32, 8, 1, 97, d, dtype)});
      cases.push_back({t + dim + " decode KV 8191 GQA 32/8", problem_shape(1, 32, 8, 1, 8191, d, dtype)});
      Problem spec = problem_shape(2, 32, 8, 4, 97, d, dtype);
      spec.causal = true;
      cases.push_back({t + dim + " seqlen_q 4 causal KV 97 GQA 32/8", spec});
      // 1, 2, 3 and 6 rows per kv head: O += P V shares each tile's keys among 8, 4, 2 and 1 (d 128) groups.
      cases.push_back({t + dim + " decode KV 700 GQA 3/1", problem_shape(2, 3, 1, 1, 700, d, dtype)});
      Problem six_rows = problem_shape(1, 6, 3, 3, 1500, d, dtype);
      six_rows.causal = true;
      cases.push_back({t + dim + " seqlen_q 3 causal KV 1500 GQA 6/3", six_rows});
      Problem two_rows = problem_shape(2, 4, 2, 1, 333, d, dtype);
      two_rows.seqlens_k = {333, 40};
      two_rows.page_size = 8;
      cases.push_back({t + dim + " decode GQA 4/2 paged 8 ragged", two_rows, 8});
      Problem ragged = problem_shape(4, 32, 8, 1, 1000, d, dtype);
      ragged.seqlens_k = {0, 1, 97, 1000};
      cases.push_back({t + dim + " ragged KV {0, 1, 97, 1000}", ragged});
      for (int page : {8, 64, 256}) {
        Problem paged = problem_shape(3, 32, 8, 4, 777, d, dtype);
        paged.causal = true;
        paged.seqlens_k = {777, 0, 300};
        paged.page_size = page;
        cases.push_back({t + dim + " paged " + std::to_string(page) + " causal sq 4 ragged", paged, page});
      }
    }
    Problem long_kv = problem_shape(1, 32, 8, 1, 65536, 128, dtype);
    cases.push_back({t + " d128 decode KV 65536 GQA 32/8", long_kv});
    Problem long_paged = long_kv;
    long_paged.page_size = 256;
    cases.push_back({t + " d128 decode KV 65536 paged 256", long_paged, 256});
    Problem spec_long = problem_shape(1, 32, 8, 4, 8191, 128, dtype);
    spec_long.causal = true;
    cases.push_back({t + " d128 seqlen_q 4 causal KV 8191", spec_long});
    Problem short_causal =
        problem_shape(3, 8, 2, 16, 20, 64, dtype);  // sk 3 < sq: the first rows see nothing
    short_causal.causal = true;
    short_causal.seqlens_k = {20, 3, 0};
    cases.push_back({t + " d64 seqlen_q 16 causal, KV {20, 3, 0}", short_causal});
    Problem mqa = problem_shape(2, 16, 1, 16, 517, 128, dtype);  // 256 rows per kv head: 16 row tiles
    mqa.causal = true;
    cases.push_back({t + " d128 MQA 16/1 seqlen_q 16 causal", mqa});
    Problem tree = problem_shape(2, 32, 8, 8, 300, 128, dtype);
    tree.mask = tree_mask(8, 300, 11, -1);
    cases.push_back({t + " d128 tree mask sq 8", tree});
    Problem tree_blind = problem_shape(1, 4, 4, 16, 1000, 64, dtype);
    tree_blind.mask = tree_mask(16, 1000, 12, 5);
    cases.push_back({t + " d64 tree mask sq 16, one blind row", tree_blind});
    Problem tree_paged = problem_shape(2, 32, 8, 8, 600, 128, dtype);
    tree_paged.mask = tree_mask(8, 600, 13, -1);
    tree_paged.seqlens_k = {600, 599};
    tree_paged.page_size = 64;
    cases.push_back({t + " d128 tree mask paged 64", tree_paged, 64});
    Problem window = problem_shape(1, 8, 8, 4, 3000, 128, dtype);
    window.causal = true;
    window.window_left = 100;
    cases.push_back({t + " d128 causal window 100, KV 3000", window});
    Problem empty = problem_shape(2, 4, 2, 2, 0, 128, dtype);
    cases.push_back({t + " d128 no keys at all", empty});
    Problem all_zero = problem_shape(2, 4, 2, 1, 64, 128, dtype);
    all_zero.seqlens_k = {0, 0};
    cases.push_back({t + " d128 every length 0", all_zero});
    for (int splits : {1, 7, 128}) {
      cases.push_back({t + " d128 KV 8191 forced " + std::to_string(splits) + " split(s)",
                       problem_shape(2, 32, 8, 1, 8191, 128, dtype), 0, splits});
    }
    cases.push_back({t + " d128 large scores (+-1e4)", problem_shape(1, 8, 2, 4, 2000, 128, dtype), 0, 0,
                     flashlab::Distribution::large});
    cases.push_back({t + " d128 0.1% outliers", problem_shape(1, 32, 8, 1, 4000, 128, dtype), 0, 0,
                     flashlab::Distribution::outliers});
  }
  return cases;
}

int run_correctness(const std::string& only) {
  int failures = 0;
  uint64_t seed = 2026;
  for (const Case& c : correctness_cases()) {
    ++seed;  // each case keeps its inputs whether or not others are filtered out
    if (!only.empty() && c.name.find(only) == std::string::npos) continue;
    c.problem.validate();
    const AttentionInputs inputs = flashlab::random_inputs(c.problem, c.distribution, seed);
    DeviceProblem device(c, inputs, seed);
    flashlab::decoding::cuda_split_kv_forward(device.params, nullptr);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    const AttentionOutputs out = device.outputs(c.problem);
    const flashlab::ReferenceResult ref = flashlab::reference_attention(c.problem, inputs);
    // The yardstick: naive attention at the kernel's precision. P stays fp32 (CUDA-core products), so
    // rounds_p is false.
    const AttentionOutputs baseline = flashlab::baseline_attention(c.problem, inputs, c.problem.dtype, false);
    const flashlab::Tolerance tol =
        flashlab::tolerance_from_baseline(c.problem.dtype, flashlab::deviation(c.problem, baseline, ref));
    const flashlab::Verdict verdict = flashlab::judge(c.problem, out, ref, tol);
    const std::string name = c.name + " (" +
                             std::to_string(flashlab::decoding::cuda_split_kv_num_splits(device.params)) +
                             " splits)";
    std::printf("%s  %-62s %s\n", verdict.passed() ? "PASS" : "FAIL", name.c_str(),
                verdict.explain().c_str());
    failures += verdict.passed() ? 0 : 1;
  }
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}

// --- Timing ---

// Fills 16-bit values in [-1, 1) from a hash of the index (no host round trip for the large caches).
__global__ void fill_kernel(__nv_bfloat16* data, int64_t count, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    data[i] = __float2bfloat16(static_cast<float>(x & 0xFFFF) / 32768.0f - 1.0f);
  }
}

DeviceBuffer<__nv_bfloat16> random_device(int64_t count, uint32_t seed) {
  DeviceBuffer<__nv_bfloat16> buffer(static_cast<size_t>(count));
  fill_kernel<<<1024, 256>>>(buffer.get(), count, seed);
  FLASHLAB_CUDA_CHECK_LAUNCH();
  return buffer;
}

// Median milliseconds per call of `work`, each sample a burst of launches (hides the host's launch cost).
template <typename Work>
double median_ms(int repeats, Work&& work) {
  cudaEvent_t start, stop;
  FLASHLAB_CUDA_CHECK(cudaEventCreate(&start));
  FLASHLAB_CUDA_CHECK(cudaEventCreate(&stop));
  work();  // warm-up
  constexpr int kBurst = 20;
  std::vector<float> ms;
  for (int r = 0; r < repeats; ++r) {
    FLASHLAB_CUDA_CHECK(cudaEventRecord(start));
    for (int launch = 0; launch < kBurst; ++launch) work();
    FLASHLAB_CUDA_CHECK(cudaEventRecord(stop));
    FLASHLAB_CUDA_CHECK(cudaEventSynchronize(stop));
    float elapsed = 0.0f;
    FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&elapsed, start, stop));
    ms.push_back(elapsed / kBurst);
  }
  FLASHLAB_CUDA_CHECK(cudaEventDestroy(start));
  FLASHLAB_CUDA_CHECK(cudaEventDestroy(stop));
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

int run_timing(int batch, int repeats) {
  // The ceiling: a 1 GiB device-to-device copy, counted as bytes read + bytes written per second.
  {
    const size_t bytes = size_t{1} << 30;
    DeviceBuffer<unsigned char> from(bytes), to(bytes);
    const double ms = median_ms(repeats, [&] {
      FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(to.get(), from.get(), bytes, cudaMemcpyDeviceToDevice));
    });
    std::printf("device-to-device copy: %.0f GB/s (read + write)\n", 2.0 * bytes / (ms * 1e-3) * 1e-9);
  }
  constexpr int kHeadsQ = 32, kHeadsKv = 8, kHeadDim = 128, kPage = 256;
  std::printf("bf16, batch %d, heads 32/8, d 128, seqlen_q 1; median of %d bursts\n", batch, repeats);
  std::printf("%-8s %-12s %7s %10s %10s\n", "KV", "layout", "splits", "time_us", "GB/s");
  for (int seqlen_k : {8192, 65536}) {
    for (int page_size : {0, kPage}) {
      SplitKvParams p;
      p.dtype = SplitKvDType::bf16;
      p.batch = batch;
      p.heads_q = kHeadsQ;
      p.heads_kv = kHeadsKv;
      p.seqlen_q = 1;
      p.seqlen_k = seqlen_k;
      p.head_dim = kHeadDim;
      p.page_size = page_size;
      flashlab::decoding::set_packed_strides(p);
      p.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
      const int64_t kv_elements = int64_t{batch} * seqlen_k * kHeadsKv * kHeadDim;
      DeviceBuffer<__nv_bfloat16> q = random_device(int64_t{batch} * kHeadsQ * kHeadDim, 1);
      DeviceBuffer<__nv_bfloat16> k = random_device(kv_elements, 2), v = random_device(kv_elements, 3);
      DeviceBuffer<__nv_bfloat16> o(static_cast<size_t>(int64_t{batch} * kHeadsQ * kHeadDim));
      DeviceBuffer<float> lse(static_cast<size_t>(batch * kHeadsQ));
      DeviceBuffer<int> table;
      if (page_size > 0) {
        // Every page of the pool used once, in shuffled order.
        const int pages_per_seq = (seqlen_k + page_size - 1) / page_size;
        std::vector<int> order(static_cast<size_t>(batch * pages_per_seq));
        std::iota(order.begin(), order.end(), 0);
        Random random(99);
        for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[random.next() % (i + 1)]);
        table = upload(order);
        p.block_table = table.get();
        p.block_table_stride = pages_per_seq;
      }
      p.q = q.get();
      p.k = k.get();
      p.v = v.get();
      p.o = o.get();
      p.lse = lse.get();
      p.workspace_bytes = flashlab::decoding::cuda_split_kv_workspace_bytes(p);
      DeviceBuffer<unsigned char> workspace(p.workspace_bytes);
      p.workspace = workspace.get();
      const double ms = median_ms(repeats, [&] { flashlab::decoding::cuda_split_kv_forward(p, nullptr); });
      const double kv_bytes = 2.0 * kv_elements * 2;  // K and V, 2 bytes each, read once
      std::printf("%-8d %-12s %7d %10.1f %10.0f\n", seqlen_k, page_size > 0 ? "paged 256" : "contiguous",
                  flashlab::decoding::cuda_split_kv_num_splits(p), ms * 1e3, kv_bytes / (ms * 1e-3) * 1e-9);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool timing = false;
  int batch = 1, repeats = 20;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--time") {
      timing = true;
    } else if (arg == "--batch" && i + 1 < argc) {
      batch = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (arg == "--repeat" && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--only TEXT] | [--time [--batch B] [--repeat N]]\n", argv[0]);
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
    std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor,
                prop.multiProcessorCount);
    if (prop.major < 8) {
      std::fprintf(stderr, "decoding/cuda_split_kv needs sm_80 or newer (cp.async)\n");
      return 2;
    }
    return timing ? run_timing(batch, repeats) : run_correctness(only);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
