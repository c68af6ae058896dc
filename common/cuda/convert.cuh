// Element conversions of device code, written once: to fp32 from the storage formats and back, rounding to
// nearest even.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

}  // namespace FLASHLAB_CUDA_TARGET
using namespace FLASHLAB_CUDA_TARGET;
}  // namespace flashlab::cuda
