// Host side of cuda_v3_hopper/ws, built for the GPU and for the emulator (common/cuda/target.hpp): the TMA
// tensor maps, the choice of instantiation (element type, head dim, ablation rung) and the registry's
// launchers. The parameters' checks are ws_params.cpp's.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/cuda/check.hpp"
#include "common/cuda/exact_rows.cuh"
#include "common/cuda/int_lengths.hpp"
#include "common/cuda/launch.cuh"
#include "common/error.hpp"
#include "cuda_v3_hopper/tma_host.hpp"
#include "cuda_v3_hopper/ws.hpp"
#include "cuda_v3_hopper/ws_kernel.cuh"
#include "cuda_v3_hopper/ws_stage.hpp"

namespace flashlab::hopper {
namespace FLASHLAB_CUDA_TARGET {
namespace {

template <class Config>
void launch(const HopperParams& params, cudaStream_t stream) {
  const int num_m_blocks = (params.seqlen_q + Config::kBlockM - 1) / Config::kBlockM;
  // With no keys at all the K and V maps are never read; they still need a valid address, extent and strides,
  // so they borrow Q's.
  HopperParams kv = params;
  if (params.seqlen_k == 0) {
    kv.k = kv.v = params.q;
    kv.seqlen_k = 1;
    kv.heads_kv = params.heads_q;
    kv.k_batch_stride = kv.v_batch_stride = params.q_batch_stride;
    kv.k_row_stride = kv.v_row_stride = params.q_row_stride;
    kv.k_head_stride = kv.v_head_stride = params.q_head_stride;
  }
  const CUtensorMap q_map =
      bshd_tensor_map(params.q, params.dtype, params.head_dim, params.seqlen_q, params.heads_q, params.batch,
                      params.q_row_stride, params.q_head_stride, params.q_batch_stride, Config::kBlockM, "q");
  const CUtensorMap k_map =
      bshd_tensor_map(kv.k, params.dtype, params.head_dim, kv.seqlen_k, kv.heads_kv, params.batch,
                      kv.k_row_stride, kv.k_head_stride, kv.k_batch_stride, Config::kBlockN, "k");
  const CUtensorMap v_map =
      bshd_tensor_map(kv.v, params.dtype, params.head_dim, kv.seqlen_k, kv.heads_kv, params.batch,
                      kv.v_row_stride, kv.v_head_stride, kv.v_batch_stride, Config::kBlockN, "v");
  // Each consumer warpgroup stores its own 64 rows.
  const CUtensorMap o_map =
      bshd_tensor_map(params.o, params.dtype, params.head_dim, params.seqlen_q, params.heads_q, params.batch,
                      params.o_row_stride, params.o_head_stride, params.o_batch_stride, 64, "o");
  WsArgs args{};
  args.lse = params.lse;
  args.seqlens_q = params.seqlens_q;
  args.seqlens_k = params.seqlens_k;
  args.seqlen_q = params.seqlen_q;
  args.seqlen_k = params.seqlen_k;
  args.heads_q = params.heads_q;
  args.heads_kv = params.heads_kv;
  args.causal = params.causal ? 1 : 0;
  args.window_left = params.window_left;
  args.window_right = params.window_right;
  args.num_m_blocks = num_m_blocks;
  args.scale_log2 = params.softmax_scale * 1.4426950408889634f;  // log2(e)
  args.special_rows = params.special_rows;
  if constexpr (Config::kPersistent) {
    args.order = ws_tile_order(params);
    args.tile_counter = params.tile_counter;
  }

  // More than 48 KB of dynamic shared memory must be asked for, once per kernel.
  static const bool configured = [] {
    FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(
        ws_attention_kernel<Config>, cudaFuncAttributeMaxDynamicSharedMemorySize, Config::kSharedBytes));
    return true;
  }();
  (void)configured;
  // A grid of tiles, or of CTAs that each compute many (the persistent kernel: one per SM, or params.ctas).
  dim3 grid(num_m_blocks, params.heads_q, params.batch);
  if constexpr (Config::kPersistent)
    grid = dim3(std::min(args.order.tiles(), params.ctas > 0 ? params.ctas : cuda::sm_count()));
  cuda::launch_kernel<ws_attention_kernel<Config>>(grid, Config::kThreads, Config::kSharedBytes, stream,
                                                   q_map, k_map, v_map, o_map, args);
}

// Bc per head dim (ws_block_n, ws.hpp), with Br = 128 (two consumer warpgroups): S, P and O must fit the
// consumers' 240 registers and two K/V stages the 227 KB of shared memory. The 192-row tile takes the same Bc
// at d 64, within 160 registers.
template <int kHeadDim>
constexpr int block_n() {
  return ws_block_n(kHeadDim);
}

// The ablation ladder (ws_params.cpp has refused the combinations that are not rungs).
template <typename Element, int kHeadDim>
void launch_rung(const HopperParams& params, cudaStream_t stream) {
  constexpr int kN = block_n<kHeadDim>();
  const HopperAblation& a = params.ablation;
  // The persistent kernel (ws_params.cpp has refused it outside the full kernel, bf16, tile widths to 128).
  if constexpr (std::is_same_v<Element, __nv_bfloat16> && kHeadDim <= 128)
    if (params.persistent)
      return launch<WsConfig<Element, kHeadDim, kN, true, true, true, true>>(params, stream);
  if constexpr (kHeadDim == 128)  // FA3's 128 x 176 (ws_params.cpp has refused it with any other rung)
    if (params.block_n == kWsWideBlockN)
      return launch<WsConfig<Element, kHeadDim, kWsWideBlockN, true, true, true>>(params, stream);
  // FA3's 192 x 128, three consumers (ws_params.cpp has refused it outside the full kernel, bf16, width 64).
  if constexpr (std::is_same_v<Element, __nv_bfloat16> && kHeadDim == 64)
    if (params.block_m == kWsTallBlockM)
      return launch<WsConfig<Element, kHeadDim, kN, true, true, true, false, 3>>(params, stream);
  if (a.intra_warpgroup_overlap)
    return launch<WsConfig<Element, kHeadDim, kN, true, true, true>>(params, stream);
  if (a.ping_pong) return launch<WsConfig<Element, kHeadDim, kN, true, true, false>>(params, stream);
  if (a.warp_specialization)
    return launch<WsConfig<Element, kHeadDim, kN, true, false, false>>(params, stream);
  return launch<WsConfig<Element, kHeadDim, kN, false, false, false>>(params, stream);
}

// The registry's launchers: one rung each, on a problem's device tensors.
void launch_ablation(const Problem& problem, const DeviceTensors& tensors, HopperAblation ablation,
                     int block_n = 0, bool persistent = false, int ctas = 0, int block_m = 0) {
  if (problem.dtype != DType::bf16 && problem.dtype != DType::f16)
    fail("cuda_v3_hopper/ws: dtype (", to_string(problem.dtype), ") must be bf16 or f16");
  if (tensors.mask != nullptr) fail("cuda_v3_hopper/ws: an explicit mask is not supported");
  HopperParams params = ws_params(problem);
  params.q = tensors.q;
  params.k = tensors.k;
  params.v = tensors.v;
  params.o = tensors.o;
  params.lse = tensors.lse;
  params.ablation = ablation;
  params.block_n = block_n;
  params.block_m = block_m;
  params.persistent = persistent;
  params.ctas = ctas;
  const cuda::IntLengths lengths = cuda::narrow_lengths(problem, tensors, tensors.workspace);
  params.seqlens_q = lengths.seqlens_q;
  params.seqlens_k = lengths.seqlens_k;
  params.special_rows = cuda::clear_special_rows_flag(tensors.workspace, problem, tensors.stream);
  if (persistent) {
    params.tile_counter = ws_tile_counter(tensors.workspace, problem);
    FLASHLAB_CUDA_CHECK(cudaMemsetAsync(params.tile_counter, 0, sizeof(unsigned), tensors.stream));
  }
  hopper_ws_forward(params, tensors.stream);
}

}  // namespace

void hopper_ws_forward(const HopperParams& params, cudaStream_t stream) {
  if (const char* reason = hopper_ws_unsupported(params); reason[0] != '\0')
    fail("cuda_v3_hopper/ws: ", reason);
  if (params.q == nullptr || params.o == nullptr || params.lse == nullptr ||
      (params.seqlen_k > 0 && (params.k == nullptr || params.v == nullptr)))
    fail("cuda_v3_hopper/ws: q, k, v, o and lse must be device pointers");
  const bool bf16 = params.dtype == HopperDType::bf16;
  switch (ws_tile_width(params.head_dim)) {  // the tile the head dim runs in (ws.hpp)
    case 64:
      bf16 ? launch_rung<__nv_bfloat16, 64>(params, stream) : launch_rung<__half, 64>(params, stream);
      break;
    case 128:
      bf16 ? launch_rung<__nv_bfloat16, 128>(params, stream) : launch_rung<__half, 128>(params, stream);
      break;
    case 192:
      bf16 ? launch_rung<__nv_bfloat16, 192>(params, stream) : launch_rung<__half, 192>(params, stream);
      break;
    default:
      bf16 ? launch_rung<__nv_bfloat16, 256>(params, stream) : launch_rung<__half, 256>(params, stream);
  }
  // NaN and Inf as the reference (docs/08, "NaN and Inf"): the exact pass after the kernel, flagged or
  // scanning (common/cuda/exact_rows.hpp).
  if (bf16)
    cuda::exact_rows<__nv_bfloat16>(cuda::exact_rows_params(params), stream);
  else
    cuda::exact_rows<__half>(cuda::exact_rows_params(params), stream);
}

void launch_ws(const Problem& problem, const DeviceTensors& tensors) {
  launch_ablation(problem, tensors, {true, true, true});
}
void launch_ws_no_overlap(const Problem& problem, const DeviceTensors& tensors) {
  launch_ablation(problem, tensors, {true, true, false});
}
void launch_ws_no_pingpong(const Problem& problem, const DeviceTensors& tensors) {
  launch_ablation(problem, tensors, {true, false, false});
}
void launch_ws_no_producer(const Problem& problem, const DeviceTensors& tensors) {
  launch_ablation(problem, tensors, {false, false, false});
}
void launch_ws_bc176(const Problem& problem, const DeviceTensors& tensors) {
  launch_ablation(problem, tensors, {true, true, true}, kWsWideBlockN);
}
void launch_ws_m192(const Problem& problem, const DeviceTensors& tensors) {
  launch_ablation(problem, tensors, {true, true, true}, 0, false, 0, kWsTallBlockM);
}
void launch_ws_persistent(const Problem& problem, const DeviceTensors& tensors) {
  launch_ablation(problem, tensors, {true, true, true}, 0, true);
}
void launch_ws_persistent_ctas(const Problem& problem, const DeviceTensors& tensors, int ctas) {
  launch_ablation(problem, tensors, {true, true, true}, 0, true, ctas);
}

}  // namespace FLASHLAB_CUDA_TARGET
}  // namespace flashlab::hopper
