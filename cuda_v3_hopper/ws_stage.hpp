// cuda_v3_hopper/ws as registry entries, in plain C++ (the registrations, ws.cpp, are compiled in every
// build): the scratch the launchers need and the launchers on the registry's device tensors, one per rung of
// the ablation ladder, in each build of the kernel (ws_launch.cu, common/cuda/target.hpp).
#pragma once

#include <cstddef>
#include <string>

#include "common/cuda/exact_rows.hpp"
#include "common/cuda/int_lengths.hpp"
#include "common/cuda/target.hpp"
#include "common/registry.hpp"

namespace flashlab::hopper {

// The persistent kernel's tile counter (HopperParams::tile_counter) in a launch's workspace, after the flag:
// 16 bytes, so that what follows stays aligned.
inline constexpr size_t kTileCounterBytes = 16;

// Scratch the launchers need: the int copies of the per-batch lengths (HopperParams holds them as int), then
// the kernel's flag of special values (common/cuda/exact_rows.hpp), then the persistent kernel's tile
// counter.
inline size_t ws_workspace_bytes(const Problem& problem) {
  return cuda::int_lengths_bytes(problem) + cuda::kSpecialRowsFlagBytes + kTileCounterBytes;
}
// Where that counter is in a launch's workspace of ws_workspace_bytes(problem).
inline unsigned* ws_tile_counter(void* workspace, const Problem& problem) {
  return reinterpret_cast<unsigned*>(static_cast<std::byte*>(workspace) + cuda::int_lengths_bytes(problem) +
                                     cuda::kSpecialRowsFlagBytes);
}

// "" on a device of compute capability 9.0, else why the sm_90a kernels cannot run on this machine's GPU (no
// device, or its compute capability): the availability of every cuda_v3_hopper entry (ws.cpp).
std::string needs_sm90a();

// The rungs for a bf16 or f16 problem, enqueued on tensors.stream: the full kernel (warp specialization,
// ping-pong, intra-warpgroup overlap), then each ingredient taken away in the ladder's order; the full kernel
// with FA3's 128 x 176 tiles (head dims in the 128 tile width), with its 192 x 128 tiles (bf16, head dims in
// the 64 tile width); and the full kernel persistent.
FLASHLAB_FOR_EACH_TARGET(void launch_ws(const Problem& problem, const DeviceTensors& tensors);
                         void launch_ws_no_overlap(const Problem& problem, const DeviceTensors& tensors);
                         void launch_ws_no_pingpong(const Problem& problem, const DeviceTensors& tensors);
                         void launch_ws_no_producer(const Problem& problem, const DeviceTensors& tensors);
                         void launch_ws_bc176(const Problem& problem, const DeviceTensors& tensors);
                         void launch_ws_m192(const Problem& problem, const DeviceTensors& tensors);
                         // The full kernel, persistent (bf16, head dims up to 128), on one CTA per SM;
                         // or on `ctas` CTAs, so that each computes many tiles on any device.
                         void launch_ws_persistent(const Problem& problem, const DeviceTensors& tensors);
                         void launch_ws_persistent_ctas(const Problem& problem, const DeviceTensors& tensors,
                                                        int ctas);
                         // The core (ws_core.cu): FA3 Algorithm 1, warp specialization alone, plain case.
                         void launch_ws_core(const Problem& problem, const DeviceTensors& tensors);)

}  // namespace flashlab::hopper
