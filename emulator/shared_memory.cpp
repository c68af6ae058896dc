// A block's shared memory and the race detector.
//
// Happens-before is tracked with vector clocks (block.hpp): a thread's accesses between two of its
// synchronizations are one "step"; an access of thread t is ordered after a step s of thread u when
// clock(t)[u] >= s. Barriers join the clocks of the threads that meet; warp shuffles and votes do not (they
// exchange registers, not memory: CUDA orders memory only through barriers, __syncwarp, fences and
// mbarriers).
//
// For every byte the detector keeps the last write (thread and step; stored once per 4-byte granule while one
// write covered all of it, which costs nothing in precision), and for every 4-byte granule the reads
// since that write (one thread and step, or, once threads that are not ordered with each other have read it,
// every thread's last step: a read set). Then, as in FastTrack (Flanagan and Freund, PLDI 2009):
//   a read races with the last write unless that write is ordered before it;
//   a write races with the last write and with every read since, unless they are ordered before it.
// A barrier at which every thread of the block meets orders everything before it before everything after
// it, so each one starts a new interval and forgets what came before (the generation counters), which keeps
// the common case cheap. A granule's reads are recorded for all its 4 bytes: a write to one byte of a granule
// that another thread is reading a different byte of, unordered, would be reported too (no kernel here does
// that; it is the one imprecision).
#include <algorithm>
#include <cstring>

#include "emulator/block.hpp"
#include "emulator/launch.hpp"

namespace flashlab::emulator {

namespace {

constexpr uint32_t kRedZone = 4096;  // past the end of the window: an access there is out of bounds
constexpr uint8_t kPoison = 0xff;    // NaN as f32, f16 and bf16 (and -1 as an integer)

}  // namespace

void BlockRunner::prepare_shared(size_t dynamic_bytes) {
  shared_end_ = kReservedShared + static_cast<uint32_t>(dynamic_bytes);
  shared_window_ = shared_end_ + kRedZone;
  // 4 KiB alignment: host addresses have the same low bits as shared addresses, which swizzles depend on.
  if (shared_storage_.size() < shared_window_ + 4096) shared_storage_.assign(shared_window_ + 4096, 0);
  const auto raw = reinterpret_cast<uintptr_t>(shared_storage_.data());
  shared_base_ = reinterpret_cast<char*>((raw + 4095) & ~uintptr_t(4095));
  // Shared memory holds garbage when a block starts: poison, so that reading it before writing it gives NaN.
  std::memset(shared_base_ + kReservedShared, kPoison, dynamic_bytes);
  if (byte_shadow_.size() < shared_window_) byte_shadow_.resize(shared_window_);
  if (pending_.size() < shared_window_) pending_.resize(shared_window_);
  if (granules_.size() < shared_window_ / 4 + 1) granules_.resize(shared_window_ / 4 + 1);
  block_generation_ = generation_ = ++generation_counter_;
  read_sets_used_ = 0;
}

void BlockRunner::full_barrier() {
  generation_ = ++generation_counter_;
  read_sets_used_ = 0;  // every read set belongs to an older interval now
}

void BlockRunner::check_shared_range(const ThreadState& self, uint32_t address, size_t bytes,
                                     const char* operation) {
  if (address >= kReservedShared && address + bytes <= shared_end_) return;
  if (address < kReservedShared)
    fail(self, operation, ": ", bytes, " bytes at shared address ", Hex{address},
         ", in the first 1 KiB of the shared window, which is reserved (dynamic shared memory starts at ",
         Hex{kReservedShared}, ")");
  fail(self, operation, ": ", bytes, " bytes at shared address ", Hex{address},
       " are out of bounds: the block has ", shared_end_ - kReservedShared,
       " bytes of dynamic shared memory, shared addresses ", Hex{kReservedShared}, " to ",
       Hex{shared_end_ - 1});
}

uint32_t BlockRunner::shared_offset(const ThreadState& self, const void* pointer, size_t bytes,
                                    const char* operation, Where where) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  if (!in_shared_window(address))
    fail(self, operation, " (", where, "): ", Hex{address}, " is not in this block's dynamic shared memory");
  const auto offset = static_cast<uint32_t>(address - reinterpret_cast<uintptr_t>(shared_base_));
  check_shared_range(self, offset, bytes, operation);
  return offset;
}

