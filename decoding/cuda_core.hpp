// decoding/cuda_core (cuda_core.cu): Flash-Decoding on CUDA as the method says it, the plain case. Plain C++:
// the registration (cuda_split_kv.cpp) sizes the launch's scratch here; the launcher exists in each build of
// the kernels (common/cuda/target.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/cuda/int_lengths.hpp"
#include "common/cuda/target.hpp"
#include "common/registry.hpp"

namespace flashlab::decoding {

// [S1] The chunks each sequence's keys are split into: enough that each holds at least 256 keys, at most 64.
inline int cuda_core_splits(const Problem& p) {
  return static_cast<int>(std::min<int64_t>(64, std::max<int64_t>(1, (p.seqlen_k + 255) / 256)));
}

// Scratch: the int copies of the per-batch lengths, then the partials O_j [rows, splits, d] and LSE_j
// [rows, splits], float.
inline size_t cuda_core_workspace_bytes(const Problem& p) {
  const int64_t partials = p.batch * p.heads_q * p.seqlen_q * cuda_core_splits(p) * (p.head_dim + 1);
  return cuda::int_lengths_bytes(p) + static_cast<size_t>(partials) * sizeof(float);
}

FLASHLAB_FOR_EACH_TARGET(void launch_cuda_core(const Problem& problem, const DeviceTensors& tensors);)

}  // namespace flashlab::decoding
