// The FlashAttention-3 forward kernel (sm_90a): roles, pipeline and schedule.
//
// One CTA computes a tile of kBlockM = 64 x kConsumers query rows of one (batch, head): 128, or FA3's 192 for
// d 64 (WsConfig::kConsumers). Its warpgroups:
//   producer   (warpgroup 0, registers lowered to 24 or 32): one thread loads Q once and K_j, V_j for
//              every visible key block into a circular buffer of kStages shared-memory stages with TMA, in
//              the order the consumers use them (K_j ahead of V_{j-1} under the overlap below, as FA3 does);
//              each load completes on the stage's "full" mbarrier, and the producer reuses a stage once its
//              "empty" barrier says every consumer is done with it.
//   consumers  (warpgroups 1 and 2 at 240 registers; or 1 to 3 at 160): each owns 64 of the rows and runs
//              FA2's loop on them with wgmma: S = Q K_j^T (both operands in shared memory), the online
//              softmax in registers, O += P V_j (P from registers), normalization at the end; O goes back
//              through shared memory with a TMA store. A consumer gives Q back (q_empty) as soon as its last
//              S = Q K^T has completed, before the tile's last P V and its epilogue.
// Ping-pong (FA3 section 3.1): named barriers make the consumers take turns issuing their matrix products,
// round the ring, so one warpgroup's softmax runs while another's wgmma keep the tensor cores busy.
// Intra-warpgroup overlap (FA3 Algorithm 2): a consumer issues S_next = Q K_j^T and O += P V_{j-1} together
// and runs the softmax of S_next while P V_{j-1} is still in flight.
// Without warp specialization (the ablation's first rung) there is no producer warpgroup: one consumer thread
// issues the same loads a few blocks ahead, between its own matrix products.
// Persistent (WsConfig::kPersistent, FA3's dynamic tile scheduler): one CTA per SM computes tile after tile
// of cuda::TileOrder's order (common/cuda/tile_order.hpp), the next a CTA takes drawn from a counter that all
// CTAs share (TileScheduler), its pipeline running on from one to the next (PipelineStart); its producer
// keeps 40 registers and its consumers take 232. O has a shared-memory tile of its own there, so that the
// next tile's K_0 and Q load while this tile's last P V, its epilogue and its O store run (FA3's producer
// order), and a store's reads of that tile are waited for only before the next epilogue writes it.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/cuda/convert.cuh"
#include "common/cuda/exact_rows.cuh"
#include "common/cuda/launch.cuh"
#include "common/cuda/ptx.cuh"
#include "common/cuda/warp_reduce.cuh"
#include "common/mask.hpp"
#include "cuda_v3_hopper/pipeline.cuh"
#include "cuda_v3_hopper/tma.cuh"
#include "cuda_v3_hopper/warpgroup.cuh"
#include "cuda_v3_hopper/wgmma.cuh"
#include "cuda_v3_hopper/ws.hpp"

namespace flashlab::hopper {
namespace FLASHLAB_CUDA_TARGET {

// The registers every thread of a kernel of `threads` threads has at launch under __launch_bounds__(threads,
// 1): the 65,536 of an SM over the threads, rounded down to ptxas's allocation unit of 8. The
// warp-specialized kernels use them all (168 for 384 threads), which the build checks (check_registers.py),
// and setmaxnreg redistributes them.
constexpr uint32_t launch_registers(int threads) {
  return 65536u / static_cast<uint32_t>(threads) / 8u * 8u;
}

template <typename Element_, int kHeadDim_, int kBlockN_, bool kWarpSpecialized_, bool kPingPong_,
          bool kIntraWarpgroupOverlap_, bool kPersistent_ = false, int kConsumers_ = 2>
struct WsConfig {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;  // Bc: keys per block
  static constexpr bool kWarpSpecialized = kWarpSpecialized_;
  static constexpr bool kPingPong = kPingPong_;
  static constexpr bool kIntraWarpgroupOverlap = kIntraWarpgroupOverlap_;
  // One CTA per SM, each computing many tiles (TileScheduler below).
  static constexpr bool kPersistent = kPersistent_;
  static_assert(!kPingPong || kWarpSpecialized, "ping-pong needs a producer warpgroup");
  // Without a producer, the issuing consumer thread would wait for a V stage that it releases itself only
  // later in the same iteration of Algorithm 2's loop.
  static_assert(!kIntraWarpgroupOverlap || kWarpSpecialized, "the overlap needs a producer warpgroup");
  static_assert(kHeadDim % 64 == 0 && kBlockN % 16 == 0, "tile shapes of the wgmma instructions");
  // The producer warpgroup carries the pipeline from tile to tile (Producer::run).
  static_assert(!kPersistent || kWarpSpecialized, "the persistent kernel needs a producer warpgroup");

  // Consumer warpgroups: two, or FA3's three for d 64 (its 192 x 128 tile: the full kernel, one tile a CTA).
  static constexpr int kConsumers = kConsumers_;
  static constexpr int kBlockM = 64 * kConsumers;  // Br: query rows per CTA, 64 per consumer
  static_assert(kBlockM == kWsBlockM || kBlockM == kWsTallBlockM, "ws.hpp states the query tiles");
  static_assert(kConsumers == 2 ||
                    (kHeadDim == 64 && kBlockN == 128 && kPingPong && kIntraWarpgroupOverlap && !kPersistent),
                "three consumers: FA3's 192 x 128 tile of the full kernel at d 64");
  static constexpr int kStages = 2;              // shared-memory stages of K and V
  static constexpr int kPanels = kHeadDim / 64;  // 128-byte-wide column panels of a tile
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kThreads = kConsumerThreads + (kWarpSpecialized ? 128 : 0);
  // FA3's split for two consumer warpgroups: 24 + 2 * 240 registers per thread, out of the 168 a thread that
  // the launch gives every warpgroup. The persistent producer carries its counts and the tile's from tile to
  // tile, and schedules the tiles: at 32 registers ptxas spills 16 bytes there (at 24, before it scheduled,
  // 8 to 40), at 40 none, and the consumers' 232 still hold d 128 without a spill: 40 + 2 x 232 is the pool
  // (nvcc 13, sm_90a; check_ptx.sh). Three consumers share 512 threads'
  // 128 registers as FA3 does: 32 + 3 * 160, enough for S (64 floats), P (32) and O (32) at d 64.
  static constexpr uint32_t kLaunchRegisters = launch_registers(kThreads);
  static constexpr uint32_t kProducerRegisters = kPersistent ? 40 : kConsumers == 3 ? 32 : 24;
  static constexpr uint32_t kConsumerRegisters = kConsumers == 3 ? 160 : kPersistent ? 232 : 240;
  static_assert(!kWarpSpecialized || 128 * (kProducerRegisters + kConsumers * kConsumerRegisters) <=
                                         kLaunchRegisters * kThreads,
                "setmaxnreg.inc would wait forever: the producer does not free what the consumers take");

