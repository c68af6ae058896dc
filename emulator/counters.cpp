#include "emulator/counters.hpp"

#include <atomic>
#include <mutex>
#include <vector>

#include "emulator/launch.hpp"

namespace flashlab::emulator {

namespace {

std::atomic<bool> counting{false};
std::mutex registry_mutex;
std::vector<Counters*>& registry() {
  static std::vector<Counters*> all;
  return all;
}

// This OS thread's counts (blocks run on the OpenMP threads, host code on the caller's): registered once,
// summed by stop_counting(). An OS thread's counts outlive it only as long as its thread_local; the OpenMP
// threads outlive every launch.
Counters* mine() {
  thread_local Counters* counters = [] {
    auto* created = new Counters();  // leaked on purpose: the registry may read it after the thread ends
    std::lock_guard lock(registry_mutex);
    registry().push_back(created);
    return created;
  }();
  return counters;
}

}  // namespace

Counters& Counters::operator+=(const Counters& other) {
  launches += other.launches;
  blocks += other.blocks;
  global_read_bytes += other.global_read_bytes;
  global_write_bytes += other.global_write_bytes;
  mma_sync += other.mma_sync;
  wgmma += other.wgmma;
  tensor_flops += other.tensor_flops;
  return *this;
}

void start_counting() {
  std::lock_guard lock(registry_mutex);
  for (Counters* counters : registry()) *counters = {};
  counting.store(true, std::memory_order_release);
}

Counters stop_counting() {
  counting.store(false, std::memory_order_release);
  std::lock_guard lock(registry_mutex);
  Counters total;
  for (const Counters* counters : registry()) total += *counters;
  return total;
}

bool counting_complete() {
  return memory_tracking();
}

namespace count {

void global(size_t bytes, bool write) {
  if (!counting.load(std::memory_order_relaxed)) return;
  (write ? mine()->global_write_bytes : mine()->global_read_bytes) += bytes;
}
void block_started() {
  if (counting.load(std::memory_order_relaxed)) ++mine()->blocks;
}
void launch_started() {
  if (counting.load(std::memory_order_relaxed)) ++mine()->launches;
}
void mma_sync() {
  if (!counting.load(std::memory_order_relaxed)) return;
  ++mine()->mma_sync;
  mine()->tensor_flops += 2.0 * 16 * 8 * 16;
}
void wgmma(int n, int k) {
  if (!counting.load(std::memory_order_relaxed)) return;
  ++mine()->wgmma;
  mine()->tensor_flops += 2.0 * 64 * n * k;
}

}  // namespace count

}  // namespace flashlab::emulator
