// cuda_v2's registrations: ordinary C++, compiled once. The kernels (split_q_simt.cu, split_q.cu) are built
// for the GPU and for the emulator, and the registry runs whichever this machine can
// (common/cuda/gpu_stage.hpp).
#include <climits>
#include <string>

#include "common/cuda/gpu_stage.hpp"
#include "common/flops.hpp"
#include "cuda_v2/backward.hpp"
#include "cuda_v2/split_q.hpp"

namespace flashlab::cuda_v2 {

namespace {

// What both kernels cannot do, as the launch check (check_split_q*) would refuse it, but before any device
// memory is touched. The dtype is the registry's business (Implementation::dtypes).
std::string supports(const Problem& p) {
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256)
    return "head_dim (" + std::to_string(p.head_dim) + ") must be 64, 128 or 256 (the compiled tiles)";
  // The grid is (q-blocks, heads_q, batch); SplitQParams holds lengths and windows as int; the kernels fold
  // the scale into exp2 after the row max of the unscaled scores.
  for (const std::string& reason :
       {grid_extent_limit("heads_q", p.heads_q), grid_extent_limit("batch", p.batch),
        int_lengths_and_positive_scale(p, "cuda_v2")})
    if (!reason.empty()) return reason;
  return "";
}

// Both kernels' global traffic: FA2's Q-block-outer order (common/flops.hpp), K/V tiles read by cp.async up
// to the batch's last key. `flashlab profile` counts it in the emulator (tests/test_counters.cpp holds them
// to it).
double simt_bytes_moved(const Problem& p) {
  const QueryKeyTile tile = split_q_simt_tile();
  return q_block_outer_bytes(p, tile.block_m, tile.block_n, 4.0, TileLoads::cp_async) +
         cuda::exact_rows_scan_bytes(p, 4.0);  // the special-value pass reads O once (docs/08)
}
double tensor_core_bytes_moved(const Problem& p) {
  const QueryKeyTile tile = split_q_tile(static_cast<int>(p.head_dim));
  return q_block_outer_bytes(p, tile.block_m, tile.block_n, 2.0, TileLoads::cp_async) +
         cuda::exact_rows_flag_bytes();  // the special-value pass reads its flag (docs/08)
}

const Registration split_q_simt{gpu_implementation(
    {.name = "cuda_v2/split_q_simt",
     .summary = "FA2 schedule on CUDA cores, fp32: grid over (q-block, head, batch), warps split Q",
     .constraints = "f32; head_dim 64, 128, 256; every mask, GQA, any length",
     .supports = supports,
     .bytes_moved = simt_bytes_moved},
    FLASHLAB_DEVICE_BUILDS(launch_split_q_simt, workspace_bytes))};

size_t backward_workspace(const Problem& p) {
  return backward_workspace_bytes(p, false);
}

const Registration split_q{with_gpu_backward(
    gpu_implementation(
        {.name = "cuda_v2/split_q",
         .summary =
             "FA2 on tensor cores: mma.sync m16n8k16 + ldmatrix, cp.async double buffering, fp32 accum",
         .dtypes = {DType::f16, DType::bf16},
         .constraints = "f16, bf16; head_dim 64, 128, 256 (backward: 64, 128); every mask, GQA, any length; "
                        "softcap, ALiBi, bias, dropout, packed varlen",
         .rounds_p = true,    // P is rounded to the input format: it is the A operand of the P V mma
         .score_mods = true,  // forward and backward (score_mod.cuh)
         .dropout = true,     // likewise (common/dropout.hpp)
         .packed = true,      // likewise (common/cuda/sequences.hpp)
         .supports = supports,
         .bytes_moved = tensor_core_bytes_moved},
        FLASHLAB_DEVICE_BUILDS(launch_split_q, workspace_bytes)),
    FLASHLAB_DEVICE_BACKWARD_BUILDS(launch_split_q_backward, backward_workspace), split_q_backward_supports)};

}  // namespace

}  // namespace flashlab::cuda_v2
