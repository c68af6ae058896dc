// The emulated bodies of the CUDA built-ins and of the sm_80 PTX instructions the kernels use (device.hpp).
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/number_format.hpp"
#include "emulator/block.hpp"
#include "emulator/counters.hpp"
#include "emulator/fragments.hpp"
#include "emulator/memory.hpp"

namespace flashlab::emulator {

// ---- Who am I ----

Index3 thread_index() {
  const Entered entered("threadIdx");
  return static_cast<ThreadState&>(entered).index;
}
Index3 block_index() {
  const Entered entered("blockIdx");
  return static_cast<ThreadState&>(entered).block->block_index();
}
Index3 block_dim() {
  const Entered entered("blockDim");
  return static_cast<ThreadState&>(entered).block->launch().block;
}
Index3 grid_dim() {
  const Entered entered("gridDim");
  return static_cast<ThreadState&>(entered).block->launch().grid;
}

// ---- Barriers ----

void barrier_sync(unsigned id, unsigned threads, Where where) {
  const Entered entered("bar.sync");
  ThreadState& t = entered;
  t.block->barrier(t, id, threads, true, false, "bar.sync", where);
}

void barrier_arrive(unsigned id, unsigned threads, Where where) {
  const Entered entered("bar.arrive");
  ThreadState& t = entered;
  t.block->barrier(t, id, threads, false, false, "bar.arrive", where);
}

void sync_threads(Where where) {
  const Entered entered("__syncthreads");
  ThreadState& t = entered;
  t.block->barrier(t, 0, static_cast<unsigned>(t.block->threads()), true, false, "__syncthreads", where);
}

int sync_threads_count(bool predicate, Where where) {
  const Entered entered("__syncthreads_count");
  ThreadState& t = entered;
  return t.block->barrier(t, 0, static_cast<unsigned>(t.block->threads()), true, predicate,
                          "__syncthreads_count/and/or", where);
}

// ---- Warp collectives ----

void sync_warp(unsigned mask, Where where) {
  const Entered entered("__syncwarp");
  ThreadState& t = entered;
  t.block->collective(
      t, "__syncwarp", mask, nullptr,
      [](BlockRunner& block, Collective& c, int warp) { block.order_lanes(warp, c.mask); }, where);
}

namespace {

struct ShuffleLane {
  ShuffleMode mode;
  uint32_t value;
  unsigned b, c;
  uint32_t result;
};

const char* shuffle_name(ShuffleMode mode) {
  switch (mode) {
    case ShuffleMode::up:
      return "__shfl_up_sync";
    case ShuffleMode::down:
      return "__shfl_down_sync";
    case ShuffleMode::bfly:
      return "__shfl_xor_sync";
    default:
      return "__shfl_sync";
  }
}

// shfl.sync (PTX ISA): the source lane j of each lane, from its b and c operands; a j outside the lane's
// segment (or past the clamp) reads the lane's own value.
void complete_shuffle(BlockRunner& block, Collective& c, int warp) {
  for (int lane = 0; lane < 32; ++lane) {
    if ((c.mask >> lane & 1u) == 0) continue;
    auto& me = *static_cast<ShuffleLane*>(c.lane_data[lane]);
    const unsigned segment_mask = (me.c >> 8) & 0x1f, clamp = me.c & 0x1f, b = me.b & 0x1f;
    const int max_lane = static_cast<int>((lane & segment_mask) | (clamp & ~segment_mask));
    const int min_lane = static_cast<int>(lane & segment_mask);
    int j = lane;
    bool in_range = true;
    switch (me.mode) {
      case ShuffleMode::up:
        j = lane - static_cast<int>(b);
        in_range = j >= max_lane;
        break;
      case ShuffleMode::down:
        j = lane + static_cast<int>(b);
        in_range = j <= max_lane;
        break;
      case ShuffleMode::bfly:
        j = lane ^ static_cast<int>(b);
        in_range = j <= max_lane;
        break;
      case ShuffleMode::idx:
        j = min_lane | static_cast<int>(b & ~segment_mask);
        in_range = j <= max_lane;
        break;
    }
    if (!in_range) j = lane;
    if ((c.mask >> j & 1u) == 0)
      block.fail(block.thread(warp * 32 + lane), shuffle_name(me.mode), " (", c.where, "): reads lane ", j,
                 ", which the mask ", Mask{c.mask}, " does not name (its value is undefined)");
    me.result = static_cast<ShuffleLane*>(c.lane_data[j])->value;
  }
}

struct VoteLane {
  VoteMode mode;
  bool predicate;
  unsigned result;
};

void complete_vote(BlockRunner&, Collective& c, int) {
  unsigned ballot = 0;
  for (int lane = 0; lane < 32; ++lane)
    if ((c.mask >> lane & 1u) != 0 && static_cast<VoteLane*>(c.lane_data[lane])->predicate)
      ballot |= 1u << lane;
  for (int lane = 0; lane < 32; ++lane) {
    if ((c.mask >> lane & 1u) == 0) continue;
    auto& me = *static_cast<VoteLane*>(c.lane_data[lane]);
    switch (me.mode) {
      case VoteMode::ballot:
        me.result = ballot;
        break;
      case VoteMode::all:
        me.result = ballot == c.mask;
        break;
      case VoteMode::any:
        me.result = ballot != 0;
        break;
    }
  }
}

}  // namespace

uint32_t shuffle(ShuffleMode mode, unsigned mask, uint32_t value, unsigned lane_operand, unsigned clamp,
                 Where where) {
  const Entered entered("__shfl_sync");
  ThreadState& t = entered;
  ShuffleLane lane{mode, value, lane_operand, clamp, 0};
  t.block->collective(t, shuffle_name(mode), mask, &lane, complete_shuffle, where);
  return lane.result;
}

unsigned vote(VoteMode mode, unsigned mask, bool predicate, Where where) {
  const Entered entered("__ballot_sync");
  ThreadState& t = entered;
  VoteLane lane{mode, predicate, 0};
  const char* name = mode == VoteMode::ballot ? "__ballot_sync"
                     : mode == VoteMode::all  ? "__all_sync"
                                              : "__any_sync";
  t.block->collective(t, name, mask, &lane, complete_vote, where);
  return lane.result;
}

// ---- Shared memory ----

void* dynamic_shared_memory(size_t alignment) {
  const Entered entered("extern __shared__");
  ThreadState& t = entered;
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > 1024)
    t.block->fail(t, "dynamic shared memory: alignment ", alignment, " must be a power of two up to 1024");
  return t.block->shared_base() + BlockRunner::kReservedShared;
}

