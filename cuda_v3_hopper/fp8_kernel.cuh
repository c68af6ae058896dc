// The FP8 forward kernel (sm_90a): cuda_v3_hopper/ws's roles and schedule (ws_kernel.cuh: a TMA producer
// warpgroup, two consumer warpgroups of 64 rows in ping-pong, FA3 Algorithm 2's intra-warpgroup overlap) with
// e4m3 operands. What changes against the bf16 kernel:
//   - every tile is e4m3, one byte per element: a 128-byte swizzled row holds 128 elements, and one wgmma
//     reduces over k = 32 (wgmma_fp8.cuh). FP8 wgmma takes only K-major operands: Q and K are (their rows run
//     over head_dim), and V comes k-major from the pre-pass (V^T per tile, keys contiguous);
//   - scores are in quantized units: the Q row's and the K block's descales multiply the softmax scale, once
//     per block (S * q_descale * k_descale * softmax_scale is what the emulation rounds);
//   - P is scaled by p_scale (2^8) and cast to e4m3 as the A operand of O += P V. The accumulator of S gives
//   a
//     thread keys 2t, 2t + 1, 8 + 2t, 9 + 2t of each 16, the e4m3 A fragment wants 4 consecutive k positions
//     4t .. 4t + 3: V's keys are stored in the accumulator's order instead (fp8_v_key, written by the
//     pre-pass), so P is packed from the thread's own registers, no shuffle, no permute at run time;
//   - O accumulates in the units of the last V block's descale: the online-softmax rescale of O also moves it
//     to the next block's descale (the emulation's acc_v_descale), and the epilogue multiplies by the last
//     descale / p_scale before dividing by l.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "common/cuda/launch.cuh"
#include "common/cuda/ptx.cuh"
#include "common/mask.hpp"
#include "cuda_v3_hopper/fp8_prepass.hpp"
#include "cuda_v3_hopper/pipeline.cuh"
#include "cuda_v3_hopper/tma.cuh"
#include "cuda_v3_hopper/warpgroup.cuh"
#include "cuda_v3_hopper/wgmma_fp8.cuh"
#include "cuda_v3_hopper/ws_kernel.cuh"

namespace flashlab::hopper {
namespace FLASHLAB_CUDA_TARGET {

template <int kHeadDim_, int kBlockN_>
struct Fp8KernelConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;  // Bc, the K/V quantization tile
  // The schedule of ws_kernel.cuh's full kernel (PingPong and block_work read these).
  static constexpr bool kWarpSpecialized = true;
  static constexpr bool kPingPong = true;
  static constexpr bool kIntraWarpgroupOverlap = true;
  static_assert(kHeadDim % 128 == 0, "128-element (128-byte) swizzled panels of e4m3");
  static_assert(kBlockN % 32 == 0 && kBlockN <= 256, "k = 32 per P V wgmma; N <= 256 per S wgmma");

  static constexpr int kConsumers = 2;
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kStages = 2;
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kThreads = kConsumerThreads + 128;
  static constexpr uint32_t kLaunchRegisters = launch_registers(kThreads);  // 168 (ws_kernel.cuh)
  static constexpr uint32_t kProducerRegisters = 24;
  static constexpr uint32_t kConsumerRegisters = 240;
  static_assert(128 * (kProducerRegisters + kConsumers * kConsumerRegisters) <= kLaunchRegisters * kThreads,
                "setmaxnreg.inc would wait forever: the producer does not free what the consumers take");

