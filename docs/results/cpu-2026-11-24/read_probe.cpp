// The read bandwidth of this machine's memory, for docs/results/cpu-2026-11-24/README.md: both cores sum 1
// GiB of floats with AVX-512 loads (four accumulators, no stores), best of 5; beside it the 2 x bytes / time
// of a 256 MiB memcpy, as `flashlab machine` counts its copy. Not part of the build:
//
//   g++ -O3 -march=native -fopenmp docs/results/cpu-2026-11-24/read_probe.cpp -o /tmp/read_probe &&
//   /tmp/read_probe
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

static double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main() {
  const size_t n = size_t{1} << 28;  // 1 GiB of floats
  float* a = static_cast<float*>(std::aligned_alloc(64, n * 4));
  float* b = static_cast<float*>(std::aligned_alloc(64, n));
  std::memset(a, 1, n * 4);
  std::memset(b, 1, n);
  double read = 0, copy = 0;
  for (int trial = 0; trial < 5; ++trial) {
    double start = seconds();
    float total = 0;
#pragma omp parallel reduction(+ : total)
    {
      const size_t begin = n / omp_get_num_threads() * omp_get_thread_num();
      const size_t end = begin + n / omp_get_num_threads();
      __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
      for (size_t i = begin; i < end; i += 64) {
        s0 = _mm512_add_ps(s0, _mm512_load_ps(a + i));
        s1 = _mm512_add_ps(s1, _mm512_load_ps(a + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_load_ps(a + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_load_ps(a + i + 48));
      }
      total += _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
    }
    read = std::max(read, n * 4.0 / (seconds() - start) / 1e9);
    if (total == 1.0f) std::puts("");            // keeps the sum
    const size_t bytes = n, piece = bytes / 64;  // 256 MiB copied from a into b, in 64 pieces
    start = seconds();
#pragma omp parallel for schedule(static)
    for (int p = 0; p < 64; ++p)
      std::memcpy(reinterpret_cast<char*>(b) + p * piece, a + p * piece / 4, piece);
    copy = std::max(copy, 2.0 * bytes / (seconds() - start) / 1e9);
  }
  std::printf("read %.1f GB/s, copy (read + written) %.1f GB/s\n", read, copy);
  std::free(a);
  std::free(b);
}
