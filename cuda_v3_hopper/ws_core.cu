// cuda_v3_hopper/ws_core: FlashAttention-3's forward (Shah et al. 2024, Algorithm 1: warp specialization
// without intra-consumer overlap, CTA view), written to be read beside the paper. The plain case only: bf16
// in and out, fp32 accumulation, head_dim 64 or 128, causal, window and padding masks, GQA, LSE. The CTA's
// warpgroups take roles: a producer that moves tiles with TMA (the Tensor Memory Accelerator) and two
// consumers that multiply them with wgmma. cuda_v3_hopper/ws adds, one rung at a time, ping-pong scheduling
// between the consumers and the overlap of softmax and products inside one (docs/05-cuda-v3-hopper.md); this
// file is the algorithm.
//
// Algorithm 1, line by line (the [Ln] marks in the code below; tests/check_cores.py holds this table to
// them):
//   [L1]  a pipeline of s = kStages shared-memory stages, each with "full" and "empty" mbarriers
//   [L2]  the producer warpgroup:
//   [L3]    gives back registers (setmaxnreg.dec)
//   [L4]    loads Q_i with TMA,  [L5] which completes on its mbarrier for the consumers
//   [L6]    for each key block j:  [L7] waits until stage j % s is free,
//   [L8]    loads K_j and V_j into it with TMA,  [L9] which complete on the stage's full barriers
//   [L11] each consumer warpgroup (64 of the CTA's 128 query rows):
//   [L12]   takes registers (setmaxnreg.inc)
//   [L13]   O_i = 0, l_i = 0, m_i = -inf in registers
//   [L14]   waits for Q_i
//   [L15]   for each key block j:  [L16] waits for K_j
//   [L17]   S = Q_i K_j^T (wgmma, both operands in shared memory), committed and waited for
//   [L18]   m_old = m_i, m_i = max(m_old, rowmax(S))
//   [L19]   P = exp(S - m_i), l_i = exp(m_old - m_i) l_i + rowsum(P)
//   [L20]   waits for V_j
//   [L21]   O_i = diag(exp(m_old - m_i)) O_i + P V_j (wgmma, P from registers), committed and waited for
//   [L22]   releases stage j % s to the producer
//   [L24]   O_i = diag(l_i)^-1 O_i and L_i = m_i + log(l_i)
//   [L25]   writes O_i and L_i
// (Lines 10, 23 and 26 close the branches and loops.)
//
// The wgmma accumulator of a warpgroup's 64 rows (wgmma.cuh): warp w holds rows 16w + lane / 4 and that + 8,
// register 4c + 2h + e being row 16w + lane / 4 + 8h, column 8c + 2 (lane % 4) + e; the four threads of a
// quad hold one row between them. K and V past a sequence's real length are padding that TMA loads like any
// row: a key that no row sees weighs 0, but 0 x NaN is NaN, so the exact pass after the kernel repairs any
// row that a NaN or Inf in padding or in a hidden key reached (common/cuda/exact_rows.hpp, scanning mode).
#include <cuda.h>
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "common/cuda/check.hpp"
#include "common/cuda/exact_rows.cuh"
#include "common/cuda/int_lengths.hpp"
#include "common/cuda/launch.cuh"
#include "common/error.hpp"
#include "common/mask.hpp"
#include "cuda_v3_hopper/pipeline.cuh"
#include "cuda_v3_hopper/tma.cuh"
#include "cuda_v3_hopper/tma_host.hpp"
#include "cuda_v3_hopper/warpgroup.cuh"
#include "cuda_v3_hopper/wgmma.cuh"
#include "cuda_v3_hopper/ws_stage.hpp"