  static constexpr uint32_t kQPanelBytes = kBlockM * kSwizzleRowBytes;
  static constexpr uint32_t kKvPanelBytes = kBlockN * kSwizzleRowBytes;
  static constexpr uint32_t kQBytes = kQPanelBytes * kPanels;
  static constexpr uint32_t kKvTileBytes = kKvPanelBytes * kPanels;
  static constexpr uint32_t kKBytes = kKvTileBytes, kVBytes = kKvTileBytes;  // SharedTiles' names
  // O's staging tile for its TMA store: in a CTA of one tile, Q's (every wgmma that read Q has completed by
  // then); in the persistent kernel its own, where the next tile's Q loads during this tile's epilogue.
  static constexpr bool kOwnOTile = kPersistent;
  // Shared memory: Q, O's tile (kOwnOTile), K stages, V stages, then the barriers. At d 128 the persistent
  // kernel takes 193 KiB, the others 161.
  static constexpr uint32_t kOOffset = kQBytes;
  static constexpr uint32_t kKOffset = kOOffset + (kOwnOTile ? kQBytes : 0);
  static constexpr uint32_t kVOffset = kKOffset + kStages * kKvTileBytes;
  static constexpr uint32_t kBarrierOffset = kVOffset + kStages * kKvTileBytes;
  static constexpr uint32_t kBarrierCount =
      3 + 4 * kStages;  // SharedTiles: q_full, 4 a stage, v_tail, q_empty
  // After the barriers, 8 bytes for the number of the tile the producer hands out (SharedTiles::tile_number).
  static constexpr uint32_t kSharedBytes =
      kBarrierOffset + 8 * kBarrierCount + 8 + kSwizzleAtomBytes;  // + align
  static_assert(kSharedBytes <= 232448, "227 KB of shared memory per block on H100");
};

// Kernel arguments besides the tensor maps.
struct WsArgs {
  float* lse;
  const int* seqlens_q;  // null: every batch element has seqlen_q rows
  const int* seqlens_k;
  int seqlen_q, seqlen_k;
  int heads_q, heads_kv;
  int causal, window_left, window_right;
  int num_m_blocks;
  float scale_log2;        // scale * log2(e): the softmax runs on exp2
  unsigned* special_rows;  // the exact pass's flag (HopperParams::special_rows), or null
  cuda::TileOrder order;   // the persistent kernel's tiles (common/cuda/tile_order.hpp)
  unsigned* tile_counter;  // its count of the tiles handed out after each CTA's first, 0 at the launch
};

// The CTA's view of shared memory (this kernel's and the FP8 kernel's: Q, in the persistent kernel O's
// staging tile, kStages K and V tiles of Config::kKBytes and kVBytes, then the pipeline's mbarriers and the
// persistent kernel's tile number).
template <class Config>
struct SharedTiles {
  uint8_t* base;
  __device__ explicit SharedTiles(uint8_t* raw)
      // TMA's 128-byte swizzle and the wgmma descriptors assume 1024-byte aligned tiles.
      : base(reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + kSwizzleAtomBytes - 1) &
                                        ~uintptr_t(kSwizzleAtomBytes - 1))) {}
  __device__ uint8_t* q() const { return base; }
  // O's staging tile (WsConfig::kOwnOTile), the Q tile where it has none.
  __device__ uint8_t* o() const { return Config::kOwnOTile ? base + Config::kOOffset : base; }
  __device__ uint8_t* k(int stage) const { return base + Config::kKOffset + stage * Config::kKBytes; }
  __device__ uint8_t* v(int stage) const { return base + Config::kVOffset + stage * Config::kVBytes; }
  __device__ uint64_t* barriers() const { return reinterpret_cast<uint64_t*>(base + Config::kBarrierOffset); }
  __device__ uint64_t* q_full() const { return barriers(); }
  __device__ uint64_t* k_full(int stage) const { return barriers() + 1 + stage; }
  __device__ uint64_t* k_empty(int stage) const { return barriers() + 1 + Config::kStages + stage; }
  __device__ uint64_t* v_full(int stage) const { return barriers() + 1 + 2 * Config::kStages + stage; }
  __device__ uint64_t* v_empty(int stage) const { return barriers() + 1 + 3 * Config::kStages + stage; }
  // Where the V block holding a batch's last keys lands before its padding rows are zeroed
  // (Producer::load_v).
  __device__ uint64_t* v_tail() const { return barriers() + 1 + 4 * Config::kStages; }
  // Completed when every consumer warp has finished reading the Q tile, its last S = Q K^T complete, so the
  // producer may load the next tile's Q there (the persistent kernel); there also when the lanes that zero
  // the tails have read the tile's number (Producer::run).
  __device__ uint64_t* q_empty() const { return barriers() + 2 + 4 * Config::kStages; }
  // The persistent kernel's: the number of the tile whose Q the producer loads, written before it arrives on
  // q_full, read by the consumers once q_full has completed (TileScheduler).
  __device__ int* tile_number() const { return reinterpret_cast<int*>(barriers() + Config::kBarrierCount); }
};

// Which rows and key blocks this CTA covers; every thread computes the same.
struct BlockWork {
  int m_block, head, batch, kv_head;
  int rows_q, rows_k;  // this batch element's valid lengths (padding)
  int seqlen_k;        // the K/V tensors' length: rows_k to seqlen_k is padding (past it, TMA reads zeros)
  int n_begin, n_end;  // key blocks that some row of the tile sees; the rest are skipped unloaded
};

// The tile of a CTA of a grid of tiles (num_m_blocks, heads_q, batch). Tiles of later rows see more keys
// under a causal mask: they are launched first so that the long ones do not trail.
__device__ inline cuda::Tile grid_tile(const WsArgs& args) {
  return cuda::Tile{args.num_m_blocks - 1 - static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
                    static_cast<int>(blockIdx.z)};
}

