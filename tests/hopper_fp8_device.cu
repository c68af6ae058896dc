// The FP8 pre-pass and kernel on the device (hopper_fp8_device.hpp), in each build (common/cuda/target.hpp).
#include "tests/hopper_fp8_device.hpp"

#include <cuda_runtime.h>

#include "common/cuda/check.hpp"
#include "common/cuda/device_problem.hpp"
#include "common/cuda/gpu_stage.hpp"
#include "cuda_v3_hopper/fp8_device.hpp"
#include "cuda_v3_hopper/fp8_stage.hpp"

namespace flashlab::testing {
namespace FLASHLAB_CUDA_TARGET {

namespace {

template <typename T>
std::vector<T> to_host(const T* device, int64_t count) {
  std::vector<T> host(static_cast<size_t>(count));
  if (count > 0)
    FLASHLAB_CUDA_CHECK(cudaMemcpy(host.data(), device, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

}  // namespace

Fp8PrepassOutputs fp8_prepass_on_device(const Problem& p, const AttentionInputs& inputs,
                                        const hopper::Fp8Config& config) {
  const size_t bytes = hopper::fp8_workspace(p, config).bytes;
  const cuda::DeviceProblem device(p, inputs, bytes);
  FLASHLAB_CUDA_CHECK(cudaMemset(device.tensors().workspace, 0xff, bytes));
  const hopper::Fp8DeviceParams params =
      hopper::FLASHLAB_CUDA_TARGET::fp8_device_params(p, device.tensors(), config);
  hopper::FLASHLAB_CUDA_TARGET::launch_fp8_prepass(params.prepass, nullptr);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const hopper::Fp8PrepassParams& pre = params.prepass;
  const int64_t tiles_q = hopper::fp8_tiles(p.seqlen_q, config.block_q);
  const int64_t tiles_k = hopper::fp8_tiles(p.seqlen_k, config.block_k);
  Fp8PrepassOutputs out;
  out.q8 = to_host(pre.q8, p.q_elements());
  out.k8 = to_host(pre.k8, p.kv_elements());
  out.v8 = to_host(pre.v8, p.batch * p.heads_kv * tiles_k * p.head_dim * config.block_k);
  out.q_descale = to_host(pre.q_descale, p.batch * p.heads_q * tiles_q);
  out.k_descale = to_host(pre.k_descale, p.batch * p.heads_kv * tiles_k);
  out.v_descale = to_host(pre.v_descale, p.batch * p.heads_kv * tiles_k);
  out.lse_shift = to_host(pre.lse_shift, p.lse_elements());
  return out;
}

AttentionOutputs fp8_attention_on_device(const Problem& p, const AttentionInputs& inputs,
                                         const hopper::Fp8Config& config) {
  AttentionOutputs out = AttentionOutputs::poisoned(p);
  cuda::run_on_device(p, inputs, out, hopper::fp8_workspace(p, config).bytes,
                      [&](const DeviceTensors& tensors) {
                        hopper::FLASHLAB_CUDA_TARGET::launch_fp8_config(p, tensors, config);
                      });
  return out;
}

}  // namespace FLASHLAB_CUDA_TARGET
}  // namespace flashlab::testing