namespace flashlab::hopper {
namespace FLASHLAB_CUDA_TARGET {
namespace {

using Element = __nv_bfloat16;
constexpr int kBlockM = 128, kBlockN = 128;  // query rows per CTA (64 a consumer), keys per K/V block
constexpr int kStages = 2;                   // [L1] s
constexpr int kThreads = 3 * 128;            // the producer warpgroup and two consumers
constexpr uint32_t kLaunchRegisters = 65536 / kThreads / 8 * 8, kProducerRegisters = 24,
                   kConsumerRegisters = 240;  // 24 + 2 x 240 of 3 x 168: FA3's split

struct CoreArgs {
  void* o;
  float* lse;
  const int *seqlens_q, *seqlens_k;  // per-batch lengths, or null
  int seqlen_q, seqlen_k, heads_q, heads_kv, causal, window_left, window_right;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  float scale;
};

// Shared memory, 1024-byte aligned for the 128-byte swizzle: Q, then the stages' K and V tiles, each in
// column panels of 64 elements (128 bytes a row) as TMA writes them; then the mbarriers.
template <int kHeadDim>
struct Layout {
  static constexpr int kPanels = kHeadDim / 64;
  static constexpr uint32_t kQBytes = kBlockM * kSwizzleRowBytes * kPanels;
  static constexpr uint32_t kKvPanelBytes = kBlockN * kSwizzleRowBytes, kKvBytes = kKvPanelBytes * kPanels;
  static constexpr uint32_t kBarriers = kQBytes + 2 * kStages * kKvBytes;  // q_full, then 3 per stage
  static constexpr uint32_t kBytes = kBarriers + 8 * (1 + 3 * kStages) + kSwizzleAtomBytes;
  uint8_t* base;
  __device__ explicit Layout(uint8_t* raw)
      : base(reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + kSwizzleAtomBytes - 1) &
                                        ~uintptr_t(kSwizzleAtomBytes - 1))) {}
  __device__ uint8_t* q() const { return base; }
  __device__ uint8_t* k(int stage) const { return base + kQBytes + stage * kKvBytes; }
  __device__ uint8_t* v(int stage) const { return base + kQBytes + (kStages + stage) * kKvBytes; }
  __device__ uint64_t* q_full() const { return reinterpret_cast<uint64_t*>(base + kBarriers); }
  __device__ uint64_t* k_full(int stage) const { return q_full() + 1 + stage; }
  __device__ uint64_t* v_full(int stage) const { return q_full() + 1 + kStages + stage; }
  __device__ uint64_t* empty(int stage) const { return q_full() + 1 + 2 * kStages + stage; }
};

template <int kHeadDim>
__global__ void __launch_bounds__(kThreads, 1)
    ws_core_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                   const __grid_constant__ CUtensorMap v_map, const CoreArgs args) {
  using Tiles = Layout<kHeadDim>;
  using Stages = Ring<kStages>;
  const Tiles tiles(cuda::dynamic_shared_memory<uint8_t>());
  const int m_block = blockIdx.x, head = blockIdx.y, b = blockIdx.z;
  const int head_kv = head / (args.heads_q / args.heads_kv);  // GQA: the kv head is a TMA coordinate
  const int rows_q = args.seqlens_q ? args.seqlens_q[b] : args.seqlen_q;
  const int rows_k = args.seqlens_k ? args.seqlens_k[b] : args.seqlen_k;
  const int blocks = (rows_k + kBlockN - 1) / kBlockN;  // every key block up to the batch's last key

  if (threadIdx.x == 0) {  // [L1] the pipeline's barriers
    mbarrier_init(tiles.q_full(), 1);
    for (int stage = 0; stage < kStages; ++stage) {
      mbarrier_init(tiles.k_full(stage), 1);  // the producer's arrival; TMA completes the bytes
      mbarrier_init(tiles.v_full(stage), 1);
      mbarrier_init(tiles.empty(stage), 8);  // one arrival per consumer warp
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (threadIdx.x < 128) {                                      // [L2] the producer warpgroup
    setmaxnreg_dec<kProducerRegisters, kLaunchRegisters>();     // [L3]
    if (threadIdx.x != 0 || blocks == 0) return;                // one thread issues every copy
    mbarrier_arrive_expect_tx(tiles.q_full(), Tiles::kQBytes);  // [L4] Q_i, [L5] completing on q_full
    for (int panel = 0; panel < Tiles::kPanels; ++panel)
      tma_load_4d(tiles.q() + panel * kBlockM * kSwizzleRowBytes, &q_map, tiles.q_full(), 64 * panel,
                  m_block * kBlockM, head, b);
    for (int j = 0; j < blocks; ++j) {  // [L6]
      const int stage = Stages::stage(j);
      mbarrier_wait(tiles.empty(stage), Stages::empty_parity(j));       // [L7]
      mbarrier_arrive_expect_tx(tiles.k_full(stage), Tiles::kKvBytes);  // [L8] K_j and V_j,
      mbarrier_arrive_expect_tx(tiles.v_full(stage), Tiles::kKvBytes);  // [L9] completing on the full ones
      for (int panel = 0; panel < Tiles::kPanels; ++panel) {
        tma_load_4d(tiles.k(stage) + panel * Tiles::kKvPanelBytes, &k_map, tiles.k_full(stage), 64 * panel,
                    j * kBlockN, head_kv, b);
        tma_load_4d(tiles.v(stage) + panel * Tiles::kKvPanelBytes, &v_map, tiles.v_full(stage), 64 * panel,
                    j * kBlockN, head_kv, b);
      }
    }
    return;
  }

  // [L11] A consumer warpgroup: rows 64c .. 64c + 63 of the CTA's tile, c = warpgroup - 1.
  setmaxnreg_inc<kConsumerRegisters, kLaunchRegisters>();  // [L12]
  const int consumer = threadIdx.x / 128 - 1, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
  const uint8_t* const q_tile = tiles.q() + consumer * 64 * kSwizzleRowBytes;
  float o[kHeadDim / 2] = {}, s[kBlockN / 2];  // [L13] O_i = 0; S (then P) of one key block
  uint32_t p[kBlockN / 4];                     // P in bf16 pairs: the A operand of P V
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};  // [L13] m_i = -inf, l_i = 0
  KeyRange keys[2];  // which keys each of this thread's two rows sees (causal, window, padding)
  int rows[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    rows[h] = m_block * kBlockM + consumer * 64 + 16 * warp + lane / 4 + 8 * h;
    keys[h] = band_key_range(rows[h], rows_q, rows_k, args.causal, args.window_left, args.window_right);
  }

  if (blocks > 0) mbarrier_wait(tiles.q_full(), 0);  // [L14]
  for (int j = 0; j < blocks; ++j) {                 // [L15]
    const int stage = Stages::stage(j);
    mbarrier_wait(tiles.k_full(stage), Stages::full_parity(j));  // [L16]
    // [L17] S = Q_i K_j^T: head_dim / 16 wgmma, the first overwriting S; committed, then waited for.
    wgmma_fence();
#pragma unroll
    for (int k_step = 0; k_step < kHeadDim / 16; ++k_step)
      Wgmma<kBlockN, Element>::ss(s, k_major_descriptor(q_tile, kBlockM * kSwizzleRowBytes, k_step),
                                  k_major_descriptor(tiles.k(stage), Tiles::kKvPanelBytes, k_step),
                                  k_step > 0);
    wgmma_commit();
    wgmma_wait<0>();
    pin_registers(s);

    float rescale[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // [L18] The scaled scores of the keys the row sees (the others -inf), then the new max over the quad.
      float tile_max = -INFINITY;
#pragma unroll
      for (int c = 0; c < kBlockN / 8; ++c)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = j * kBlockN + 8 * c + 2 * (lane % 4) + e;
          float& score = s[4 * c + 2 * h + e];
          score = key >= keys[h].begin && key < keys[h].end ? score * args.scale : -INFINITY;
          tile_max = fmaxf(tile_max, score);
        }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float m_old = row_max[h];
      row_max[h] = fmaxf(m_old, tile_max);
      // [L19] P = exp(S - m_i), l_i = exp(m_old - m_i) l_i + rowsum(P). While every key so far is hidden
      // (m_i = -inf) subtract 0 instead: -inf - (-inf) would be NaN.
      const float max_used = row_max[h] == -INFINITY ? 0.0f : row_max[h];
      rescale[h] = expf(m_old - max_used);
      float tile_sum = 0.0f;
#pragma unroll
      for (int c = 0; c < kBlockN / 8; ++c)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& score = s[4 * c + 2 * h + e];
          score = expf(score - max_used);
          tile_sum += score;
        }
      row_sum[h] = rescale[h] * row_sum[h] + tile_sum;
    }
    // The accumulator's layout of S is the A operand's of the next product: P is S's registers paired.
#pragma unroll
    for (int i = 0; i < kBlockN / 4; ++i) p[i] = cuda::pack_pair<Element>(s[2 * i], s[2 * i + 1]);

    mbarrier_wait(tiles.v_full(stage), Stages::full_parity(j));  // [L20]
    // [L21] O_i = diag(exp(m_old - m_i)) O_i + P V_j: the rescale, then block_n / 16 wgmma accumulating.
#pragma unroll
    for (int c = 0; c < kHeadDim / 8; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        o[4 * c + 2 * h] *= rescale[h];
        o[4 * c + 2 * h + 1] *= rescale[h];
      }
    pin_registers(o);
    pin_registers(p);
    wgmma_fence();
#pragma unroll
    for (int k_step = 0; k_step < kBlockN / 16; ++k_step) {
      const uint32_t a[4] = {p[4 * k_step], p[4 * k_step + 1], p[4 * k_step + 2], p[4 * k_step + 3]};
      Wgmma<kHeadDim, Element>::rs(o, a, mn_major_descriptor(tiles.v(stage), Tiles::kKvPanelBytes, k_step),
                                   1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    pin_registers(o);
    __syncwarp();
    if (lane == 0) mbarrier_arrive(tiles.empty(stage));  // [L22] this warp is done with the stage
  }

  // [L24] O_i / l_i and L_i = m_i + log(l_i); [L25] written from registers. A row that saw no key (l = 0:
  // padding, or every mask hides it) writes O = 0 and LSE = -inf (docs/conventions.md §4).
  Element* const out = static_cast<Element*>(args.o) + b * args.o_batch_stride + head * args.o_head_stride;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = row_sum[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (rows[h] >= args.seqlen_q) continue;  // the last block's rows past the tensor do not exist
    const float inverse = l == 0.0f ? 0.0f : 1.0f / l;
#pragma unroll
    for (int c = 0; c < kHeadDim / 8; ++c)
      *reinterpret_cast<uint32_t*>(out + rows[h] * args.o_row_stride + 8 * c + 2 * (lane % 4)) =
          cuda::pack_pair<Element>(o[4 * c + 2 * h] * inverse, o[4 * c + 2 * h + 1] * inverse);
    if (lane % 4 == 0)
      args.lse[(static_cast<int64_t>(b) * args.heads_q + head) * args.seqlen_q + rows[h]] =
          l == 0.0f ? -INFINITY : row_max[h] + logf(l);
  }
}

template <int kHeadDim>
void launch(const HopperParams& p, cudaStream_t stream) {
  // With no keys at all the K and V maps are never read; they still need a valid address and extent.
  const bool keys = p.seqlen_k > 0;
  const CUtensorMap q_map = bshd_tensor_map(p.q, p.dtype, p.head_dim, p.seqlen_q, p.heads_q, p.batch,
                                            p.q_row_stride, p.q_head_stride, p.q_batch_stride, kBlockM, "q");
  const CUtensorMap k_map = bshd_tensor_map(
      keys ? p.k : p.q, p.dtype, p.head_dim, keys ? p.seqlen_k : 1, keys ? p.heads_kv : p.heads_q, p.batch,
      keys ? p.k_row_stride : p.q_row_stride, keys ? p.k_head_stride : p.q_head_stride,
      keys ? p.k_batch_stride : p.q_batch_stride, kBlockN, "k");
  const CUtensorMap v_map = bshd_tensor_map(
      keys ? p.v : p.q, p.dtype, p.head_dim, keys ? p.seqlen_k : 1, keys ? p.heads_kv : p.heads_q, p.batch,
      keys ? p.v_row_stride : p.q_row_stride, keys ? p.v_head_stride : p.q_head_stride,
      keys ? p.v_batch_stride : p.q_batch_stride, kBlockN, "v");
  const CoreArgs args{p.o,
                      p.lse,
                      p.seqlens_q,
                      p.seqlens_k,
                      p.seqlen_q,
                      p.seqlen_k,
                      p.heads_q,
                      p.heads_kv,
                      p.causal ? 1 : 0,
                      p.window_left,
                      p.window_right,
                      p.o_batch_stride,
                      p.o_row_stride,
                      p.o_head_stride,
                      p.softmax_scale};
  FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(
      ws_core_kernel<kHeadDim>, cudaFuncAttributeMaxDynamicSharedMemorySize, Layout<kHeadDim>::kBytes));
  const dim3 grid((p.seqlen_q + kBlockM - 1) / kBlockM, p.heads_q, p.batch);
  cuda::launch_kernel<ws_core_kernel<kHeadDim>>(grid, kThreads, Layout<kHeadDim>::kBytes, stream, q_map,
                                                k_map, v_map, args);
}

}  // namespace

void launch_ws_core(const Problem& problem, const DeviceTensors& tensors) {
  if (problem.dtype != DType::bf16)
    fail("cuda_v3_hopper/ws_core: dtype (", to_string(problem.dtype), ") must be bf16");
  if (problem.head_dim != 64 && problem.head_dim != 128)
    fail("cuda_v3_hopper/ws_core: head_dim (", problem.head_dim, ") must be 64 or 128");
  HopperParams params = ws_params(problem);
  params.q = tensors.q, params.k = tensors.k, params.v = tensors.v, params.o = tensors.o;
  params.lse = tensors.lse;
  const cuda::IntLengths lengths = cuda::narrow_lengths(problem, tensors, tensors.workspace);
  params.seqlens_q = lengths.seqlens_q;
  params.seqlens_k = lengths.seqlens_k;
  if (problem.head_dim == 64)
    launch<64>(params, tensors.stream);
  else
    launch<128>(params, tensors.stream);
  cuda::exact_rows<Element>(cuda::exact_rows_params(params), tensors.stream);  // NaN and Inf as the reference
}

}  // namespace FLASHLAB_CUDA_TARGET
}  // namespace flashlab::hopper