// The persistent kernel's tiles (FA3's dynamic tile scheduler, which FA3 takes for causal and local masks):
// the tiles are numbered in args.order, the longest first. A CTA's producer takes tile blockIdx.x first; as
// it starts each tile it draws the number of its next from a counter that every CTA's producer draws from,
// gridDim.x + (the counter's count so far), so a CTA that finished early takes the next tile of the order.
// (A static schedule, tiles blockIdx.x, blockIdx.x + gridDim.x, ..., gives each CTA a fixed share: under a
// causal mask the shares' sums differ, and the longest waits on the others; tools/wave_model.py puts that at
// 1.09x and 1.15x the dynamic schedule at 8k and 16k keys, as the H200 measured it.) The producer hands each
// number to its consumers in shared memory (SharedTiles::tile_number), written before it arrives on the
// tile's q_full, where they read it; a number past the last tile tells them there is none. The slot is
// written again only after q_empty, for which every consumer warp arrives after it read it.
struct TileScheduler {
  __device__ static int first() { return static_cast<int>(blockIdx.x); }
  // The number of this CTA's next tile (args.order.tiles() or more: none left). One thread, once a tile.
  __device__ static int next(const WsArgs& args) {
    const unsigned drawn = atomicAdd(args.tile_counter, 1u);
    const unsigned left =
        static_cast<unsigned>(args.order.tiles()) - gridDim.x;  // order.tiles() >= gridDim.x
    return drawn < left ? static_cast<int>(gridDim.x + drawn) : args.order.tiles();
  }
};

// Where a CTA's pipeline stands when it starts a tile: the key blocks, tiles and V tails (Producer::Tail) of
// the tiles it has already computed. All 0 for the only tile of a CTA; the persistent kernel carries them
// from tile to tile, so that the ring's stages and the barriers' phases go on where the last tile left them.
struct PipelineStart {
  int iteration = 0, tile = 0, tails = 0;
  int last_tail = -1;  // the pipeline iteration of the CTA's last V tail; -1: none yet
  // Past a tile of `blocks` key blocks, whose V tail is at its iteration `tail` (-1: none): the producer and
  // the consumers count alike.
  __device__ void pass(int blocks, int tail = -1) {
    if (tail >= 0) last_tail = iteration + tail, tails += 1;
    iteration += blocks;
    tile += 1;
  }
};

template <class Config>
__device__ inline BlockWork block_work(const WsArgs& args, const cuda::Tile& tile) {
  BlockWork work;
  work.m_block = tile.block;
  work.head = tile.head;
  work.batch = tile.batch;
  work.kv_head = work.head / (args.heads_q / args.heads_kv);
  work.rows_q = args.seqlens_q ? args.seqlens_q[work.batch] : args.seqlen_q;
  work.rows_k = args.seqlens_k ? args.seqlens_k[work.batch] : args.seqlen_k;
  work.seqlen_k = args.seqlen_k;
  work.n_begin = work.n_end = 0;
  const int first_row = work.m_block * Config::kBlockM;
  if (first_row < work.rows_q) {
    const int last_row = min(first_row + Config::kBlockM, work.rows_q) - 1;
    // Both ends of a row's key range grow with the row (mask.hpp), so the first row has the smallest begin
    // and the last row the largest end.
    const KeyRange first =
        band_key_range(first_row, work.rows_q, work.rows_k, args.causal, args.window_left, args.window_right);
    const KeyRange last =
        band_key_range(last_row, work.rows_q, work.rows_k, args.causal, args.window_left, args.window_right);
    if (last.end > first.begin) {
      work.n_begin = static_cast<int>(first.begin / Config::kBlockN);
      work.n_end = static_cast<int>((last.end + Config::kBlockN - 1) / Config::kBlockN);
    }
  }
  return work;
}

// --- Producer: TMA loads into the circular buffer ---
template <class Config>
struct Producer {
  // Q of the tile's rows, once: kPanels boxes of 64 columns x kBlockM rows. Rows past seqlen_q read as zero.
  // A tile whose rows see no key needs no Q: q_full only completes, for the consumers wait on it all the
  // same.
  __device__ static void load_q(const SharedTiles<Config>& tiles, const CUtensorMap* q_map,
                                const BlockWork& work) {
    if (work.n_end == work.n_begin) return mbarrier_arrive(tiles.q_full());
    mbarrier_arrive_expect_tx(tiles.q_full(), Config::kQBytes);
#pragma unroll
    for (int panel = 0; panel < Config::kPanels; ++panel)
      tma_load_4d(tiles.q() + panel * Config::kQPanelBytes, q_map, tiles.q_full(), 64 * panel,
                  work.m_block * Config::kBlockM, work.head, work.batch);
  }

  // V's rows from the batch's last key (rows_k) to the tensor's end (seqlen_k) are padding, which may hold
  // anything, and TMA reads them like any row (it fills zeros only past the tensor). A masked key weighs 0 in
  // P, but 0 x NaN is NaN: a NaN there would reach every row through P V. The one block that holds the
  // batch's last key and padding after it (the CTA's "tail") therefore lands on v_tail instead of v_full;
  // lanes of the loading warp zero its padding rows, and one of them then completes v_full. (Padding keys in
  // K need nothing: their scores are masked to -inf.)
  struct Tail {
    int iteration = -1;  // the tail's iteration of the tile's load loop; -1: the tile has no padded block
    int pad_begin = 0, pad_end = 0;  // its padding rows
    int stage = 0;                   // its stage of the ring
    uint32_t parity = 0;             // the phase of v_tail it completes: one per tail the CTA loads
    int previous = -1;               // the pipeline iteration of the CTA's tail before it; -1: none
  };
  __device__ static Tail tail_of(const BlockWork& work, const PipelineStart& start) {
    Tail tail;
    const int block = work.rows_k / Config::kBlockN;  // holds key rows_k, the first padding key
    if (work.rows_k >= work.seqlen_k || block < work.n_begin || block >= work.n_end) return tail;
    const int key = block * Config::kBlockN;
    tail.iteration = block - work.n_begin;
    tail.pad_begin = work.rows_k - key;
    tail.pad_end = min(key + Config::kBlockN, work.seqlen_k) - key;
    tail.stage = Ring<Config::kStages>::stage(start.iteration + tail.iteration);
    tail.parity = start.tails & 1;
    tail.previous = start.last_tail;
    return tail;
  }

  // One v_tail serves every tail of a CTA, so a tail's bytes may be expected on it only once the CTA's tail
  // before it has been zeroed (its v_full completed): else the two would fall in one phase of v_tail (one
  // arrival too many), or the zeroing lanes would miss the first's. A tail two or more iterations after the
  // last has waited for that stage's v_empty, which the consumers complete after its v_full; only a tail
  // right after the last (a tile whose one visible block is a tail, after a tile that ended in one: short
  // batch elements, in the persistent kernel) can come first, and waits here.
  __device__ static void wait_for_previous_tail(const SharedTiles<Config>& tiles, const Tail& tail,
                                                const PipelineStart& start) {
    using Stages = Ring<Config::kStages>;
    if (tail.previous >= 0 && tail.previous == start.iteration + tail.iteration - 1)
      mbarrier_wait(tiles.v_full(Stages::stage(tail.previous)), Stages::full_parity(tail.previous));
  }

