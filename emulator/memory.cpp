// Device memory, and the instrumentation hooks through which the emulator sees every load and store of
// kernel code.
//
// Emulated translation units are compiled with GCC's ThreadSanitizer instrumentation (-fsanitize=thread,
// without linking ThreadSanitizer's run-time library): the compiler calls __tsan_read4(address) before each
// 4-byte load, __tsan_write16(address) before each 16-byte store, and so on. The emulator defines those
// functions itself. Outside a kernel (host code in the same files) they return at once; inside one they check
// the access: shared memory against the block's window, the race detector and the cp.async poison; anything
// else against the device allocations (emulator/block.hpp, shared_memory.cpp).
#include "emulator/memory.hpp"

#include <link.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "emulator/block.hpp"
#include "emulator/counters.hpp"
#include "emulator/launch.hpp"
#include "emulator/report.hpp"

namespace flashlab::emulator {

namespace {

constexpr size_t kGuard = 256;      // bytes on either side of an allocation that belong to nothing
constexpr size_t kAlignment = 256;  // cudaMalloc's alignment

struct Allocations {
  std::shared_mutex mutex;
  std::map<uintptr_t, size_t> sizes;  // start -> bytes
  std::atomic<uint64_t> version{1};   // changes with every allocation or free (per-thread caches)
};

Allocations& allocations() {
  static Allocations* instance =
      new Allocations;  // never destroyed: freed buffers may outlive static teardown
  return *instance;
}

// The allocation a thread found last: kernels touch a few buffers many times.
struct Found {
  uintptr_t begin = 0, end = 0;
  uint64_t version = 0;
};
thread_local Found last_found;

bool inside_allocation(uintptr_t address, size_t bytes) {
  Allocations& all = allocations();
  const uint64_t version = all.version.load(std::memory_order_acquire);
  if (last_found.version == version && address >= last_found.begin && address + bytes <= last_found.end)
    return true;
  std::shared_lock lock(all.mutex);
  auto next = all.sizes.upper_bound(address);
  if (next == all.sizes.begin()) return false;
  const auto& [begin, size] = *std::prev(next);
  if (address + bytes > begin + size) return false;
  last_found = {begin, begin + size, version};
  return true;
}

// The program's read-only data (constants, string literals, lookup tables): kernels may load from it, as from
// a GPU's constant memory.
struct Range {
  uintptr_t begin, end;
};
const std::vector<Range>& read_only_ranges() {
  static const std::vector<Range> ranges = [] {
    std::vector<Range> found;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* out) {
          for (int i = 0; i < info->dlpi_phnum; ++i) {
            const ElfW(Phdr)& header = info->dlpi_phdr[i];
            const bool read_only = header.p_type == PT_LOAD && (header.p_flags & PF_W) == 0;
            if (read_only || header.p_type == PT_GNU_RELRO)
              static_cast<std::vector<Range>*>(out)->push_back(
                  {info->dlpi_addr + header.p_vaddr, info->dlpi_addr + header.p_vaddr + header.p_memsz});
          }
          return 0;
        },
        &found);
    return found;
  }();
  return ranges;
}

// This OS thread's block of the thread-local storage of the object the emulator is linked into (the program,
// or the Python module, python/): static __shared__ variables live there in emulated builds
// (emulator/include/cuda_runtime.h), one copy per OS thread, and an OS thread runs one block at a time. The
// object is the one whose loaded segments hold this function's code; its block is allocated by now, since
// `range` itself lives in it.
Range static_shared_range() {
  thread_local const Range range = [] {
    struct Search {
      uintptr_t code;
      Range found;
    } search{reinterpret_cast<uintptr_t>(&static_shared_range), {0, 0}};
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* out) {
          auto& state = *static_cast<Search*>(out);
          bool ours = false;
          for (int i = 0; i < info->dlpi_phnum; ++i) {
            const ElfW(Phdr)& header = info->dlpi_phdr[i];
            const uintptr_t begin = info->dlpi_addr + header.p_vaddr;
            ours |= header.p_type == PT_LOAD && state.code >= begin && state.code < begin + header.p_memsz;
          }
          if (!ours || info->dlpi_tls_data == nullptr) return 0;
          for (int i = 0; i < info->dlpi_phnum; ++i)
            if (info->dlpi_phdr[i].p_type == PT_TLS) {
              const auto begin = reinterpret_cast<uintptr_t>(info->dlpi_tls_data);
              state.found = {begin, begin + info->dlpi_phdr[i].p_memsz};
            }
          return 1;
        },
        &search);
    return search.found;
  }();
  return range;
}

bool inside(const Range& range, uintptr_t address, size_t bytes) {
  return address >= range.begin && address + bytes <= range.end;
}

std::atomic<bool> instrumented{false};

