// The emulator's model of one thread block (internal to emulator/): its threads as fibers, the scheduler that
// switches between them at synchronization points, its barriers and warp collectives, its shared memory with
// what is known of every byte, and the vector clocks that decide whether two accesses are ordered.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "emulator/device.hpp"
#include "emulator/fiber.hpp"
#include "emulator/launch.hpp"
#include "emulator/report.hpp"

namespace flashlab::emulator {

class BlockRunner;

// An asynchronous copy in flight (cp.async): issued by one thread, completed by its wait_group.
struct AsyncCopy {
  uint32_t destination = 0;  // shared address
  int bytes = 0;
  uint8_t data[16];  // the source bytes, read at issue, zero-filled past the source size
  Where issued_at;
};

struct ThreadState {
  BlockRunner* block = nullptr;
  int tid = 0;  // linear index in the block: x + y * blockDim.x + z * blockDim.x * blockDim.y
  Index3 index;
  Fiber fiber;
  enum class Status : uint8_t { runnable, waiting, exited } status = Status::runnable;
  // While waiting: the operation and where it was called, for deadlock reports.
  const char* wait_operation = nullptr;
  Where wait_where;
  // The last synchronization this thread passed: where its current run of instructions began (none yet: a
  // null operation).
  Where last_sync;
  const char* last_sync_operation = nullptr;
  SyncPoint sync_point() const { return {last_sync_operation, last_sync}; }
  int barrier_result = 0;  // what a completed bar.red gave this thread (__syncthreads_count)
  // Inside an emulated operation (sm80.cpp's Entered): the instrumentation hooks ignore its accesses.
  bool in_emulator = false;
  // cp.async: copies issued since the last commit, then the committed groups, oldest first.
  std::vector<AsyncCopy> uncommitted;
  std::vector<std::vector<AsyncCopy>> committed;

  int warp() const { return tid / 32; }
  int lane() const { return tid % 32; }
};

// A warp-level rendezvous in progress: the lanes of `mask` meet at one operation.
struct Collective {
  const char* operation = nullptr;  // e.g. "__shfl_xor_sync"; lanes must agree on it (.aligned)
  Where where;                      // where the first lane called it
  unsigned mask = 0;
  unsigned arrived = 0;
  void* lane_data[32] = {};  // per lane, the operation's operands on that lane's stack
  // Carries the operation out once every lane of `mask` has arrived (run by the last one to arrive).
  void (*complete)(BlockRunner& block, Collective& collective, int warp) = nullptr;
};

// One of the 16 named barriers (bar.sync / bar.arrive; barrier 0 is __syncthreads).
struct Barrier {
  unsigned expected = 0;  // threads of the current phase; 0 while idle
  unsigned arrived = 0;
  int predicate_count = 0;             // bar.red.popc: threads that arrived with a true predicate
  std::vector<int> waiters;            // threads blocked in bar.sync (and the one completing it)
  std::vector<int> arrivals;           // every thread that arrived in this phase (sync or arrive)
  std::vector<uint8_t> arrived_flags;  // per thread: arrived in this phase
  std::vector<uint32_t> released;      // the join of the clocks released to the waiters
  bool arrive_only = false;  // some thread arrived without waiting (bar.arrive): it acquires nothing
  const char* operation = nullptr;
  Where where;
};

// Settings of a run (emulator/launch.hpp): the schedule.
struct Schedule {
  bool shuffled = false;  // seeded random order of threads, and yields between shared-memory accesses
  uint64_t seed = 0;
};

class BlockRunner {
 public:
  BlockRunner();
  ~BlockRunner();
  BlockRunner(const BlockRunner&) = delete;
  BlockRunner& operator=(const BlockRunner&) = delete;

  // Runs one block of `launch` to its end. Returns "" or the error that ended it.
  std::string run(const Launch& launch, Index3 block_index, const Schedule& schedule);

  // ---- For the operations (called on the calling thread's fiber) ----
  ThreadState& thread(int tid) { return threads_[tid]; }
  int threads() const { return thread_count_; }
  Index3 block_index() const { return block_index_; }
  const Launch& launch() const { return *launch_; }

  // Suspends `self` until another thread wakes it; `operation` and `where` describe the wait.
  void wait(ThreadState& self, const char* operation, Where where);
  void wake(int tid);
  // Gives the other threads a turn (the shuffled schedule's preemption).
  void yield(ThreadState& self);
  bool shuffled() const { return schedule_.shuffled; }
  // True with probability 1/32 under the shuffled schedule: where to preempt between memory accesses.
  bool should_preempt();

  // Ends the block with an error about thread `about` (the message starts with its kernel, block, warp and
  // lane), composed from `parts` (emulator/report.hpp). Never returns: the calling fiber is abandoned.
  template <typename... Parts>
  [[noreturn]] void fail(const ThreadState& about, const Parts&... parts) {
    fail_with(about, compose(parts...));
  }
  [[noreturn]] void fail_with(const ThreadState& about, std::string message);
  // The prefix of every message about `tid`: "kernel K, block (x, y, z), warp w, lane l".
  std::string describe(int tid) const;

  // Warp collectives and barriers (block.cpp).
  void collective(ThreadState& self, const char* operation, unsigned mask, void* lane_data,
                  void (*complete)(BlockRunner&, Collective&, int), Where where);
  int barrier(ThreadState& self, unsigned id, unsigned threads, bool wait, bool predicate,
              const char* operation, Where where);