  // K_j of the tile's key block `iteration` into the ring's stage for the CTA's pipeline iteration
  // start.iteration + iteration, once every consumer has released it. One thread issues. GQA/MQA: the kv
  // head is a tensor-map coordinate, so query heads of one group read the same K and V.
  __device__ static void load_k(const SharedTiles<Config>& tiles, const CUtensorMap* k_map,
                                const BlockWork& work, const PipelineStart& start, int iteration) {
    using Stages = Ring<Config::kStages>;
    const int stage = Stages::stage(start.iteration + iteration);
    mbarrier_wait(tiles.k_empty(stage), Stages::empty_parity(start.iteration + iteration));
    mbarrier_arrive_expect_tx(tiles.k_full(stage), Config::kKvTileBytes);
#pragma unroll
    for (int panel = 0; panel < Config::kPanels; ++panel)
      tma_load_4d(tiles.k(stage) + panel * Config::kKvPanelBytes, k_map, tiles.k_full(stage), 64 * panel,
                  (work.n_begin + iteration) * Config::kBlockN, work.kv_head, work.batch);
  }

  // V_j likewise, landing on v_tail when it is the tail.
  __device__ static void load_v(const SharedTiles<Config>& tiles, const CUtensorMap* v_map,
                                const BlockWork& work, const PipelineStart& start, int iteration, bool tail) {
    using Stages = Ring<Config::kStages>;
    const int stage = Stages::stage(start.iteration + iteration);
    mbarrier_wait(tiles.v_empty(stage), Stages::empty_parity(start.iteration + iteration));
    uint64_t* const landed = tail ? tiles.v_tail() : tiles.v_full(stage);
    mbarrier_arrive_expect_tx(landed, Config::kKvTileBytes);
#pragma unroll
    for (int panel = 0; panel < Config::kPanels; ++panel)
      tma_load_4d(tiles.v(stage) + panel * Config::kKvPanelBytes, v_map, landed, 64 * panel,
                  (work.n_begin + iteration) * Config::kBlockN, work.kv_head, work.batch);
  }

  // The tail's padding rows zeroed by lanes first_lane to 31 of the loading warp once its V has landed; then
  // lane first_lane completes v_full. Whole 128-byte rows of every column panel (the swizzle only permutes
  // 16-byte chunks within a row): in a panel they are contiguous.
  __device__ static void zero_tail(const SharedTiles<Config>& tiles, const Tail& tail, int lane,
                                   int first_lane) {
    mbarrier_wait(tiles.v_tail(), tail.parity);
    uint8_t* const tile = tiles.v(tail.stage);
    const int chunks = (tail.pad_end - tail.pad_begin) * static_cast<int>(kSwizzleRowBytes / 16);
#pragma unroll
    for (int panel = 0; panel < Config::kPanels; ++panel) {
      uint4* const rows =
          reinterpret_cast<uint4*>(tile + panel * Config::kKvPanelBytes + tail.pad_begin * kSwizzleRowBytes);
      for (int chunk = lane - first_lane; chunk < chunks; chunk += 32 - first_lane)
        rows[chunk] = make_uint4(0, 0, 0, 0);
    }
    fence_proxy_async_shared();  // the consumers' wgmma (async proxy) reads what these stores wrote
    __syncwarp(0xffffffffu << first_lane);
    if (lane == first_lane) mbarrier_arrive(tiles.v_full(tail.stage));
  }

  // One tile's loads, issued by one thread, in FA3's order: K_0, into a stage that an earlier S freed; Q,
  // once every consumer warp has finished reading the last tile's (q_empty, given back after its last
  // S = Q K^T), with the tile's number in the persistent kernel (TileScheduler); then the other key blocks in
  // the order the consumers wait for them (consumer_mainloop): with the intra-warpgroup overlap, iteration j
  // takes K_j and then V_{j-1}, so K_j is issued ahead of V_{j-1}, as FA3's producer does; without it, K_j
  // and then V_j. Returns the tile's V tail's iteration (Tail::iteration, -1: none) for PipelineStart::pass.
  __device__ static int issue_tile(const SharedTiles<Config>& tiles, const CUtensorMap* q_map,
                                   const CUtensorMap* k_map, const CUtensorMap* v_map, const BlockWork& work,
                                   const PipelineStart& start, int number) {
    const int blocks = work.n_end - work.n_begin;
    const Tail tail = tail_of(work, start);
    if (blocks > 0) load_k(tiles, k_map, work, start, 0);
    mbarrier_wait(tiles.q_empty(), Ring<1>::empty_parity(start.tile));
    if constexpr (Config::kPersistent) *tiles.tile_number() = number;
    load_q(tiles, q_map, work);
    constexpr int lag = Config::kIntraWarpgroupOverlap ? 1 : 0;  // V's iteration behind K's
    for (int iteration = 0; iteration < blocks + lag && blocks > 0; ++iteration) {
      if (iteration > 0 && iteration < blocks) load_k(tiles, k_map, work, start, iteration);
      if (iteration >= lag) {
        if (iteration - lag == tail.iteration) wait_for_previous_tail(tiles, tail, start);
        load_v(tiles, v_map, work, start, iteration - lag, iteration - lag == tail.iteration);
      }
    }
    return tail.iteration;
  }

