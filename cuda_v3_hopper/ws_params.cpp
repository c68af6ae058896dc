// cuda_v3_hopper/ws's parameters and their checks, in plain C++ (compiled once): what both builds of the
// launcher (ws_launch.cu) and the registration (ws.cpp) ask.
#include <cstdint>

#include "cuda_v3_hopper/ws.hpp"

namespace flashlab::hopper {

void set_packed_strides(HopperParams& p) {
  p.q_head_stride = p.o_head_stride = p.head_dim;
  p.q_row_stride = p.o_row_stride = static_cast<int64_t>(p.heads_q) * p.head_dim;
  p.q_batch_stride = p.o_batch_stride = p.q_row_stride * p.seqlen_q;
  p.k_head_stride = p.v_head_stride = p.head_dim;
  p.k_row_stride = p.v_row_stride = static_cast<int64_t>(p.heads_kv) * p.head_dim;
  p.k_batch_stride = p.v_batch_stride = p.k_row_stride * p.seqlen_k;
}

cuda::TileOrder ws_tile_order(const HopperParams& p) {
  return cuda::l2_sectioned_order((p.seqlen_q + ws_block_m(p) - 1) / ws_block_m(p), p.heads_q, p.batch,
                                  int64_t{4} * p.seqlen_k * p.head_dim);
}

HopperParams ws_params(const Problem& problem) {
  HopperParams params;
  params.dtype = problem.dtype == DType::bf16 ? HopperDType::bf16 : HopperDType::f16;
  params.batch = static_cast<int>(problem.batch);
  params.heads_q = static_cast<int>(problem.heads_q);
  params.heads_kv = static_cast<int>(problem.heads_kv);
  params.seqlen_q = static_cast<int>(problem.seqlen_q);
  params.seqlen_k = static_cast<int>(problem.seqlen_k);
  params.head_dim = static_cast<int>(problem.head_dim);
  set_packed_strides(params);
  params.softmax_scale = static_cast<float>(problem.softmax_scale());
  params.causal = problem.causal;
  params.window_left = static_cast<int>(problem.window_left);
  params.window_right = static_cast<int>(problem.window_right);
  return params;
}

const char* hopper_ws_unsupported(const HopperParams& p) {
  if (ws_tile_width(p.head_dim) == 0) return "head_dim must be a multiple of 8 up to 256";
  if (p.batch < 1 || p.heads_q < 1 || p.heads_kv < 1 || p.seqlen_q < 1 || p.seqlen_k < 0)
    return "batch, heads_q, heads_kv and seqlen_q must be >= 1, seqlen_k >= 0";
  if (p.heads_q % p.heads_kv != 0) return "heads_q must be a multiple of heads_kv";
  if (!(p.softmax_scale > 0.0f))
    return "softmax_scale must be positive (the row maximum is taken on unscaled scores)";
  if (p.window_left < -1 || p.window_right < -1) return "window_left and window_right must be >= -1";
  // TMA: global addresses 16-byte aligned, strides multiples of 16 bytes.
  for (const void* pointer : {p.q, p.k, p.v, static_cast<const void*>(p.o)})
    if (pointer != nullptr && reinterpret_cast<uintptr_t>(pointer) % 16 != 0)
      return "q, k, v and o must be 16-byte aligned";
  for (int64_t stride :
       {p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.o_batch_stride, p.o_row_stride, p.o_head_stride})
    if (stride <= 0 || stride % 8 != 0) return "strides must be positive multiples of 8 elements (16 bytes)";
  if (p.seqlen_k > 0)  // with no keys K and V are never read
    for (int64_t stride : {p.k_batch_stride, p.k_row_stride, p.k_head_stride, p.v_batch_stride,
                           p.v_row_stride, p.v_head_stride})
      if (stride <= 0 || stride % 8 != 0)
        return "strides must be positive multiples of 8 elements (16 bytes)";
  const HopperAblation& a = p.ablation;
  if (a.ping_pong && !a.warp_specialization) return "ablation: ping_pong needs warp_specialization";
  if (a.intra_warpgroup_overlap && !a.warp_specialization)
    return "ablation: intra_warpgroup_overlap needs warp_specialization";
  if (a.intra_warpgroup_overlap && !a.ping_pong)
    return "ablation: the ladder adds ping-pong before intra-warpgroup overlap";
  // FA3's other tiles and its persistent scheduler are built for the full kernel alone.
  const bool full_kernel = a.warp_specialization && a.ping_pong && a.intra_warpgroup_overlap;
  if (p.block_n != 0 && p.block_n != ws_block_n(ws_tile_width(p.head_dim)) &&
      !(p.block_n == kWsWideBlockN && ws_tile_width(p.head_dim) == 128 && full_kernel))
    return "block_n must be 0, the head dim's own, or 176 for the full kernel in the 128 tile width";
  if (p.block_m != 0 && p.block_m != kWsBlockM &&
      !(p.block_m == kWsTallBlockM && p.dtype == HopperDType::bf16 && ws_tile_width(p.head_dim) == 64 &&
        !p.persistent && full_kernel))
    return "block_m must be 0, 128, or 192 for the full kernel in bf16 and the 64 tile width (its own "
           "block_n, not persistent)";
  if (p.persistent) {
    // block_n is 0, its own or 176 by now (above): the persistent kernel takes the first two.
    if (p.dtype != HopperDType::bf16 || ws_tile_width(p.head_dim) > 128 || p.block_n == kWsWideBlockN ||
        !full_kernel)
      return "persistent: the full kernel, bf16, head dims up to 128, its own block_n";
    if (p.ctas < 0) return "ctas must be >= 0 (0: one CTA per SM)";
    if (p.tile_counter == nullptr) return "persistent: tile_counter must be a device pointer (cleared to 0)";
    // The tiles are numbered in an int (cuda::TileOrder).
    if (!cuda::numbered_in_an_int((p.seqlen_q + ws_block_m(p) - 1) / ws_block_m(p), p.heads_q, p.batch))
      return "persistent: more than 2^31 - 1 tiles";
  }
  return "";
}

}  // namespace flashlab::hopper
