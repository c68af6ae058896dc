// cuda_v1/split_k: FlashAttention-1's Algorithm 1 on CUDA in fp32 (docs/03-cuda-v1.md). Plain C++: the
// parameters, built once on the host (split_k.cpp), and the launchers of both builds of the kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/cuda/stream.hpp"
#include "common/cuda/target.hpp"
#include "common/registry.hpp"

namespace flashlab::cuda_v1 {

constexpr int kMaxHeadDim = 128;  // head dims 1..128, padded up to a compiled tile of 32, 64 or 128

// Global scratch for Algorithm 1's running statistics: m and l, one float each per query row.
inline size_t workspace_bytes(const Problem& p) {
  return 2 * sizeof(float) * static_cast<size_t>(p.lse_elements());
}

// The kernel's parameters: dense BSHD tensors on the device.
struct SplitKParams {
  const float* q = nullptr;  // [batch, seqlen_q, heads_q, head_dim]
  const float* k = nullptr;  // [batch, seqlen_k, heads_kv, head_dim]
  const float* v = nullptr;
  float* o = nullptr;        // [batch, seqlen_q, heads_q, head_dim]; also Algorithm 1's O in global memory
  float* lse = nullptr;      // [batch, heads_q, seqlen_q]
  float* row_max = nullptr;  // Algorithm 1's m in global memory, [batch, heads_q, seqlen_q]
  float* row_sum = nullptr;  // Algorithm 1's l
  const uint8_t* mask = nullptr;
  const int64_t* seqlens_q = nullptr;
  const int64_t* seqlens_k = nullptr;
  int64_t batch = 0, heads_q = 0, heads_kv = 0, seqlen_q = 0, seqlen_k = 0;
  int head_dim = 0;
  float scale = 0.0f;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
};

// Why the kernel cannot run `problem` (naming the field), or "" when it can: the one statement of its rules,
// which the registry asks before touching device memory and split_k_params() enforces.
std::string split_k_refusal(const Problem& problem);

// The parameters of `problem` on the registry's device tensors (m and l in tensors.workspace,
// workspace_bytes(problem) bytes); throws flashlab::Error with split_k_refusal's reason.
SplitKParams split_k_params(const Problem& problem, const DeviceTensors& tensors);

// Each build of the kernel (common/cuda/target.hpp): the forward pass on `stream`, and the registry's
// launcher (split_k_forward of split_k_params, on tensors.stream).
FLASHLAB_FOR_EACH_TARGET(void split_k_forward(const SplitKParams& params, cudaStream_t stream);
                         void launch_split_k(const Problem& problem, const DeviceTensors& tensors);)

}  // namespace flashlab::cuda_v1