  // The producer warpgroup's whole job (warp-specialized kernel): lane 0 of its warp 0 issues every load, the
  // rest of that warp zeroes the tails' padding, the other three warps retire at once. In the persistent
  // kernel the next tile's loads follow at once, into the stages the consumers free: its K_0 and Q land
  // while the consumers finish this tile's last P V and its epilogue. There lane 0 is also the tile
  // scheduler (TileScheduler): it hands each tile's number out with the tile's Q, and when no tile is left a
  // number past the last; the lanes that zero the tails take the numbers as the consumers do (lane 1 reads
  // each, shuffles it to the others and arrives on q_empty), so that lane 0 writes no number over one not yet
  // read.
  __device__ static void run(const SharedTiles<Config>& tiles, const CUtensorMap* q_map,
                             const CUtensorMap* k_map, const CUtensorMap* v_map, const WsArgs& args) {
    if (threadIdx.x >= 32) return;
    const int lane = static_cast<int>(threadIdx.x);
    PipelineStart start;
    if constexpr (!Config::kPersistent) {  // a CTA of one tile
      const BlockWork work = block_work<Config>(args, grid_tile(args));
      if (lane == 0) {
        issue_tile(tiles, q_map, k_map, v_map, work, start, 0);
      } else if (const Tail tail = tail_of(work, start); tail.iteration >= 0) {
        zero_tail(tiles, tail, lane, 1);
      }
    } else if (lane == 0) {
      for (int number = TileScheduler::first(); number < args.order.tiles();) {
        const BlockWork work = block_work<Config>(args, args.order(number));
        // Drawn as the tile starts. The SASS waits for the atomic here (ptxas makes it a warp-wide aggregate,
        // whose result is shuffled at once), while the consumers still compute the last tile.
        const int next = TileScheduler::next(args);
        start.pass(work.n_end - work.n_begin, issue_tile(tiles, q_map, k_map, v_map, work, start, number));
        number = next;
      }
      mbarrier_wait(tiles.q_empty(), Ring<1>::empty_parity(start.tile));
      *tiles.tile_number() = args.order.tiles();  // none left
      mbarrier_arrive(tiles.q_full());
    } else {
      for (;;) {
        mbarrier_wait(tiles.q_full(), Ring<1>::full_parity(start.tile));
        // Read by lane 1 alone, the lane that then gives the word back on q_empty, and shuffled to the others
        // (the consumers' read below says why).
        const int number = __shfl_sync(0xfffffffeu, lane == 1 ? *tiles.tile_number() : 0, 1);
        if (lane == 1) mbarrier_arrive(tiles.q_empty());
        if (number >= args.order.tiles()) return;
        const BlockWork work = block_work<Config>(args, args.order(number));
        const Tail tail = tail_of(work, start);
        if (tail.iteration >= 0) zero_tail(tiles, tail, lane, 1);
        start.pass(work.n_end - work.n_begin, tail.iteration);
      }
    }
  }
};

// --- Ping-pong scheduling between the consumer warpgroups (FA3 section 3.1) ---
// Named barrier 1 + c is "consumer c may issue its matrix products" (consumer c is warpgroup c + 1 in the
// warp-specialized kernel). A consumer waits for its own barrier, issues, then arrives on the next one's,
// round the ring (0, 1, 0, 1, ... with two; 0, 1, 2, 0, ... with three, as FA3's scheduler barrier). The last
// consumer arrives once at the start (consumer 0 goes first) and consumer 0 waits once at the end, so every
// barrier sees as many arrivals as waits.
template <class Config>
struct PingPong {
  // Two warpgroups take part in each barrier: the one waiting for its turn and the one passing it.
  static constexpr uint32_t kThreads = 256;
  static constexpr int kLast = Config::kConsumers - 1;
  __device__ static void start(int consumer) {
    if constexpr (Config::kPingPong)
      if (consumer == kLast) ptx::barrier_arrive(1, kThreads);
  }
  __device__ static void wait_turn(int consumer) {
    if constexpr (Config::kPingPong) ptx::barrier_sync(1 + consumer, kThreads);
  }
  __device__ static void pass_turn(int consumer) {
    if constexpr (Config::kPingPong)
      ptx::barrier_arrive(1 + (consumer == kLast ? 0 : consumer + 1), kThreads);
  }
  __device__ static void finish(int consumer) {
    if constexpr (Config::kPingPong)
      if (consumer == 0) ptx::barrier_sync(1, kThreads);
  }
};

// 2^x in one MUFU.EX2, subnormals flushed (the softmax's exponentials are at most 1 and need none).
__device__ inline float exp2_approx(float x) {
  return ptx::ex2_approx<true>(x);
}

using cuda::pack_pair;  // fp32 pairs to 16-bit register pairs (common/cuda/convert.cuh)

// --- Consumer: one warpgroup, 64 query rows ---
// Thread layout of a 64 x N accumulator (wgmma.cuh): warp w of the warpgroup holds rows 16w + lane/4 ("half"
// 0) and 16w + lane/4 + 8 (half 1); register 4*i + 2*half + e is column 8*i + 2*(lane%4) + e.
// What a consumer warpgroup knows of its rows, whatever its products compute: its 64 rows of Q in shared
// memory, the visible keys of each thread's two rows, and, over the warpgroup's rows, the keys inside which a
// block needs no mask. Consumer below and fp8_kernel.cuh's Fp8Consumer build on it.
template <class Config>
struct ConsumerRows {
  KeyRange rows[2];                      // the visible keys of this thread's two rows
  int64_t tile_begin_max, tile_end_min;  // over the warpgroup's rows: a key block inside both needs no mask
  const uint8_t* q_tile;                 // this warpgroup's 64 rows of Q in shared memory
  int consumer, warp, lane;

  __device__ ConsumerRows(const SharedTiles<Config>& tiles, const WsArgs& args, const BlockWork& work,
                          int consumer_index) {
    consumer = consumer_index;
    warp = (threadIdx.x / 32) % 4;
    lane = threadIdx.x % 32;
    q_tile = tiles.q() + consumer * 64 * kSwizzleRowBytes;
    const int64_t first = first_row(work);
#pragma unroll
    for (int half = 0; half < 2; ++half)
      rows[half] = band_key_range(first + 16 * warp + lane / 4 + 8 * half, work.rows_q, work.rows_k,
                                  args.causal, args.window_left, args.window_right);
    const int64_t last_row = min(first + 63, static_cast<int64_t>(work.rows_q) - 1);
    tile_end_min =
        band_key_range(first, work.rows_q, work.rows_k, args.causal, args.window_left, args.window_right).end;
    tile_begin_max =
        band_key_range(last_row, work.rows_q, work.rows_k, args.causal, args.window_left, args.window_right)
            .begin;
  }

  // The warpgroup's first query row.
  __device__ int64_t first_row(const BlockWork& work) const {
    return work.m_block * Config::kBlockM + consumer * 64;
  }

  // Sets to -inf the scores of s (the accumulator of key block n_block) whose keys a row does not see; a
  // block inside every row's visible keys is left as it is.
  template <int kN>
  __device__ void mask_scores(float (&s)[kN / 2], int n_block) const {
    const int64_t key0 = static_cast<int64_t>(n_block) * kN;
    if (key0 >= tile_begin_max && key0 + kN <= tile_end_min) return;
#pragma unroll
    for (int i = 0; i < kN / 8; ++i)
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t key = key0 + 8 * i + 2 * (lane % 4) + e;
          if (key < rows[half].begin || key >= rows[half].end) s[4 * i + 2 * half + e] = -INFINITY;
        }
  }

  // One warp's arrival per warpgroup on an "empty" barrier (count: 4 warps x kConsumers).
  __device__ void release(uint64_t* empty) const {
    __syncwarp();
    if (lane == 0) mbarrier_arrive(empty);
  }
};

