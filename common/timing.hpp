// Wall-clock timing for CPU implementations: the median of timed runs that follow a warm-up.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace flashlab {

struct Timing {
  double median_seconds = 0;
  int runs = 0;  // the timed runs the median is taken over
};

// Times `work` up to `runs` times (at least once) and returns the median. The caller has run `work` once
// already, untimed: that run is the warm-up (first-touch page faults, caches, the thread pool's start). With
// a budget above 0, the runs stop as soon as they have taken `budget_seconds` in all, so that a slow
// implementation is timed fewer times.
template <typename Work>
Timing time_after_warm_up(int runs, double budget_seconds, Work&& work) {
  std::vector<double> seconds;
  double spent = 0;
  do {
    const auto start = std::chrono::steady_clock::now();
    work();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    spent += seconds.back();
  } while (static_cast<int>(seconds.size()) < runs && !(budget_seconds > 0 && spent >= budget_seconds));
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  return {seconds[seconds.size() / 2], static_cast<int>(seconds.size())};
}

}  // namespace flashlab