  // Q and K: panels of 128 head-dim columns. V^T: panels of 128 keys, each head_dim rows; a block of Bc keys
  // that is not a multiple of 128 fills its last panel partly (TMA reads zeros past the tile's Bc).
  static constexpr int kQkPanels = kHeadDim / 128;
  static constexpr int kVPanels = (kBlockN + 127) / 128;
  static constexpr uint32_t kQPanelBytes = kBlockM * kSwizzleRowBytes;
  static constexpr uint32_t kKPanelBytes = kBlockN * kSwizzleRowBytes;
  static constexpr uint32_t kVPanelBytes = kHeadDim * kSwizzleRowBytes;
  static constexpr uint32_t kQBytes = kQPanelBytes * kQkPanels;
  static constexpr uint32_t kKBytes = kKPanelBytes * kQkPanels;
  static constexpr uint32_t kVBytes = kVPanelBytes * kVPanels;
  static constexpr uint32_t kKOffset = kQBytes;
  static constexpr uint32_t kVOffset = kKOffset + kStages * kKBytes;
  static constexpr uint32_t kBarrierOffset = kVOffset + kStages * kVBytes;
  static constexpr uint32_t kBarrierCount = 1 + 4 * kStages;
  static constexpr uint32_t kSharedBytes = kBarrierOffset + 8 * kBarrierCount + kSwizzleAtomBytes;
  static_assert(kKPanelBytes % kSwizzleAtomBytes == 0, "panels start on 1024-byte swizzle atoms");
  static_assert(kSharedBytes <= 232448, "227 KB of shared memory per block on H100");
};

// What the FP8 kernel takes besides WsArgs (geometry, masks, LSE) and the tensor maps.
struct Fp8Args {
  const float* q_descale;  // [batch, heads_q, tiles_q]
  const float* k_descale;  // [batch, heads_kv, tiles_k]
  const float* v_descale;
  const float* lse_shift;  // [batch, heads_q, seqlen_q]
  __nv_bfloat16* o;        // BSHD
  int block_q, tiles_q, tiles_k;
  float softmax_scale, p_scale;
};

// The claim convert_p() rests on, checked at compile time: fp8_v_key is a permutation of every 32-key group,
// and k position 4t + e (+16) holds the key of the accumulator's registers {0, 1, 4, 5}: 2t, 2t + 1, 8 + 2t,
// 9 + 2t (+16).
constexpr bool fp8_v_order_matches_accumulator(int64_t block_k) {
  for (int64_t key = 0; key < block_k; ++key)
    if (fp8_v_key(fp8_v_position(key, block_k), block_k) != key) return false;
  for (int64_t group = 0; group + 32 <= block_k; group += 32)
    for (int64_t t = 0; t < 4; ++t)
      for (int64_t e = 0; e < 4; ++e)
        for (int64_t h = 0; h < 2; ++h)
          if (fp8_v_key(group + 16 * h + 4 * t + e, block_k) != group + 16 * h + 8 * (e / 2) + 2 * t + e % 2)
            return false;
  return true;
}
static_assert(fp8_v_order_matches_accumulator(224) && fp8_v_order_matches_accumulator(128) &&
              fp8_v_order_matches_accumulator(160) && fp8_v_order_matches_accumulator(50));

template <class Config>
struct Fp8Producer {
  __device__ static void run(const SharedTiles<Config>& tiles, const CUtensorMap* q_map,
                             const CUtensorMap* k_map, const CUtensorMap* v_map, const BlockWork& work,
                             int tiles_k, int heads_kv) {
    if (threadIdx.x != 0) return;
    const int blocks = work.n_end - work.n_begin;
    if (blocks == 0) return;
    // TMA counts a box's full bytes, zero-filled parts included.
    mbarrier_arrive_expect_tx(tiles.q_full(), Config::kQBytes);
#pragma unroll
    for (int panel = 0; panel < Config::kQkPanels; ++panel)
      tma_load_4d(tiles.q() + panel * Config::kQPanelBytes, q_map, tiles.q_full(), 128 * panel,
                  work.m_block * Config::kBlockM, work.head, work.batch);
    // In the order the consumers wait (fp8_mainloop, FA3 Algorithm 2): iteration j takes K_j and then
    // V_{j-1}, so K_j is issued ahead of V_{j-1}, as ws's producer does.
    using Stages = Ring<Config::kStages>;
    for (int it = 0; it <= blocks; ++it) {
      if (it < blocks) {
        const int stage = Stages::stage(it);
        mbarrier_wait(tiles.k_empty(stage), Stages::empty_parity(it));
        mbarrier_arrive_expect_tx(tiles.k_full(stage), Config::kKBytes);
#pragma unroll
        for (int panel = 0; panel < Config::kQkPanels; ++panel)
          tma_load_4d(tiles.k(stage) + panel * Config::kKPanelBytes, k_map, tiles.k_full(stage), 128 * panel,
                      (work.n_begin + it) * Config::kBlockN, work.kv_head, work.batch);
      }
      if (it > 0) {
        const int stage = Stages::stage(it - 1);
        mbarrier_wait(tiles.v_empty(stage), Stages::empty_parity(it - 1));
        mbarrier_arrive_expect_tx(tiles.v_full(stage), Config::kVBytes);
        // V_{j-1} transposed, one box per K/V quantization tile (= key block).
        const int tile_index = (work.batch * heads_kv + work.kv_head) * tiles_k + work.n_begin + it - 1;
#pragma unroll
        for (int panel = 0; panel < Config::kVPanels; ++panel)
          tma_load_3d(tiles.v(stage) + panel * Config::kVPanelBytes, v_map, tiles.v_full(stage), 128 * panel,
                      0, tile_index);
      }
    }
  }
};

// Four fp32 values times p_scale to e4m3, packed low byte first (the A fragment's k order).
__device__ inline uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3, float p_scale) {
  const uint16_t low = ptx::cvt_e4m3x2(x1 * p_scale, x0 * p_scale);
  const uint16_t high = ptx::cvt_e4m3x2(x3 * p_scale, x2 * p_scale);
  return static_cast<uint32_t>(low) | (static_cast<uint32_t>(high) << 16);
}