uint32_t shared_address(const void* generic, Where where) {
  const Entered entered("__cvta_generic_to_shared");
  ThreadState& t = entered;
  BlockRunner& block = *t.block;
  const auto address = reinterpret_cast<uintptr_t>(generic);
  if (!block.in_shared_window(address))
    block.fail(t, "__cvta_generic_to_shared (", where, "): ", Hex{address},
               " is not in this block's dynamic shared memory (static __shared__ variables are not in the "
               "emulated shared window)");
  return static_cast<uint32_t>(address - reinterpret_cast<uintptr_t>(block.shared_base()));
}

void* shared_pointer(uint32_t address, size_t bytes, Where where) {
  const Entered entered("shared address");
  ThreadState& t = entered;
  (void)where;
  t.block->check_shared_range(t, address, bytes, "shared address");
  return t.block->shared_base() + address;
}

// ---- cp.async ----

void cp_async(void* shared_destination, const void* global_source, int copy_bytes, int source_bytes,
              Where where) {
  const Entered entered("cp.async");
  ThreadState& t = entered;
  BlockRunner& block = *t.block;
  if (copy_bytes != 4 && copy_bytes != 8 && copy_bytes != 16)
    block.fail(t, "cp.async (", where, "): cp-size ", copy_bytes, " must be 4, 8 or 16");
  if (source_bytes < 0 || source_bytes > copy_bytes)
    block.fail(t, "cp.async (", where, "): src-size ", source_bytes, " must be in [0, cp-size ", copy_bytes,
               "]");
  const auto destination = reinterpret_cast<uintptr_t>(shared_destination);
  const auto source = reinterpret_cast<uintptr_t>(global_source);
  if (!block.in_shared_window(destination))
    block.fail(t, "cp.async (", where, "): the destination ", Hex{destination}, " is not shared memory");
  if (destination % static_cast<unsigned>(copy_bytes) != 0 || source % static_cast<unsigned>(copy_bytes) != 0)
    block.fail(t, "cp.async (", where, "): the source ", Hex{source}, " and destination ", Hex{destination},
               " must be aligned to the cp-size ", copy_bytes);
  AsyncCopy copy;
  copy.destination = static_cast<uint32_t>(destination - reinterpret_cast<uintptr_t>(block.shared_base()));
  copy.bytes = copy_bytes;
  copy.issued_at = where;
  std::memset(copy.data, 0, sizeof copy.data);  // src-size < cp-size: the rest is zero-filled
  if (source_bytes > 0) {
    const Launch& launch = block.launch();
    std::string problem = check_global_access(source, static_cast<size_t>(source_bytes), false,
                                              launch.parameters, launch.parameter_bytes);
    if (!problem.empty()) {
      problem = compose("cp.async (", where, ") source: ") + problem;
      block.fail_with(t, std::move(problem));
    }
    std::memcpy(copy.data, global_source, static_cast<size_t>(source_bytes));
    count::global(static_cast<size_t>(source_bytes), false);
  }
  if (counting()) {
    const uint64_t site = source_site(where);
    if (source_bytes > 0)
      count::lane_access(t.warp(), t.lane(), site, Access::cp_async_global, source,
                         static_cast<uint32_t>(source_bytes));
    count::lane_access(t.warp(), t.lane(), site, Access::cp_async_shared, copy.destination,
                       static_cast<uint32_t>(copy_bytes));
  }
  block.begin_async_write(t, copy.destination, copy_bytes, where);
  t.uncommitted.push_back(copy);
}

