// cuda_v3_hopper/ws: FlashAttention-3's forward pass on Hopper (sm_90a), on device pointers. Plain C++ (no
// CUDA header needed to include it): the parameters and their checks are compiled once (ws_params.cpp), the
// launcher in each build of the kernel (ws_launch.cu: the GPU's and the emulator's).
//
// One producer warpgroup loads Q once and K_j, V_j into a circular shared-memory buffer with TMA; two
// consumer warpgroups compute S = Q K_j^T and O += P V_j with wgmma, the online softmax in registers between
// them. Ping-pong scheduling and intra-warpgroup overlap (FA3 section 3.1 and Algorithm 2) hide the softmax
// under the matrix products. HopperAblation switches the ingredients off one at a time, a ladder of rungs
// (docs/05 sets them beside FA3's Table 2, which is an ablation of the full kernel, not a ladder).
#pragma once

#include <cstdint>

#include "common/cuda/exact_rows.hpp"
#include "common/cuda/stream.hpp"
#include "common/cuda/target.hpp"
#include "common/cuda/tile_order.hpp"
#include "common/cuda/tile_width.hpp"
#include "common/host_device.hpp"
#include "common/problem.hpp"

namespace flashlab::hopper {

// The head-dim tile widths the kernel is compiled for: whole 128-byte panels (64 elements), the unit of its
// TMA boxes and wgmma descriptors. Any head dim that is a multiple of 8 up to 256 runs in the narrowest that
// holds it (32 in 64, 80 and 96 in 128, 160 in 192): TMA fills the columns past the tensor's head_dim with
// zeros on the way in and does not store them on the way out (common/cuda/tile_width.hpp).
inline constexpr int kWsTileWidths[] = {64, 128, 192, 256};
constexpr int ws_tile_width(int64_t head_dim) {
  return cuda::tile_width(head_dim, kWsTileWidths);
}

// The CTA's tiles: 128 query rows (two consumer warpgroups of 64; ws_m192's 192 below), and keys per K/V
// block by tile width (d 256 takes FA3's 128 x 80; d 192 takes 96, so that Q and two stages of K and V fit
// 227 KB of shared memory). By head dim or by the tile width it runs in: the two agree. The kernel is built
// from these (ws_launch.cu, ws_kernel.cuh) and the traffic model reads them (ws.cpp).
constexpr int kWsBlockM = 128;
constexpr int ws_block_n(int head_dim) {
  return head_dim > 192 ? 80 : head_dim > 128 ? 96 : 128;
}
// FA3's wider key block for non-causal d 128 (its hopper/tile_size.h): 128 x 176, the full kernel in the 128
// tile width only. S (88 floats a thread), P and O stay within the consumers' 240 registers, and Q with two
// K/V stages take 208 KiB of shared memory. A rung of its own (ws_bc176, ws.cpp), timed beside ws.
constexpr int kWsWideBlockN = 176;
// FA3's taller query block for d 64 (its hopper/tile_size.h, under a causal mask or a window): 192 x 128,
// three consumer warpgroups of 64 rows, each with 160 registers, beside the producer's 32. More rows share
// each K and V block that the CTA loads. The full kernel in the 64 tile width only (ws_m192, ws.cpp).
constexpr int kWsTallBlockM = 192;

// The persistent kernel's tiles: a block of kWsBlockM (or kWsTallBlockM) query rows of one (batch, head),
// handed out in cuda::TileOrder's order (common/cuda/tile_order.hpp): CTA c computes tiles c, c + CTAs,
// c + 2 CTAs, ... of it (a static schedule, FA3's for non-causal attention), longest first in L2 sections.

enum class HopperDType { bf16, f16 };

// The ingredients FA3 ablates (its Table 2 and section 3.1). Our ladder: all off (plain TMA + wgmma, every
// warpgroup computes and one thread also issues the copies) -> + warp specialization -> + ping-pong ->
// + intra-warpgroup overlap. Ping-pong needs warp specialization (the producer must never wait behind a
// consumer's turn). Each rung is also a registry entry (ws.cpp), so the harness checks it and the tools time
// it.
struct HopperAblation {
  bool warp_specialization = true;
  bool ping_pong = true;
  bool intra_warpgroup_overlap = true;
};

struct HopperParams {
  HopperDType dtype = HopperDType::bf16;
  // Device pointers, BSHD: q and o [batch, seqlen_q, heads_q, head_dim], k and v [batch, seqlen_k, heads_kv,
  // head_dim], all of `dtype`, head_dim contiguous, 16-byte aligned. lse: float [batch, heads_q, seqlen_q].
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  int batch = 1;
  int heads_q = 1;
  int heads_kv = 1;  // GQA/MQA: query head h reads kv head h / (heads_q / heads_kv)
  int seqlen_q = 1;
  int seqlen_k = 1;
  int head_dim = 128;  // 64, 128 or 256
  // Strides in elements (the head_dim stride is 1). Packed BSHD: stride_seq = heads * head_dim, stride_head =
  // head_dim, stride_batch = seqlen * heads * head_dim.
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  float softmax_scale = 0.0f;  // (> 0), usually 1/sqrt(head_dim)
  bool causal = false;         // bottom-right aligned
  int window_left = -1;        // sliding window, -1 = unbounded
  int window_right = -1;
  // Per-batch valid lengths (padding), device int arrays of `batch` entries, or null for seqlen_q / seqlen_k.
  const int* seqlens_q = nullptr;
  const int* seqlens_k = nullptr;
  HopperAblation ablation;
  // Keys per block (Bc): 0 takes ws_block_n(head_dim); kWsWideBlockN takes FA3's 128 x 176 (the full kernel,
  // tile width 128).
  int block_n = 0;
  // Query rows per CTA (Br): 0 takes kWsBlockM; kWsTallBlockM takes FA3's 192 x 128 (the full kernel, tile
  // width 64, its own block_n, not persistent).
  int block_m = 0;
  // FA3's persistent kernel: a grid of `ctas` CTAs (0: one per SM), each computing tiles in cuda::TileOrder's
  // order, its pipeline running on from one tile to the next. The full kernel, bf16, head dims up to 128.
  bool persistent = false;
  int ctas = 0;
  // The persistent kernel's count of the tiles handed out after the CTAs' first (its dynamic tile
  // scheduler), 0 when the kernel starts: the launcher clears it on the launch's stream.
  unsigned* tile_counter = nullptr;
  // Where the kernel notes that it wrote a NaN or an Inf, so that the exact pass after it repairs those rows
  // (common/cuda/exact_rows.hpp, flagged mode); null: the pass scans every row.
  unsigned* special_rows = nullptr;
};

// The query rows of a CTA's tile for these parameters (HopperParams::block_m).
inline int ws_block_m(const HopperParams& params) {
  return params.block_m != 0 ? params.block_m : kWsBlockM;
}

// The persistent kernel's order for these parameters (sections sized by cuda::kL2SectionBytes).
cuda::TileOrder ws_tile_order(const HopperParams& params);

// Fills the strides of packed BSHD tensors from the sizes.
void set_packed_strides(HopperParams& params);

// A problem's parameters: dtype (bf16, or f16 for any other), sizes, packed strides, scale, causal and
// window, the full kernel. The pointers (tensors, lengths) are the caller's to set. Used by the registry
// launcher (launch_ws, ws_stage.hpp) and the self-test.
HopperParams ws_params(const Problem& problem);

// Why the launcher cannot run these parameters, or empty when it can (head dim, dtype, ablation, alignment).
const char* hopper_ws_unsupported(const HopperParams& params);

// Launches the forward pass on `stream`. Throws flashlab::Error naming the field for unsupported parameters,
// and on any CUDA failure.
FLASHLAB_FOR_EACH_TARGET(void hopper_ws_forward(const HopperParams& params, cudaStream_t stream);)

}  // namespace flashlab::hopper
