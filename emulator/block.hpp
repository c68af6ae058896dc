// The emulator's model of one thread block (internal to emulator/): its threads as fibers, the scheduler that
// switches between them at synchronization points, its barriers and warp collectives, its shared memory with
// what is known of every byte, and the vector clocks that decide whether two accesses are ordered.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
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

// A source line as a number: the site at which the counters group the lanes' calls of an emulated operation
// (emulator/counters.hpp).
inline uint64_t source_site(const Where& where) {
  return reinterpret_cast<uintptr_t>(where.file_name()) ^ uint64_t(where.line()) << 40 ^
         uint64_t(where.column()) << 56;
}

// An asynchronous copy in flight (cp.async): issued by one thread, completed by its wait_group.
struct AsyncCopy {
  uint32_t destination = 0;  // shared address
  int bytes = 0;
  uint8_t data[16];  // the source bytes, read at issue, zero-filled past the source size
  Where issued_at;
};

// A range of shared memory that a bulk copy (TMA store) reads until its cp.async.bulk.wait_group.read.
struct SharedRange {
  uint32_t address = 0;
  uint32_t bytes = 0;
};

// A cp.async.bulk.tensor load in flight (tma.cpp): its bytes land in shared memory, and complete their
// transaction bytes on its mbarrier, at a later scheduling point.
struct BulkLoad {
  uint32_t destination = 0;   // shared address
  std::vector<uint8_t> data;  // the box as it lands (swizzled, out-of-bounds elements filled)
  uint32_t barrier = 0;       // the mbarrier's shared address
  int issuer = 0;
  uint32_t issue_step = 0;  // the issuer's step: what the copy's writes are ordered after
  Where where;
};

// An mbarrier object in shared memory (tma.cpp): phases, arrivals and transaction bytes (PTX ISA "mbarrier").
struct MBarrier {
  uint32_t address = 0;
  uint32_t count = 0;        // arrivals per phase
  uint32_t pending = 0;      // arrivals the current phase still waits for
  int64_t tx = 0;            // the current phase's tx-count: expected bytes not yet delivered
  int64_t tx_announced = 0;  // this phase's expect-tx total (for messages)
  int64_t tx_delivered = 0;  // this phase's complete-tx total
  uint32_t phase = 0;        // phases completed so far: the current phase's number
  int init_thread = 0;       // who initialized it, and at which step (uses must be ordered after that)
  uint32_t init_step = 0;
  Where init_where;
  std::vector<uint32_t> released;      // the clocks this phase's arrivals and copies release
  std::vector<uint32_t> completed[2];  // what the last completed phase of each parity released
  std::vector<int> waiters;            // threads blocked in mbarrier.try_wait.parity
};

// One wgmma.mma_async in flight (warpgroup.cpp): its result, computed at issue from the operands as they
// were then, and written to the accumulator registers at the wgmma.wait_group that completes it.
struct WgmmaOperand {
  bool in_shared = false;  // false: A from registers
  uint64_t descriptor = 0;
  bool mn_major = false;
  uint32_t rows = 0, k = 0, element_bytes = 0;
  std::vector<uint8_t> values;  // rows x k elements as read at issue (re-read at completion: unchanged?)
};
struct WgmmaOp {
  uint32_t n = 0;
  float* accumulators[128] = {};  // each thread's accumulator registers (n / 2 floats)
  std::vector<float> result;      // 64 x n, row-major
  WgmmaOperand a, b;
  const char* operation = nullptr;
  Where where;
};

// A warpgroup's state (sm_90): its rendezvous in progress, its wgmma groups, its register allocation.
struct GroupCollective {
  const char* operation = nullptr;  // nullptr: none in progress
  Where where;
  int arrived = 0;
  void* thread_data[128] = {};
  void (*complete)(BlockRunner& block, GroupCollective& collective, int warpgroup) = nullptr;
};
struct Warpgroup {
  GroupCollective collective;
  bool fenced = false;  // a wgmma.fence since the last wgmma.commit_group
  std::vector<WgmmaOp> uncommitted;
  std::vector<std::vector<WgmmaOp>> committed;  // oldest first
  uint32_t registers = 0;                       // per thread (setmaxnreg); 0 until the first setmaxnreg
  uint32_t requested = 0;                       // a setmaxnreg.inc waiting for the pool: its count
  Where requested_where;
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
  // TMA stores: the shared memory they read, since the last cp.async.bulk.commit_group, then per group.
  std::vector<SharedRange> bulk_uncommitted;
  std::vector<std::vector<SharedRange>> bulk_committed;
  // While blocked in mbarrier.try_wait.parity: the barrier's shared address and the parity waited for.
  uint32_t wait_barrier = 0;
  uint32_t wait_parity = 0;
  // The step at which this thread last ran fence.proxy.async (0: never): its ordinary shared-memory writes
  // of earlier steps are visible to the async proxy (TMA, wgmma).
  uint32_t proxy_fence_step = 0;