// `site`: the instrumented instruction's address (where the hook returns to), which groups the lanes'
// accesses into warp instructions for the counters.
void check_access(ThreadState& self, const void* pointer, size_t bytes, bool write, const void* site) {
  BlockRunner& block = *self.block;
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  const auto pc = reinterpret_cast<uintptr_t>(site);
  if (block.in_shared_window(address)) {
    const auto offset = static_cast<uint32_t>(address - reinterpret_cast<uintptr_t>(block.shared_base()));
    block.shared_access(self, offset, bytes, write);
    if (counting())
      count::lane_access(self.warp(), self.lane(), pc, write ? Access::shared_store : Access::shared_load,
                         offset, static_cast<uint32_t>(bytes));
    return;
  }
  if (block.in_stacks(address)) return;  // registers and local memory
  if (inside_allocation(address, bytes)) {
    if (counting()) {
      count::global(bytes, write);
      count::lane_access(self.warp(), self.lane(), pc, write ? Access::global_store : Access::global_load,
                         address, static_cast<uint32_t>(bytes));
    }
    return;
  }
  const Launch& launch = block.launch();
  std::string problem = check_global_access(address, bytes, write, launch.parameters, launch.parameter_bytes);
  if (!problem.empty()) block.fail_with(self, std::move(problem));
}

void access(const void* pointer, size_t bytes, bool write, const void* site) {
  ThreadState* self = current_thread();
  if (self == nullptr || self->in_emulator) return;  // host code, or the emulator's own
  // While the access is checked, the emulator's own accesses (its containers may run instrumented copies of
  // library templates) are not kernel accesses.
  self->in_emulator = true;
  check_access(*self, pointer, bytes, write, site);
  self->in_emulator = false;
}

}  // namespace

void* device_allocate(size_t bytes) {
  // More than the emulated device holds (DeviceLimits::global_bytes, an H100's 80 GiB) fails, as cudaMalloc's
  // does on a GPU, before the host is asked for it.
  if (bytes > DeviceLimits::global_bytes) return nullptr;
  const size_t total = (bytes + 2 * kGuard + kAlignment - 1) / kAlignment * kAlignment;
  char* base = static_cast<char*>(std::aligned_alloc(kAlignment, total));
  if (base == nullptr) return nullptr;
  std::memset(base, 0xff, total);
  char* start = base + kGuard;
  Allocations& all = allocations();
  std::unique_lock lock(all.mutex);
  all.sizes[reinterpret_cast<uintptr_t>(start)] = bytes;
  all.version.fetch_add(1, std::memory_order_release);
  return start;
}

bool device_free(void* pointer) {
  if (pointer == nullptr) return true;
  Allocations& all = allocations();
  {
    std::unique_lock lock(all.mutex);
    auto found = all.sizes.find(reinterpret_cast<uintptr_t>(pointer));
    if (found == all.sizes.end()) return false;
    all.sizes.erase(found);
    all.version.fetch_add(1, std::memory_order_release);
  }
  std::free(static_cast<char*>(pointer) - kGuard);
  return true;
}

bool is_device_range(const void* address, size_t bytes) {
  return inside_allocation(reinterpret_cast<uintptr_t>(address), bytes);
}

std::string describe_device_address(uintptr_t address) {
  Allocations& all = allocations();
  std::shared_lock lock(all.mutex);
  if (all.sizes.empty()) return "no device memory is allocated";
  auto next = all.sizes.upper_bound(address);
  // The nearest allocation: the one starting at or before the address, or else the next one.
  if (next != all.sizes.begin()) {
    const auto& [begin, size] = *std::prev(next);
    if (address < begin + size)
      return compose("inside the ", size, "-byte allocation at ", Hex{begin}, ", but running past its end");
    const uintptr_t past = address - (begin + size);
    if (next == all.sizes.end() || past < next->first - address)
      return compose(past, " bytes after the end of the ", size, "-byte allocation at ", Hex{begin});
  }
  return compose(next->first - address, " bytes before the start of the ", next->second,
                 "-byte allocation at ", Hex{next->first});
}

std::string check_global_access(uintptr_t address, size_t bytes, bool write, const void* parameters,
                                size_t parameter_bytes) {
  if (inside_allocation(address, bytes)) return "";
  const auto parameter_begin = reinterpret_cast<uintptr_t>(parameters);
  const bool in_parameters = inside({parameter_begin, parameter_begin + parameter_bytes}, address, bytes);
  bool read_only = false;
  for (const Range& range : read_only_ranges()) read_only |= inside(range, address, bytes);
  if (!write && (in_parameters || read_only)) return "";
  if (inside(static_shared_range(), address, bytes)) return "";
  if (in_parameters || read_only)
    return compose("stores ", bytes, " bytes at ", Hex{address}, ", in the kernel's ",
                   in_parameters ? "parameters" : "read-only data", ", which cannot be written");
  return compose(write ? "stores " : "loads ", bytes, " bytes at ", Hex{address},
                 ", which is not device memory: ", describe_device_address(address));
}

