// decoding/cuda_split_kv as a registry entry: the launcher on the registry's device tensors, in plain C++
// (cuda_split_kv.hpp needs the CUDA headers; the registration, cuda_split_kv.cpp, is compiled in every
// build). Defined in cuda_split_kv.cu, CUDA builds only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/registry.hpp"

namespace flashlab::decoding {

// Scratch the launcher needs: the partials (O_j, LSE_j) of the split count the heuristic picks on this
// device, then the int copies of the per-batch lengths.
size_t cuda_split_kv_registry_workspace_bytes(const Problem& problem);

// Elements of the partials (O_j and LSE_j) at the split count the heuristic picks on this device (0 when it
// runs unsplit; one split is assumed where there is no device).
int64_t cuda_split_kv_partial_elements(const Problem& problem);

// Contiguous K/V (no paged cache: DeviceTensors holds K and V as BSHD tensors), the heuristic's split count,
// enqueued on the default stream.
void launch_cuda_split_kv(const Problem& problem, const DeviceTensors& tensors);

}  // namespace flashlab::decoding
