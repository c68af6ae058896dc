// The TMA and mbarriers (sm_90): tensor maps, cp.async.bulk.tensor loads and stores, the transaction
// barriers their loads complete on, and the proxy fences between ordinary stores and the async proxy.
//
// A TMA load is checked and its destination marked at issue (ordering-wise the copy writes then, attributed
// to the issuing thread's step, and its bytes read as poison); the data lands, and its transaction bytes
// reach the mbarrier, at a later scheduling point: at the next one under the in-order schedule, at a random
// later one under the shuffled schedule, and in any case before the scheduler declares a deadlock. A thread
// that waits on the barrier therefore sees the data only through the barrier's phase, as on the GPU.
#include <algorithm>
#include <cstring>

#include "emulator/block.hpp"
#include "emulator/counters.hpp"
#include "emulator/memory.hpp"
#include "emulator/report.hpp"
#include "emulator/tensor_map.hpp"

namespace flashlab::emulator {

namespace {

constexpr int64_t kMaxTransactionCount = (int64_t{1} << 20) - 1;  // tx-count and arrival counts (PTX ISA)

// CUtensorMapDataType -> bytes per element (0: unknown), and whether it is a floating-point type.
uint32_t element_bytes(uint32_t data_type) {
  static constexpr uint8_t bytes[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};
  return data_type < sizeof bytes ? bytes[data_type] : 0;
}
bool floating_point(uint32_t data_type) {
  return data_type >= 6 && data_type <= 12;  // FLOAT16 to TFLOAT32_FTZ
}

const char* tma_load_name(int rank) {
  static constexpr const char* names[] = {"",
                                          "cp.async.bulk.tensor.1d",
                                          "cp.async.bulk.tensor.2d",
                                          "cp.async.bulk.tensor.3d",
                                          "cp.async.bulk.tensor.4d",
                                          "cp.async.bulk.tensor.5d"};
  return rank >= 1 && rank <= 5 ? names[rank] : "cp.async.bulk.tensor";
}

// The map a kernel passes to cp.async.bulk.tensor (a __grid_constant__ parameter): the emulator's twin.
tma::TensorMap read_map(BlockRunner& block, const ThreadState& t, const void* pointer, int rank,
                        const char* operation, Where where) {
  if (reinterpret_cast<uintptr_t>(pointer) % 64 != 0)
    block.fail(t, operation, " (", where, "): the tensor map at ", Hex{reinterpret_cast<uintptr_t>(pointer)},
               " must be 64-byte aligned");
  tma::TensorMap map;
  std::memcpy(&map, pointer, sizeof map);
  if (map.magic != tma::TensorMap::kMagic)
    block.fail(t, operation, " (", where, "): the tensor map at ", Hex{reinterpret_cast<uintptr_t>(pointer)},
               " was not made by cuTensorMapEncodeTiled");
  if (map.rank != rank)
    block.fail(t, operation, " (", where, "): the tensor map has ", int(map.rank), " dimensions, the copy ",
               rank);
  return map;
}

struct Box {
  uint32_t size[5] = {1, 1, 1, 1, 1};
  uint32_t elements = 1;
};
Box box_of(const tma::TensorMap& map) {
  Box box;
  for (int d = 0; d < map.rank; ++d) {
    box.size[d] = map.box[d] + 1u;
    box.elements *= box.size[d];
  }
  return box;
}

// Visits every element of the box at `coordinates`, in the box's row-major order (dimension 0 fastest), as
// runs along dimension 0: visit(first element index in the box, global address of the run or 0 when out of
// bounds, elements in the run).
template <typename Visit>
void for_each_run(const tma::TensorMap& map, const Box& box, const int32_t* coordinates, Visit&& visit) {
  uint32_t index[5] = {};
  for (uint32_t first = 0; first < box.elements; first += box.size[0]) {
    uint32_t rest = first / box.size[0];
    bool rows_in_bounds = true;
    uint64_t row_address = map.base;
    for (int d = 1; d < map.rank; ++d) {
      index[d] = rest % box.size[d];
      rest /= box.size[d];
      const int64_t c = int64_t(coordinates[d]) + index[d];
      rows_in_bounds &= c >= 0 && c <= int64_t(map.dims_minus_one[d]);
      row_address += uint64_t(c) * map.strides[d - 1];
    }
    // Along dimension 0 the run splits into out-of-bounds, in-bounds and out-of-bounds parts.
    const int64_t c0 = coordinates[0];
    const int64_t begin = rows_in_bounds ? std::clamp<int64_t>(-c0, 0, box.size[0]) : box.size[0];
    const int64_t end = rows_in_bounds
                            ? std::clamp<int64_t>(int64_t(map.dims_minus_one[0]) + 1 - c0, begin, box.size[0])
                            : box.size[0];
    if (begin > 0) visit(first, uint64_t{0}, static_cast<uint32_t>(begin));
    if (end > begin)
      visit(first + static_cast<uint32_t>(begin), row_address + uint64_t(c0 + begin) * map.element_bytes,
            static_cast<uint32_t>(end - begin));
    if (end < box.size[0] && rows_in_bounds)
      visit(first + static_cast<uint32_t>(end), uint64_t{0}, static_cast<uint32_t>(box.size[0] - end));
  }
}

}  // namespace

// ---- Tensor maps ----

std::string tma::encode(void* destination, uint32_t data_type, uint32_t rank, const void* base,
                        const uint64_t* dims, const uint64_t* strides, const uint32_t* box,
                        const uint32_t* element_strides, uint32_t interleave, uint32_t swizzle,
                        uint32_t oob_fill) {
  if (destination == nullptr || reinterpret_cast<uintptr_t>(destination) % 64 != 0)
    return "tensorMap must be 64-byte aligned";
  const uint32_t bytes = element_bytes(data_type);
  if (bytes == 0) return "tensorDataType is not a CUtensorMapDataType";
  if (rank < 1 || rank > 5) return "tensorRank must be 1 to 5";
  if (base == nullptr || reinterpret_cast<uintptr_t>(base) % 16 != 0)
    return "globalAddress must be 16-byte aligned";
  if (interleave != 0) return "interleaved layouts are not emulated";
  if (swizzle > 3) return "swizzle is not a CUtensorMapSwizzle";
  if (oob_fill > 1) return "oobFill is not a CUtensorMapFloatOOBfill";
  if (oob_fill == 1 && !floating_point(data_type)) return "oobFill NaN needs a floating-point tensorDataType";
  TensorMap map;
  map.magic = TensorMap::kMagic;
  map.rank = static_cast<uint8_t>(rank);
  map.element_bytes = static_cast<uint8_t>(bytes);
  map.data_type = static_cast<uint8_t>(data_type);
  map.swizzle = static_cast<uint8_t>(swizzle);
  map.nan_fill = static_cast<uint8_t>(oob_fill);
  map.base = reinterpret_cast<uintptr_t>(base);
  for (uint32_t d = 0; d < rank; ++d) {
    if (dims[d] == 0 || dims[d] > (uint64_t{1} << 32)) return "globalDim must be 1 to 2^32";
    if (box[d] == 0 || box[d] > 256) return "boxDim must be 1 to 256";
    if (element_strides[d] == 0 || element_strides[d] > 8) return "elementStrides must be 1 to 8";
    if (element_strides[d] != 1) return "elementStrides other than 1 are not emulated";
    map.dims_minus_one[d] = static_cast<uint32_t>(dims[d] - 1);
    map.box[d] = static_cast<uint8_t>(box[d] - 1);
  }
  for (uint32_t d = 0; d + 1 < rank; ++d) {
    if (strides[d] % 16 != 0 || strides[d] >= (uint64_t{1} << 40))
      return "globalStrides must be multiples of 16 below 2^40";
    map.strides[d] = strides[d];
  }
  if (box[0] * bytes % 16 != 0) return "boxDim[0] * the element size must be a multiple of 16 bytes";
  if (swizzle != 0 && box[0] * bytes > swizzle_span_bytes(swizzle))
    return "with a swizzle, boxDim[0] * the element size must be at most the swizzle span";
  std::memset(destination, 0, 128);
  std::memcpy(destination, &map, sizeof map);
  return "";
}

// ---- mbarriers ----

MBarrier& BlockRunner::mbarrier(ThreadState& self, const void* pointer, const char* operation, Where where) {
  const uint32_t address = shared_offset(self, pointer, 8, operation, where);
  for (MBarrier& b : mbarriers_) {
    if (b.address != address) continue;
    if (self.tid != b.init_thread && std::max(clock(self.tid)[b.init_thread], clock_floor_) < b.init_step) {
      const ThreadState& initializer = threads_[b.init_thread];
      fail(self, operation, " (", where, ") on the mbarrier at shared address ", Hex{address},
           " before its initialization by warp ", initializer.warp(), " lane ", initializer.lane(), " (",
           b.init_where, ") is ordered before it: a barrier (__syncthreads) belongs between them");
    }
    return b;
  }
  fail(self, operation, " (", where, "): shared address ", Hex{address},
       " holds no initialized mbarrier (mbarrier.init)");
}

void BlockRunner::mbarrier_init(ThreadState& self, const void* pointer, uint32_t count, Where where) {
  const uint32_t address = shared_offset(self, pointer, 8, "mbarrier.init", where);
  if (address % 8 != 0) fail(self, "mbarrier.init (", where, "): ", Hex{address}, " is not 8-byte aligned");
  if (count < 1 || count > kMaxTransactionCount)
    fail(self, "mbarrier.init (", where, "): the count ", count, " must be 1 to 2^20 - 1");
  for (const MBarrier& b : mbarriers_)
    if (b.address == address)
      fail(self, "mbarrier.init (", where, ") of the mbarrier at shared address ", Hex{address},
           ", which is initialized already (", b.init_where, "): mbarrier.inval must come first");
  check_not_in_flight(self, address, 8, true, "mbarrier.init");
  shared_access(self, address, 8, true);  // races with the memory's earlier use
  std::fill_n(&pending_[address], 8, kMbarrierObject);
  MBarrier b;
  b.address = address;
  b.count = b.pending = count;
  b.init_thread = self.tid;
  b.init_step = clock(self.tid)[self.tid];
  b.init_where = where;
  b.released.assign(static_cast<size_t>(thread_count_), 0);
  mbarriers_.push_back(std::move(b));
}

void BlockRunner::mbarrier_arrive(ThreadState& self, const void* pointer, uint32_t expect_tx_bytes,
                                  Where where) {
  const char* operation = expect_tx_bytes > 0 ? "mbarrier.arrive.expect_tx" : "mbarrier.arrive";
  MBarrier& b = mbarrier(self, pointer, operation, where);
  if (b.pending == 0)
    fail(self, operation, " (", where, ") on the mbarrier at shared address ", Hex{b.address}, " in phase ",
         b.phase, ", whose ", b.count, " expected arrivals have all happened (it waits for ", b.tx,
         " more transaction bytes): one arrival too many");
  b.tx += expect_tx_bytes;
  b.tx_announced += expect_tx_bytes;
  if (b.tx > kMaxTransactionCount)
    fail(self, operation, " (", where, "): the tx-count of the mbarrier at shared address ", Hex{b.address},
         " would reach ", b.tx, ", past 2^20 - 1");
  join_into(b.released, self.tid);
  tick(self.tid);
  self.last_sync = where;
  self.last_sync_operation = operation;
  if (--b.pending > 0) return;
  if (b.tx < 0)
    fail(self, operation, " (", where, ") completes the arrivals of phase ", b.phase,
         " of the mbarrier at shared address ", Hex{b.address}, ", whose copies delivered ", -b.tx,
         " transaction bytes more than its expect-tx announced (", b.tx_delivered, " delivered, ",
         b.tx_announced, " announced)");
  if (b.tx == 0) complete_phase(b);
}

void BlockRunner::mbarrier_wait(ThreadState& self, const void* pointer, uint32_t parity, Where where) {
  const char* operation = "mbarrier.try_wait.parity";
  MBarrier& b = mbarrier(self, pointer, operation, where);
  count::mbarrier_wait();
  if (parity > 1) fail(self, operation, " (", where, "): the parity ", parity, " must be 0 or 1");
  self.last_sync = where;
  self.last_sync_operation = operation;
  // Complete when the phase of that parity is the one before the current phase (PTX ISA: waitComplete).
  if ((b.phase & 1) != parity) {
    if (!b.completed[parity].empty()) acquire(self.tid, b.completed[parity]);
    if (should_preempt()) yield(self);
    return;
  }
  b.waiters.push_back(self.tid);
  self.wait_barrier = b.address;
  self.wait_parity = parity;
  wait(self, operation, where);  // complete_phase() acquires for it and wakes it
}

void BlockRunner::complete_phase(MBarrier& b) {
  const uint32_t parity = b.phase & 1;
  b.completed[parity] = b.released;
  std::fill(b.released.begin(), b.released.end(), 0u);
  ++b.phase;
  b.pending = b.count;
  b.tx_announced = b.tx_delivered = 0;
  std::vector<int> still;
  for (int tid : b.waiters) {
    if (threads_[tid].wait_parity == parity) {
      acquire(tid, b.completed[parity]);
      wake(tid);
    } else {
      still.push_back(tid);
    }
  }
  b.waiters = std::move(still);
}

void BlockRunner::complete_tx(MBarrier& b, int64_t bytes, const BulkLoad& load) {
  b.tx -= bytes;
  b.tx_delivered += bytes;
  // The copy's writes are the issuer's, at the step it issued them: waiters acquire that much.
  b.released[load.issuer] = std::max(b.released[load.issuer], load.issue_step);
  const ThreadState& issuer = threads_[load.issuer];
  if (b.tx < -kMaxTransactionCount && scheduler_error_.empty())
    scheduler_error_ =
        describe(issuer.tid) + ": " +
        compose("the TMA load issued at ", load.where, " takes the tx-count of the mbarrier at ",
                Hex{b.address}, " below -(2^20 - 1)");
  if (b.pending > 0) return;
  if (b.tx == 0) {
    complete_phase(b);
  } else if (b.tx < 0 && scheduler_error_.empty()) {
    scheduler_error_ = describe(issuer.tid) + ": " +
                       compose("the TMA load issued at ", load.where, " completes ", bytes,
                               " transaction bytes on phase ", b.phase, " of the mbarrier at shared address ",
                               Hex{b.address}, ", whose arrivals have all happened: its copies delivered ",
                               b.tx_delivered, " bytes, but arrive.expect_tx announced ", b.tx_announced);
  }
}

std::string BlockRunner::describe_mbarrier(const MBarrier& b) const {
  return compose("the mbarrier at shared address ", Hex{b.address}, " (initialized at ", b.init_where,
                 " with count ", b.count, ") is in phase ", b.phase, " (parity ", b.phase & 1, ") with ",
                 b.pending, " of ", b.count, " arrivals and ", b.tx, " transaction bytes outstanding (",
                 b.tx_announced, " announced, ", b.tx_delivered, " delivered)");
}

// ---- TMA loads ----

void BlockRunner::begin_bulk_load(ThreadState& self, uint32_t destination, uint32_t bytes,
                                  const char* operation) {
  check_not_in_flight(self, destination, bytes, true, operation);
  // Ordering-wise the copy writes now (its data lands later): it must not overtake other threads' accesses.
  // It is recorded as the async proxy's write.
  shared_access(self, destination, bytes, true, true);
  std::fill_n(&pending_[destination], bytes, kPendingBulkLoad);
  std::memset(shared_base_ + destination, 0xff, bytes);  // poison until it lands
}

void BlockRunner::add_bulk_load(ThreadState& self, BulkLoad load) {
  load.issuer = self.tid;
  load.issue_step = clock(self.tid)[self.tid];
  bulk_loads_.push_back(std::move(load));
}

void BlockRunner::land(BulkLoad& load) {
  std::memcpy(shared_base_ + load.destination, load.data.data(), load.data.size());
  for (uint32_t a = load.destination; a < load.destination + load.data.size(); ++a)
    if (pending_[a] == kPendingBulkLoad) pending_[a] = 0;
  for (MBarrier& b : mbarriers_)
    if (b.address == load.barrier) complete_tx(b, static_cast<int64_t>(load.data.size()), load);
}

void BlockRunner::land_bulk_loads(bool all) {
  if (bulk_loads_.empty()) return;
  std::vector<BulkLoad> still;
  for (BulkLoad& load : bulk_loads_) {
    if (all || !schedule_.shuffled || random_() % static_cast<uint64_t>(schedule_.tma_landing_odds) == 0)
      land(load);
    else
      still.push_back(std::move(load));
  }
  bulk_loads_ = std::move(still);
}

// ---- TMA stores ----

void BlockRunner::lock_bulk_read(ThreadState& self, SharedRange range) {
  for (uint32_t a = range.address; a < range.address + range.bytes; ++a)
    if (pending_[a] == 0) pending_[a] = kPendingBulkRead;
  self.bulk_uncommitted.push_back(range);
}

void BlockRunner::release_bulk_reads(ThreadState& self, int pending) {
  while (self.bulk_committed.size() > static_cast<size_t>(pending)) {
    for (const SharedRange& range : self.bulk_committed.front())
      for (uint32_t a = range.address; a < range.address + range.bytes; ++a)
        if (pending_[a] == kPendingBulkRead) pending_[a] = 0;
    self.bulk_committed.erase(self.bulk_committed.begin());
  }
}

// ---- The emulated instructions (device.hpp) ----

void mbarrier_init(void* barrier, uint32_t count, Where where) {
  const Entered entered("mbarrier.init");
  ThreadState& t = entered;
  t.block->mbarrier_init(t, barrier, count, where);
}

void fence_mbarrier_init(Where) {
  // Orders this thread's mbarrier.init before later uses across the cluster; within the block the emulator
  // asks only that every use be ordered after the initialization (a barrier between them).
  const Entered entered("fence.mbarrier_init");
}

void mbarrier_arrive(void* barrier, uint32_t expect_tx_bytes, Where where) {
  const Entered entered("mbarrier.arrive");
  ThreadState& t = entered;
  t.block->mbarrier_arrive(t, barrier, expect_tx_bytes, where);
}

void mbarrier_wait_parity(void* barrier, uint32_t parity, Where where) {
  const Entered entered("mbarrier.try_wait.parity");
  ThreadState& t = entered;
  t.block->mbarrier_wait(t, barrier, parity, where);
}

namespace {

// A TMA copy's box and shared-memory side, checked: the map, its box, and the 128-byte aligned shared address
// (`side` is "destination" or "source", for the message).
struct TmaCopy {
  tma::TensorMap map;
  Box box;
  uint32_t bytes = 0, shared = 0;
  const char* operation = nullptr;
};
TmaCopy resolve(BlockRunner& block, const ThreadState& t, const void* tensor_map, const void* pointer,
                int rank, const char* side, Where where) {
  TmaCopy copy;
  copy.operation = tma_load_name(rank);
  copy.map = read_map(block, t, tensor_map, rank, copy.operation, where);
  copy.box = box_of(copy.map);
  copy.bytes = copy.box.elements * copy.map.element_bytes;
  copy.shared = block.shared_offset(t, pointer, copy.bytes, copy.operation, where);
  if (copy.shared % 128 != 0)
    block.fail(t, copy.operation, " (", where, "): the ", side, " ", Hex{copy.shared},
               " must be 128-byte aligned (CUDA Programming Guide, \"Tensor Memory Access\")");
  return copy;
}

// Every element of the box inside the tensor must be device memory.
void check_tensor_memory(BlockRunner& block, const ThreadState& t, const TmaCopy& copy,
                         const int32_t* coordinates, bool write, Where where) {
  for_each_run(copy.map, copy.box, coordinates, [&](uint32_t, uint64_t address, uint32_t count) {
    const uint32_t run_bytes = count * copy.map.element_bytes;
    if (address != 0 && !is_device_range(reinterpret_cast<const void*>(address), run_bytes)) {
      std::string problem =
          compose(copy.operation, " (", where, ") ", write ? "writes " : "reads ", run_bytes,
                  " bytes of the tensor at ", Hex{address}, ", which is not device memory: ") +
          describe_device_address(address);
      block.fail_with(t, std::move(problem));
    }
  });
}

}  // namespace

void tma_load(void* destination, const void* tensor_map, void* barrier, const int32_t* coordinates, int rank,
              Where where) {
  const Entered entered("cp.async.bulk.tensor");
  ThreadState& t = entered;
  BlockRunner& block = *t.block;
  const TmaCopy copy = resolve(block, t, tensor_map, destination, rank, "destination", where);
  const uint32_t barrier_address = block.mbarrier(t, barrier, copy.operation, where).address;
  // Every check that can fail comes before anything is allocated (a failing fiber's stack is abandoned).
  check_tensor_memory(block, t, copy, coordinates, false, where);
  block.begin_bulk_load(t, copy.shared, copy.bytes, copy.operation);
  BulkLoad load;
  load.destination = copy.shared;
  load.barrier = barrier_address;
  load.where = where;
  load.data.resize(copy.bytes);
  const uint8_t fill = copy.map.nan_fill != 0 ? 0xff : 0;  // 0xff bytes: a NaN of every floating-point format
  const uint32_t element_bytes = copy.map.element_bytes;
  for_each_run(copy.map, copy.box, coordinates, [&](uint32_t first, uint64_t address, uint32_t count) {
    const auto* values = reinterpret_cast<const uint8_t*>(address);
    if (address != 0) count::global(size_t(count) * element_bytes, false);
    for (uint32_t byte = 0; byte < count * element_bytes; ++byte) {
      const uint32_t at = tma::shared_address(copy.map.swizzle, copy.shared, first * element_bytes + byte);
      load.data[at - copy.shared] = address != 0 ? values[byte] : fill;
    }
  });
  block.add_bulk_load(t, std::move(load));
  count::instruction(Access::tma_shared, {1, (copy.bytes + 127) / 128, (copy.bytes + 127) / 128});
}

void tma_store(const void* tensor_map, const void* source, const int32_t* coordinates, int rank,
               Where where) {
  const Entered entered("cp.async.bulk.tensor");
  ThreadState& t = entered;
  BlockRunner& block = *t.block;
  const TmaCopy copy = resolve(block, t, tensor_map, source, rank, "source", where);
  // Unlike a load's, a store's box cannot start before the tensor: "When writing from shared to global
  // memory, parts of the tile may be out of bounds, but the top left corner cannot have any negative indices"
  // (CUDA C++ Programming Guide, "Using TMA to transfer multi-dimensional arrays"). A GPU stops the kernel
  // with cudaErrorIllegalInstruction.
  for (int d = 0; d < rank; ++d)
    if (coordinates[d] < 0) {
      std::string corner = "(";
      for (int e = 0; e < rank; ++e) corner += std::to_string(coordinates[e]) + (e + 1 < rank ? ", " : ")");
      block.fail(t, copy.operation, " (", where, "): a store to the box at ", corner,
                 ", whose top-left corner has negative indices: a store's box may run past the tensor's "
                 "end, where its elements are dropped, but cannot start before it (CUDA C++ Programming "
                 "Guide, \"Using TMA to transfer multi-dimensional arrays\"); a GPU stops the kernel with an "
                 "illegal instruction");
    }
  block.check_async_read(t, block.clock(t.tid), copy.shared, copy.bytes, copy.operation, where);
  check_tensor_memory(block, t, copy, coordinates, true, where);
  // Elements out of the tensor's bounds are dropped.
  const uint32_t element_bytes = copy.map.element_bytes;
  for_each_run(copy.map, copy.box, coordinates, [&](uint32_t first, uint64_t address, uint32_t count) {
    auto* out = reinterpret_cast<uint8_t*>(address);
    if (address != 0) count::global(size_t(count) * element_bytes, true);
    for (uint32_t byte = 0; address != 0 && byte < count * element_bytes; ++byte)
      out[byte] = static_cast<uint8_t>(block.shared_base()[tma::shared_address(
          copy.map.swizzle, copy.shared, first * element_bytes + byte)]);
  });
  block.lock_bulk_read(t, {copy.shared, copy.bytes});
  count::instruction(Access::tma_shared, {1, (copy.bytes + 127) / 128, (copy.bytes + 127) / 128});
}

void bulk_commit_group(Where) {
  const Entered entered("cp.async.bulk.commit_group");
  ThreadState& t = entered;
  t.bulk_committed.push_back(std::move(t.bulk_uncommitted));
  t.bulk_uncommitted.clear();
}

void bulk_wait_group_read(int pending, Where) {
  const Entered entered("cp.async.bulk.wait_group.read");
  ThreadState& t = entered;
  t.block->release_bulk_reads(t, pending);
}

void fence_proxy_async(Where where) {
  const Entered entered("fence.proxy.async");
  ThreadState& t = entered;
  t.proxy_fence_step = t.block->clock(t.tid)[t.tid];
  t.block->tick(t.tid);  // its later stores are not covered
  t.last_sync = where;
  t.last_sync_operation = "fence.proxy.async";
}

}  // namespace flashlab::emulator
