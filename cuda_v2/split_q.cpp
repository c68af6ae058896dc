// cuda_v2's registrations: ordinary C++, compiled once. The kernels (split_q_simt.cu, split_q.cu) are built
// for the GPU and for the emulator, and the registry runs whichever this machine can
// (common/cuda/gpu_stage.hpp).
#include <string>

#include "common/cuda/gpu_stage.hpp"
#include "common/flops.hpp"
#include "cuda_v2/backward.hpp"
#include "cuda_v2/split_q.hpp"

namespace flashlab::cuda_v2 {

namespace {

// The registry's supports(): each kernel's launch check on the problem's parameters (split_q_params.cpp), so
// a rule is written once and refused before any device memory is touched. The dtype is also the registry's
// business (Implementation::dtypes).
std::string simt_supports(const Problem& p) {
  return refusal(check_split_q_simt, p);
}
std::string split_q_supports(const Problem& p) {
  return refusal(check_split_q, p);
}
std::string mma_supports(const Problem& p) {
  return refusal(check_mma, p);
}
std::string rung_supports(const Problem& p) {
  return refusal(check_split_q_rung, p);
}
std::string eight_warps_supports(const Problem& p) {
  return refusal(check_split_q_8warps, p);
}
std::string narrow_keys_supports(const Problem& p) {
  return refusal(check_split_q_bc64, p);
}
std::string longest_first_supports(const Problem& p) {
  return refusal(check_split_q_longest_first, p);
}

// Both kernels' global traffic: FA2's Q-block-outer order (common/flops.hpp), K/V tiles read by cp.async up
// to the batch's last key. `flashlab profile` counts it in the emulator (tests/test_counters.cpp holds them
// to it).
double simt_bytes_moved(const Problem& p) {
  const QueryKeyTile tile = split_q_simt_tile();
  return q_block_outer_bytes(p, tile.block_m, tile.block_n, 4.0, TileLoads::cp_async) +
         cuda::exact_rows_scan_bytes(p, 4.0);  // the special-value pass reads O once (docs/08)
}
double tensor_core_bytes(const Problem& p, QueryKeyTile tile) {
  return q_block_outer_bytes(p, tile.block_m, tile.block_n, 2.0, TileLoads::cp_async) +
         cuda::exact_rows_flag_bytes();  // the special-value pass reads its flag (docs/08)
}
// split_q's tiles for the problem's kernel: with a variant or without (split_q_tile). Under a mask the keys
// of a tile that a valid row sees are read in whole key tiles, so a 128-key tile reads more keys no row
// needs.
double tensor_core_bytes_moved(const Problem& p) {
  return tensor_core_bytes(p, split_q_tile(static_cast<int>(p.head_dim), split_q_params(p).has_variants()));
}
// split_q_bc64's tiles: those of split_q's kernels with a variant at the 64 width, 64 keys a tile.
double narrow_keys_bytes_moved(const Problem& p) {
  return tensor_core_bytes(p, split_q_tile(64, true));
}

// The tensor-core ladder's first rung (mma.cu): Br = Bc = 64, every key tile up to the batch's last key, and
// the exact pass scanning O.
double mma_bytes_moved(const Problem& p) {
  return q_block_outer_bytes(p, 64, 64, 2.0, TileLoads::cp_async, KeyTiles::all) +
         cuda::exact_rows_scan_bytes(p, 2.0);
}

const Registration mma{gpu_implementation(
    {.name = "cuda_v2/mma",
     .summary = "FA2 Algorithm 1 on tensor cores as the paper writes it: mma.sync, plain shared-memory loads",
     .dtypes = {DType::f16},
     .constraints = "the plain case: f16; head_dim 64, 128; causal, window, padding, GQA; no explicit mask",
     .rounds_p = true,  // P is rounded to fp16: it is the A operand of the P V mma
     .explicit_mask = false,
     .supports = mma_supports,
     .bytes_moved = mma_bytes_moved},
    FLASHLAB_DEVICE_BUILDS(launch_mma, workspace_bytes))};

// The rungs between mma and split_q: split_q's kernel (its tiles) without block skipping; plain case, f16.
double rung_bytes_moved(const Problem& p) {
  const QueryKeyTile tile = split_q_tile(static_cast<int>(p.head_dim));
  return q_block_outer_bytes(p, tile.block_m, tile.block_n, 2.0, TileLoads::cp_async, KeyTiles::all) +
         cuda::exact_rows_flag_bytes();
}

Implementation rung(const char* name, const char* summary, DeviceBuilds builds) {
  return gpu_implementation({.name = name,
                             .summary = summary,
                             .dtypes = {DType::f16},
                             .constraints = "the plain case: f16; head_dim 64, 128; causal, window, padding, "
                                            "GQA; no explicit mask",
                             .rounds_p = true,
                             .explicit_mask = false,
                             .supports = rung_supports,
                             .bytes_moved = rung_bytes_moved},
                            builds);
}

const Registration mma_ldmatrix{
    rung("cuda_v2/mma_ldmatrix", "the tensor-core ladder, rung 2: + ldmatrix and a swizzled shared layout",
         FLASHLAB_DEVICE_BUILDS(launch_mma_ldmatrix, workspace_bytes))};
const Registration mma_cp_async{rung("cuda_v2/mma_cp_async",
                                     "the tensor-core ladder, rung 3: + cp.async double buffering of K/V",
                                     FLASHLAB_DEVICE_BUILDS(launch_mma_cp_async, workspace_bytes))};

const Registration split_q_simt{gpu_implementation(
    {.name = "cuda_v2/split_q_simt",
     .summary = "FA2 schedule on CUDA cores, fp32: grid over (q-block, head, batch), warps split Q",
     .constraints = "f32; head_dim 32, 64, 96, 128, 256; every mask, GQA, any length",
     .supports = simt_supports,
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
         .constraints = "f16, bf16; head_dim a multiple of 8 up to 256 (backward: 32, 64, 96, 128); every "
                        "mask, GQA, any length; "
                        "softcap, ALiBi, bias, dropout, packed varlen",
         .rounds_p = true,    // P is rounded to the input format: it is the A operand of the P V mma
         .score_mods = true,  // forward and backward (score_mod.cuh)
         .dropout = true,     // likewise (common/dropout.hpp)
         .packed = true,      // likewise (common/cuda/sequences.hpp)
         .supports = split_q_supports,
         .bytes_moved = tensor_core_bytes_moved},
        FLASHLAB_DEVICE_BUILDS(launch_split_q, workspace_bytes)),
    FLASHLAB_DEVICE_BACKWARD_BUILDS(launch_split_q_backward, backward_workspace), split_q_backward_supports)};

// An entry of split_q's kernel with FlashAttention-2's own tiles in one tile width (split_q.cu), bf16, no
// score modification or dropout: a candidate for the GPU to judge against split_q's tiles.
Implementation one_width_entry(const char* name, const char* summary, const char* head_dims,
                               std::string (*supports)(const Problem&), double (*bytes_moved)(const Problem&),
                               DeviceBuilds builds) {
  return gpu_implementation(
      {.name = name,
       .summary = summary,
       .dtypes = {DType::bf16},
       .constraints = std::string("bf16; head_dim ") + head_dims +
                      "; every mask, GQA, any length, packed varlen; no score modification or dropout",
       .rounds_p = true,  // P is rounded to bf16: it is the A operand of the P V mma
       .packed = true,
       .supports = supports,
       .bytes_moved = bytes_moved},
      builds);
}

// At d = 128, split_q's earlier warp layout: 8 warps of one row tile (EightWarpsRung), as its variants keep,
// against FA2's 4 warps of two that split_q takes.
const Registration split_q_8warps{
    one_width_entry("cuda_v2/split_q_8warps",
                    "split_q at d 128 with 8 warps of one 16-row tile (split_q: FA2's 4 warps of two)",
                    "a multiple of 8 from 104 to 128", eight_warps_supports, tensor_core_bytes_moved,
                    FLASHLAB_DEVICE_BUILDS(launch_split_q_8warps, workspace_bytes))};

// At d = 64, split_q's earlier key tile: 64 keys a tile (NarrowKeysRung), as its variants keep, against the
// 128 of FA2's that split_q takes.
const Registration split_q_bc64{one_width_entry(
    "cuda_v2/split_q_bc64", "split_q at d 64 with 64 keys a tile: 128 x 64 (split_q: FA2's 128 x 128)",
    "a multiple of 8 from 40 to 64", narrow_keys_supports, narrow_keys_bytes_moved,
    FLASHLAB_DEVICE_BUILDS(launch_split_q_bc64, workspace_bytes))};

// split_q's kernel and tiles, the grid's tiles handed out in another order (common/cuda/tile_order.hpp):
// under a causal mask the longest first, in sections of heads whose K and V fit in L2. A candidate for the
// GPU to judge against split_q's (q-block, head, batch) grid; the forward only.
const Registration split_q_longest_first{gpu_implementation(
    {.name = "cuda_v2/split_q_longest_first",
     .summary = "split_q with its tiles launched longest first, in L2 sections of heads (FA3's order)",
     .dtypes = {DType::f16, DType::bf16},
     .constraints = "f16, bf16; head_dim a multiple of 8 up to 256; every mask, GQA, any length, packed "
                    "varlen; no score modification or dropout; the forward only",
     .rounds_p = true,
     .packed = true,
     .supports = longest_first_supports,
     .bytes_moved = tensor_core_bytes_moved},
    FLASHLAB_DEVICE_BUILDS(launch_split_q_longest_first, workspace_bytes))};

// An entry beside split_q whose forward is split_q's kernel and whose backward takes another tile, a
// candidate for the GPU to judge against split_q's: bf16, head dims 64 and 128, no score modification or
// dropout.
Implementation backward_tile_entry(const char* name, const char* summary, DeviceBackwardBuilds backward,
                                   std::string (*backward_supports)(const Problem&)) {
  return with_gpu_backward(
      gpu_implementation(
          {.name = name,
           .summary = summary,
           .dtypes = {DType::bf16},
           .constraints =
               "bf16; forward: split_q's; backward: head_dim 64, 128; every mask, GQA, any length, "
               "packed varlen; no score modification or dropout",
           .rounds_p = true,  // P is rounded to bf16: it is the A operand of the P V mma
           .packed = true,
           .supports = split_q_supports,
           .bytes_moved = tensor_core_bytes_moved},
          FLASHLAB_DEVICE_BUILDS(launch_split_q, workspace_bytes)),
      backward, backward_supports);
}

// The same backward kernel with 128 keys a block (8 warps of 16 keys), FlashAttention-2's key tile at d 128
// (backward.cu).
const Registration split_q_bwd128{
    backward_tile_entry("cuda_v2/split_q_bwd128",
                        "split_q with its backward on 128-key tiles, 8 warps (split_q's: 64 keys, 4 warps)",
                        FLASHLAB_DEVICE_BACKWARD_BUILDS(launch_split_q_bwd128_backward, backward_workspace),
                        split_q_bwd128_backward_supports)};

// The backward in FlashAttention-2's own warp layout at d 128, 64 query rows a step over 128 keys
// (backward_64x128.cu), where split_q_bwd128's steps take 32.
const Registration split_q_bwd64x128{backward_tile_entry(
    "cuda_v2/split_q_bwd64x128",
    "split_q with its backward in FA2's warp layout: 64 query rows a step over 128 keys",
    FLASHLAB_DEVICE_BACKWARD_BUILDS(launch_split_q_bwd64x128_backward, backward_workspace),
    split_q_bwd64x128_backward_supports)};

// The same kernel with its key tiles handed out longest first, in L2 sections of (batch, kv head) pairs
// (SplitQBackwardParams::longest_first): under a causal mask the first key tiles are the longest.
const Registration split_q_bwd64x128_longest_first{backward_tile_entry(
    "cuda_v2/split_q_bwd64x128_longest_first",
    "split_q_bwd64x128 with its key tiles launched longest first, in L2 sections of heads",
    FLASHLAB_DEVICE_BACKWARD_BUILDS(launch_split_q_bwd64x128_longest_first_backward, backward_workspace),
    split_q_bwd64x128_longest_first_backward_supports)};

size_t backward_workspace_tiled_dq(const Problem& p) {
  return backward_workspace_bytes(p, false, kBackwardWideBlockN, true);
}

// The same kernel with dQ's accumulator in the order its threads hold it (dq_tile.hpp, FlashAttention-2's
// way): each warp's add covers 512 contiguous bytes, where in row order it covers 8 rows of 32 bytes.
const Registration split_q_bwd64x128_tiled_dq{backward_tile_entry(
    "cuda_v2/split_q_bwd64x128_tiled_dq",
    "split_q_bwd64x128 with dQ's fp32 accumulator in the fragments' order: 512 contiguous bytes an add",
    FLASHLAB_DEVICE_BACKWARD_BUILDS(launch_split_q_bwd64x128_tiled_dq_backward, backward_workspace_tiled_dq),
    split_q_bwd64x128_tiled_dq_backward_supports)};

// Both: dQ's accumulator in the fragments' order, the key tiles handed out longest first.
const Registration split_q_bwd64x128_tiled_dq_longest_first{backward_tile_entry(
    "cuda_v2/split_q_bwd64x128_tiled_dq_longest_first",
    "split_q_bwd64x128_tiled_dq with its key tiles launched longest first, in L2 sections of heads",
    FLASHLAB_DEVICE_BACKWARD_BUILDS(launch_split_q_bwd64x128_tiled_dq_longest_first_backward,
                                    backward_workspace_tiled_dq),
    split_q_bwd64x128_tiled_dq_longest_first_backward_supports)};

}  // namespace

}  // namespace flashlab::cuda_v2
