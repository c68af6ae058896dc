// The per-batch lengths as int32, for kernels that index them as int (cuda_v2, cuda_v3_hopper/ws,
// decoding/cuda_split_kv). DeviceTensors holds the problem's int64 lengths; a launcher narrows them into its
// workspace before the launch. Plain C++: the registrations (compiled once) size the workspace with
// int_lengths_bytes(); narrow_lengths() exists in each build of the launchers (common/cuda/target.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/cuda/target.hpp"
#include "common/registry.hpp"

namespace flashlab::cuda {

// Workspace bytes for the int32 copies of the problem's seqlens_q and seqlens_k and of its cumulative lengths
// cu_seqlens_q and cu_seqlens_k (0 when it has none), a multiple of 16 so that whatever a launcher places
// after them stays 16-byte aligned.
inline size_t int_lengths_bytes(const Problem& p) {
  const size_t count =
      p.seqlens_q.size() + p.seqlens_k.size() + p.cu_seqlens_q.size() + p.cu_seqlens_k.size();
  return (count * sizeof(int32_t) + 15) / 16 * 16;
}

struct IntLengths {
  const int* seqlens_q = nullptr;  // device [batch], or nullptr when the problem has no seqlens_q
  const int* seqlens_k = nullptr;
  const int* cu_seqlens_q = nullptr;  // device [batch + 1], or nullptr when the problem is not packed
  const int* cu_seqlens_k = nullptr;
};

// Enqueues on tensors.stream the copies of tensors.seqlens_q / seqlens_k / cu_seqlens_q / cu_seqlens_k
// into `workspace` (at least int_lengths_bytes(problem) bytes, 4-byte aligned) as int32. The lengths are in
// [0, seqlen] and the cumulative ones in [0, tokens], so the caller must have checked that seqlen_q,
// seqlen_k and the token counts fit an int.
FLASHLAB_FOR_EACH_TARGET(IntLengths narrow_lengths(const Problem& problem, const DeviceTensors& tensors,
                                                   void* workspace);)
using namespace FLASHLAB_CUDA_TARGET;

}  // namespace flashlab::cuda
