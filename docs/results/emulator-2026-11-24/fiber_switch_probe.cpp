// How long one switch between fibers takes, glibc's swapcontext against Boost.Context's fcontext: 128 fibers
// (a thread block), each switched to and back 20000 times by a scheduler, as the emulator does
// (emulator/fiber.hpp). The figures chose Boost.Context.
//
//   g++ -O2 -std=c++20 fiber_switch_probe.cpp -o fiber_switch_probe -lboost_context && ./fiber_switch_probe
#include <ucontext.h>

#include <boost/context/detail/fcontext.hpp>
#include <chrono>
#include <cstdio>
#include <vector>

namespace context = boost::context::detail;

constexpr int kFibers = 128, kRounds = 20000;
constexpr size_t kStack = 64 * 1024;

volatile long work = 0;
ucontext_t scheduler_context;
ucontext_t fiber_context[kFibers];
context::fcontext_t fiber_fcontext[kFibers];

void ucontext_fiber(int index) {
  for (;;) {
    work = work + 1;
    swapcontext(&fiber_context[index], &scheduler_context);
  }
}

void fcontext_fiber(context::transfer_t from) {
  for (;;) {
    work = work + 1;
    from = context::jump_fcontext(from.fctx, nullptr);
  }
}

double nanoseconds_per_switch(std::chrono::steady_clock::time_point start) {
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  return ns / (2.0 * kRounds * kFibers);  // there and back
}

int main() {
  std::vector<std::vector<char>> stacks(2 * kFibers, std::vector<char>(kStack));
  for (int f = 0; f < kFibers; ++f) {
    getcontext(&fiber_context[f]);
    fiber_context[f].uc_stack.ss_sp = stacks[f].data();
    fiber_context[f].uc_stack.ss_size = kStack;
    fiber_context[f].uc_link = nullptr;
    makecontext(&fiber_context[f], reinterpret_cast<void (*)()>(ucontext_fiber), 1, f);
    fiber_fcontext[f] = context::make_fcontext(stacks[kFibers + f].data() + kStack, kStack, fcontext_fiber);
  }
  auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < kRounds; ++r)
    for (int f = 0; f < kFibers; ++f) swapcontext(&scheduler_context, &fiber_context[f]);
  std::printf("glibc swapcontext:      %6.1f ns per switch\n", nanoseconds_per_switch(start));
  start = std::chrono::steady_clock::now();
  for (int r = 0; r < kRounds; ++r)
    for (int f = 0; f < kFibers; ++f)
      fiber_fcontext[f] = context::jump_fcontext(fiber_fcontext[f], nullptr).fctx;
  std::printf("Boost.Context fcontext: %6.1f ns per switch\n", nanoseconds_per_switch(start));
  return 0;
}