  int warp() const { return tid / 32; }
  int lane() const { return tid % 32; }
  int warpgroup() const { return tid / 128; }
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
  int tma_landing_odds = 4;  // shuffled: a TMA load lands at a scheduling point with probability 1 / odds
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
  // `async_proxy`: the write is a TMA load's (ordinary stores need a fence.proxy.async before the async proxy
  // reads them; the async proxy's own writes do not).
  void shared_access(ThreadState& self, uint32_t address, size_t bytes, bool write, bool async_proxy = false);
  // Fails naming what is still in flight on [address, address + bytes), if anything is (report_in_flight).
  void check_not_in_flight(const ThreadState& self, uint32_t address, size_t bytes, bool write,
                           const char* actor);
  // The error for an access to a byte that something is in flight on (a cp.async, a TMA load or store, an
  // mbarrier object), by kernel code (`actor` "") or an instruction of the async proxy ("wgmma.mma_async");
  // returns when the access is allowed (reading what a TMA store reads).
  void report_in_flight(const ThreadState& self, uint32_t address, bool write, const char* actor);
  // cp.async: the destination is written at issue as far as ordering is concerned, and reads as poison
  // until the copy completes.
  void begin_async_write(ThreadState& self, uint32_t address, int bytes, Where where);
  void complete_async_write(ThreadState& self, const AsyncCopy& copy);
  void check_shared_range(const ThreadState& self, uint32_t address, size_t bytes, const char* operation);
  // Whether the emulator sees kernel code's own loads and stores (launch.hpp memory_tracking()); without
  // that only bounds and cp.async poison are checked, not races or uninitialized reads.
  bool tracking() const { return tracking_; }
  // The shared address of a generic pointer into the window, or an error naming `operation`.
  uint32_t shared_offset(const ThreadState& self, const void* pointer, size_t bytes, const char* operation,
                         Where where);
  // A read of shared memory by the async proxy (a wgmma operand, a TMA store's source) on behalf of `reader`,
  // whose knowledge of the other threads is `known`: nothing may be in flight into it, it must have been
  // written, the writes must be ordered before the read, and ordinary writes must have been followed by their
  // writer's fence.proxy.async.
  void check_async_read(const ThreadState& reader, const uint32_t* known, uint32_t address, size_t bytes,
                        const char* operation, Where where);

  // ---- Warpgroups (sm_90, warpgroup.cpp) ----
  // A rendezvous of the 128 threads of the caller's warpgroup at one .sync.aligned operation; the last to
  // arrive runs `complete` for all of them, which may call hold_warpgroup() to keep them all waiting.
  void warpgroup_collective(ThreadState& self, const char* operation, void* thread_data,
                            void (*complete)(BlockRunner&, GroupCollective&, int), Where where);
  Warpgroup& warpgroup(int index) { return warpgroups_[index]; }
  void hold_warpgroup() { hold_warpgroup_ = true; }
  void wake_warpgroup(int index);
  // The join of the warpgroup's clocks: what its collective operations are ordered after.
  const std::vector<uint32_t>& warpgroup_clock(int index);
  // setmaxnreg's register pool (registers, not per thread): what the launch allotted and what is free.
  uint32_t launch_registers = 0;  // per thread, from the kernel; 0 until the first setmaxnreg
  int64_t free_registers = 0;

