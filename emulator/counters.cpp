#include "emulator/counters.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "emulator/launch.hpp"

namespace flashlab::emulator {

namespace {

std::atomic<bool> counting_on{false};
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

// The lanes' accesses not yet grouped into instructions, per warp of the block this OS thread runs (one block
// at a time): per site, how many times each lane has been there since the warp last met, and per (site,
// occurrence) the accesses so far.
struct SiteVisit {
  uint64_t key;  // the site and the kind
  uint32_t occurrence;
  bool operator==(const SiteVisit&) const = default;
};
struct SiteVisitHash {
  size_t operator()(const SiteVisit& v) const { return v.key * 0x9E3779B97F4A7C15ull ^ v.occurrence; }
};
struct OpenInstruction {
  Access kind;
  std::vector<LaneAccess> lanes;
};
struct WarpAccesses {
  std::unordered_map<uint64_t, std::array<uint32_t, 32>> visits;
  std::unordered_map<SiteVisit, OpenInstruction, SiteVisitHash> open;
};
thread_local std::vector<WarpAccesses> open_warps;

void add_instruction(Access kind, const AccessCounts& counts) {
  mine()->access[static_cast<int>(kind)] += counts;
}

void close_instructions(WarpAccesses& warp) {
  for (auto& [visit, instruction] : warp.open)
    add_instruction(instruction.kind, counts_sectors(instruction.kind) ? sectors(instruction.lanes)
                                                                       : wavefronts(instruction.lanes));
  warp.open.clear();
  warp.visits.clear();
}

}  // namespace

const char* access_name(Access kind) {
  static constexpr const char* names[kAccessKinds] = {
      "ld.global", "st.global", "cp.async (global)", "atom/red.global", "ld.shared",
      "st.shared", "ldmatrix",  "cp.async (shared)", "TMA (shared)",    "wgmma operands"};
  return names[static_cast<int>(kind)];
}

AccessCounts& AccessCounts::operator+=(const AccessCounts& other) {
  instructions += other.instructions;
  units += other.units;
  ideal += other.ideal;
  return *this;
}

Counters& Counters::operator+=(const Counters& other) {
  launches += other.launches;
  blocks += other.blocks;
  global_read_bytes += other.global_read_bytes;
  global_write_bytes += other.global_write_bytes;
  global_atomic_bytes += other.global_atomic_bytes;
  for (int kind = 0; kind < kAccessKinds; ++kind) access[kind] += other.access[kind];
  barriers += other.barriers;
  mbarrier_waits += other.mbarrier_waits;
  mma_sync += other.mma_sync;
  wgmma += other.wgmma;
  tensor_flops += other.tensor_flops;
  return *this;
}

AccessCounts sectors(std::span<const LaneAccess> lanes) {
  constexpr uint64_t kSector = 32;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [begin, end) of each lane's bytes
  std::vector<uint64_t> touched;
  for (const LaneAccess& lane : lanes) {
    if (lane.bytes == 0) continue;
    ranges.emplace_back(lane.address, lane.address + lane.bytes);
    for (uint64_t s = lane.address / kSector; s <= (lane.address + lane.bytes - 1) / kSector; ++s)
      touched.push_back(s);
  }
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  std::sort(ranges.begin(), ranges.end());
  uint64_t distinct = 0, covered = 0;  // bytes, and the end of what is counted so far
  for (const auto& [begin, end] : ranges) {
    const uint64_t from = std::max(begin, covered);
    if (end > from) distinct += end - from;
    covered = std::max(covered, end);
  }
  return {1, touched.size(), (distinct + kSector - 1) / kSector};
}

AccessCounts wavefronts(std::span<const LaneAccess> lanes) {
  constexpr uint32_t kBanks = 32, kWord = 4, kWavefrontBytes = kBanks * kWord;
  uint32_t width = kWord;
  for (const LaneAccess& lane : lanes) width = std::max(width, lane.bytes);
  uint32_t rounded = kWord;
  while (rounded < width) rounded *= 2;
  const int lanes_per_phase = static_cast<int>(std::max(1u, kWavefrontBytes / rounded));
  std::vector<std::pair<int, uint64_t>> words;  // (phase, word) of every byte touched
  for (const LaneAccess& lane : lanes)
    for (uint64_t w = lane.address / kWord; lane.bytes > 0 && w <= (lane.address + lane.bytes - 1) / kWord;
         ++w)
      words.emplace_back(lane.lane / lanes_per_phase, w);
  std::sort(words.begin(), words.end());
  words.erase(std::unique(words.begin(), words.end()), words.end());
  AccessCounts counts{1, 0, 0};
  for (size_t first = 0; first < words.size();) {
    size_t last = first;
    std::array<uint32_t, kBanks> per_bank{};
    while (last < words.size() && words[last].first == words[first].first)
      ++per_bank[words[last++].second % kBanks];
    counts.units += *std::max_element(per_bank.begin(), per_bank.end());
    counts.ideal += 1;
    first = last;
  }
  return counts;
}

void start_counting() {
  std::lock_guard lock(registry_mutex);
  for (Counters* counters : registry()) *counters = {};
  counting_on.store(true, std::memory_order_release);
}

Counters stop_counting() {
  counting_on.store(false, std::memory_order_release);
  std::lock_guard lock(registry_mutex);
  Counters total;
  for (const Counters* counters : registry()) total += *counters;
  return total;
}

bool counting() {
  return counting_on.load(std::memory_order_relaxed);
}

bool counting_complete() {
  return memory_tracking();
}

namespace count {

void global(size_t bytes, bool write) {
  if (!counting()) return;
  (write ? mine()->global_write_bytes : mine()->global_read_bytes) += bytes;
}
void global_atomic(size_t bytes) {
  if (counting()) mine()->global_atomic_bytes += bytes;
}
void block_started() {
  open_warps.clear();
  if (counting()) ++mine()->blocks;
}
void block_ended() {
  for (WarpAccesses& warp : open_warps) close_instructions(warp);
  open_warps.clear();
}
void launch_started() {
  if (counting()) ++mine()->launches;
}
void mma_sync() {
  if (!counting()) return;
  ++mine()->mma_sync;
  mine()->tensor_flops += 2.0 * 16 * 8 * 16;
}
void wgmma(int n, int k) {
  if (!counting()) return;
  ++mine()->wgmma;
  mine()->tensor_flops += 2.0 * 64 * n * k;
}
void barrier(int warps) {
  if (counting()) mine()->barriers += static_cast<uint64_t>(warps);
}
void mbarrier_wait() {
  if (counting()) ++mine()->mbarrier_waits;
}

void lane_access(int warp, int lane, uint64_t site, Access kind, uint64_t address, uint32_t bytes) {
  if (!counting()) return;
  if (open_warps.size() <= static_cast<size_t>(warp)) open_warps.resize(static_cast<size_t>(warp) + 1);
  WarpAccesses& mine_open = open_warps[warp];
  const uint64_t key = site * kAccessKinds + static_cast<uint64_t>(kind);
  auto [visits, unseen] = mine_open.visits.try_emplace(key);
  if (unseen) visits->second.fill(0);
  const SiteVisit visit{key, visits->second[lane]++};
  OpenInstruction& instruction = mine_open.open[visit];
  instruction.kind = kind;
  instruction.lanes.push_back({lane, address, bytes});
}

void warp_met(int warp) {
  if (static_cast<size_t>(warp) < open_warps.size()) close_instructions(open_warps[warp]);
}

void instruction(Access kind, const AccessCounts& counts) {
  if (counting()) add_instruction(kind, counts);
}

}  // namespace count

}  // namespace flashlab::emulator