template <class Config>
struct Consumer : ConsumerRows<Config> {
  using Element = typename Config::Element;
  static constexpr int kD = Config::kHeadDim;
  static constexpr int kN = Config::kBlockN;
  using ConsumerRows<Config>::consumer;
  using ConsumerRows<Config>::lane;

  float o[kD / 2];     // O, unnormalized, fp32
  float s[kN / 2];     // S of the current key block, then its probabilities
  uint32_t p[kN / 4];  // P rounded to Element, packed in pairs: the A operand of O += P V
  float row_max[2];    // m, in the log2 domain: the max of S * scale_log2
  float row_sum[2];    // l, this thread's partial sum (the quad's four partials are added at the end)

  __device__ Consumer(const SharedTiles<Config>& tiles, const WsArgs& args, const BlockWork& work,
                      int consumer_index)
      : ConsumerRows<Config>(tiles, args, work, consumer_index) {
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      row_max[half] = -INFINITY;
      row_sum[half] = 0.0f;
    }
  }

  // S = Q K_j^T: kD/16 wgmma over the head dim, the first one overwriting S (scale-d 0). Committed, not
  // waited.
  __device__ void issue_qk(const uint8_t* k_tile) {
    pin_registers(s);
    wgmma_fence();
#pragma unroll
    for (int k_step = 0; k_step < kD / 16; ++k_step)
      Wgmma<kN, Element>::ss(s, k_major_descriptor(this->q_tile, Config::kQPanelBytes, k_step),
                             k_major_descriptor(k_tile, Config::kKvPanelBytes, k_step), k_step > 0);
    wgmma_commit();
    pin_registers(s);
  }

  // O += P V_j: kN/16 wgmma over the keys, P from registers. Committed, not waited.
  __device__ void issue_pv(const uint8_t* v_tile) {
    pin_registers(o);
    pin_registers(p);
    wgmma_fence();
#pragma unroll
    for (int k_step = 0; k_step < kN / 16; ++k_step) {
      const uint32_t a[4] = {p[4 * k_step], p[4 * k_step + 1], p[4 * k_step + 2], p[4 * k_step + 3]};
      Wgmma<kD, Element>::rs(o, a, mn_major_descriptor(v_tile, Config::kKvPanelBytes, k_step), 1);
    }
    wgmma_commit();
    pin_registers(o);
  }

  // The online softmax on S of key block n_block (FA2 Algorithm 1 lines 9-10, in base 2): masks the keys the
  // rows do not see, scales S by scale_log2, updates m and l, turns S into exp2(S - m), and returns through
  // `correction` the factor exp(m_old - m_new) by which O must still be rescaled. The scores are scaled
  // first and the max taken on the scaled values, so that the largest score gives exactly exp2(0) = 1:
  // exp2(fma(s, scale_log2, -m * scale_log2)) would leave the rounding of m * scale_log2 in every exponent,
  // a relative error of up to 2^-24 |m * scale_log2| that exceeds fp16's rounding once scores reach ~1e4
  // (the case matrix's "large magnitude" cases found it in the emulator).
  __device__ void softmax(int n_block, float scale_log2, float (&correction)[2]) {
    pin_registers(s);
    this->template mask_scores<kN>(s, n_block);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < kN / 8; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& score = s[4 * i + 2 * half + e];
          score = __fmul_rn(score, scale_log2);  // rounded, never fused with the subtraction below
          tile_max = fmaxf(tile_max, score);
        }
      // The four threads of a quad hold the same row.
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 2));
      const float new_max = fmaxf(row_max[half], tile_max);
      // A row that has seen only masked keys keeps m = -inf; subtract 0 instead, so that its (masked) scores
      // give exp2(-inf) = 0 and not exp2(-inf + inf) = NaN.
      const float max_used = new_max == -INFINITY ? 0.0f : new_max;
      correction[half] = exp2_approx(row_max[half] - max_used);
      row_max[half] = new_max;
      float tile_sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kN / 8; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& score = s[4 * i + 2 * half + e];
          score = exp2_approx(score - max_used);
          tile_sum += score;
        }
      row_sum[half] = row_sum[half] * correction[half] + tile_sum;
    }
  }

  // FA2 Algorithm 1 line 10: O <- diag(exp(m_old - m_new)) O. A warp none of whose 16 rows' max grew skips
  // it, O the same to the bit (common/cuda/warp_reduce.cuh).
  __device__ void rescale_o(const float (&correction)[2]) {
    if (!cuda::warp_must_rescale(correction)) return;
#pragma unroll
    for (int i = 0; i < kD / 8; ++i)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        o[4 * i + 2 * half] *= correction[half];
        o[4 * i + 2 * half + 1] *= correction[half];
      }
  }

  // P in Element for the tensor cores. The accumulator layout of S is the A-operand layout of the next
  // product, 16 columns per k-step, so P is S's registers paired in order.
  __device__ void convert_p() {
#pragma unroll
    for (int i = 0; i < kN / 4; ++i) p[i] = pack_pair<Element>(s[2 * i], s[2 * i + 1]);
  }
};

