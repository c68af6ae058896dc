// cuda_v3_hopper/fp8 as a registry entry, in plain C++ (the registration, fp8.cpp, is compiled in every
// build): the scratch the launcher carves from the registry's device workspace, and the launchers on the
// registry's device tensors (fp8_stage.cu; CUDA builds only, runs on sm_90a). The device-side set-up behind
// them is fp8_device.hpp's, shared with fp8_selftest.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/cuda/int_lengths.hpp"
#include "common/cuda/target.hpp"
#include "common/registry.hpp"
#include "cuda_v3_hopper/fp8_emulated.hpp"

namespace flashlab::hopper {

// Byte offsets into the device workspace, each 16-byte aligned (TMA reads q8, k8 and v8 and needs that).
// Every region holds at least one element, so that every pointer is a distinct address inside the workspace.
struct Fp8Workspace {
  size_t lengths = 0;             // the int32 per-batch lengths (common/cuda/int_lengths.hpp), at offset 0
  size_t q8 = 0, k8 = 0, v8 = 0;  // e4m3 operands (fp8_prepass.hpp layouts)
  size_t q_descale = 0, k_descale = 0, v_descale = 0;  // float, one per tile
  size_t lse_shift = 0;                                // float [batch, heads_q, seqlen_q]
  size_t k_mean = 0;                                   // float [batch, heads_kv, head_dim]
  size_t hadamard_factors = 0;                         // float [head_dim]
  size_t bytes = 0;                                    // the whole workspace
};

inline Fp8Workspace fp8_workspace(const Problem& p, const Fp8Config& config) {
  Fp8Workspace layout;
  size_t at = cuda::int_lengths_bytes(p);  // a multiple of 16
  auto place = [&at](int64_t count, size_t element_bytes) {
    const size_t offset = at;
    at += (static_cast<size_t>(std::max<int64_t>(count, 1)) * element_bytes + 15) / 16 * 16;
    return offset;
  };
  const int64_t tiles_q = (p.seqlen_q + config.block_q - 1) / config.block_q;
  const int64_t tiles_k = (p.seqlen_k + config.block_k - 1) / config.block_k;
  layout.q8 = place(p.q_elements(), 1);
  layout.k8 = place(p.kv_elements(), 1);
  layout.v8 = place(p.batch * p.heads_kv * tiles_k * p.head_dim * config.block_k, 1);  // tiles padded to Bc
  layout.q_descale = place(p.batch * p.heads_q * tiles_q, sizeof(float));
  layout.k_descale = place(p.batch * p.heads_kv * tiles_k, sizeof(float));
  layout.v_descale = place(p.batch * p.heads_kv * tiles_k, sizeof(float));
  layout.lse_shift = place(p.lse_elements(), sizeof(float));
  layout.k_mean = place(p.batch * p.heads_kv * p.head_dim, sizeof(float));
  layout.hadamard_factors = place(p.head_dim, sizeof(float));
  layout.bytes = at;
  return layout;
}

// The registry's DeviceBuild::workspace: the scratch of the registered configuration.
inline size_t fp8_workspace_bytes(const Problem& problem) {
  return fp8_workspace(problem, registered_fp8_config(problem.head_dim)).bytes;
}

// The pre-pass then the main kernel on the registry's device tensors (bf16 Q, K, V in; bf16 O and LSE out),
// enqueued on the default stream, with the registered configuration (registered_fp8_config) or `config`
// (block scales only; the kernel's key tile, fp8_kernel_block_k; `tensors.workspace` of at least
// fp8_workspace(problem, config).bytes).
// launch_fp8_main: the main kernel alone, with the registered configuration, on a workspace that launch_fp8
// has prepared for the same problem and tensors (the registry's DeviceBuild::forward_main: FA3 reports its
// FP8 kernel's speed without the pre-pass).
FLASHLAB_FOR_EACH_TARGET(void launch_fp8(const Problem& problem, const DeviceTensors& tensors);
                         void launch_fp8_config(const Problem& problem, const DeviceTensors& tensors,
                                                const Fp8Config& config);
                         void launch_fp8_main(const Problem& problem, const DeviceTensors& tensors);)

// "" when the FP8 kernels run on this machine's GPU, else why they run in the emulator (the registry entry's
// `emulation`).
std::string fp8_emulation();

// O and LSE of `problem` (e4m3 or bf16: both are fed as bf16) through the pre-pass and kernel with `config`,
// on the GPU or else in the emulator (fp8_emulation), host in, host out; flashlab::Error with the reason
// where the kernel does not take the problem or the configuration. What `flashlab fp8-accuracy --device cuda`
// runs.
void fp8_cuda_attention(const Problem& problem, const AttentionInputs& inputs, AttentionOutputs& outputs,
                        const Fp8Config& config);

}  // namespace flashlab::hopper
