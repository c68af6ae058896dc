// GPU timing with CUDA events (CUDA builds only): the median of `repeats` timed runs after `warmups` untimed
// ones. Each run is bracketed by its own pair of events on the default stream, so host overhead between
// launches is not counted; the host waits once, at the end.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "common/cuda/check.hpp"
#include "common/cuda/target.hpp"

namespace flashlab::cuda {
namespace FLASHLAB_CUDA_TARGET {

// An owning cudaEvent_t (RAII).
class Event {
 public:
  Event() { FLASHLAB_CUDA_CHECK(cudaEventCreate(&event_)); }
  ~Event() { cudaEventDestroy(event_); }  // no throw from a destructor
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record() { FLASHLAB_CUDA_CHECK(cudaEventRecord(event_)); }
  // Milliseconds from `start` to this event; both must have completed.
  float ms_since(const Event& start) const {
    float ms = 0;
    FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
    return ms;
  }

 private:
  cudaEvent_t event_ = nullptr;
};

// work(run) enqueues one run on the default stream; `run` counts from 0 over warm-ups and timed runs, so the
// caller can rotate between copies of its inputs.
template <typename Work>
double median_event_ms(int warmups, int repeats, Work&& work) {
  int run = 0;
  for (int w = 0; w < warmups; ++w) work(run++);
  repeats = std::max(1, repeats);
  std::vector<Event> starts(static_cast<size_t>(repeats)), stops(static_cast<size_t>(repeats));
  for (int r = 0; r < repeats; ++r) {
    starts[r].record();
    work(run++);
    stops[r].record();
  }
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) ms.push_back(stops[r].ms_since(starts[r]));
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

}  // namespace FLASHLAB_CUDA_TARGET
using namespace FLASHLAB_CUDA_TARGET;
}  // namespace flashlab::cuda
