// Host side of TMA: the driver's tensor-map encoder, which the Hopper kernels' launchers (ws_launch.cu,
// ws_core.cu, fp8_launch.cu) use to describe their tiles, and the tensor maps of BSHD tensors. In emulated
// builds the runtime hands out the emulator's encoder (emulator/tensor_map.hpp), which checks the same
// parameters and records them for its TMA.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include "common/cuda/check.hpp"
#include "common/cuda/target.hpp"
#include "common/error.hpp"
#include "cuda_v3_hopper/ws.hpp"

namespace flashlab::hopper {
namespace FLASHLAB_CUDA_TARGET {

// cuTensorMapEncodeTiled, found through the runtime once (no link against libcuda).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    FLASHLAB_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                                         cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || function == nullptr)
      fail("cuTensorMapEncodeTiled: not available from the installed driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encode;
}

// A 4-D view (head_dim, seqlen, heads, batch) of a BSHD tensor, moved in boxes of 64 columns x box_rows rows
// with the 128-byte swizzle the wgmma descriptors expect. Out-of-bounds boxes read zeros and drop writes.
inline CUtensorMap bshd_tensor_map(const void* base, HopperDType dtype, int head_dim, int seqlen, int heads,
                                   int batch, int64_t stride_seq, int64_t stride_head, int64_t stride_batch,
                                   int box_rows, const char* tensor) {
  constexpr int64_t kBytes = 2;  // bf16 and fp16
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(seqlen),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(stride_seq * kBytes),
                                 static_cast<cuuint64_t>(stride_head * kBytes),
                                 static_cast<cuuint64_t>(stride_batch * kBytes)};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult result = tensor_map_encoder()(
      &map, dtype == HopperDType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      4, const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) fail("cuTensorMapEncodeTiled failed for ", tensor, " (CUresult ", result, ")");
  return map;
}

}  // namespace FLASHLAB_CUDA_TARGET
using namespace FLASHLAB_CUDA_TARGET;
}  // namespace flashlab::hopper
