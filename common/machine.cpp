#include "common/machine.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace flashlab {

namespace {

#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
#elif defined(__AVX2__)
constexpr int kVectorBytes = 32;
#else
constexpr int kVectorBytes = 16;
#endif
typedef float Vector __attribute__((vector_size(kVectorBytes)));
constexpr int kLanes = kVectorBytes / 4;
constexpr int kChains = 12;  // independent FMA chains: more than latency x pipes (4 cycles x 2)

// Runs `iterations` x kChains vector FMAs, all operands in registers. Returns a value so the work is not
// removed. The FMAs are written in assembly on x86: compilers otherwise keep some chains in memory (measured
// here: 55 instead of 170 GFLOP/s on one AVX-512 core).
__attribute__((noinline)) float fma_loop(int64_t iterations, float seed) {
  Vector a0 = Vector{} + seed, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3, a4 = a0 + 4, a5 = a0 + 5, a6 = a0 + 6,
         a7 = a0 + 7, a8 = a0 + 8, a9 = a0 + 9, a10 = a0 + 10, a11 = a0 + 11;
  const Vector m = Vector{} + 0.999999f, b = Vector{} + 1e-7f;
  for (int64_t n = 0; n < iterations; ++n) {
#if defined(__AVX2__) || defined(__AVX512F__)
    asm volatile(
        "vfmadd213ps %[b], %[m], %[x0]\n\tvfmadd213ps %[b], %[m], %[x1]\n\tvfmadd213ps %[b], %[m], %[x2]\n\t"
        "vfmadd213ps %[b], %[m], %[x3]\n\tvfmadd213ps %[b], %[m], %[x4]\n\tvfmadd213ps %[b], %[m], %[x5]\n\t"
        "vfmadd213ps %[b], %[m], %[x6]\n\tvfmadd213ps %[b], %[m], %[x7]\n\tvfmadd213ps %[b], %[m], %[x8]\n\t"
        "vfmadd213ps %[b], %[m], %[x9]\n\tvfmadd213ps %[b], %[m], %[x10]\n\tvfmadd213ps %[b], %[m], %[x11]"
        : [x0] "+v"(a0), [x1] "+v"(a1), [x2] "+v"(a2), [x3] "+v"(a3), [x4] "+v"(a4), [x5] "+v"(a5),
          [x6] "+v"(a6), [x7] "+v"(a7), [x8] "+v"(a8), [x9] "+v"(a9), [x10] "+v"(a10), [x11] "+v"(a11)
        : [m] "v"(m), [b] "v"(b));
#else
    a0 = a0 * m + b, a1 = a1 * m + b, a2 = a2 * m + b, a3 = a3 * m + b, a4 = a4 * m + b, a5 = a5 * m + b;
    a6 = a6 * m + b, a7 = a7 * m + b, a8 = a8 * m + b, a9 = a9 * m + b, a10 = a10 * m + b, a11 = a11 * m + b;
#endif
  }
  const Vector sum = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
  float total = 0;
  for (int l = 0; l < kLanes; ++l) total += sum[l];
  return total;
}

double measure_fma(int threads) {
  const int64_t iterations = 20'000'000;
  double best = 0;
  for (int trial = 0; trial < 7; ++trial) {  // the best of several: other work on a shared machine only slows
    const auto start = std::chrono::steady_clock::now();
    float sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += fma_loop(iterations / 4, 1.0f + static_cast<float>(omp_get_thread_num()));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (sink == 12345.0f) std::fprintf(stderr, " ");
    const double flops = 2.0 * kLanes * kChains * static_cast<double>(iterations / 4) * threads;
    best = std::max(best, flops / seconds / 1e9);
  }
  return best;
}

double measure_copy_gbps(int threads) {
  const size_t count = size_t{64} << 20;  // 256 MiB per buffer: far beyond any cache
  std::vector<float> source(count, 1.0f), target(count, 0.0f);
  double best = 0;
  for (int trial = 0; trial < 3; ++trial) {
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t chunk = 0; chunk < 64; ++chunk) {
      const size_t begin = count / 64 * chunk;
      std::memcpy(target.data() + begin, source.data() + begin, count / 64 * sizeof(float));
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * count * sizeof(float) / seconds / 1e9);
  }
  return best;
}

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

// Reads one line of a sysfs file; "" when it is not there.
std::string read_line(const std::string& path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  return line;
}

// "48K", "2048K", "300M" -> bytes.
int64_t parse_size(const std::string& text) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    return 0;
  }
  const char unit = used < text.size() ? text[used] : ' ';
  return unit == 'K' ? value << 10 : unit == 'M' ? value << 20 : unit == 'G' ? value << 30 : value;
}

// "0-1,4,6-7" -> 5 CPUs.
int count_cpus(const std::string& list) {
  int count = 0;
  size_t start = 0;
  while (start < list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string range = list.substr(start, comma - start);
    const size_t dash = range.find('-');
    try {
      count += dash == std::string::npos ? 1 : std::stoi(range.substr(dash + 1)) - std::stoi(range) + 1;
    } catch (const std::exception&) {
      return std::max(count, 1);
    }
    start = comma + 1;
  }
  return std::max(count, 1);
}

}  // namespace

std::vector<CacheLevel> cache_levels() {
  std::vector<CacheLevel> caches;
  for (int index = 0;; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    const std::string level = read_line(dir + "level");
    if (level.empty()) break;
    CacheLevel cache;
    cache.type = read_line(dir + "type");
    if (cache.type == "Instruction") continue;
    cache.level = std::atoi(level.c_str());
    cache.bytes = parse_size(read_line(dir + "size"));
    cache.shared_by_threads = count_cpus(read_line(dir + "shared_cpu_list"));
    caches.push_back(cache);
  }
  return caches;
}

const MachineCeilings& machine_ceilings() {
  static const MachineCeilings ceilings = [] {
    MachineCeilings m;
    m.cpu = cpu_model();
    m.threads = omp_get_max_threads();
    m.vector_bits = kVectorBytes * 8;
    m.fma_gflops_1core = measure_fma(1);
    m.fma_gflops_all = measure_fma(m.threads);
    m.copy_gbps = measure_copy_gbps(m.threads);
    m.caches = cache_levels();
    return m;
  }();
  return ceilings;
}

}  // namespace flashlab
