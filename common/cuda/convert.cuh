// Element conversions of device code, written once: to fp32 from the storage formats and back, rounding to
// nearest even.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/cuda/target.hpp"

namespace flashlab::cuda {
namespace FLASHLAB_CUDA_TARGET {  // both builds of this code may be linked into one program

__device__ inline float to_float(float x) {
  return x;
}
__device__ inline float to_float(__half x) {
  return __half2float(x);
}
__device__ inline float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename Element>
__device__ inline Element from_float(float x);
template <>
__device__ inline float from_float<float>(float x) {
  return x;
}
template <>
__device__ inline __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Two fp32 values rounded to a 16-bit format and packed into one 32-bit register, `lo` in the low half: how
// the tensor cores' operands (mma.sync, wgmma) and 32-bit stores of a pair hold them.
template <typename Element>
__device__ inline uint32_t pack_pair(float lo, float hi);
template <>
__device__ inline uint32_t pack_pair<__half>(float lo, float hi) {
  const __half2 pair = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}
template <>
__device__ inline uint32_t pack_pair<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

}  // namespace FLASHLAB_CUDA_TARGET
using namespace FLASHLAB_CUDA_TARGET;
}  // namespace flashlab::cuda
