// One emulated GPU thread's execution context: a stack and a saved register context, switched cooperatively.
//
// Boost.Context's fcontext does the switch (a few instructions: about 6 ns a switch on the 2-core CI machine,
// against about 250 ns for glibc's swapcontext, which makes a sigprocmask system call every time; the probe
// and its figures are in docs/results/emulator-2026-11-24/). A fiber runs until it suspends itself; only the
// scheduler resumes fibers (block.cpp), so every switch goes through it and back.
#pragma once

#include <cstddef>

namespace flashlab::emulator {

class Fiber {
 public:
  // Prepares the fiber to run entry(argument) on [stack, stack + size) at its first resume(). The stack must
  // outlive the fiber's run; it may be reused by the next prepare() once this fiber finished or was
  // abandoned.
  void prepare(void* stack, size_t size, void (*entry)(void*), void* argument);

  // From the scheduler: runs the fiber until it suspends or its entry returns.
  void resume();
  // From inside the fiber: back to the scheduler, until the next resume().
  void suspend();

  bool finished() const { return finished_; }

 private:
  static void trampoline(void* transfer);  // entry point of a new fiber (takes Boost's transfer_t)
  void switch_to_scheduler(bool final);

  void* context_ = nullptr;    // the fiber's saved context while it is suspended
  void* scheduler_ = nullptr;  // the scheduler's saved context while the fiber runs
  void (*entry_)(void*) = nullptr;
  void* argument_ = nullptr;
  bool finished_ = false;
  // AddressSanitizer's view of the two stacks (only used in ASan builds): where this fiber's stack is, where
  // the scheduler's is, and ASan's fake-stack handle of the side that is switched away from.
  void* stack_ = nullptr;
  size_t stack_size_ = 0;
  const void* scheduler_stack_ = nullptr;
  size_t scheduler_stack_size_ = 0;
  void* fake_stack_ = nullptr;
};

}  // namespace flashlab::emulator