// The consumer's main loop over a tile's key blocks, with or without FA3 Algorithm 2's overlap; the tile's
// iteration `it` is the CTA's pipeline iteration start.iteration + it. `prefetch(iteration)` lets the kernel
// without warp specialization issue loads between the products (no-op otherwise).
template <class Config, class Prefetch>
__device__ inline void consumer_mainloop(Consumer<Config>& c, const SharedTiles<Config>& tiles,
                                         const WsArgs& args, const BlockWork& work,
                                         const PipelineStart& start, Prefetch&& prefetch) {
  using Schedule = PingPong<Config>;
  const int blocks = work.n_end - work.n_begin;
  auto stage = [&](int it) { return Ring<Config::kStages>::stage(start.iteration + it); };
  auto phase = [&](int it) { return Ring<Config::kStages>::full_parity(start.iteration + it); };
  float correction[2];
  // K_j's stage once S_j = Q K_j^T has completed, and with the tile's last S the Q tile (q_empty): the
  // producer may load the next tile's Q while this tile's last P V and its epilogue run.
  auto release_k = [&](int it) {
    c.release(tiles.k_empty(stage(it)));
    if (it == blocks - 1) c.release(tiles.q_empty());
  };
  // Every tile's Q, or for a tile that sees no key its producer's word that there is none (Producer::load_q).
  mbarrier_wait(tiles.q_full(), Ring<1>::full_parity(start.tile));
  if (blocks == 0) return c.release(tiles.q_empty());

  if constexpr (!Config::kIntraWarpgroupOverlap) {
    // FA2's order: S_j, softmax, O += P_j V_j, each product waited for before the next step.
    for (int it = 0; it < blocks; ++it) {
      prefetch(it);
      mbarrier_wait(tiles.k_full(stage(it)), phase(it));
      Schedule::wait_turn(c.consumer);
      c.issue_qk(tiles.k(stage(it)));
      Schedule::pass_turn(c.consumer);
      wgmma_wait<0>();
      release_k(it);
      c.softmax(work.n_begin + it, args.scale_log2, correction);
      c.rescale_o(correction);
      c.convert_p();
      mbarrier_wait(tiles.v_full(stage(it)), phase(it));
      Schedule::wait_turn(c.consumer);
      c.issue_pv(tiles.v(stage(it)));
      Schedule::pass_turn(c.consumer);
      wgmma_wait<0>();
      pin_registers(c.o);
      c.release(tiles.v_empty(stage(it)));
    }
  } else {
    // FA3 Algorithm 2 (line numbers of the paper's listing). Lines 5-8, the prologue: S_cur = Q K_0^T, its
    // softmax and P_cur (O is still zero, so no rescale).
    prefetch(0);
    mbarrier_wait(tiles.k_full(stage(0)), phase(0));
    Schedule::wait_turn(c.consumer);
    c.issue_qk(tiles.k(stage(0)));
    Schedule::pass_turn(c.consumer);
    wgmma_wait<0>();
    release_k(0);
    c.softmax(work.n_begin, args.scale_log2, correction);
    c.convert_p();
    for (int it = 1; it < blocks; ++it) {
      prefetch(it);
      // Line 10: issue S_next = Q K_j^T without waiting for it...
      mbarrier_wait(tiles.k_full(stage(it)), phase(it));
      Schedule::wait_turn(c.consumer);
      c.issue_qk(tiles.k(stage(it)));
      // ... line 12: and O += P_cur V_{j-1} behind it.
      mbarrier_wait(tiles.v_full(stage(it - 1)), phase(it - 1));
      c.issue_pv(tiles.v(stage(it - 1)));
      Schedule::pass_turn(c.consumer);
      // Lines 11 and 13: wait for S_next only; the softmax runs while P_cur V_{j-1} is in flight.
      wgmma_wait<1>();
      release_k(it);
      c.softmax(work.n_begin + it, args.scale_log2, correction);
      // Line 14: wait for P_cur V_{j-1}, then rescale O by exp(m_old - m_new) and take P_next.
      wgmma_wait<0>();
      pin_registers(c.o);
      c.release(tiles.v_empty(stage(it - 1)));
      c.rescale_o(correction);
      c.convert_p();
    }
    // Lines 16-17, the epilogue: the last O += P V.
    mbarrier_wait(tiles.v_full(stage(blocks - 1)), phase(blocks - 1));
    Schedule::wait_turn(c.consumer);
    c.issue_pv(tiles.v(stage(blocks - 1)));
    Schedule::pass_turn(c.consumer);
    wgmma_wait<0>();
    pin_registers(c.o);
    c.release(tiles.v_empty(stage(blocks - 1)));
  }
}

// FA2 Algorithm 1 lines 12-13: O / l and LSE = m + log(l); then O through shared memory (this warpgroup's
// rows of O's staging tile, SharedTiles::o) and a TMA store, which drops rows past seqlen_q. Rows with no
// visible key write O = 0 and LSE = -inf. The store is committed, not waited for: the thread that issued it
// waits for its reads before the next epilogue writes the rows (consumer_epilogue) and before the kernel
// ends (finish_o_stores).
template <class Config>
__device__ inline void consumer_epilogue(Consumer<Config>& c, const SharedTiles<Config>& tiles,
                                         const CUtensorMap* o_map, const WsArgs& args,
                                         const BlockWork& work) {
  using Element = typename Config::Element;
  constexpr int kD = Config::kHeadDim;
  // Per-warpgroup named barrier (1 to kConsumers are ping-pong's).
  const uint32_t barrier_id = 1 + Config::kConsumers + c.consumer;
  const int first_row = work.m_block * Config::kBlockM + c.consumer * 64;
  float inverse_sum[2];
  bool seen_row[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float sum = c.row_sum[half];
    sum += __shfl_xor_sync(0xffffffff, sum, 1);
    sum += __shfl_xor_sync(0xffffffff, sum, 2);
    // Empty key range: nothing was seen (the row is padding or lies outside the band). l = 0 would give
    // 0/0; docs/conventions.md §4 asks for O = 0 and LSE = -inf. (A NaN sum counts as seen, so NaN inputs
    // propagate.)
    const bool seen = !c.rows[half].empty() && sum != 0.0f;
    seen_row[half] = seen;
    inverse_sum[half] = seen ? 1.0f / sum : 0.0f;
    const int row = first_row + 16 * c.warp + c.lane / 4 + 8 * half;
    if (c.lane % 4 == 0 && row < args.seqlen_q) {
      // LSE = ln(l) + m * scale = (m + log2(l)) * ln(2), with m the max the exponents subtracted (log2
      // domain).
      const float lse = seen ? (c.row_max[half] + log2f(sum)) * 0.6931471805599453f : -INFINITY;
      args.lse[(static_cast<int64_t>(work.batch) * args.heads_q + work.head) * args.seqlen_q + row] = lse;
    }
  }
  // The rows are free once the barrier below is passed: the last tile's O store (the persistent kernel) has
  // read them, its issuing thread having waited, and in a CTA of one tile, where they are the warpgroup's Q
  // rows, every wgmma of the warpgroup that read them has completed.
  if (threadIdx.x % 128 == 0) tma_store_wait_read();
  ptx::barrier_sync(barrier_id, 128);
  uint8_t* o_tile = tiles.o() + c.consumer * 64 * kSwizzleRowBytes;
  bool special = false;  // whether this thread writes a NaN or an Inf (the exact pass's flag, below)
#pragma unroll
  for (int i = 0; i < kD / 8; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = 16 * c.warp + c.lane / 4 + 8 * half;  // within the warpgroup's 64 rows
      const int column = 8 * i + 2 * (c.lane % 4);
      const int panel = column / 64, byte = (column % 64) * 2;
      // The 128-byte swizzle TMA expects: 16-byte chunk index XOR (row % 8).
      const int swizzled = (((byte / 16) ^ (row % 8)) * 16) | (byte % 16);
      // Selected rather than multiplied by 0: an unseen padding row may hold anything, even NaN.
      const float lo = seen_row[half] ? c.o[4 * i + 2 * half] * inverse_sum[half] : 0.0f;
      const float hi = seen_row[half] ? c.o[4 * i + 2 * half + 1] * inverse_sum[half] : 0.0f;
      special |= !isfinite(lo) || !isfinite(hi);
      *reinterpret_cast<uint32_t*>(o_tile + panel * Config::kQPanelBytes + row * kSwizzleRowBytes +
                                   swizzled) = pack_pair<Element>(lo, hi);
    }
  // A NaN or Inf input reaches O through P V even for the keys a row does not see (0 x NaN): the exact pass
  // after this kernel repairs such rows, and runs only when some thread noted one (exact_rows.hpp).
  cuda::note_special_rows(args.special_rows, special);
  fence_proxy_async_shared();  // the TMA store (async proxy) reads what these ordinary stores wrote
  ptx::barrier_sync(barrier_id, 128);
  if (threadIdx.x % 128 == 0) {
#pragma unroll
    for (int panel = 0; panel < Config::kPanels; ++panel)
      tma_store_4d(o_map, o_tile + panel * Config::kQPanelBytes, 64 * panel, first_row, work.head,
                   work.batch);
    tma_store_commit();
  }
}