// One consumer warpgroup, 64 query rows (accumulator layout: wgmma.cuh).
template <class Config>
struct Fp8Consumer : ConsumerRows<Config> {
  static constexpr int kD = Config::kHeadDim;
  static constexpr int kN = Config::kBlockN;
  static constexpr float kLog2e = 1.4426950408889634f;
  using ConsumerRows<Config>::consumer;
  using ConsumerRows<Config>::lane;

  float o[kD / 2];      // O in the units of acc_v_descale and p_scale, unnormalized
  float s[kN / 2];      // S of the current block (raw e4m3 dot products), then P
  uint32_t p[kN / 8];   // P * p_scale in e4m3, four per register: the A operand of O += P V
  float row_max[2];     // m, in softmax units (scaled scores)
  float row_sum[2];     // l, this thread's partial sum of the fp32 P
  float q_descale[2];   // of this thread's two rows
  float acc_v_descale;  // the V descale O is currently expressed in (uniform over the CTA)

  __device__ Fp8Consumer(const SharedTiles<Config>& tiles, const WsArgs& args, const Fp8Args& fp8,
                         const BlockWork& work, int consumer_index)
      : ConsumerRows<Config>(tiles, args, work, consumer_index) {
    const int64_t first_row = this->first_row(work);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t row = first_row + 16 * this->warp + lane / 4 + 8 * half;
      // Rows past seqlen_q have no tile (and see nothing): any finite descale will do.
      q_descale[half] =
          row < args.seqlen_q
              ? fp8.q_descale[(static_cast<int64_t>(work.batch) * args.heads_q + work.head) * fp8.tiles_q +
                              row / fp8.block_q]
              : 1.0f;
      row_max[half] = -INFINITY;
      row_sum[half] = 0.0f;
    }
    acc_v_descale = 1.0f;
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;
  }

  // S = Q8 K8^T over head_dim / 32 k-steps (32 bytes each, inside a 128-byte panel row).
  __device__ void issue_qk(const uint8_t* k_tile) {
    pin_registers(s);
    wgmma_fence();
#pragma unroll
    for (int k_step = 0; k_step < kD / 32; ++k_step)
      WgmmaE4m3<kN>::ss(s, k_major_descriptor(this->q_tile, Config::kQPanelBytes, k_step),
                        k_major_descriptor(k_tile, Config::kKPanelBytes, k_step), k_step > 0);
    wgmma_commit();
    pin_registers(s);
  }

  // O += P8 V8 over Bc / 32 k-steps; V^T's rows are head_dim channels of 128 keys per panel.
  __device__ void issue_pv(const uint8_t* v_tile) {
    pin_registers(o);
    pin_registers(p);
    wgmma_fence();
#pragma unroll
    for (int k_step = 0; k_step < kN / 32; ++k_step) {
      const uint32_t a[4] = {p[4 * k_step], p[4 * k_step + 1], p[4 * k_step + 2], p[4 * k_step + 3]};
      WgmmaE4m3<kD>::rs(o, a, k_major_descriptor(v_tile, Config::kVPanelBytes, k_step), 1);
    }
    wgmma_commit();
    pin_registers(o);
  }

  // The online softmax of block n_block with the K descale of its tile: scores in softmax units are
  // raw * q_descale * k_descale * softmax_scale (the emulation's score_scale, in its order). The row max is
  // taken on raw scores and scaled after (multiplying by a positive factor keeps the order), and the
  // exponent is one FMA: exp2(raw * score_scale * log2(e) - m * log2(e)).
  __device__ void softmax(int n_block, float k_descale, float softmax_scale, float (&correction)[2]) {
    pin_registers(s);
    this->template mask_scores<kN>(s, n_block);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float score_scale = q_descale[half] * k_descale * softmax_scale;
      float raw_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < kN / 8; ++i)
        raw_max = fmaxf(raw_max, fmaxf(s[4 * i + 2 * half], s[4 * i + 2 * half + 1]));
      raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffff, raw_max, 1));
      raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffff, raw_max, 2));
      const float new_max = fmaxf(row_max[half], raw_max * score_scale);
      // A row with nothing visible yet keeps m = -inf: subtract 0, not -inf (exp2(-inf + inf) would be NaN).
      const float max_scaled = new_max == -INFINITY ? 0.0f : __fmul_rn(new_max, kLog2e);
      // Both sides rounded: a plain product here could be fused into the subtraction (an FFMA), and a max
      // that held would then rescale by 2^(its rounding error) instead of 1 (cuda_v2/split_q.cu: what that
      // did there).
      correction[half] = exp2_approx(__fmul_rn(row_max[half], kLog2e) - max_scaled);
      row_max[half] = new_max;
      const float exponent_scale = score_scale * kLog2e;
      float tile_sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kN / 8; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& score = s[4 * i + 2 * half + e];
          score = exp2_approx(fmaf(score, exponent_scale, -max_scaled));
          tile_sum += score;  // l sums the fp32 P, as FA3 and the emulation do
        }
      row_sum[half] = row_sum[half] * correction[half] + tile_sum;
    }
  }

  // O <- O * exp(m_old - m_new) * (acc_v_descale / v_descale): the online-softmax rescale, which also moves O
  // to the units of the V block about to be added (the emulation's rebase, in its order of operations).
  // (v_descale is read only by the exercise's lines: [[maybe_unused]] keeps the exercise's skeleton
  // warning-free.)
  __device__ void rescale_o(const float (&correction)[2], [[maybe_unused]] float v_descale) {
    float factor[2] = {correction[0], correction[1]};  // the online softmax's exp(m_old - m_new), per half
    // EXERCISE BEGIN fp8-descale
    // teaches: FP8 block quantization inside the online softmax: O accumulates P V in the units of a V
    //   block's descale (and of P's 2^8 scale), so each rescale also moves O to the next block's units, and
    //   the epilogue turns the last block's units back into real ones
    // difficulty: 3
    // docs: docs/06-fp8.md#The GPU half
    // grades: cuda_v3_hopper/fp8$
    // hint: O accumulates products of quantized V, so it is in the units of a V block's descale; before a
    //   block with another descale is added, O must move to that block's units, and at the end back to real
    //   ones
    // hint2: acc_v_descale is the unit O is in now; the rescale factor can carry the ratio of the old unit to
    //   the new one as well as the softmax's correction. The epilogue's undo must account for every scale
    //   that entered the products, P's included
    // hint3: V_j = v_descale(j) * V8_j, and O holds sum_j P_j V8_j (scaled by the softmax's corrections): its
    //   real value is O * acc_v_descale. Before the block whose descale is v_descale is added, O must be
    //   expressed in that block's units too: change factor[half] (it holds the softmax's correction) and
    //   acc_v_descale. In fp8_epilogue below, set `undo`, the factor from O's units to real ones; remember
    //   that P entered the products multiplied by p_scale.
    const float rebase = acc_v_descale / v_descale;
    acc_v_descale = v_descale;
#pragma unroll
    for (int half = 0; half < 2; ++half) factor[half] *= rebase;
      // EXERCISE END fp8-descale
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int i = 0; i < kD / 8; ++i) {
        o[4 * i + 2 * half] *= factor[half];
        o[4 * i + 2 * half + 1] *= factor[half];
      }
    }
  }

  // P * p_scale to e4m3 in the A fragment: register r of k-step ks holds, for row lane/4 (+8 for r = 1, 3),
  // the accumulator columns 16 * (r / 2) + {2t, 2t + 1, 8 + 2t, 9 + 2t} of the step (t = lane % 4), which
  // fp8_v_key puts at k positions 16 * (r / 2) + 4t .. 4t + 3: accumulator registers {0, 1, 4, 5} + 8 * (r /
  // 2)
  // + 2 * (r % 2) of the step.
  __device__ void convert_p(float p_scale) {
#pragma unroll
    for (int k_step = 0; k_step < kN / 32; ++k_step)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int b = 16 * k_step + 8 * (r / 2) + 2 * (r % 2);
        p[4 * k_step + r] = pack_e4m3x4(s[b], s[b + 1], s[b + 4], s[b + 5], p_scale);
      }
  }
};

