// The two micro-kernels of cpu_tiled alone, on one core, on tiles already in L1 and L2 (d 128, Bc 96, one
// micro-column of 64 query rows, K rows 512 floats apart as in BSHD with 4 kv heads), for
// docs/02-cpu-tiled.md section 5. Not part of the build; from the repository root:
//
//   g++ -I. -O3 -march=native -std=c++20 docs/results/cpu-2026-11-24/micro_kernel_probe.cpp -o /tmp/mk &&
//   /tmp/mk
#include <chrono>
#include <cstdio>
#include <vector>

#include "cpu_tiled/micro_kernel.hpp"
#include "cpu_tiled/tile_step.hpp"

using namespace flashlab::cpu_tiled;

int main() {
  const int64_t d = 128, W = micro_width<Vec>(), nk = 96, k_stride = 512, repeats = 20000;
  std::vector<float> qt(d * W, 0.01f), k(nk * k_stride, 0.02f), st(nk * W), v(nk * v_tile_stride(d), 0.1f),
      o(d * W), pre(W, 1.0f), post(W, 1.0f);
  const double flops = 2.0 * nk * W * d * repeats;
  for (int trial = 0; trial < 2; ++trial) {  // the first is a warm-up
    auto start = std::chrono::steady_clock::now();
    for (int64_t n = 0; n < repeats; ++n)
      scores_column<Vec>(qt.data(), W, k.data(), k_stride, nk, d, 0.1f, st.data());
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("scores_column %.1f GFLOP/s\n", flops / seconds / 1e9);
    start = std::chrono::steady_clock::now();
    for (int64_t n = 0; n < repeats; ++n)
      output_column<Vec>(st.data(), v.data(), v_tile_stride(d), nk, d, pre.data(), post.data(), o.data(), W);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("output_column %.1f GFLOP/s\n", flops / seconds / 1e9);
  }
}
