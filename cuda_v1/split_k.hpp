// cuda_v1/split_k: FlashAttention-1's Algorithm 1 on CUDA in fp32 (docs/03-cuda-v1.md).
#pragma once

#include <cstddef>

#include "common/cuda/target.hpp"
#include "common/registry.hpp"

namespace flashlab::cuda_v1 {

constexpr int kMaxHeadDim = 128;  // head dims 1..128, padded up to a compiled tile of 32, 64 or 128

// Global scratch for Algorithm 1's running statistics: m and l, one float each per query row.
inline size_t workspace_bytes(const Problem& p) {
  return 2 * sizeof(float) * static_cast<size_t>(p.lse_elements());
}

// The launcher on device pointers (split_k.cu, built for the GPU and for the emulator). Enqueues on the
// default stream.
FLASHLAB_FOR_EACH_TARGET(void launch_split_k(const Problem& problem, const DeviceTensors& tensors);)

}  // namespace flashlab::cuda_v1