// FA3 Algorithm 2 with ping-pong, as consumer_mainloop of ws_kernel.cuh, plus the per-block descales.
template <class Config>
__device__ inline void fp8_mainloop(Fp8Consumer<Config>& c, const SharedTiles<Config>& tiles,
                                    const WsArgs& args, const Fp8Args& fp8, const BlockWork& work) {
  using Schedule = PingPong<Config>;
  const int blocks = work.n_end - work.n_begin;
  if (blocks == 0) return;
  auto stage = [](int it) { return Ring<Config::kStages>::stage(it); };
  auto phase = [](int it) { return Ring<Config::kStages>::full_parity(it); };
  const int64_t kv_tiles = (static_cast<int64_t>(work.batch) * args.heads_kv + work.kv_head) * fp8.tiles_k;
  auto k_descale = [&](int it) { return fp8.k_descale[kv_tiles + work.n_begin + it]; };
  auto v_descale = [&](int it) { return fp8.v_descale[kv_tiles + work.n_begin + it]; };
  float correction[2];
  mbarrier_wait(tiles.q_full(), 0);

  mbarrier_wait(tiles.k_full(stage(0)), phase(0));
  Schedule::wait_turn(c.consumer);
  c.issue_qk(tiles.k(stage(0)));
  Schedule::pass_turn(c.consumer);
  wgmma_wait<0>();
  c.release(tiles.k_empty(stage(0)));
  c.softmax(work.n_begin, k_descale(0), fp8.softmax_scale, correction);
  c.acc_v_descale = v_descale(0);  // O is still zero: no rescale
  c.convert_p(fp8.p_scale);
  for (int it = 1; it < blocks; ++it) {
    mbarrier_wait(tiles.k_full(stage(it)), phase(it));
    Schedule::wait_turn(c.consumer);
    c.issue_qk(tiles.k(stage(it)));
    mbarrier_wait(tiles.v_full(stage(it - 1)), phase(it - 1));
    c.issue_pv(tiles.v(stage(it - 1)));
    Schedule::pass_turn(c.consumer);
    wgmma_wait<1>();
    c.release(tiles.k_empty(stage(it)));
    c.softmax(work.n_begin + it, k_descale(it), fp8.softmax_scale, correction);
    wgmma_wait<0>();
    pin_registers(c.o);
    c.release(tiles.v_empty(stage(it - 1)));
    c.rescale_o(correction, v_descale(it));
    c.convert_p(fp8.p_scale);
  }
  mbarrier_wait(tiles.v_full(stage(blocks - 1)), phase(blocks - 1));
  Schedule::wait_turn(c.consumer);
  c.issue_pv(tiles.v(stage(blocks - 1)));
  Schedule::pass_turn(c.consumer);
  wgmma_wait<0>();
  pin_registers(c.o);
  c.release(tiles.v_empty(stage(blocks - 1)));
}