bool memory_tracking() {
  return instrumented.load(std::memory_order_relaxed);
}

}  // namespace flashlab::emulator

// ---- The instrumentation's entry points (GCC -fsanitize=thread, with our run time instead of libtsan) ----

using flashlab::emulator::access;

extern "C" {
// Called by every instrumented translation unit's static constructor: emulated code was compiled with the
// instrumentation, so the emulator sees its accesses.
void __tsan_init() {
  flashlab::emulator::instrumented.store(true, std::memory_order_relaxed);
}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}

#define FLASHLAB_TSAN_ACCESS(bytes)                             \
  void __tsan_read##bytes(void* address) {                      \
    access(address, bytes, false, __builtin_return_address(0)); \
  }                                                             \
  void __tsan_write##bytes(void* address) {                     \
    access(address, bytes, true, __builtin_return_address(0));  \
  }                                                             \
  void __tsan_unaligned_read##bytes(void* address) {            \
    access(address, bytes, false, __builtin_return_address(0)); \
  }                                                             \
  void __tsan_unaligned_write##bytes(void* address) {           \
    access(address, bytes, true, __builtin_return_address(0));  \
  }
FLASHLAB_TSAN_ACCESS(1)
FLASHLAB_TSAN_ACCESS(2)
FLASHLAB_TSAN_ACCESS(4)
FLASHLAB_TSAN_ACCESS(8)
FLASHLAB_TSAN_ACCESS(16)
#undef FLASHLAB_TSAN_ACCESS
void __tsan_read_range(void* address, unsigned long bytes) {
  access(address, bytes, false, __builtin_return_address(0));
}
void __tsan_write_range(void* address, unsigned long bytes) {
  access(address, bytes, true, __builtin_return_address(0));
}

// Atomic operations in instrumented code (std::atomic in host code of emulated files, static-local guards):
// performed as they would be, unchecked.
#define FLASHLAB_TSAN_ATOMICS(bits, type)                                                         \
  type __tsan_atomic##bits##_load(const volatile type* a, int order) {                            \
    return __atomic_load_n(a, order);                                                             \
  }                                                                                               \
  void __tsan_atomic##bits##_store(volatile type* a, type v, int order) {                         \
    __atomic_store_n(a, v, order);                                                                \
  }                                                                                               \
  type __tsan_atomic##bits##_exchange(volatile type* a, type v, int order) {                      \
    return __atomic_exchange_n(a, v, order);                                                      \
  }                                                                                               \
  type __tsan_atomic##bits##_fetch_add(volatile type* a, type v, int order) {                     \
    return __atomic_fetch_add(a, v, order);                                                       \
  }                                                                                               \
  type __tsan_atomic##bits##_fetch_sub(volatile type* a, type v, int order) {                     \
    return __atomic_fetch_sub(a, v, order);                                                       \
  }                                                                                               \
  type __tsan_atomic##bits##_fetch_and(volatile type* a, type v, int order) {                     \
    return __atomic_fetch_and(a, v, order);                                                       \
  }                                                                                               \
  type __tsan_atomic##bits##_fetch_or(volatile type* a, type v, int order) {                      \
    return __atomic_fetch_or(a, v, order);                                                        \
  }                                                                                               \
  type __tsan_atomic##bits##_fetch_xor(volatile type* a, type v, int order) {                     \
    return __atomic_fetch_xor(a, v, order);                                                       \
  }                                                                                               \
  type __tsan_atomic##bits##_fetch_nand(volatile type* a, type v, int order) {                    \
    return __atomic_fetch_nand(a, v, order);                                                      \
  }                                                                                               \
  int __tsan_atomic##bits##_compare_exchange_strong(volatile type* a, type* c, type v, int order, \
                                                    int failure) {                                \
    return __atomic_compare_exchange_n(a, c, v, false, order, failure);                           \
  }                                                                                               \
  int __tsan_atomic##bits##_compare_exchange_weak(volatile type* a, type* c, type v, int order,   \
                                                  int failure) {                                  \
    return __atomic_compare_exchange_n(a, c, v, true, order, failure);                            \
  }                                                                                               \
  type __tsan_atomic##bits##_compare_exchange_val(volatile type* a, type c, type v, int order,    \
                                                  int failure) {                                  \
    __atomic_compare_exchange_n(a, &c, v, false, order, failure);                                 \
    return c;                                                                                     \
  }
FLASHLAB_TSAN_ATOMICS(8, unsigned char)
FLASHLAB_TSAN_ATOMICS(16, unsigned short)
FLASHLAB_TSAN_ATOMICS(32, unsigned int)
FLASHLAB_TSAN_ATOMICS(64, unsigned long long)
#undef FLASHLAB_TSAN_ATOMICS
void __tsan_atomic_thread_fence(int order) {
  __atomic_thread_fence(order);
}
void __tsan_atomic_signal_fence(int order) {
  __atomic_signal_fence(order);
}
}