// Before a consumer warpgroup ends: shared memory must outlive its last O store's reads.
__device__ inline void finish_o_stores() {
  if (threadIdx.x % 128 == 0) tma_store_wait_read();
}

template <class Config>
__global__ void __launch_bounds__(Config::kThreads, 1)
    ws_attention_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                        const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap o_map,
                        const WsArgs args) {
  const SharedTiles<Config> tiles(cuda::dynamic_shared_memory<uint8_t>());
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    mbarrier_init(tiles.q_full(), 1);
    for (int stage = 0; stage < Config::kStages; ++stage) {
      mbarrier_init(tiles.k_full(stage), 1);  // the producer's arrive.expect_tx; TMA completes the bytes
      mbarrier_init(tiles.v_full(stage), 1);
      mbarrier_init(tiles.k_empty(stage), 4 * Config::kConsumers);  // one arrival per consumer warp
      mbarrier_init(tiles.v_empty(stage), 4 * Config::kConsumers);
    }
    mbarrier_init(tiles.v_tail(), 1);  // the loading warp's arrive.expect_tx; TMA completes the bytes
    // One arrival per consumer warp; in the persistent kernel one more from the lanes that zero the tails,
    // once they have read the tile's number (Producer::run).
    mbarrier_init(tiles.q_empty(), 4 * Config::kConsumers + (Config::kPersistent ? 1 : 0));
    fence_barrier_init();
  }
  __syncthreads();

  if constexpr (Config::kWarpSpecialized) {
    if (warpgroup == 0) {
      setmaxnreg_dec<Config::kProducerRegisters, Config::kLaunchRegisters>();
      Producer<Config>::run(tiles, &q_map, &k_map, &v_map, args);
      return;
    }
    setmaxnreg_inc<Config::kConsumerRegisters, Config::kLaunchRegisters>();
    // The consumers take turns across tiles as within one: all compute the same tiles, and each takes as
    // many turns in a tile as the others.
    const int consumer_index = warpgroup - 1;
    PingPong<Config>::start(consumer_index);
    PipelineStart start;
    for (;;) {
      cuda::Tile tile = grid_tile(args);
      if constexpr (Config::kPersistent) {
        // The producer's word of which tile comes (TileScheduler) lands with its Q; consumer_mainloop's own
        // wait on the same phase then returns at once.
        mbarrier_wait(tiles.q_full(), Ring<1>::full_parity(start.tile));
        // Lane 0 reads it, the lane that gives Q back on q_empty (ConsumerRows::release), and a shuffle hands
        // it to the warp. Read from shared memory by every lane, the number was one value a lane to the
        // compiler, and so was all the loop derives from it: descriptors, ring stages and barrier addresses
        // left the uniform datapath (sm_90a SASS at d 128: the loop's 106 uniform instructions became 1, with
        // 4 R2UR before each HGMMA), the likely cause of the 6-15% the H200's third run lost on non-causal
        // shapes. A shuffle's value is the warp's. And the read is now the arriving lane's own: racecheck
        // flagged the other lanes' reads, which __syncwarp orders before the arrive; whether it accepts this
        // form is for a GPU run to show.
        const int number = __shfl_sync(0xffffffffu, threadIdx.x % 32 == 0 ? *tiles.tile_number() : 0, 0);
        if (number >= args.order.tiles()) break;
        tile = args.order(number);
      }
      const BlockWork work = block_work<Config>(args, tile);
      Consumer<Config> consumer(tiles, args, work, consumer_index);
      consumer_mainloop(consumer, tiles, args, work, start, [](int) {});
      consumer_epilogue(consumer, tiles, &o_map, args, work);
      start.pass(work.n_end - work.n_begin);
      if constexpr (!Config::kPersistent) break;  // a CTA of one tile
    }
    finish_o_stores();
    PingPong<Config>::finish(consumer_index);
  } else {
    // No producer warpgroup: warp 0 (lane 0 issuing) loads Q and the first kStages blocks up front, then at
    // the start of iteration j the block j + kStages - 1 (its stage freed by block j - 1), between its own
    // products.
    using Loads = Producer<Config>;
    const BlockWork work = block_work<Config>(args, grid_tile(args));
    const PipelineStart start;  // the CTA's one tile
    const int blocks = work.n_end - work.n_begin;
    const bool loading_warp = threadIdx.x < 32;
    const int lane = static_cast<int>(threadIdx.x % 32);
    const typename Loads::Tail tail = Loads::tail_of(work, start);
    // Block `it`: lane 0 issues it, and the warp zeroes its padding if it is the tail.
    auto load = [&](int it) {
      if (lane == 0) {
        Loads::load_k(tiles, &k_map, work, start, it);
        Loads::load_v(tiles, &v_map, work, start, it, it == tail.iteration);
      }
      if (it == tail.iteration) Loads::zero_tail(tiles, tail, lane, 0);
    };
    if (loading_warp) {
      if (lane == 0) Loads::load_q(tiles, &q_map, work);
      for (int it = 0; it < min(blocks, Config::kStages); ++it) load(it);
    }
    __syncwarp();
    Consumer<Config> consumer(tiles, args, work, warpgroup);
    auto prefetch = [&](int it) {
      const int next = it + Config::kStages - 1;
      if (loading_warp && it > 0 && next < blocks) load(next);
      __syncwarp();  // wgmma is warp-aligned: reconverge before the next product
    };
    consumer_mainloop(consumer, tiles, args, work, start, prefetch);
    consumer_epilogue(consumer, tiles, &o_map, args, work);
    finish_o_stores();
  }
}

}  // namespace FLASHLAB_CUDA_TARGET
using namespace FLASHLAB_CUDA_TARGET;
}  // namespace flashlab::hopper
