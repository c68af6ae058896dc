// The FP8 pass on the registry's device tensors: the device-side set-up (fp8_device.hpp) and the launchers
// of the registry entry cuda_v3_hopper/fp8 (fp8_stage.hpp), built for the GPU and for the emulator.
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "common/cuda/check.hpp"
#include "common/cuda/device_problem.hpp"
#include "common/cuda/int_lengths.hpp"
#include "common/error.hpp"
#include "common/hadamard.hpp"
#include "cuda_v3_hopper/fp8_device.hpp"
#include "cuda_v3_hopper/fp8_stage.hpp"

namespace flashlab::hopper {
namespace FLASHLAB_CUDA_TARGET {

namespace {

// What the pre-pass and the main kernel are given, in `tensors.workspace` (fp8_workspace). Setup::copy also
// copies the Hadamard factors there for the pre-pass; the main kernel never reads them, and Setup::done keeps
// that host-to-device copy out of a launch of the main kernel alone, which a benchmark times. The per-batch
// lengths are narrowed into the workspace either way (narrow_lengths also says where they lie), so with
// padded lengths their copy is enqueued and timed with the main kernel; the benchmark shapes have none.
enum class Setup { copy, done };
Fp8DeviceParams fp8_params_on(const Problem& p, const DeviceTensors& tensors, const Fp8Config& config,
                              Setup setup) {
  if (cuda::storage_dtype(p.dtype) != DType::bf16)
    fail("cuda_v3_hopper/fp8: dtype (", to_string(p.dtype), ") must be e4m3 or bf16 (stored as bf16)");
  if (tensors.mask != nullptr || p.mask) fail("cuda_v3_hopper/fp8: mask: an explicit mask is not supported");
  if (p.page_size > 0) fail("cuda_v3_hopper/fp8: page_size: paged K/V is not supported");
  if (const std::string reason = why_invalid(config); !reason.empty()) fail("cuda_v3_hopper/fp8: ", reason);
  if (config.scaling != Fp8Scaling::per_block)
    fail("cuda_v3_hopper/fp8: scaling must be per_block (the pre-pass computes tile scales only)");
  if (config.qk_outlier_threshold > 0.0f || config.v_outlier_threshold > 0.0f)
    fail(
        "cuda_v3_hopper/fp8: qk_outlier_threshold and v_outlier_threshold must be 0 (no outlier extraction)");
  if (!config.quantize_qk || !config.quantize_v || !config.round_p)
    fail("cuda_v3_hopper/fp8: quantize_qk, quantize_v and round_p must be on (the kernel always quantizes)");
  if (tensors.workspace == nullptr) fail("cuda_v3_hopper/fp8: workspace must be a device pointer");

  const Fp8Workspace layout = fp8_workspace(p, config);
  std::byte* const base = static_cast<std::byte*>(tensors.workspace);
  auto at = [base](size_t offset) { return base + offset; };
  const cuda::IntLengths lengths = cuda::narrow_lengths(p, tensors, at(layout.lengths));
  float* const factors = reinterpret_cast<float*>(at(layout.hadamard_factors));
  const bool hadamard = config.hadamard && RandomHadamard::why_unsupported(p.head_dim).empty();
  if (hadamard && setup == Setup::copy) {
    // The transform's own factors s_c / sqrt(d), so that the kernel multiplies by the floats the emulation
    // multiplies by.
    const RandomHadamard transform(p.head_dim, config.hadamard_seed);
    std::vector<float> host(static_cast<size_t>(p.head_dim));
    for (int64_t c = 0; c < p.head_dim; ++c) host[c] = transform.output_factor(c);
    FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(factors, host.data(), host.size() * sizeof(float),
                                        cudaMemcpyHostToDevice, tensors.stream));
  }