void cp_async_commit_group() {
  const Entered entered("cp.async.commit_group");
  ThreadState& t = entered;
  t.committed.push_back(std::move(t.uncommitted));
  t.uncommitted.clear();
}

void cp_async_wait_group(int pending, Where where) {
  const Entered entered("cp.async.wait_group");
  ThreadState& t = entered;
  (void)where;
  while (t.committed.size() > static_cast<size_t>(pending)) {
    for (const AsyncCopy& copy : t.committed.front()) t.block->complete_async_write(t, copy);
    t.committed.erase(t.committed.begin());
  }
}

// ---- ldmatrix ----

namespace {

struct LdmatrixLane {
  const void* row;
  uint32_t* registers;
  int matrices;
  bool transpose;
};

void complete_ldmatrix(BlockRunner& block, Collective& c, int warp) {
  const auto& first = *static_cast<LdmatrixLane*>(c.lane_data[0]);
  uint16_t matrix[4][fragments::ldmatrix::rows][fragments::ldmatrix::cols];
  LaneAccess rows[32];
  int row_count = 0;
  for (int m = 0; m < first.matrices; ++m)
    for (int r = 0; r < fragments::ldmatrix::rows; ++r) {
      const int lane = fragments::ldmatrix::address_lane(m, r);
      ThreadState& supplier = block.thread(warp * 32 + lane);
      const auto address = reinterpret_cast<uintptr_t>(static_cast<LdmatrixLane*>(c.lane_data[lane])->row);
      if (!block.in_shared_window(address) || address % 16 != 0)
        block.fail(supplier, c.operation, " (", c.where, "): the row address ", Hex{address}, " of matrix ",
                   m, ", row ", r, " must be 16-byte aligned shared memory");
      const auto shared = static_cast<uint32_t>(address - reinterpret_cast<uintptr_t>(block.shared_base()));
      block.shared_access(supplier, shared, 16, false);
      std::memcpy(matrix[m][r], block.shared_base() + shared, 16);
      rows[row_count++] = {lane, shared, 16};
    }
  count::instruction(Access::ldmatrix, wavefronts({rows, static_cast<size_t>(row_count)}));
  for (int lane = 0; lane < 32; ++lane) {
    auto& me = *static_cast<LdmatrixLane*>(c.lane_data[lane]);
    for (int m = 0; m < me.matrices; ++m) {
      const fragments::Element low = fragments::ldmatrix::element(lane, 0, me.transpose);
      const fragments::Element high = fragments::ldmatrix::element(lane, 1, me.transpose);
      me.registers[m] = uint32_t(matrix[m][low.row][low.col]) | uint32_t(matrix[m][high.row][high.col]) << 16;
    }
  }
}

}  // namespace

