#include "emulator/fiber.hpp"

#include <boost/context/detail/fcontext.hpp>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define FLASHLAB_FIBER_ASAN 1
#else
#define FLASHLAB_FIBER_ASAN 0
#endif

namespace flashlab::emulator {

namespace context = boost::context::detail;

void Fiber::prepare(void* stack, size_t size, void (*entry)(void*), void* argument) {
  entry_ = entry;
  argument_ = argument;
  finished_ = false;
  stack_ = stack;
  stack_size_ = size;
#if FLASHLAB_FIBER_ASAN
  // An abandoned fiber may have left ASan's redzones of its frames on this stack.
  ASAN_UNPOISON_MEMORY_REGION(stack, size);
#endif
  // fcontext grows the stack down from its top.
  context_ = context::make_fcontext(static_cast<char*>(stack) + size, size,
                                    [](context::transfer_t transfer) { trampoline(&transfer); });
}

void Fiber::trampoline(void* transfer_pointer) {
  const auto transfer = *static_cast<context::transfer_t*>(transfer_pointer);
  auto* fiber = static_cast<Fiber*>(transfer.data);
  fiber->scheduler_ = transfer.fctx;
#if FLASHLAB_FIBER_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &fiber->scheduler_stack_, &fiber->scheduler_stack_size_);
#endif
  fiber->entry_(fiber->argument_);
  fiber->finished_ = true;
  fiber->switch_to_scheduler(true);  // never comes back
}

void Fiber::resume() {
#if FLASHLAB_FIBER_ASAN
  void* scheduler_fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&scheduler_fake_stack, stack_, stack_size_);
#endif
  const context::transfer_t back = context::jump_fcontext(context_, this);
  context_ = back.fctx;
#if FLASHLAB_FIBER_ASAN
  __sanitizer_finish_switch_fiber(scheduler_fake_stack, nullptr, nullptr);
#endif
}

void Fiber::suspend() {
  switch_to_scheduler(false);
}

void Fiber::switch_to_scheduler(bool final) {
#if FLASHLAB_FIBER_ASAN
  // A finished fiber passes no fake-stack slot: ASan then releases the fiber's fake stack.
  __sanitizer_start_switch_fiber(final ? nullptr : &fake_stack_, scheduler_stack_, scheduler_stack_size_);
#else
  (void) final;
#endif
  const context::transfer_t back = context::jump_fcontext(scheduler_, nullptr);
  scheduler_ = back.fctx;
#if FLASHLAB_FIBER_ASAN
  __sanitizer_finish_switch_fiber(fake_stack_, &scheduler_stack_, &scheduler_stack_size_);
#endif
}

}  // namespace flashlab::emulator