  // Vector clocks (happens-before): clock(t)[u] is the latest step of thread u that thread t is ordered
  // after. Entries below clock_floor_ stand for clock_floor_: a barrier of the whole block orders every step
  // so far before every later one, and raises the floor instead of joining every clock (shared_memory.cpp).
  uint32_t* clock(int tid) { return &clocks_[static_cast<size_t>(tid) * thread_count_]; }
  // After a release (an arrival at a barrier, ...), a thread's later accesses start a new step.
  void tick(int tid) {
    uint32_t& own = clock(tid)[tid];
    own = std::max(own, clock_floor_) + 1;
    clock_ceiling_ = std::max(clock_ceiling_, own);
  }
  void join_into(std::vector<uint32_t>& target, int tid);
  // __syncwarp: the lanes of `mask` in `warp` are ordered with each other from here on.
  void order_lanes(int warp, unsigned mask);
  void acquire(int tid, const std::vector<uint32_t>& source);

  // ---- Shared memory (shared_memory.cpp) ----
  static constexpr uint32_t kReservedShared = 1024;  // the window's first 1 KiB is the system's (sm_80+)
  char* shared_base() const { return shared_base_; }
  uint32_t shared_end() const { return shared_end_; }  // one past the last usable shared address
  bool in_shared_window(uintptr_t address) const {
    return address - reinterpret_cast<uintptr_t>(shared_base_) < shared_window_;
  }
  bool in_stacks(uintptr_t address) const { return address - stacks_low_ < stacks_bytes_; }
  // A kernel's load or store of `bytes` at shared `address` by `self`: bounds, races, poison.
  void shared_access(ThreadState& self, uint32_t address, size_t bytes, bool write);
  // cp.async: the destination is written at issue as far as ordering is concerned, and reads as poison
  // until the copy completes.
  void begin_async_write(ThreadState& self, uint32_t address, int bytes, Where where);
  void complete_async_write(ThreadState& self, const AsyncCopy& copy);
  void check_shared_range(const ThreadState& self, uint32_t address, size_t bytes, const char* operation);
  // Whether the emulator sees kernel code's own loads and stores (launch.hpp memory_tracking()); without
  // that only bounds and cp.async poison are checked, not races or uninitialized reads.
  bool tracking() const { return tracking_; }

 private:
  void start_threads(const Launch& launch);
  void schedule();
  void exit_thread(ThreadState& self);
  std::string deadlock_report() const;
  void complete_barrier(Barrier& barrier);
  void full_barrier();  // every thread met: a new barrier interval for the race detector
  void prepare_shared(size_t dynamic_bytes);
  void finish_async_copies();
  static void thread_main(void* state);

  const Launch* launch_ = nullptr;
  Index3 block_index_;
  Schedule schedule_;
  bool tracking_ = false;
  std::mt19937_64 random_;
  int thread_count_ = 0;
  int exited_ = 0;
  std::vector<ThreadState> threads_;
  // Runnable threads not running, in the order the schedule takes them: ready_[ready_head_...].
  std::vector<int> ready_;
  size_t ready_head_ = 0;
  std::vector<std::vector<Collective>> collectives_;  // per warp, the rendezvous in progress
  std::vector<unsigned> exited_lanes_;                // per warp, the lanes that have exited
  Barrier barriers_[16];
  std::vector<uint32_t> clocks_;
  uint32_t clock_floor_ = 0;    // every step at or below it is ordered before every thread's next step
  uint32_t clock_ceiling_ = 0;  // the latest step any thread has reached
  std::vector<uint32_t> scratch_clock_;
  bool completing_ = false;  // a collective is being carried out: its lanes must not be preempted
  std::string error_;

  // Fiber stacks, one mapping for all threads of the block (with a guard page below each).
  char* stacks_ = nullptr;
  size_t stack_capacity_ = 0;  // threads the mapping holds
  uintptr_t stacks_low_ = 0;
  size_t stacks_bytes_ = 0;

  // Shared memory: the window [0, shared_end_) (the first kReservedShared bytes reserved), then a red zone.
  std::vector<char> shared_storage_;
  char* shared_base_ = nullptr;
  uint32_t shared_end_ = 0;
  size_t shared_window_ = 0;  // shared_end_ plus the red zone
  // What is known of each shared byte and each 4-byte granule (shared_memory.cpp).
  struct ByteShadow {
    uint32_t generation = 0;  // barrier interval of the last write; below block_generation_: never written
    uint32_t write_clock = 0;
    uint16_t writer = 0;
    uint16_t pending = 0;  // 1 + the thread whose cp.async will write it; 0 when none is in flight
  };
  struct ReadShadow {
    uint32_t generation = 0;  // barrier interval of the reads recorded; older ones are ordered already
    uint32_t clock = 0;       // the one reader's step, or the index of a read set when shared_reads
    uint16_t reader = 0;
    bool shared_reads = false;  // read by several threads not ordered with each other: a read set
  };
  std::vector<ByteShadow> byte_shadow_;
  std::vector<ReadShadow> read_shadow_;
  std::vector<std::vector<uint32_t>> read_sets_;  // per set, each thread's last read step (0: none)
  size_t read_sets_used_ = 0;
  uint32_t generation_counter_ = 0;  // barrier intervals, counted over every block this runner ran
  uint32_t block_generation_ = 0;    // the first interval of the current block
  uint32_t generation_ = 0;          // the current interval
};

// The thread the calling fiber emulates; nullptr outside a kernel (host code).
ThreadState* current_thread();

}  // namespace flashlab::emulator