void ldmatrix(uint32_t* registers, int matrices, bool transpose, const void* shared_row, Where where) {
  const Entered entered("ldmatrix");
  ThreadState& t = entered;
  static constexpr const char* names[2][5] = {
      {"", "ldmatrix.x1", "ldmatrix.x2", "", "ldmatrix.x4"},
      {"", "ldmatrix.x1.trans", "ldmatrix.x2.trans", "", "ldmatrix.x4.trans"}};
  if (matrices != 1 && matrices != 2 && matrices != 4)
    t.block->fail(t, "ldmatrix (", where, "): .x", matrices, " must be .x1, .x2 or .x4");
  LdmatrixLane lane{shared_row, registers, matrices, transpose};
  t.block->collective(t, names[transpose][matrices], 0xffffffffu, &lane, complete_ldmatrix, where);
}

void ldmatrix(uint32_t* registers, int matrices, bool transpose, uint32_t shared_row, Where where) {
  const Entered entered("ldmatrix");
  ThreadState& t = entered;
  // Formed as an integer and left unchecked here: complete_ldmatrix checks the rows it reads.
  const uintptr_t generic = reinterpret_cast<uintptr_t>(t.block->shared_base()) + shared_row;
  ldmatrix(registers, matrices, transpose, reinterpret_cast<const void*>(generic), where);
}

// ---- mma.sync m16n8k16 ----

namespace {

struct MmaLane {
  float* d;
  const uint32_t* a;
  const uint32_t* b;
  const float* c;
  MmaInput input;
};

float decode(uint16_t bits, MmaInput input) {
  return input == MmaInput::f16 ? decode_fp16(bits) : decode_bf16(bits);
}

// Each product of two 16-bit values is exact in fp32 and the sum is formed in fp64 and rounded once: the
// tensor cores' own internal precision and rounding are not specified (and not emulated), so results can
// differ from a GPU's in the last bits of fp32.
void complete_mma(BlockRunner&, Collective& c, int) {
  namespace f = fragments::m16n8k16;
  count::mma_sync();
  float a[f::M][f::K], b[f::K][f::N], acc[f::M][f::N];
  for (int lane = 0; lane < 32; ++lane) {
    const auto& me = *static_cast<MmaLane*>(c.lane_data[lane]);
    for (int reg = 0; reg < f::a_registers; ++reg)
      for (int half = 0; half < 2; ++half) {
        const fragments::Element e = f::a(lane, reg, half);
        a[e.row][e.col] = decode(static_cast<uint16_t>(me.a[reg] >> (16 * half)), me.input);
      }
    for (int reg = 0; reg < f::b_registers; ++reg)
      for (int half = 0; half < 2; ++half) {
        const fragments::Element e = f::b(lane, reg, half);
        b[e.row][e.col] = decode(static_cast<uint16_t>(me.b[reg] >> (16 * half)), me.input);
      }
    for (int reg = 0; reg < f::c_registers; ++reg) {
      const fragments::Element e = f::c(lane, reg);
      acc[e.row][e.col] = me.c[reg];
    }
  }
  float d[f::M][f::N];
  for (int i = 0; i < f::M; ++i)
    for (int j = 0; j < f::N; ++j) {
      double sum = acc[i][j];
      for (int k = 0; k < f::K; ++k) sum += static_cast<double>(a[i][k]) * b[k][j];
      d[i][j] = static_cast<float>(sum);
    }
  for (int lane = 0; lane < 32; ++lane) {
    const auto& me = *static_cast<MmaLane*>(c.lane_data[lane]);
    for (int reg = 0; reg < f::c_registers; ++reg) {
      const fragments::Element e = f::c(lane, reg);
      me.d[reg] = d[e.row][e.col];
    }
  }
}

}  // namespace

void mma_m16n8k16(float* d, const uint32_t* a, const uint32_t* b, const float* c, MmaInput input,
                  Where where) {
  const Entered entered("mma.sync");
  ThreadState& t = entered;
  MmaLane lane{d, a, b, c, input};
  t.block->collective(t, input == MmaInput::f16 ? "mma.sync.m16n8k16.f32.f16" : "mma.sync.m16n8k16.f32.bf16",
                      0xffffffffu, &lane, complete_mma, where);
}

// ---- Atomics ----

