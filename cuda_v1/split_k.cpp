// cuda_v1/split_k's registration and parameters: ordinary C++, compiled once; the kernel (split_k.cu) is
// built for the GPU and for the emulator, and the registry runs whichever this machine can
// (common/cuda/gpu_stage.hpp).
#include <string>

#include "common/cuda/gpu_stage.hpp"
#include "common/error.hpp"
#include "cuda_v1/split_k.hpp"

namespace flashlab::cuda_v1 {

std::string split_k_refusal(const Problem& p) {
  if (p.dtype != DType::f32)
    return "dtype (" + std::string(to_string(p.dtype)) + ") must be f32 for cuda_v1/split_k";
  if (p.head_dim > kMaxHeadDim)
    return "head_dim (" + std::to_string(p.head_dim) + ") must be at most " + std::to_string(kMaxHeadDim) +
           " for cuda_v1/split_k";
  if (p.batch * p.heads_q > int64_t{0x7fffffff})
    return "batch * heads_q (" + std::to_string(p.batch * p.heads_q) + ") exceeds the grid limit 2^31 - 1";
  return "";
}

SplitKParams split_k_params(const Problem& problem, const DeviceTensors& tensors) {
  if (const std::string reason = split_k_refusal(problem); !reason.empty()) fail(reason);
  float* const statistics = static_cast<float*>(tensors.workspace);
  return {.q = static_cast<const float*>(tensors.q),
          .k = static_cast<const float*>(tensors.k),
          .v = static_cast<const float*>(tensors.v),
          .o = static_cast<float*>(tensors.o),
          .lse = tensors.lse,
          .row_max = statistics,
          .row_sum = statistics + problem.lse_elements(),
          .mask = tensors.mask,
          .seqlens_q = tensors.seqlens_q,
          .seqlens_k = tensors.seqlens_k,
          .batch = problem.batch,
          .heads_q = problem.heads_q,
          .heads_kv = problem.heads_kv,
          .seqlen_q = problem.seqlen_q,
          .seqlen_k = problem.seqlen_k,
          .head_dim = static_cast<int>(problem.head_dim),
          .scale = static_cast<float>(problem.softmax_scale()),
          .causal = problem.causal,
          .window_left = problem.window_left,
          .window_right = problem.window_right};
}

namespace {

// Algorithm 1's HBM traffic (FA1 Theorem 2): O = 0, l = 0, m = -inf written first (line 2); K and V read
// once per query head (one block per (batch, head): with GQA each head of a group reads its kv head); Q_i
// read, and O_i, l_i, m_i read and written, once per K/V block (Tc = ceil(seqlen_k / 128) of them); at the
// end m and l read back for LSE, which is written once. Hidden tiles (causal, windows) are skipped, so this
// is an upper bound for masked problems. `flashlab profile` counts it in the emulator.
double bytes_moved(const Problem& p) {
  const double kv_blocks = static_cast<double>((p.seqlen_k + 127) / 128);
  const double q = static_cast<double>(p.q_elements()), rows = static_cast<double>(p.lse_elements());
  const double kv = static_cast<double>(p.kv_elements() * p.group_size());
  return sizeof(float) * ((q + 2.0 * rows) + 2.0 * kv + kv_blocks * (3.0 * q + 4.0 * rows) + 3.0 * rows);
}

const Registration split_k{gpu_implementation(
    {.name = "cuda_v1/split_k",
     .summary = "FA1 Algorithm 1 on CUDA, fp32: K/V outer, Q inner, O/l/m in global memory, warps split K/V",
     .constraints = "f32; head_dim <= 128; every mask, GQA, any length",
     .supports = split_k_refusal,
     .bytes_moved = bytes_moved},
    FLASHLAB_DEVICE_BUILDS(launch_split_k, workspace_bytes))};

}  // namespace

}  // namespace flashlab::cuda_v1