void BlockRunner::check_not_in_flight(const ThreadState& self, uint32_t address, size_t bytes, bool write,
                                      const char* actor) {
  uint16_t any = 0;  // nearly always 0: one pass without branches says so (vectorized)
  for (size_t i = 0; i < bytes; ++i) any |= pending_[address + i];
  if (any == 0) return;
  for (uint32_t a = address; a < address + bytes; ++a)
    if (pending_[a] != 0) report_in_flight(self, a, write, actor);
}

void BlockRunner::report_in_flight(const ThreadState& self, uint32_t address, bool write, const char* actor) {
  const uint16_t pending = pending_[address];
  const char* space = actor[0] != '\0' ? " " : "";
  const char* access = write ? "writes" : "reads";
  if (pending == kPendingBulkRead) {
    if (!write) return;  // reading what a TMA store reads is fine
    for (const ThreadState& t : threads_) {
      auto covers = [&](const SharedRange& r) { return address - r.address < r.bytes; };
      bool found = std::any_of(t.bulk_uncommitted.begin(), t.bulk_uncommitted.end(), covers);
      for (const auto& group : t.bulk_committed) found |= std::any_of(group.begin(), group.end(), covers);
      if (found)
        fail(self, actor, space, access, " shared address ", Hex{address},
             " while a TMA store issued by warp ", t.warp(), " lane ", t.lane(),
             " still reads it: its cp.async.bulk.wait_group.read has not been reached");
    }
  }
  if (pending == kMbarrierObject) {
    for (const MBarrier& b : mbarriers_)
      if (address - b.address < 8)
        fail(self, actor, space, access, " shared address ", Hex{address}, ", part of the mbarrier at ",
             Hex{b.address}, " (initialized at ", b.init_where,
             "): an mbarrier object is only accessed by mbarrier instructions");
  }
  if (pending == kPendingBulkLoad) {
    for (const BulkLoad& load : bulk_loads_)
      if (address - load.destination < load.data.size()) {
        const ThreadState& issuer = threads_[load.issuer];
        fail(self, actor, space, access, " shared address ", Hex{address},
             " while a TMA load issued by warp ", issuer.warp(), " lane ", issuer.lane(), " (", load.where,
             ") is still copying into it: no wait on its mbarrier (", Hex{load.barrier},
             ") has seen it complete (this thread's last synchronization: ", self.sync_point(), ")");
      }
  }
  const ThreadState& issuer = threads_[pending - 1];
  fail(self, actor, space, access, " shared address ", Hex{address}, " while a cp.async by warp ",
       issuer.warp(), " lane ", issuer.lane(),
       " is still copying into it: its cp.async.wait_group has not been reached (this thread's last "
       "synchronization: ",
       self.sync_point(), ")");
}

void BlockRunner::ReadSet::reset(int threads) {
  if (in_place < 0) {  // leave the per-thread array all zero for the next set that needs it
    for (const uint16_t u : readers) step[u] = 0;
    readers.clear();
  }
  if (step.size() != static_cast<size_t>(threads)) step.assign(static_cast<size_t>(threads), 0);
  in_place = 0;
}

void BlockRunner::ReadSet::add(int tid, uint32_t at) {
  if (in_place >= 0) {
    for (int i = 0; i < in_place; ++i)
      if (place_tid[i] == tid) {
        place_step[i] = at;
        return;
      }
    if (in_place < kInPlace) {
      place_tid[in_place] = static_cast<uint16_t>(tid);
      place_step[in_place++] = at;
      return;
    }
    for (int i = 0; i < kInPlace; ++i) {  // a fifth reader: the set moves to the per-thread array
      step[place_tid[i]] = place_step[i];
      readers.push_back(place_tid[i]);
    }
    in_place = -1;
  }
  if (step[tid] == 0) readers.push_back(static_cast<uint16_t>(tid));
  step[tid] = at;
}