namespace {

// An atomic's address must be device memory or this block's shared memory. One on global memory is counted:
// its element's bytes, and while counting is on, the lane's access of `lane_bytes` at `where` (0: the caller
// counts the access, as a vector red counts its whole vector once).
template <typename T>
T* atomic_target(T* address, const char* operation, const Where& where, uint32_t lane_bytes = sizeof(T)) {
  const Entered entered(operation);
  ThreadState& t = entered;
  BlockRunner& block = *t.block;
  const auto at = reinterpret_cast<uintptr_t>(address);
  if (at % sizeof(T) != 0)
    block.fail(t, operation, ": ", Hex{at}, " is not aligned to ", sizeof(T), " bytes");
  if (block.in_shared_window(at)) {
    block.check_shared_range(t, static_cast<uint32_t>(at - reinterpret_cast<uintptr_t>(block.shared_base())),
                             sizeof(T), operation);
  } else if (!is_device_range(address, sizeof(T))) {
    std::string problem =
        compose(operation, " at ", Hex{at}, ": not device memory (") + describe_device_address(at) + ")";
    block.fail_with(t, std::move(problem));
  } else {
    count::global_atomic(sizeof(T));
    if (lane_bytes > 0 && counting())
      count::lane_access(t.warp(), t.lane(), source_site(where), Access::global_atomic, at, lane_bytes);
  }
  return address;
}

float add_float(float* target_address, float value) {
  std::atomic_ref<float> target(*target_address);
  float old = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(old, old + value, std::memory_order_relaxed)) {
  }
  return old;
}

}  // namespace

int atomic_add(int* address, int value, Where where) {
  return std::atomic_ref<int>(*atomic_target(address, "atomicAdd", where))
      .fetch_add(value, std::memory_order_relaxed);
}
unsigned atomic_add(unsigned* address, unsigned value, Where where) {
  return std::atomic_ref<unsigned>(*atomic_target(address, "atomicAdd", where))
      .fetch_add(value, std::memory_order_relaxed);
}
float atomic_add(float* address, float value, Where where) {
  return add_float(atomic_target(address, "atomicAdd", where), value);
}
void red_add_f32_vector(float* address, const float* values, int width, Where where) {
  const char* const name = width == 4 ? "red.global.add.v4.f32" : "red.global.add.v2.f32";
  {
    const Entered entered(name);
    ThreadState& t = entered;
    const auto at = reinterpret_cast<uintptr_t>(address);
    const auto alignment = static_cast<uintptr_t>(4 * width);
    if (width != 2 && width != 4)
      t.block->fail(t, "red.global.add: ", width, " is not a vector width (2 or 4)");
    if (at % alignment != 0)
      t.block->fail(t, name, ": ", Hex{at}, " is not aligned to ", alignment, " bytes");
    if (t.block->in_shared_window(at))
      t.block->fail(t, name, ": ", Hex{at}, " is shared memory; a vector red takes global only");
  }
  // Each element checked and its bytes counted as an atomic of its own; the lane's access is the vector's.
  const auto vector_bytes = static_cast<uint32_t>(4 * width);
  for (int i = 0; i < width; ++i)
    add_float(atomic_target(address + i, name, where, i == 0 ? vector_bytes : 0), values[i]);
}
int atomic_max(int* address, int value, Where where) {
  std::atomic_ref<int> target(*atomic_target(address, "atomicMax", where));
  int old = target.load(std::memory_order_relaxed);
  while (old < value && !target.compare_exchange_weak(old, value, std::memory_order_relaxed)) {
  }
  return old;
}
int atomic_min(int* address, int value, Where where) {
  std::atomic_ref<int> target(*atomic_target(address, "atomicMin", where));
  int old = target.load(std::memory_order_relaxed);
  while (old > value && !target.compare_exchange_weak(old, value, std::memory_order_relaxed)) {
  }
  return old;
}
int atomic_exchange(int* address, int value, Where where) {
  return std::atomic_ref<int>(*atomic_target(address, "atomicExch", where))
      .exchange(value, std::memory_order_relaxed);
}
int atomic_compare_exchange(int* address, int compare, int value, Where where) {
  std::atomic_ref<int>(*atomic_target(address, "atomicCAS", where))
      .compare_exchange_strong(compare, value, std::memory_order_relaxed);
  return compare;
}

// ---- Special functions ----

float ex2_approx(float x, bool flush_subnormals) {
  if (flush_subnormals && std::fpclassify(x) == FP_SUBNORMAL) x = std::copysign(0.0f, x);
  float y = std::exp2(x);
  if (flush_subnormals && std::fpclassify(y) == FP_SUBNORMAL) y = 0.0f;
  return y;
}

}  // namespace flashlab::emulator