// O * acc_v_descale / p_scale / l in bf16, straight from registers to global memory (each quad writes 16
// contiguous bytes of a row); LSE = m + log(l) + K smoothing's shift. Rows with nothing visible: O = 0,
// LSE = -inf (the emulation adds no shift to -inf).
template <class Config>
__device__ inline void fp8_epilogue(const Fp8Consumer<Config>& c, const WsArgs& args, const Fp8Args& fp8,
                                    const BlockWork& work) {
  constexpr int kD = Config::kHeadDim;
  const int first_row = work.m_block * Config::kBlockM + c.consumer * 64;
  float undo = 1.0f;  // from O's units (the last V block's descale, P's p_scale) to real ones
  // EXERCISE BEGIN fp8-descale
  undo = c.acc_v_descale / fp8.p_scale;
  // EXERCISE END fp8-descale
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float sum = c.row_sum[half];
    sum += __shfl_xor_sync(0xffffffff, sum, 1);
    sum += __shfl_xor_sync(0xffffffff, sum, 2);
    const bool seen = !c.rows[half].empty() && sum != 0.0f;  // a NaN sum counts as seen: NaN propagates
    const int row = first_row + 16 * c.warp + c.lane / 4 + 8 * half;
    if (row >= args.seqlen_q) continue;
    const int64_t lse_index =
        (static_cast<int64_t>(work.batch) * args.heads_q + work.head) * args.seqlen_q + row;
    if (c.lane % 4 == 0)
      args.lse[lse_index] =
          seen ? (c.row_max[half] * Fp8Consumer<Config>::kLog2e + log2f(sum)) * 0.6931471805599453f +
                     fp8.lse_shift[lse_index]
               : -INFINITY;
    const float factor = seen ? undo / sum : 0.0f;
    __nv_bfloat16* out =
        fp8.o + ((static_cast<int64_t>(work.batch) * args.seqlen_q + row) * args.heads_q + work.head) * kD;
#pragma unroll
    for (int i = 0; i < kD / 8; ++i) {
      // Selected rather than multiplied by 0: an unseen row may hold anything, even NaN.
      *reinterpret_cast<uint32_t*>(out + 8 * i + 2 * (c.lane % 4)) =
          seen ? pack_pair<__nv_bfloat16>(c.o[4 * i + 2 * half] * factor, c.o[4 * i + 2 * half + 1] * factor)
               : 0u;
    }
  }
}