  Fp8DeviceParams params;
  params.prepass = Fp8PrepassParams{.q = static_cast<const uint16_t*>(tensors.q),
                                    .k = static_cast<const uint16_t*>(tensors.k),
                                    .v = static_cast<const uint16_t*>(tensors.v),
                                    .batch = p.batch,
                                    .seqlen_q = p.seqlen_q,
                                    .seqlen_k = p.seqlen_k,
                                    .heads_q = p.heads_q,
                                    .heads_kv = p.heads_kv,
                                    .head_dim = p.head_dim,
                                    .block_q = config.block_q,
                                    .block_k = config.block_k,
                                    .rows_q = lengths.seqlens_q,
                                    .rows_k = lengths.seqlens_k,
                                    .smooth_k = config.smooth_k,
                                    .hadamard_factors = hadamard ? factors : nullptr,
                                    .softmax_scale = p.softmax_scale(),
                                    .q8 = reinterpret_cast<uint8_t*>(at(layout.q8)),
                                    .k8 = reinterpret_cast<uint8_t*>(at(layout.k8)),
                                    .v8 = reinterpret_cast<uint8_t*>(at(layout.v8)),
                                    .q_descale = reinterpret_cast<float*>(at(layout.q_descale)),
                                    .k_descale = reinterpret_cast<float*>(at(layout.k_descale)),
                                    .v_descale = reinterpret_cast<float*>(at(layout.v_descale)),
                                    .lse_shift = reinterpret_cast<float*>(at(layout.lse_shift)),
                                    .k_mean = reinterpret_cast<float*>(at(layout.k_mean))};
  const Fp8PrepassParams& pre = params.prepass;
  // The kernel holds lengths and windows as int: the registration's supports() has checked they fit.
  params.attention = Fp8AttentionParams{.q8 = pre.q8,
                                        .k8 = pre.k8,
                                        .v8 = pre.v8,
                                        .q_descale = pre.q_descale,
                                        .k_descale = pre.k_descale,
                                        .v_descale = pre.v_descale,
                                        .lse_shift = pre.lse_shift,
                                        .o = static_cast<uint16_t*>(tensors.o),
                                        .lse = tensors.lse,
                                        .seqlens_q = pre.rows_q,
                                        .seqlens_k = pre.rows_k,
                                        .batch = static_cast<int>(p.batch),
                                        .seqlen_q = static_cast<int>(p.seqlen_q),
                                        .seqlen_k = static_cast<int>(p.seqlen_k),
                                        .heads_q = static_cast<int>(p.heads_q),
                                        .heads_kv = static_cast<int>(p.heads_kv),
                                        .head_dim = static_cast<int>(p.head_dim),
                                        .block_q = static_cast<int>(config.block_q),
                                        .block_k = static_cast<int>(config.block_k),
                                        .softmax_scale = static_cast<float>(p.softmax_scale()),
                                        .p_scale = config.p_scale,
                                        .causal = p.causal,
                                        .window_left = static_cast<int>(p.window_left),
                                        .window_right = static_cast<int>(p.window_right)};
  return params;
}

}  // namespace

Fp8DeviceParams fp8_device_params(const Problem& p, const DeviceTensors& tensors, const Fp8Config& config) {
  return fp8_params_on(p, tensors, config, Setup::copy);
}

void run_fp8(const Fp8DeviceParams& params, cudaStream_t stream) {
  launch_fp8_prepass(params.prepass, stream);
  launch_fp8_attention(params.attention, stream);
}

void launch_fp8_config(const Problem& problem, const DeviceTensors& tensors, const Fp8Config& config) {
  run_fp8(fp8_device_params(problem, tensors, config), tensors.stream);
}

void launch_fp8(const Problem& problem, const DeviceTensors& tensors) {
  launch_fp8_config(problem, tensors, registered_fp8_config(problem.head_dim));
}

void launch_fp8_main(const Problem& problem, const DeviceTensors& tensors) {
  const Fp8DeviceParams params =
      fp8_params_on(problem, tensors, registered_fp8_config(problem.head_dim), Setup::done);
  launch_fp8_attention(params.attention, tensors.stream);
}

}  // namespace FLASHLAB_CUDA_TARGET
}  // namespace flashlab::hopper