int BlockRunner::ReadSet::first_unordered(const uint32_t* known, int self) const {
  int first = -1;
  auto consider = [&](int u, uint32_t at) {
    if (u != self && at > known[u] && (first < 0 || u < first)) first = u;
  };
  if (in_place >= 0) {
    for (int i = 0; i < in_place; ++i) consider(place_tid[i], place_step[i]);
  } else {
    for (const uint16_t u : readers) consider(u, step[u]);
  }
  return first;
}

template <typename Visit>
void BlockRunner::for_each_write(uint32_t address, size_t bytes, Visit&& visit) const {
  const uint32_t end = address + static_cast<uint32_t>(bytes);
  for (uint32_t g = address / 4; g * 4 < end; ++g) {
    const uint32_t first = std::max(address, g * 4), last = std::min(end, g * 4 + 4);
    if (!granules_[g].write.split) {
      visit(first, granules_[g].write);
    } else {
      for (uint32_t a = first; a < last; ++a) visit(a, byte_shadow_[a]);
    }
  }
}

void BlockRunner::record_write(uint32_t address, size_t bytes, const WriteShadow& write) {
  const uint32_t end = address + static_cast<uint32_t>(bytes);
  for (uint32_t g = address / 4; g * 4 < end; ++g) {
    const uint32_t first = std::max(address, g * 4), last = std::min(end, g * 4 + 4);
    WriteShadow& granule = granules_[g].write;
    if (first == g * 4 && last == g * 4 + 4) {
      granule = write;  // the whole granule: one entry again
      continue;
    }
    if (!granule.split) {  // a narrower write: the granule's bytes go their own ways from here
      std::fill_n(&byte_shadow_[g * 4], 4, granule);
      granule.split = true;
    }
    std::fill(&byte_shadow_[first], &byte_shadow_[last], write);
  }
}

void BlockRunner::shared_access(ThreadState& self, uint32_t address, size_t bytes, bool write,
                                bool async_proxy) {
  check_shared_range(self, address, bytes, write ? "store to shared memory" : "load from shared memory");
  const int tid = self.tid;
  const uint32_t* known = clock(tid);
  check_not_in_flight(self, address, bytes, write, "");
  if (!tracking_) return;
  for_each_write(address, bytes, [&](uint32_t a, const WriteShadow& s) {
    if (!write && s.generation < block_generation_)
      fail(
          self, "reads shared address ", Hex{a}, " (", bytes,
          "-byte load), which no thread of this block has written: shared memory is undefined until written");
    if (s.generation == generation_ && s.writer != tid && known[s.writer] < s.write_clock) {
      const ThreadState& writer = threads_[s.writer];
      fail(self, "data race on shared memory: ", write ? "writes" : "reads", " ", bytes,
           " bytes at shared address ", Hex{address}, " that warp ", writer.warp(), " lane ", writer.lane(),
           " wrote with no synchronization between them (this thread's last synchronization: ",
           self.sync_point(), "; the writer's: ", writer.sync_point(), ")");
    }
  });
  const uint32_t first_granule = address / 4, last_granule = (address + static_cast<uint32_t>(bytes) - 1) / 4;
  for (uint32_t g = first_granule; g <= last_granule; ++g) {
    ReadShadow& r = granules_[g].read;
    if (write) {
      // Every read of this interval must be ordered before the write.
      if (r.generation == generation_) {
        int racing = -1;
        if (r.shared_reads) {
          racing = read_sets_[r.clock].first_unordered(known, tid);
        } else if (r.reader != tid && r.clock > known[r.reader]) {
          racing = r.reader;
        }
        if (racing >= 0) {
          const ThreadState& reader = threads_[racing];
          fail(self, "data race on shared memory: writes ", bytes, " bytes at shared address ", Hex{address},
               " that warp ", reader.warp(), " lane ", reader.lane(),
               " read with no synchronization between them (this thread's last synchronization: ",
               self.sync_point(), "; the reader's: ", reader.sync_point(), ")");
        }
      }
      r.generation = 0;  // the write is ordered after every read so far: later writes check against it alone
      continue;
    }
    const uint32_t step = known[tid];
    if (r.generation != generation_) {
      r = {generation_, step, static_cast<uint16_t>(tid), false};
    } else if (r.shared_reads) {
      read_sets_[r.clock].add(tid, step);
    } else if (r.reader == tid || r.clock <= known[r.reader]) {
      r.reader = static_cast<uint16_t>(tid);  // the earlier read is ordered before this one: keep the later
      r.clock = step;
    } else {
      if (read_sets_used_ == read_sets_.size()) read_sets_.emplace_back();
      ReadSet& set = read_sets_[read_sets_used_];
      set.reset(thread_count_);
      set.add(r.reader, r.clock);
      set.add(tid, step);
      r.clock = static_cast<uint32_t>(read_sets_used_++);
      r.shared_reads = true;
    }
  }
  if (write) record_write(address, bytes, {generation_, known[tid], static_cast<uint16_t>(tid), async_proxy});
  if (should_preempt()) yield(self);
}

