// Running a grid: blocks over the OpenMP threads, each on its thread's BlockRunner; settings; kernel
// attributes.
#include "emulator/launch.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

#include "common/error.hpp"
#include "emulator/block.hpp"
#include "emulator/counters.hpp"
#include "emulator/report.hpp"

namespace flashlab::emulator {

namespace {

std::mutex settings_mutex;

ScheduleSetting default_schedule() {
  ScheduleSetting setting;
  const char* text = std::getenv("FLASHLAB_EMULATOR_SCHEDULE");
  if (text == nullptr || std::string_view(text) == "in-order" || *text == '\0') return setting;
  const std::string_view value(text);
  if (value.substr(0, 9) == "shuffled:") {
    setting.shuffled = true;
    setting.seed = std::strtoull(text + 9, nullptr, 10);
    return setting;
  }
  if (value == "shuffled") {
    setting.shuffled = true;
    return setting;
  }
  fail("FLASHLAB_EMULATOR_SCHEDULE (", value, ") must be \"in-order\", \"shuffled\" or \"shuffled:SEED\"");
}

ScheduleSetting& current_schedule() {
  static ScheduleSetting setting = default_schedule();
  return setting;
}

std::map<const void*, size_t>& kernel_shared_limits() {
  static std::map<const void*, size_t> limits;
  return limits;
}

// Each OS thread keeps its runner (stacks, shared memory, shadows) from block to block.
BlockRunner& runner() {
  thread_local std::unique_ptr<BlockRunner> instance = std::make_unique<BlockRunner>();
  return *instance;
}

void check_configuration(const Launch& launch) {
  const Index3 g = launch.grid, b = launch.block;
  // A launcher's bug, not the input's: an ExecutionError, as the GPU's refusal is (common/cuda/check.hpp).
  const auto reject = [&](const auto&... parts) {
    std::ostringstream message;
    message << "kernel launch of " << launch.kernel << " with grid " << format_index(g) << ", block "
            << format_index(b) << ", " << launch.dynamic_shared_bytes << " bytes of dynamic shared memory: ";
    (message << ... << parts);
    message << " (a GPU refuses it with cudaErrorInvalidValue or cudaErrorInvalidConfiguration)";
    throw ExecutionError(message.str());
  };
  if (g.x == 0 || g.y == 0 || g.z == 0) reject("a grid dimension is 0");
  if (g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535)
    reject("the grid is limited to (2^31 - 1, 65535, 65535)");
  if (b.x == 0 || b.y == 0 || b.z == 0) reject("a block dimension is 0");
  if (b.x > 1024 || b.y > 1024 || b.z > 64) reject("the block is limited to (1024, 1024, 64)");
  if (uint64_t(b.x) * b.y * b.z > DeviceLimits::max_threads_per_block)
    reject("more than 1024 threads per block");
  const size_t limit = max_dynamic_shared(launch.kernel_address);
  if (launch.dynamic_shared_bytes > limit)
    reject("the kernel may use at most ", limit,
           " bytes of dynamic shared memory (above 48 KiB a kernel must opt in with cudaFuncSetAttribute("
           "cudaFuncAttributeMaxDynamicSharedMemorySize), up to ",
           DeviceLimits::shared_per_block_optin, ")");
}

}  // namespace

std::string ScheduleSetting::describe() const {
  if (!shuffled) return "in-order";
  const std::string text = "shuffled:" + std::to_string(seed);
  return tma_landing_odds == ScheduleSetting{}.tma_landing_odds
             ? text
             : text + ", TMA landing 1/" + std::to_string(tma_landing_odds);
}

ScheduleSetting schedule() {
  std::lock_guard lock(settings_mutex);
  return current_schedule();
}

void set_schedule(const ScheduleSetting& setting) {
  if (setting.tma_landing_odds < 1)
    fail("emulator schedule: tma_landing_odds (", setting.tma_landing_odds, ") must be >= 1");
  std::lock_guard lock(settings_mutex);
  current_schedule() = setting;
}

void set_max_dynamic_shared(const void* kernel_address, size_t bytes) {
  std::lock_guard lock(settings_mutex);
  kernel_shared_limits()[kernel_address] = bytes;
}

size_t max_dynamic_shared(const void* kernel_address) {
  std::lock_guard lock(settings_mutex);
  const auto found = kernel_shared_limits().find(kernel_address);
  return found == kernel_shared_limits().end() ? DeviceLimits::shared_per_block : found->second;
}

void run(const Launch& launch) {
  check_configuration(launch);
  count::launch_started();
  const ScheduleSetting setting = schedule();
  const int64_t blocks = int64_t(launch.grid.x) * launch.grid.y * launch.grid.z;
  std::atomic<bool> failed{false};
  std::string first_error;
  std::mutex error_mutex;
  const auto record = [&](std::string error) {
    std::lock_guard lock(error_mutex);
    if (first_error.empty()) first_error = std::move(error);
    failed = true;
  };
  // Shuffled: the blocks also start in a seeded random order, as a GPU's block scheduler may start them in
  // any order (what atomics from several blocks add up to, in floating point, depends on it).
  std::vector<int64_t> order;
  if (setting.shuffled) {
    order.resize(static_cast<size_t>(blocks));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::shuffle(order.begin(), order.end(), std::mt19937_64(setting.seed * 0x2545F4914F6CDD1Dull + 1));
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t started = 0; started < blocks; ++started) {
    if (failed) continue;
    const int64_t linear = order.empty() ? started : order[static_cast<size_t>(started)];
    const Index3 index{static_cast<unsigned>(linear % launch.grid.x),
                       static_cast<unsigned>(linear / launch.grid.x % launch.grid.y),
                       static_cast<unsigned>(linear / (int64_t(launch.grid.x) * launch.grid.y))};
    try {
      count::block_started();
      std::string error =
          runner().run(launch, index, {setting.shuffled, setting.seed, setting.tma_landing_odds});
      if (!error.empty()) record("emulator: " + std::move(error));
    } catch (const std::exception& e) {
      record(std::string("emulator: ") + e.what());
    }
  }
  if (failed) throw ExecutionError(first_error);
}

}  // namespace flashlab::emulator
