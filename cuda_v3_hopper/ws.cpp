// cuda_v3_hopper/ws's registrations: ordinary C++, compiled in every build. Each runs on an sm_90 GPU where
// there is one, and in the emulator otherwise. The kernel is in ws_kernel.cuh, its launchers in ws_launch.cu.
#include <climits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/cuda/device.hpp"
#include "common/cuda/gpu_stage.hpp"
#include "common/flops.hpp"
#include "cuda_v3_hopper/ws.hpp"
#include "cuda_v3_hopper/ws_stage.hpp"

namespace flashlab::hopper {

// wgmma and setmaxnreg exist only in sm_90a's feature set, and the kernel is compiled for it alone: it runs
// on compute capability 9.0 and nowhere else (not on 8.x, nor on 10.x).
std::string needs_sm90a() {
  return cuda::needs_compute_capability(9, 0, "sm_90a");
}

namespace {

std::string supports(const Problem& p) {
  if (ws_tile_width(p.head_dim) == 0)
    return "head_dim (" + std::to_string(p.head_dim) +
           ") must be a multiple of 8 up to 256 for cuda_v3_hopper/ws";
  // The grid is (q-blocks, heads_q, batch); HopperParams holds lengths and windows as int; the row max is
  // taken on unscaled scores and the scale folded into exp2.
  for (const std::string& reason :
       {grid_extent_limit("heads_q", p.heads_q), grid_extent_limit("batch", p.batch),
        int_lengths_and_positive_scale(p, "cuda_v3_hopper/ws")})
    if (!reason.empty()) return reason;
  return "";
}

// Global traffic: FA2's Q-block-outer order (common/flops.hpp), 16-bit, with TMA boxes that read a visited
// key block to the tensor's end (padding keys included), for tiles of `block_m` query rows and key blocks of
// `block_n` (0: the head dim's own). `flashlab profile` counts it in the emulator.
double traffic(const Problem& p, int block_m, int block_n) {
  const int n = block_n != 0 ? block_n : ws_block_n(static_cast<int>(p.head_dim));
  return q_block_outer_bytes(p, block_m, n, 2.0, TileLoads::tma) +
         cuda::exact_rows_flag_bytes();  // the special-value pass reads its flag (docs/08)
}
double bytes_moved(const Problem& p) {
  return traffic(p, kWsBlockM, 0);
}

// One entry per rung of the ablation ladder (ws.hpp, HopperAblation), and one for each of FA3's other tile
// shapes and its persistent scheduler: the harness checks each, and the tools compare and time them side by
// side. No explicit mask: the registry refuses one by name.
Implementation rung(const char* name, const char* summary, DeviceBuilds builds,
                    const char* constraints =
                        "bf16, f16; sm_90a; head_dim a multiple of 8 up to 256; causal, "
                        "window, padding, GQA; no explicit mask",
                    std::string (*accepts)(const Problem&) = supports,
                    double (*moved)(const Problem&) = bytes_moved,
                    std::vector<DType> dtypes = {DType::bf16, DType::f16}) {
  return gpu_implementation(
      {.name = name,
       .summary = summary,
       .dtypes = std::move(dtypes),
       .constraints = constraints,
       .rounds_p = true,  // P is rounded to the input format: it is the A operand of the P V wgmma
       .explicit_mask = false,
       .availability = needs_sm90a,
       .supports = accepts,
       .bytes_moved = moved},
      builds);
}

// FA3's 128 x 176 tile: the head dims that run in the 128 tile width.
std::string wide_supports(const Problem& p) {
  if (ws_tile_width(p.head_dim) != 128)
    return "head_dim (" + std::to_string(p.head_dim) +
           ") must be a multiple of 8 from 72 to 128 for cuda_v3_hopper/ws_bc176 (its tiles are 128 wide)";
  return supports(p);
}
double wide_bytes_moved(const Problem& p) {
  return traffic(p, kWsBlockM, kWsWideBlockN);
}

// FA3's 192 x 128 tile: bf16, the head dims that run in the 64 tile width.
std::string tall_supports(const Problem& p) {
  if (ws_tile_width(p.head_dim) != 64)
    return "head_dim (" + std::to_string(p.head_dim) +
           ") must be a multiple of 8 up to 64 for cuda_v3_hopper/ws_m192 (its tiles are 64 wide)";
  return supports(p);
}
double tall_bytes_moved(const Problem& p) {
  return traffic(p, kWsTallBlockM, 0);
}

// The persistent kernel: the full kernel's tiles, in bf16 for the head dims of the 64 and 128 tile widths.
std::string persistent_supports(const Problem& p) {
  if (ws_tile_width(p.head_dim) == 0 || ws_tile_width(p.head_dim) > 128)
    return "head_dim (" + std::to_string(p.head_dim) +
           ") must be a multiple of 8 up to 128 for cuda_v3_hopper/ws_persistent";
  return supports(p);
}

// The core (ws_core.cu): FA3 Algorithm 1 as the paper writes it. 128 x 128 tiles, every key block up to the
// batch's last key, TMA boxes to the tensor's end; the exact pass scans O.
double core_bytes_moved(const Problem& p) {
  return q_block_outer_bytes(p, kWsBlockM, 128, 2.0, TileLoads::tma, KeyTiles::all) +
         cuda::exact_rows_scan_bytes(p, 2.0);
}

std::string core_supports(const Problem& p) {
  if (p.head_dim != 64 && p.head_dim != 128)
    return "head_dim (" + std::to_string(p.head_dim) + ") must be 64 or 128 for cuda_v3_hopper/ws_core";
  return supports(p);
}

const Registration ws_core{gpu_implementation(
    {.name = "cuda_v3_hopper/ws_core",
     .summary = "FA3 Algorithm 1 as the paper writes it: a TMA producer warpgroup, two wgmma consumers",
     .dtypes = {DType::bf16},
     .constraints = "the plain case: bf16; sm_90a; head_dim 64, 128; causal, window, padding, GQA",
     .rounds_p = true,  // P is rounded to bf16: it is the A operand of the P V wgmma
     .explicit_mask = false,
     .availability = needs_sm90a,
     .supports = core_supports,
     .bytes_moved = core_bytes_moved},
    FLASHLAB_DEVICE_BUILDS(launch_ws_core, ws_workspace_bytes))};

const Registration ws{
    rung("cuda_v3_hopper/ws",
         "FA3 on Hopper: TMA producer warpgroup, wgmma consumers, ping-pong and intra-warpgroup "
         "overlap",
         FLASHLAB_DEVICE_BUILDS(launch_ws, ws_workspace_bytes))};
const Registration ws_no_overlap{
    rung("cuda_v3_hopper/ws_no_overlap",
         "FA3's ablation: warp-specialized, ping-pong, without the intra-warpgroup overlap (Algorithm 2)",
         FLASHLAB_DEVICE_BUILDS(launch_ws_no_overlap, ws_workspace_bytes))};
const Registration ws_no_pingpong{rung("cuda_v3_hopper/ws_no_pingpong",
                                       "FA3's ablation: warp-specialized only, no ping-pong, no overlap",
                                       FLASHLAB_DEVICE_BUILDS(launch_ws_no_pingpong, ws_workspace_bytes))};
const Registration ws_no_producer{
    rung("cuda_v3_hopper/ws_no_producer",
         "FA3's ablation: TMA and wgmma without a producer warpgroup (one consumer thread issues the loads)",
         FLASHLAB_DEVICE_BUILDS(launch_ws_no_producer, ws_workspace_bytes))};
// Beside the ladder: the full kernel with the key block FA3 takes for non-causal d 128 (ws.hpp).
const Registration ws_bc176{rung(
    "cuda_v3_hopper/ws_bc176", "the full FA3 kernel with FA3's 128 x 176 tiles (non-causal d 128 in FA3)",
    FLASHLAB_DEVICE_BUILDS(launch_ws_bc176, ws_workspace_bytes),
    "bf16, f16; sm_90a; head_dim a multiple of 8 from 72 to 128; causal, window, "
    "padding, GQA; no explicit mask",
    wide_supports, wide_bytes_moved)};
// Beside the ladder: the full kernel with the query block FA3 takes for d 64, three consumers (ws.hpp).
const Registration ws_m192{
    rung("cuda_v3_hopper/ws_m192",
         "the full FA3 kernel with FA3's 192 x 128 tiles for d 64: three consumer warpgroups",
         FLASHLAB_DEVICE_BUILDS(launch_ws_m192, ws_workspace_bytes),
         "bf16; sm_90a; head_dim a multiple of 8 up to 64; causal, window, padding, GQA; no explicit mask",
         tall_supports, tall_bytes_moved, {DType::bf16})};
// Beside the ladder: the full kernel with FA3's persistent tile scheduler (common/cuda/tile_order.hpp).
const Registration ws_persistent{
    rung("cuda_v3_hopper/ws_persistent",
         "the full FA3 kernel, persistent: one CTA per SM, tiles in L2 sections, longest first",
         FLASHLAB_DEVICE_BUILDS(launch_ws_persistent, ws_workspace_bytes),
         "bf16; sm_90a; head_dim a multiple of 8 up to 128; causal, window, padding, GQA; no explicit mask",
         persistent_supports, bytes_moved, {DType::bf16})};

}  // namespace

}  // namespace flashlab::hopper
