// Warpgroups (sm_90): their rendezvous, wgmma and its fence / commit / wait protocol, setmaxnreg's register
// pool; and what the block checks of all sm_90 state when a thread exits, when the block ends and when it
// deadlocks.
//
// wgmma.mma_async is emulated when its warpgroup meets at it: the operands are read then (A and B from
// shared memory through their descriptors, emulator/gmma.hpp, or A from the 128 threads' registers), the
// product is computed, and the accumulator registers are set to NaN. Each product of two inputs is exact. For
// bf16 and f16 the sum over K is formed in fp64 and rounded to fp32 once per instruction (the PTX ISA leaves
// the tensor cores' precision and rounding open; these differ from the hardware's in fp32's last bits). For
// e4m3 it is the hardware's, as measured and modeled (common/e4m3_block_sum.hpp: 13 bits kept). The result
// reaches them at the wgmma.wait_group that completes the instruction's group; by then its shared-memory
// operands must not have changed (they are read again and compared), and nothing may have written its
// accumulators.
#include <algorithm>
#include <bit>
#include <cstring>

#include "common/e4m3_block_sum.hpp"
#include "common/number_format.hpp"
#include "emulator/block.hpp"
#include "emulator/counters.hpp"
#include "emulator/gmma.hpp"
#include "emulator/report.hpp"

