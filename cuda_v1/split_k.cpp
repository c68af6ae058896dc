// cuda_v1/split_k's registration: ordinary C++, compiled once; the kernel (split_k.cu) is built for the GPU
// and for the emulator, and the registry runs whichever this machine can (common/cuda/gpu_stage.hpp).
#include <string>

#include "common/cuda/gpu_stage.hpp"
#include "cuda_v1/split_k.hpp"

namespace flashlab::cuda_v1 {

namespace {

std::string supports(const Problem& p) {
  if (p.head_dim > kMaxHeadDim)
    return "head_dim (" + std::to_string(p.head_dim) + ") must be at most " + std::to_string(kMaxHeadDim);
  return "";
}

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
     .supports = supports,
     .bytes_moved = bytes_moved},
    FLASHLAB_DEVICE_BUILDS(launch_split_k, workspace_bytes))};

}  // namespace

}  // namespace flashlab::cuda_v1
