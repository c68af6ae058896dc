// Wall-clock timing for CPU implementations: the median of `repeats` runs after one warm-up run.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace flashlab {

template <typename Work>
double median_seconds(int repeats, Work&& work) {
  work();  // warm-up: first-touch page faults, caches, thread pool start
  std::vector<double> seconds;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    const auto start = std::chrono::steady_clock::now();
    work();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  return seconds[seconds.size() / 2];
}

}  // namespace flashlab
