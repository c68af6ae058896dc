// The scheduler of one block's threads, its barriers and warp collectives, and the errors that end a block.
#include "emulator/block.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <new>

#include "emulator/counters.hpp"
#include "emulator/report.hpp"

namespace flashlab::emulator {

namespace {

thread_local ThreadState* running = nullptr;

// Fiber stacks: kernels keep their fragments in arrays on the stack, and the emulated collectives build whole
// matrices there. AddressSanitizer's red zones need more.
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kStackBytes = 512 * 1024;
#else
constexpr size_t kStackBytes = 128 * 1024;
#endif

size_t page_bytes() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

ThreadState* current_thread() {
  return running;
}

BlockRunner::BlockRunner() = default;

BlockRunner::~BlockRunner() {
  if (stacks_ != nullptr) munmap(stacks_, stack_capacity_ * (kStackBytes + page_bytes()));
}

std::string BlockRunner::describe(int tid) const {
  const ThreadState& t = threads_[tid];
  return "kernel " + launch_->kernel + ", block " + format_index(block_index_) + ", warp " +
         std::to_string(t.warp()) + ", lane " + std::to_string(t.lane());
}

std::string BlockRunner::run(const Launch& launch, Index3 block_index, const Schedule& schedule) {
  launch_ = &launch;
  block_index_ = block_index;
  schedule_ = schedule;
  tracking_ = memory_tracking();
  const uint64_t linear =
      block_index.x + uint64_t(launch.grid.x) * (block_index.y + uint64_t(launch.grid.y) * block_index.z);
  random_.seed(schedule.seed * 0x9E3779B97F4A7C15ull + linear);
  error_.clear();
  prepare_shared(launch.dynamic_shared_bytes);
  start_threads(launch);
  this->schedule();
  count::block_ended();
  if (error_.empty()) error_ = sm90_block_end();
  finish_async_copies();
  release_sm90_shadow();
  launch_ = nullptr;
  return error_;
}

void BlockRunner::start_threads(const Launch& launch) {
  const Index3 dim = launch.block;
  thread_count_ = static_cast<int>(dim.x * dim.y * dim.z);
  exited_ = 0;
  const size_t slot = kStackBytes + page_bytes();
  if (stack_capacity_ < static_cast<size_t>(thread_count_)) {
    if (stacks_ != nullptr) munmap(stacks_, stack_capacity_ * slot);
    stack_capacity_ = static_cast<size_t>(thread_count_);
    void* mapping = mmap(nullptr, stack_capacity_ * slot, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapping == MAP_FAILED) throw std::bad_alloc();
    stacks_ = static_cast<char*>(mapping);
    // A guard page below each stack (stacks grow down): an overflow faults instead of corrupting a neighbour.
    for (size_t t = 0; t < stack_capacity_; ++t) mprotect(stacks_ + t * slot, page_bytes(), PROT_NONE);
    stacks_low_ = reinterpret_cast<uintptr_t>(stacks_);
    stacks_bytes_ = stack_capacity_ * slot;
  }
  threads_.resize(static_cast<size_t>(thread_count_));
  for (int tid = 0; tid < thread_count_; ++tid) {
    ThreadState& t = threads_[tid];
    t.block = this;
    t.tid = tid;
    t.index = {tid % dim.x, (tid / dim.x) % dim.y, tid / (dim.x * dim.y)};
    t.status = ThreadState::Status::runnable;
    t.wait_operation = nullptr;
    t.last_sync = Where();
    t.last_sync_operation = nullptr;
    t.barrier_result = 0;
    t.in_emulator = false;
    t.uncommitted.clear();
    t.committed.clear();
    t.bulk_uncommitted.clear();
    t.bulk_committed.clear();
    t.wait_barrier = t.wait_parity = 0;
    t.proxy_fence_step = 0;
    t.fiber.prepare(stacks_ + tid * slot + page_bytes(), kStackBytes, &BlockRunner::thread_main, &t);
  }
  clocks_.assign(static_cast<size_t>(thread_count_) * thread_count_, 0);
  for (int tid = 0; tid < thread_count_; ++tid) clock(tid)[tid] = 1;
  clock_floor_ = 0;
  clock_ceiling_ = 1;
  collectives_.assign(static_cast<size_t>((thread_count_ + 31) / 32), {});
  exited_lanes_.assign(collectives_.size(), 0u);
  for (Barrier& barrier : barriers_) barrier = Barrier();
  ready_.clear();
  for (int tid = 0; tid < thread_count_; ++tid) ready_.push_back(tid);
  ready_head_ = 0;
  reset_sm90();
}

void BlockRunner::thread_main(void* state) {
  auto& self = *static_cast<ThreadState*>(state);
  const Launch& launch = self.block->launch();
  launch.body(launch.parameters);
  self.in_emulator = true;  // the kernel returned: what follows is the emulator's
  self.block->exit_thread(self);
}

void BlockRunner::schedule() {
  while (exited_ < thread_count_ && error_.empty()) {
    if (ready_head_ == ready_.size() && !bulk_loads_.empty()) {
      land_bulk_loads(true);  // whatever TMA loads are in flight complete before anything else can happen
      if (!scheduler_error_.empty()) error_ = scheduler_error_;
      continue;
    }
    if (ready_head_ == ready_.size()) {
      error_ =
          "kernel " + launch_->kernel + ", block " + format_index(block_index_) + ": " + deadlock_report();
      break;
    }
    int tid;
    if (schedule_.shuffled) {
      std::uniform_int_distribution<size_t> pick(ready_head_, ready_.size() - 1);
      std::swap(ready_[ready_head_], ready_[pick(random_)]);
    }
    tid = ready_[ready_head_++];
    if (ready_head_ > 4096 && ready_head_ * 2 > ready_.size()) {  // keep the queue from growing forever
      ready_.erase(ready_.begin(), ready_.begin() + static_cast<std::ptrdiff_t>(ready_head_));
      ready_head_ = 0;
    }
    ThreadState& t = threads_[tid];
    running = &t;
    t.fiber.resume();
    running = nullptr;
    land_bulk_loads(false);
    if (!scheduler_error_.empty() && error_.empty()) error_ = scheduler_error_;
  }
}

void BlockRunner::wait(ThreadState& self, const char* operation, Where where) {
  self.status = ThreadState::Status::waiting;
  self.wait_operation = operation;
  self.wait_where = where;
  self.fiber.suspend();
}

void BlockRunner::wake(int tid) {
  threads_[tid].status = ThreadState::Status::runnable;
  threads_[tid].wait_operation = nullptr;
  ready_.push_back(tid);
}

void BlockRunner::yield(ThreadState& self) {
  ready_.push_back(self.tid);
  self.fiber.suspend();
}

bool BlockRunner::should_preempt() {
  return schedule_.shuffled && !completing_ && (random_() & 31) == 0;
}

void BlockRunner::fail_with(const ThreadState& about, std::string message) {
  if (error_.empty()) error_ = describe(about.tid) + ": " + message;
  // The block ends here: the scheduler stops at the error and never resumes this fiber (or any other), so
  // nothing on its stack may own memory (report.hpp), the message included.
  std::string().swap(message);
  ThreadState* self = running;
  self->status = ThreadState::Status::waiting;
  self->fiber.suspend();
  __builtin_unreachable();
}

void BlockRunner::exit_thread(ThreadState& self) {
  check_sm90_exit(self);
  // Copies still in flight land in shared memory all the same; nobody can wait for them any more.
  for (const AsyncCopy& copy : self.uncommitted) complete_async_write(self, copy);
  for (const auto& group : self.committed)
    for (const AsyncCopy& copy : group) complete_async_write(self, copy);
  self.uncommitted.clear();
  self.committed.clear();
  self.status = ThreadState::Status::exited;
  ++exited_;
  const unsigned lane_bit = 1u << self.lane();
  exited_lanes_[self.warp()] |= lane_bit;
  for (const Collective& c : collectives_[self.warp()])
    if ((c.mask & lane_bit) != 0 && (c.arrived & lane_bit) == 0)
      fail(self, "exits while lanes ", Lanes{c.arrived}, " wait for it at ", c.operation, " (", c.where, ")");
  const Barrier& block_barrier = barriers_[0];
  if (block_barrier.arrived > 0 && block_barrier.expected == static_cast<unsigned>(thread_count_))
    fail(self, "exits without reaching ", block_barrier.operation, " (", block_barrier.where, "), where ",
         block_barrier.arrived, " of the block's ", thread_count_, " threads wait");
}

// ---- Barriers ----

int BlockRunner::barrier(ThreadState& self, unsigned id, unsigned threads, bool wait_for_it, bool predicate,
                         const char* operation, Where where) {
  if (id >= 16) fail(self, operation, " (", where, "): barrier ", id, " does not exist (0-15)");
  const bool whole_block = threads == static_cast<unsigned>(thread_count_);
  if (threads == 0 || threads > static_cast<unsigned>(thread_count_) || (!whole_block && threads % 32 != 0))
    fail(self, operation, " ", id, ", ", threads, " (", where,
         "): the thread count must be a multiple of 32 and at most the block's ", thread_count_);
  if (whole_block && exited_ > 0)
    fail(self, operation, " (", where, ") waits for all ", thread_count_, " threads, but ", exited_,
         " have exited without reaching it");
  Barrier& b = barriers_[id];
  if (b.expected == 0) {
    b.expected = threads;
    b.operation = operation;
    b.where = where;
    if (b.arrived_flags.size() != static_cast<size_t>(thread_count_))
      b.arrived_flags.assign(static_cast<size_t>(thread_count_), 0);
  } else if (b.expected != threads) {
    fail(self, operation, " ", id, " (", where, ") counts ", threads, " threads, but the ", b.arrived,
         " already there (", b.operation, ", ", b.where, ") count ", b.expected);
  }
  if (b.arrived_flags[self.tid] != 0)
    fail(self, operation, " ", id, " (", where, "): arrives a second time before the barrier completed");
  b.arrived_flags[self.tid] = 1;
  b.arrivals.push_back(self.tid);
  ++b.arrived;
  if (predicate) ++b.predicate_count;
  if (!wait_for_it) {
    // It goes on at once: what it did so far is released now. (A waiting thread's clock does not change
    // until the barrier completes, so it is joined then.)
    b.arrive_only = true;
    if (b.released.size() != static_cast<size_t>(thread_count_))
      b.released.assign(static_cast<size_t>(thread_count_), 0);
    join_into(b.released, self.tid);
  }
  tick(self.tid);
  self.last_sync = where;
  self.last_sync_operation = operation;
  if (b.arrived == b.expected) {
    const int count = b.predicate_count;
    if (wait_for_it) b.waiters.push_back(self.tid);  // completes it: acquires with the others
    complete_barrier(b);
    return count;
  }
  if (!wait_for_it) return 0;
  b.waiters.push_back(self.tid);
  wait(self, operation, where);
  return self.barrier_result;
}

void BlockRunner::complete_barrier(Barrier& b) {
  const ThreadState* completer = running;
  if (counting()) {
    // One barrier instruction per warp that reached it; a warp all of whose lanes wait here has met.
    std::vector<int> lanes(collectives_.size(), 0), waiting(collectives_.size(), 0);
    for (int tid : b.arrivals) ++lanes[static_cast<size_t>(tid / 32)];
    for (int tid : b.waiters) ++waiting[static_cast<size_t>(tid / 32)];
    int warps = 0;
    for (size_t w = 0; w < lanes.size(); ++w) {
      warps += lanes[w] > 0;
      const int present =
          std::min(32, thread_count_ - static_cast<int>(w) * 32) - std::popcount(exited_lanes_[w]);
      if (waiting[w] == present) count::warp_met(static_cast<int>(w));
    }
    count::barrier(warps);
  }
  if (b.expected == static_cast<unsigned>(thread_count_) && !b.arrive_only) {
    // Every thread of the block met and waited: whatever any of them did before is ordered before whatever
    // any does next. Raising the clock floor past every step so far says that without joining every clock.
    clock_floor_ = clock_ceiling_;
    for (int tid = 0; tid < thread_count_; ++tid) tick(tid);
    full_barrier();
  } else {
    if (b.released.size() != static_cast<size_t>(thread_count_))
      b.released.assign(static_cast<size_t>(thread_count_), 0);
    for (int tid : b.waiters) join_into(b.released, tid);
    for (int tid : b.waiters) acquire(tid, b.released);
  }
  for (int tid : b.waiters) {
    threads_[tid].barrier_result = b.predicate_count;
    if (&threads_[tid] != completer) wake(tid);
  }
  for (int tid : b.arrivals) b.arrived_flags[tid] = 0;
  std::fill(b.released.begin(), b.released.end(), 0u);
  b.expected = b.arrived = 0;
  b.predicate_count = 0;
  b.waiters.clear();
  b.arrivals.clear();
  b.arrive_only = false;
}

void BlockRunner::join_into(std::vector<uint32_t>& target, int tid) {
  const uint32_t* source = clock(tid);
  for (int u = 0; u < thread_count_; ++u) target[u] = std::max(target[u], source[u]);
}

void BlockRunner::order_lanes(int warp, unsigned mask) {
  scratch_clock_.assign(static_cast<size_t>(thread_count_), 0);
  for (int lane = 0; lane < 32; ++lane)
    if ((mask >> lane & 1u) != 0) join_into(scratch_clock_, warp * 32 + lane);
  for (int lane = 0; lane < 32; ++lane)
    if ((mask >> lane & 1u) != 0) {
      acquire(warp * 32 + lane, scratch_clock_);
      tick(warp * 32 + lane);
    }
}

void BlockRunner::acquire(int tid, const std::vector<uint32_t>& source) {
  uint32_t* target = clock(tid);
  for (int u = 0; u < thread_count_; ++u) target[u] = std::max(target[u], source[u]);
}

// ---- Warp collectives ----

void BlockRunner::collective(ThreadState& self, const char* operation, unsigned mask, void* lane_data,
                             void (*complete)(BlockRunner&, Collective&, int), Where where) {
  const int warp = self.warp(), lane = self.lane();
  const int first = warp * 32;
  const int lanes_here = std::min(32, thread_count_ - first);
  const unsigned existing = lanes_here == 32 ? ~0u : (1u << lanes_here) - 1;
  if ((mask >> lane & 1u) == 0)
    fail(self, operation, " (", where, "): its mask ", Mask{mask}, " does not name the calling lane");
  if ((mask & ~existing) != 0)
    fail(self, operation, " (", where, "): its mask ", Mask{mask}, " names lanes past the end of the block");
  if (const unsigned gone = mask & exited_lanes_[warp]; gone != 0)
    fail(self, operation, " (", where, "): lane ", std::countr_zero(gone), ", which its mask ", Mask{mask},
         " names, has exited");
  std::vector<Collective>& pending = collectives_[warp];
  size_t index = pending.size();
  for (size_t i = 0; i < pending.size(); ++i) {
    if (pending[i].mask == mask) {
      index = i;
    } else if ((pending[i].mask & mask) != 0) {
      fail(self, operation, " with mask ", Mask{mask}, " (", where, ") while lanes ",
           Lanes{pending[i].arrived}, " wait at ", pending[i].operation, " with mask ", Mask{pending[i].mask},
           " (", pending[i].where,
           "): the lanes of a warp must meet at the same operation with the same mask");
    }
  }
  if (index == pending.size()) {
    pending.emplace_back();
    pending.back().operation = operation;
    pending.back().where = where;
    pending.back().mask = mask;
    pending.back().complete = complete;
  } else if (pending[index].operation != operation) {
    fail(self, "lanes ", Lanes{pending[index].arrived}, " wait at ", pending[index].operation, " (",
         pending[index].where, ") but this lane calls ", operation, " (", where,
         "): .aligned operations need every lane at the same one");
  }
  Collective& c = pending[index];
  c.lane_data[lane] = lane_data;
  c.arrived |= 1u << lane;
  if (c.arrived != mask) {
    wait(self, operation, where);
    return;
  }
  // The last lane carries the operation out for all of them.
  Collective done = c;
  pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(index));
  completing_ = true;
  done.complete(*this, done, warp);
  completing_ = false;
  const unsigned lanes_here_mask = existing & ~exited_lanes_[warp];
  if ((mask & lanes_here_mask) == lanes_here_mask) count::warp_met(warp);
  for (unsigned lanes = mask; lanes != 0; lanes &= lanes - 1) {
    const int l = std::countr_zero(lanes);
    ThreadState& t = threads_[first + l];
    t.last_sync = where;
    t.last_sync_operation = operation;
    if (l != lane) wake(first + l);
  }
  if (should_preempt()) yield(self);
}

// ---- Deadlocks ----

std::string BlockRunner::deadlock_report() const {
  // Group the waiting threads by what they wait for.
  struct Group {
    const char* operation;
    Where where;
    uint32_t barrier, parity;  // an mbarrier wait's object and parity (else 0)
    std::vector<int> threads;
  };
  std::vector<Group> groups;
  for (const ThreadState& t : threads_) {
    if (t.status != ThreadState::Status::waiting) continue;
    const bool on_mbarrier = std::string_view(t.wait_operation) == "mbarrier.try_wait.parity";
    const uint32_t barrier = on_mbarrier ? t.wait_barrier : 0, parity = on_mbarrier ? t.wait_parity : 0;
    auto same = [&](const Group& g) {
      return g.operation == t.wait_operation && g.where.line() == t.wait_where.line() &&
             std::string_view(g.where.file_name()) == t.wait_where.file_name() && g.barrier == barrier &&
             g.parity == parity;
    };
    auto found = std::find_if(groups.begin(), groups.end(), same);
    if (found == groups.end()) {
      groups.push_back({t.wait_operation, t.wait_where, barrier, parity, {}});
      found = groups.end() - 1;
    }
    found->threads.push_back(t.tid);
  }
  std::string report = "deadlock: no thread can go on.";
  for (const Group& g : groups) {
    report +=
        " " + format_threads(g.threads) + " wait at " + g.operation + " (" + format_where(g.where) + ")";
    if (std::string_view(g.operation) == "mbarrier.try_wait.parity")
      report += compose(" for the phase of parity ", g.parity, " of the mbarrier at shared address ",
                        Hex{g.barrier});
    report += ";";
  }
  report += sm90_deadlock_details();
  for (unsigned id = 0; id < 16; ++id)
    if (barriers_[id].arrived > 0)
      report += " barrier " + std::to_string(id) + ": " + std::to_string(barriers_[id].arrived) + " of " +
                std::to_string(barriers_[id].expected) + " threads arrived;";
  if (exited_ > 0) report += " " + std::to_string(exited_) + " threads have exited;";
  report.pop_back();
  return report;
}

}  // namespace flashlab::emulator