template <class Config>
__global__ void __launch_bounds__(Config::kThreads, 1)
    fp8_attention_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                         const __grid_constant__ CUtensorMap v_map, const WsArgs args, const Fp8Args fp8) {
  const SharedTiles<Config> tiles(cuda::dynamic_shared_memory<uint8_t>());
  const BlockWork work = block_work<Config>(args, grid_tile(args));
  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    mbarrier_init(tiles.q_full(), 1);
    for (int stage = 0; stage < Config::kStages; ++stage) {
      mbarrier_init(tiles.k_full(stage), 1);
      mbarrier_init(tiles.v_full(stage), 1);
      mbarrier_init(tiles.k_empty(stage), 4 * Config::kConsumers);
      mbarrier_init(tiles.v_empty(stage), 4 * Config::kConsumers);
    }
    fence_barrier_init();
  }
  __syncthreads();
  if (warpgroup == 0) {
    setmaxnreg_dec<Config::kProducerRegisters, Config::kLaunchRegisters>();
    Fp8Producer<Config>::run(tiles, &q_map, &k_map, &v_map, work, fp8.tiles_k, args.heads_kv);
    return;
  }
  setmaxnreg_inc<Config::kConsumerRegisters, Config::kLaunchRegisters>();
  Fp8Consumer<Config> consumer(tiles, args, fp8, work, warpgroup - 1);
  PingPong<Config>::start(consumer.consumer);
  fp8_mainloop(consumer, tiles, args, fp8, work);
  PingPong<Config>::finish(consumer.consumer);
  fp8_epilogue(consumer, args, fp8, work);
}

}  // namespace FLASHLAB_CUDA_TARGET
using namespace FLASHLAB_CUDA_TARGET;
}  // namespace flashlab::hopper