  // ---- mbarriers and the TMA (sm_90, tma.cpp) ----
  void mbarrier_init(ThreadState& self, const void* pointer, uint32_t count, Where where);
  void mbarrier_arrive(ThreadState& self, const void* pointer, uint32_t expect_tx_bytes, Where where);
  void mbarrier_wait(ThreadState& self, const void* pointer, uint32_t parity, Where where);
  // An initialized mbarrier at `pointer` that `self` may use (its initialization ordered before), or an
  // error.
  MBarrier& mbarrier(ThreadState& self, const void* pointer, const char* operation, Where where);
  // A TMA load: its destination checked and marked (begin_bulk_load), then the copy kept in flight until it
  // lands (add_bulk_load).
  void begin_bulk_load(ThreadState& self, uint32_t destination, uint32_t bytes, const char* operation);
  void add_bulk_load(ThreadState& self, BulkLoad load);
  // A TMA store's read of shared memory: locked against writes until the group's wait_group.read.
  void lock_bulk_read(ThreadState& self, SharedRange range);
  void release_bulk_reads(ThreadState& self, int pending);

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
  // sm_90 (tma.cpp, warpgroup.cpp).
  void reset_sm90();
  void land_bulk_loads(bool all);  // at scheduling points: TMA loads complete some time after their issue
  void land(BulkLoad& load);
  void complete_tx(MBarrier& barrier, int64_t bytes, const BulkLoad& load);
  void complete_phase(MBarrier& barrier);
  std::string describe_mbarrier(const MBarrier& barrier) const;
  std::string sm90_deadlock_details() const;
  void check_sm90_exit(ThreadState& self);
  std::string sm90_block_end();  // what an ending block leaves in flight: "" or the error
  void release_sm90_shadow();    // the shadow's marks of mbarriers and bulk copies, gone with the block
  std::string scheduler_error_;  // an error found in the scheduler's context (a landing TMA load)

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
  // What is known of the last write of each shared byte (shared_memory.cpp): kept per 4-byte granule while
  // one write covered the whole granule (nearly every write does), per byte once a narrower write split it.
  struct WriteShadow {
    uint32_t generation = 0;  // barrier interval of the last write; below block_generation_: never written
    uint32_t write_clock = 0;
    uint16_t writer = 0;
    bool async_write = false;  // the last write was the async proxy's (a TMA load), not an ordinary store
    bool split = false;        // in a granule's entry: the bytes differ, byte_shadow_ holds each one
  };
  // The last write's shadow, once for each granule of [address, address + bytes) that one write covers and
  // once per byte of a split one: visit(first byte address, shadow).
  template <typename Visit>
  void for_each_write(uint32_t address, size_t bytes, Visit&& visit) const;
  void record_write(uint32_t address, size_t bytes, const WriteShadow& write);
  // What is in flight on each byte: 0 nothing, 1 + t a cp.async of thread t, or one of the kPending* below.
  // Apart from the rest of the shadow, so that checking a TMA tile for it reads contiguous memory.
  static constexpr uint16_t kPendingBulkLoad = 0xfffe;  // a TMA load will write it
  static constexpr uint16_t kPendingBulkRead = 0xfffd;  // a TMA store is reading it (writes must wait)
  static constexpr uint16_t kMbarrierObject = 0xffff;   // part of an initialized mbarrier
  std::vector<uint16_t> pending_;
  struct ReadShadow {
    uint32_t generation = 0;  // barrier interval of the reads recorded; older ones are ordered already
    uint32_t clock = 0;       // the one reader's step, or the index of a read set when shared_reads
    uint16_t reader = 0;
    bool shared_reads = false;  // read by several threads not ordered with each other: a read set
  };
  // A granule's last write and reads side by side: an access finds both in one cache line (the shadow of a
  // 228 KB window does not fit in a host's L2, and these loads were the detector's main cost).
  struct GranuleShadow {
    WriteShadow write;
    ReadShadow read;
  };
  std::vector<GranuleShadow> granules_;   // per 4-byte granule
  std::vector<WriteShadow> byte_shadow_;  // per byte, read only where the granule is split
  // The reads of one granule in one interval by threads not ordered with each other: each reader's last read
  // step. A write is checked against the readers only, not the whole block. The first few readers (most sets:
  // the warps that share a tile) are kept in place; past them the set moves to a per-thread array (0: no
  // read; a thread's own step starts at 1) and the list of its readers.
  struct ReadSet {
    static constexpr int kInPlace = 4;
    int in_place = 0;  // readers kept in place; -1 once the set is per thread
    uint16_t place_tid[kInPlace] = {};
    uint32_t place_step[kInPlace] = {};
    std::vector<uint32_t> step;
    std::vector<uint16_t> readers;
    void reset(int threads);
    void add(int tid, uint32_t at);
    // The lowest thread other than `self` whose read the clock `known` does not order, or -1.
    int first_unordered(const uint32_t* known, int self) const;
  };
  std::vector<ReadSet> read_sets_;
  size_t read_sets_used_ = 0;
  uint32_t generation_counter_ = 0;  // barrier intervals, counted over every block this runner ran
  uint32_t block_generation_ = 0;    // the first interval of the current block
  uint32_t generation_ = 0;          // the current interval

  // sm_90.
  std::vector<MBarrier> mbarriers_;
  std::vector<BulkLoad> bulk_loads_;  // TMA loads in flight, in issue order
  std::vector<Warpgroup> warpgroups_;
  std::vector<uint32_t> warpgroup_clock_;
  bool hold_warpgroup_ = false;
};

// The thread the calling fiber emulates; nullptr outside a kernel (host code).
ThreadState* current_thread();

// The calling emulated thread, inside the emulator until the operation returns (the instrumentation hooks
// then leave its accesses alone: they are the emulator's, whatever copy of a library template runs them).
// Device functions called from host code are a programming error.
class Entered {
 public:
  explicit Entered(const char* what) : thread_(current_thread()) {
    if (thread_ == nullptr) {
      std::fprintf(stderr, "flashlab emulator: %s called outside a kernel\n", what);
      std::abort();
    }
    previous_ = thread_->in_emulator;
    thread_->in_emulator = true;
  }
  ~Entered() { thread_->in_emulator = previous_; }
  Entered(const Entered&) = delete;
  Entered& operator=(const Entered&) = delete;
  operator ThreadState&() const { return *thread_; }
  ThreadState* operator->() const { return thread_; }

 private:
  ThreadState* thread_;
  bool previous_ = false;
};

}  // namespace flashlab::emulator