void BlockRunner::check_async_read(const ThreadState& reader, const uint32_t* known, uint32_t address,
                                   size_t bytes, const char* operation, Where where) {
  check_shared_range(reader, address, bytes, operation);
  check_not_in_flight(reader, address, bytes, false, operation);
  if (!tracking_) return;
  for_each_write(address, bytes, [&](uint32_t a, const WriteShadow& s) {
    if (s.generation < block_generation_)
      fail(reader, operation, " (", where, ") reads shared address ", Hex{a},
           ", which no thread of this block has written: shared memory is undefined until written");
    const ThreadState& writer = threads_[s.writer];
    // (A write before the last barrier of the whole block is ordered before the read, but a barrier is no
    // proxy fence.)
    if (s.generation == generation_ && s.writer != reader.tid && known[s.writer] < s.write_clock)
      fail(reader, "data race on shared memory: ", operation, " (", where, ") reads shared address ", Hex{a},
           " that warp ", writer.warp(), " lane ", writer.lane(), " wrote",
           s.async_write ? " (a TMA load)" : "",
           " with no synchronization between them (the reader's last synchronization: ", reader.sync_point(),
           "; the writer's: ", writer.sync_point(), ")");
    if (!s.async_write && writer.proxy_fence_step < s.write_clock)
      fail(reader, operation, " (", where, ") reads shared address ", Hex{a}, ", which warp ", writer.warp(),
           " lane ", writer.lane(),
           " wrote with an ordinary store and no fence.proxy.async after it: the async proxy may not see the "
           "write (PTX ISA, \"Async proxy\")");
  });
}

void BlockRunner::begin_async_write(ThreadState& self, uint32_t address, int bytes, Where where) {
  check_shared_range(self, address, static_cast<size_t>(bytes), "cp.async destination");
  (void)where;
  check_not_in_flight(self, address, static_cast<size_t>(bytes), true, "cp.async");
  // Ordering-wise the copy writes now: it must not overtake reads or writes other threads still make.
  shared_access(self, address, static_cast<size_t>(bytes), true);
  std::fill_n(&pending_[address], bytes, static_cast<uint16_t>(self.tid + 1));
  std::memset(shared_base_ + address, kPoison, static_cast<size_t>(bytes));
}

void BlockRunner::complete_async_write(ThreadState& self, const AsyncCopy& copy) {
  std::memcpy(shared_base_ + copy.destination, copy.data, static_cast<size_t>(copy.bytes));
  std::fill_n(&pending_[copy.destination], copy.bytes, uint16_t{0});
  // cp.async writes through the generic proxy (async_write false).
  record_write(copy.destination, static_cast<size_t>(copy.bytes),
               {generation_, clock(self.tid)[self.tid], static_cast<uint16_t>(self.tid), false});
}

void BlockRunner::finish_async_copies() {
  // A block that ended with an error may leave copies in flight: complete them so that no byte stays pending.
  for (ThreadState& t : threads_) {
    for (const AsyncCopy& copy : t.uncommitted) complete_async_write(t, copy);
    for (const auto& group : t.committed)
      for (const AsyncCopy& copy : group) complete_async_write(t, copy);
    t.uncommitted.clear();
    t.committed.clear();
  }
}

}  // namespace flashlab::emulator
