// Interposes the C allocation functions (glibc exports the real ones as __libc_*) to count heap bytes in use.
// malloc_usable_size gives the same size at allocation and at release, so the count balances.
#include "common/memory_meter.hpp"

#include <malloc.h>

#include <atomic>
#include <cerrno>
#include <cstddef>

extern "C" {
void* __libc_malloc(size_t size);
void* __libc_calloc(size_t count, size_t size);
void* __libc_realloc(void* pointer, size_t size);
void* __libc_memalign(size_t alignment, size_t size);
void __libc_free(void* pointer);
}

namespace {
std::atomic<int64_t> g_in_use{0};
std::atomic<int64_t> g_peak{0};

void* counted(void* pointer) {
  if (pointer != nullptr) {
    const int64_t now = g_in_use.fetch_add(static_cast<int64_t>(malloc_usable_size(pointer))) +
                        static_cast<int64_t>(malloc_usable_size(pointer));
    int64_t peak = g_peak.load(std::memory_order_relaxed);
    while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
    }
  }
  return pointer;
}

void uncount(void* pointer) {
  if (pointer != nullptr) g_in_use.fetch_sub(static_cast<int64_t>(malloc_usable_size(pointer)));
}
}  // namespace

extern "C" {
void* malloc(size_t size) {
  return counted(__libc_malloc(size));
}
void* calloc(size_t count, size_t size) {
  return counted(__libc_calloc(count, size));
}
void free(void* pointer) {
  uncount(pointer);
  __libc_free(pointer);
}
void* realloc(void* pointer, size_t size) {
  uncount(pointer);
  return counted(__libc_realloc(pointer, size));
}
void* memalign(size_t alignment, size_t size) {
  return counted(__libc_memalign(alignment, size));
}
void* aligned_alloc(size_t alignment, size_t size) {
  return counted(__libc_memalign(alignment, size));
}
int posix_memalign(void** out, size_t alignment, size_t size) {
  if (alignment % sizeof(void*) != 0 || (alignment & (alignment - 1)) != 0) return EINVAL;
  void* pointer = counted(__libc_memalign(alignment, size));
  if (pointer == nullptr && size != 0) return ENOMEM;
  *out = pointer;
  return 0;
}
}

namespace flashlab::memory_meter {
bool active() {
  return true;
}
int64_t in_use() {
  return g_in_use.load();
}
int64_t peak() {
  return g_peak.load();
}
void reset_peak() {
  g_peak.store(g_in_use.load());
}
}  // namespace flashlab::memory_meter