namespace flashlab::emulator {

namespace {

constexpr uint32_t kAccumulatorPoison = 0xffffffffu;  // NaN

uint32_t input_bytes(WgmmaInput input) {
  return input == WgmmaInput::e4m3 ? 1 : 2;
}

double decode_input(const uint8_t* bytes, WgmmaInput input) {
  if (input == WgmmaInput::e4m3) return decode_e4m3(bytes[0]);
  const auto bits = static_cast<uint16_t>(bytes[0] | bytes[1] << 8);
  return input == WgmmaInput::f16 ? decode_fp16(bits) : decode_bf16(bits);
}

}  // namespace

// ---- Warpgroup rendezvous ----

void BlockRunner::warpgroup_collective(ThreadState& self, const char* operation, void* thread_data,
                                       void (*complete)(BlockRunner&, GroupCollective&, int), Where where) {
  const int index = self.warpgroup();
  if ((index + 1) * 128 > thread_count_)
    fail(self, operation, " (", where, "): warpgroup ", index, " is incomplete (the block has ",
         thread_count_, " threads; a warpgroup is 4 whole warps)");
  for (int tid = index * 128; tid < (index + 1) * 128; ++tid)
    if (threads_[tid].status == ThreadState::Status::exited)
      fail(self, operation, " (", where, "): warp ", tid / 32, " lane ", tid % 32,
           " of its warpgroup has exited: .sync.aligned operations need all 128 threads");
  GroupCollective& c = warpgroups_[index].collective;
  if (c.operation == nullptr) {
    c.operation = operation;
    c.where = where;
    c.arrived = 0;
    c.complete = complete;
    std::fill(std::begin(c.thread_data), std::end(c.thread_data), nullptr);
  } else if (std::strcmp(c.operation, operation) != 0) {
    fail(self, operation, " (", where, ") while ", c.arrived, " threads of its warpgroup wait at ",
         c.operation, " (", c.where,
         "): .aligned operations need every thread of the warpgroup at the same one");
  }
  c.thread_data[self.tid % 128] = thread_data;
  if (++c.arrived < 128) {
    wait(self, operation, where);
    return;
  }
  GroupCollective done = c;
  c.operation = nullptr;
  hold_warpgroup_ = false;
  completing_ = true;
  done.complete(*this, done, index);
  completing_ = false;
  for (int warp = 4 * index; warp < 4 * index + 4; ++warp) count::warp_met(warp);
  for (int tid = index * 128; tid < (index + 1) * 128; ++tid) {
    threads_[tid].last_sync = where;
    threads_[tid].last_sync_operation = operation;
  }
  if (hold_warpgroup_) {  // they all wait on (setmaxnreg.inc for registers)
    hold_warpgroup_ = false;
    wait(self, operation, where);
    return;
  }
  for (int tid = index * 128; tid < (index + 1) * 128; ++tid)
    if (tid != self.tid) wake(tid);
  if (should_preempt()) yield(self);
}

void BlockRunner::wake_warpgroup(int index) {
  for (int tid = index * 128; tid < (index + 1) * 128; ++tid) wake(tid);
}

const std::vector<uint32_t>& BlockRunner::warpgroup_clock(int index) {
  warpgroup_clock_.assign(static_cast<size_t>(thread_count_), 0);
  for (int tid = index * 128; tid < (index + 1) * 128; ++tid) join_into(warpgroup_clock_, tid);
  return warpgroup_clock_;
}

// ---- wgmma ----

namespace {

struct WgmmaThread {
  float* accumulators;
  WgmmaShape shape;
  uint32_t a[4];
  uint64_t a_descriptor, b_descriptor;
  bool scale_d;
};

const char* wgmma_name(const WgmmaShape& shape) {
  switch (shape.input) {
    case WgmmaInput::f16:
      return shape.a_from_registers ? "wgmma.mma_async (RS, f16)" : "wgmma.mma_async (SS, f16)";
    case WgmmaInput::bf16:
      return shape.a_from_registers ? "wgmma.mma_async (RS, bf16)" : "wgmma.mma_async (SS, bf16)";
    default:
      return shape.a_from_registers ? "wgmma.mma_async (RS, e4m3)" : "wgmma.mma_async (SS, e4m3)";
  }
}

bool same_shape(const WgmmaShape& x, const WgmmaShape& y) {
  return x.n == y.n && x.input == y.input && x.a_from_registers == y.a_from_registers &&
         x.transpose_a == y.transpose_a && x.transpose_b == y.transpose_b && x.scale_a == y.scale_a &&
         x.scale_b == y.scale_b;
}

// Reads a shared-memory operand through its descriptor into `operand.values`, checking each element.
void read_operand(BlockRunner& block, const ThreadState& reader, const uint32_t* known, WgmmaOperand& operand,
                  const char* operation, Where where) {
  const gmma::Descriptor d = gmma::decode(operand.descriptor);
  if (d.base_offset != 0)
    block.fail(reader, operation, " (", where, "): the descriptor ", Hex{operand.descriptor},
               " has a base offset (", d.base_offset, "), which the emulator does not model");
  const gmma::Major major = operand.mn_major ? gmma::Major::mn : gmma::Major::k;
  operand.values.resize(static_cast<size_t>(operand.rows) * operand.k * operand.element_bytes);
  for (uint32_t row = 0; row < operand.rows; ++row)
    for (uint32_t k = 0; k < operand.k; ++k) {
      const uint32_t address = gmma::element_address(d, major, operand.element_bytes, row, k);
      if (address % operand.element_bytes != 0)
        block.fail(reader, operation, " (", where, "): the descriptor ", Hex{operand.descriptor},
                   " puts element (", row, ", ", k, ") at the misaligned shared address ", Hex{address});
      block.check_async_read(reader, known, address, operand.element_bytes, operation, where);
      std::memcpy(&operand.values[(static_cast<size_t>(row) * operand.k + k) * operand.element_bytes],
                  block.shared_base() + address, operand.element_bytes);
    }
  if (!counting()) return;
  // The counters' view of the read: core matrices of 8 rows of one 16-byte chunk each (8 M/N rows at one K
  // chunk for K-major, 8 K rows at one M/N chunk for MN-major), one wavefront each unless rows share banks.
  const uint32_t t = 16 / operand.element_bytes;
  const uint32_t outer = operand.mn_major ? operand.rows / t : operand.rows / 8;
  const uint32_t inner = operand.mn_major ? operand.k / 8 : operand.k / t;
  AccessCounts total{1, 0, 0};
  for (uint32_t i = 0; i < outer; ++i)
    for (uint32_t j = 0; j < inner; ++j) {
      LaneAccess rows[8];
      for (int r = 0; r < 8; ++r) {
        const uint32_t u = static_cast<uint32_t>(r);
        const uint32_t address =
            operand.mn_major ? gmma::element_address(d, major, operand.element_bytes, i * t, 8 * j + u)
                             : gmma::element_address(d, major, operand.element_bytes, 8 * i + u, j * t);
        rows[r] = {r, address, 16};
      }
      const AccessCounts core = wavefronts(rows);
      total.units += core.units;
      total.ideal += core.ideal;
    }
  count::instruction(Access::wgmma_operand, total);
}

void complete_wgmma(BlockRunner& block, GroupCollective& c, int index) {
  auto thread = [&](int t) -> WgmmaThread& { return *static_cast<WgmmaThread*>(c.thread_data[t]); };
  const WgmmaThread& first = thread(0);
  const WgmmaShape& shape = first.shape;
  ThreadState& leader = block.thread(index * 128);
  for (int t = 1; t < 128; ++t) {
    const WgmmaThread& other = thread(t);
    if (!same_shape(other.shape, shape) || other.a_descriptor != first.a_descriptor ||
        other.b_descriptor != first.b_descriptor || other.scale_d != first.scale_d)
      block.fail(block.thread(index * 128 + t), c.operation, " (", c.where,
                 "): its descriptors, shape and scale-d must be the same in every thread of the warpgroup; "
                 "thread ",
                 t, " of the warpgroup differs from thread 0");
  }
  if (shape.n < 8 || shape.n > 256 || shape.n % 8 != 0)
    block.fail(leader, c.operation, " (", c.where, "): N ", shape.n,
               " must be a multiple of 8 from 8 to 256");
  if (shape.input == WgmmaInput::e4m3 && (shape.transpose_a || shape.transpose_b))
    block.fail(leader, c.operation, " (", c.where, "): e4m3 operands are K-major only (no transpose)");
  Warpgroup& g = block.warpgroup(index);
  if (!g.fenced)
    block.fail(
        leader, c.operation, " (", c.where,
        ") without a wgmma.fence since the warpgroup's last wgmma.commit_group: register accesses before "
        "it are not ordered with it (PTX ISA, wgmma.fence)");
  const uint32_t n = static_cast<uint32_t>(shape.n), bytes = input_bytes(shape.input), k = 32 / bytes;
  count::wgmma(shape.n, static_cast<int>(k));
  // Chained accumulation: the accumulators may be those of a wgmma still in flight (of the same shape),
  // whose result is then this one's C.
  const WgmmaOp* chained = nullptr;
  auto find_chained = [&](const std::vector<WgmmaOp>& ops) {
    for (const WgmmaOp& op : ops)
      if (op.accumulators[0] == first.accumulators) chained = &op;
  };
  for (const auto& group : g.committed) find_chained(group);
  find_chained(g.uncommitted);
  for (int t = 0; t < 128; ++t) {
    const bool t_chained = chained != nullptr && chained->accumulators[t] == thread(t).accumulators;
    if (t_chained != (chained != nullptr))
      block.fail(block.thread(index * 128 + t), c.operation, " (", c.where,
                 "): its accumulator registers are those of a wgmma in flight in some threads of the "
                 "warpgroup and not in others");
  }
  if (chained != nullptr && chained->n != n)
    block.fail(leader, c.operation, " (", c.where, "): accumulates onto the registers of a wgmma in flight (",
               chained->where, ") of another shape (N ", chained->n, ")");

  // The op lives in the runner from here (an error below abandons the fiber, which must own nothing). Its C
  // is the chained wgmma's result, copied before the vector may move it.
  std::vector<float> chained_result;
  if (chained != nullptr) chained_result = chained->result;
  chained = nullptr;
  g.uncommitted.emplace_back();
  WgmmaOp& op = g.uncommitted.back();
  op.result = std::move(chained_result);
  op.n = n;
  op.operation = c.operation;
  op.where = c.where;
  for (int t = 0; t < 128; ++t) op.accumulators[t] = thread(t).accumulators;
  const uint32_t* known = block.warpgroup_clock(index).data();
  op.a = {!shape.a_from_registers, first.a_descriptor, shape.transpose_a, 64, k, bytes, {}};
  op.b = {true, first.b_descriptor, shape.transpose_b, n, k, bytes, {}};
  if (op.a.in_shared) {
    read_operand(block, leader, known, op.a, c.operation, c.where);
  } else {
    op.a.values.resize(64 * k * bytes);
    for (uint32_t t = 0; t < 128; ++t)
      for (uint32_t reg = 0; reg < 4; ++reg)
        for (uint32_t v = 0; v < 4 / bytes; ++v) {
          const gmma::Element e = gmma::a_fragment(bytes, t, reg, v);
          const uint32_t bits = thread(static_cast<int>(t)).a[reg] >> (8 * bytes * v);
          std::memcpy(&op.a.values[(e.row * k + e.col) * bytes], &bits, bytes);
        }
  }
  read_operand(block, leader, known, op.b, c.operation, c.where);

  // D = A B + C, row-major 64 x n.
  std::vector<double> a(64 * k), b(static_cast<size_t>(n) * k);
  for (size_t i = 0; i < a.size(); ++i)
    a[i] = shape.scale_a * decode_input(&op.a.values[i * bytes], shape.input);
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = shape.scale_b * decode_input(&op.b.values[i * bytes], shape.input);
  const bool from_chained = !op.result.empty();
  if (!first.scale_d || !from_chained) op.result.assign(64 * static_cast<size_t>(n), 0.0f);
  for (uint32_t t = 0; t < 128 && first.scale_d && !from_chained; ++t)
    for (uint32_t reg = 0; reg < n / 2; ++reg) {
      const gmma::Element e = gmma::accumulator(t, reg);
      op.result[e.row * n + e.col] = thread(static_cast<int>(t)).accumulators[reg];
    }
  for (uint32_t row = 0; row < 64; ++row)
    for (uint32_t col = 0; col < n; ++col) {
      float& d = op.result[row * n + col];
      if (shape.input == WgmmaInput::e4m3) {
        d = e4m3_block_sum(&a[row * k], &b[col * k], static_cast<int>(k), d);
        continue;
      }
      double sum = d;
      for (uint32_t i = 0; i < k; ++i) sum += a[row * k + i] * b[col * k + i];
      d = static_cast<float>(sum);
    }
  for (int t = 0; t < 128; ++t)
    std::fill_n(reinterpret_cast<uint32_t*>(thread(t).accumulators), n / 2, kAccumulatorPoison);
}

// Completes one wgmma: its shared operands must read as they did at issue, its accumulators must still hold
// the poison (nothing wrote them), unless a later wgmma in flight accumulates onto them.
void finish_wgmma(BlockRunner& block, int index, const WgmmaOp& op, bool superseded, const char* operation,
                  Where where) {
  ThreadState& leader = block.thread(index * 128);
  for (const WgmmaOperand* operand : {&op.a, &op.b}) {
    if (!operand->in_shared) continue;
    const gmma::Descriptor d = gmma::decode(operand->descriptor);
    const gmma::Major major = operand->mn_major ? gmma::Major::mn : gmma::Major::k;
    for (uint32_t row = 0; row < operand->rows; ++row)
      for (uint32_t k = 0; k < operand->k; ++k) {
        const uint32_t address = gmma::element_address(d, major, operand->element_bytes, row, k);
        // Recorded as a read that lasts until now: a write ordered before this wait and after the issue
        // races. (Nothing here may own memory: an error abandons the fiber, report.hpp.)
        if (block.tracking()) block.shared_access(leader, address, operand->element_bytes, false);
        const uint8_t* expected =
            &operand->values[(static_cast<size_t>(row) * operand->k + k) * operand->element_bytes];
        if (std::memcmp(block.shared_base() + address, expected, operand->element_bytes) != 0)
          block.fail(leader, op.operation, " (", op.where, "), completed by ", operation, " (", where,
                     "): its operand at shared address ", Hex{address},
                     " changed while it was in flight (a wgmma reads shared memory until its wait_group)");
      }
  }
  if (superseded) return;
  for (int t = 0; t < 128; ++t) {
    const float* registers = op.accumulators[t];
    for (uint32_t reg = 0; reg < op.n / 2; ++reg)
      if (std::bit_cast<uint32_t>(registers[reg]) != kAccumulatorPoison)
        block.fail(block.thread(index * 128 + t), "wrote accumulator register ", reg, " of ", op.operation,
                   " (", op.where, ") while it was in flight, before the ", operation, " (", where,
                   ") that completes it");
  }
  for (int t = 0; t < 128; ++t)
    for (uint32_t reg = 0; reg < op.n / 2; ++reg) {
      const gmma::Element e = gmma::accumulator(static_cast<uint32_t>(t), reg);
      op.accumulators[t][reg] = op.result[e.row * op.n + e.col];
    }
}

void complete_wait(BlockRunner& block, GroupCollective& c, int index) {
  const int pending = *static_cast<int*>(c.thread_data[0]);
  for (int t = 1; t < 128; ++t)
    if (*static_cast<int*>(c.thread_data[t]) != pending)
      block.fail(block.thread(index * 128 + t), c.operation, " (", c.where,
                 "): N must be the same in every thread of the warpgroup");
  Warpgroup& g = block.warpgroup(index);
  while (g.committed.size() > static_cast<size_t>(pending)) {
    const std::vector<WgmmaOp>& group = g.committed.front();
    for (size_t i = 0; i < group.size(); ++i) {
      // A later wgmma in flight on the same registers supersedes this result.
      bool superseded = false;
      auto later = [&](const WgmmaOp& other) {
        superseded |= other.accumulators[0] == group[i].accumulators[0];
      };
      for (size_t j = i + 1; j < group.size(); ++j) later(group[j]);
      for (size_t gi = 1; gi < g.committed.size(); ++gi)
        for (const WgmmaOp& other : g.committed[gi]) later(other);
      for (const WgmmaOp& other : g.uncommitted) later(other);
      finish_wgmma(block, index, group[i], superseded, c.operation, c.where);
    }
    g.committed.erase(g.committed.begin());
  }
}

}  // namespace

void wgmma(float* accumulators, const WgmmaShape& shape, const uint32_t* a_registers, uint64_t a_descriptor,
           uint64_t b_descriptor, bool scale_d, Where where) {
  const Entered entered("wgmma.mma_async");
  ThreadState& t = entered;
  WgmmaThread mine{accumulators, shape, {}, a_descriptor, b_descriptor, scale_d};
  if (shape.a_from_registers) std::memcpy(mine.a, a_registers, sizeof mine.a);
  t.block->warpgroup_collective(t, wgmma_name(shape), &mine, complete_wgmma, where);
}

void wgmma_fence(Where where) {
  const Entered entered("wgmma.fence");
  ThreadState& t = entered;
  t.block->warpgroup_collective(
      t, "wgmma.fence", nullptr,
      [](BlockRunner& block, GroupCollective&, int index) { block.warpgroup(index).fenced = true; }, where);
}

void wgmma_commit_group(Where where) {
  const Entered entered("wgmma.commit_group");
  ThreadState& t = entered;
  t.block->warpgroup_collective(
      t, "wgmma.commit_group", nullptr,
      [](BlockRunner& block, GroupCollective&, int index) {
        Warpgroup& g = block.warpgroup(index);
        g.committed.push_back(std::move(g.uncommitted));
        g.uncommitted.clear();
        g.fenced = false;
      },
      where);
}

void wgmma_wait_group(int pending, Where where) {
  const Entered entered("wgmma.wait_group");
  ThreadState& t = entered;
  t.block->warpgroup_collective(t, "wgmma.wait_group", &pending, complete_wait, where);
}

// ---- setmaxnreg ----

namespace {

struct SetmaxnregThread {
  bool increase;
  uint32_t count, launch_registers;
};

void complete_setmaxnreg(BlockRunner& block, GroupCollective& c, int index) {
  const auto& first = *static_cast<SetmaxnregThread*>(c.thread_data[0]);
  ThreadState& leader = block.thread(index * 128);
  for (int t = 1; t < 128; ++t) {
    const auto& other = *static_cast<SetmaxnregThread*>(c.thread_data[t]);
    if (other.increase != first.increase || other.count != first.count ||
        other.launch_registers != first.launch_registers)
      block.fail(block.thread(index * 128 + t), c.operation, " (", c.where,
                 "): every warp of the warpgroup must execute the same setmaxnreg");
  }
  if (first.count < 24 || first.count > 256 || first.count % 8 != 0)
    block.fail(leader, c.operation, " ", first.count, " (", c.where,
               "): the register count must be a multiple of 8 from 24 to 256");
  const int64_t threads = block.threads();
  if (block.launch_registers == 0) {
    // The launch gives every thread the kernel's register count; the pool holds what warpgroups release.
    if (first.launch_registers == 0 || first.launch_registers % 8 != 0 ||
        int64_t(first.launch_registers) * threads > DeviceLimits::registers_per_sm)
      block.fail(leader, c.operation, " (", c.where, "): the kernel states ", first.launch_registers,
                 " registers a thread at launch, which ", threads,
                 " threads cannot have (a multiple of 8, at most 65536 in all)");
    block.launch_registers = first.launch_registers;
    block.free_registers = 0;
    for (int w = 0; w < (block.threads() + 127) / 128; ++w)
      block.warpgroup(w).registers = first.launch_registers;
  } else if (block.launch_registers != first.launch_registers) {
    block.fail(leader, c.operation, " (", c.where, "): states ", first.launch_registers,
               " registers a thread at launch where an earlier setmaxnreg stated ", block.launch_registers);
  }
  Warpgroup& g = block.warpgroup(index);
  if (!first.increase) {
    if (first.count > g.registers)
      block.fail(leader, c.operation, " ", first.count, " (", c.where, "): warpgroup ", index, " has ",
                 g.registers, " registers a thread; .dec cannot raise the count");
    block.free_registers += int64_t(g.registers - first.count) * 128;
    g.registers = first.count;
    // Increases waiting for the pool, in warpgroup order.
    for (int w = 0; w < (block.threads() + 127) / 128; ++w) {
      Warpgroup& waiting = block.warpgroup(w);
      const int64_t need = int64_t(waiting.requested) * 128 - int64_t(waiting.registers) * 128;
      if (waiting.requested == 0 || need > block.free_registers) continue;
      block.free_registers -= need;
      waiting.registers = waiting.requested;
      waiting.requested = 0;
      block.wake_warpgroup(w);
    }
    return;
  }
  if (first.count < g.registers)
    block.fail(leader, c.operation, " ", first.count, " (", c.where, "): warpgroup ", index, " has ",
               g.registers, " registers a thread; .inc cannot lower the count");
  const int64_t need = int64_t(first.count - g.registers) * 128;
  if (need <= block.free_registers) {
    block.free_registers -= need;
    g.registers = first.count;
    return;
  }
  g.requested = first.count;  // waits until a setmaxnreg.dec frees enough (or forever: a deadlock)
  g.requested_where = c.where;
  block.hold_warpgroup();
}

}  // namespace

void setmaxnreg(bool increase, uint32_t count, uint32_t launch_registers, Where where) {
  const Entered entered("setmaxnreg");
  ThreadState& t = entered;
  SetmaxnregThread mine{increase, count, launch_registers};
  t.block->warpgroup_collective(t, increase ? "setmaxnreg.inc" : "setmaxnreg.dec", &mine, complete_setmaxnreg,
                                where);
}

// ---- Block-level checks of sm_90 state ----

void BlockRunner::reset_sm90() {
  mbarriers_.clear();
  bulk_loads_.clear();
  warpgroups_.assign(static_cast<size_t>((thread_count_ + 127) / 128), Warpgroup());
  launch_registers = 0;
  free_registers = 0;
  hold_warpgroup_ = false;
  scheduler_error_.clear();
}

void BlockRunner::check_sm90_exit(ThreadState& self) {
  if (!self.bulk_uncommitted.empty() || !self.bulk_committed.empty())
    fail(self,
         "exits while a TMA store it issued may still read shared memory: cp.async.bulk.commit_group and "
         "cp.async.bulk.wait_group.read belong before the end");
  if (static_cast<size_t>(self.warpgroup()) >= warpgroups_.size()) return;
  const Warpgroup& g = warpgroups_[self.warpgroup()];
  const WgmmaOp* in_flight = !g.uncommitted.empty() ? &g.uncommitted.front()
                             : !g.committed.empty() && !g.committed.front().empty()
                                 ? &g.committed.front().front()
                                 : nullptr;
  if (in_flight != nullptr)
    fail(self, "exits while ", in_flight->operation, " (", in_flight->where,
         ") of its warpgroup is in flight: a wgmma.wait_group belongs before the end");
  const GroupCollective& c = g.collective;
  if (c.operation != nullptr && c.thread_data[self.tid % 128] == nullptr)
    fail(self, "exits while ", c.arrived, " threads of its warpgroup wait for it at ", c.operation, " (",
         c.where, ")");
}

std::string BlockRunner::sm90_block_end() {
  if (!scheduler_error_.empty()) return scheduler_error_;
  if (!bulk_loads_.empty()) {
    const BulkLoad& load = bulk_loads_.front();
    return describe(load.issuer) + ": " +
           compose("the block ends while the TMA load it issued at ", load.where, " into shared address ",
                   Hex{load.destination},
                   " is in flight: no thread waited on its mbarrier, and the copy would write shared memory "
                   "the block no longer owns");
  }
  return "";
}

void BlockRunner::release_sm90_shadow() {
  auto clear = [&](uint32_t address, size_t bytes) { std::fill_n(&pending_[address], bytes, uint16_t{0}); };
  for (const MBarrier& b : mbarriers_) clear(b.address, 8);
  for (const BulkLoad& load : bulk_loads_) clear(load.destination, load.data.size());
  for (ThreadState& t : threads_) {
    for (const SharedRange& r : t.bulk_uncommitted) clear(r.address, r.bytes);
    for (const auto& group : t.bulk_committed)
      for (const SharedRange& r : group) clear(r.address, r.bytes);
  }
}

std::string BlockRunner::sm90_deadlock_details() const {
  std::string out;
  for (const MBarrier& b : mbarriers_) {
    if (b.waiters.empty()) continue;
    out += " " + describe_mbarrier(b) + ";";
  }
  for (size_t w = 0; w < warpgroups_.size(); ++w) {
    const Warpgroup& g = warpgroups_[w];
    if (g.requested == 0) continue;
    std::string held;
    for (size_t v = 0; v < warpgroups_.size(); ++v)
      held += (v > 0 ? ", " : "") + std::to_string(warpgroups_[v].registers);
    out += compose(" warpgroup ", w, " waits in setmaxnreg.inc ", g.requested, " (", g.requested_where,
                   ") for (", g.requested, " - ", g.registers,
                   ") x 128 = ", int64_t(g.requested - g.registers) * 128, " registers, but the pool has ",
                   free_registers, " free: the launch gave ", launch_registers, " registers a thread x ",
                   thread_count_, " threads = ", int64_t(launch_registers) * thread_count_,
                   ", and the warpgroups hold ") +
           held + " registers a thread;";
  }
  return out;
}

}  // namespace flashlab::emulator
