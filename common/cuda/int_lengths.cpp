#include "common/cuda/int_lengths.hpp"

#include <cuda_runtime.h>

#include "common/cuda/check.hpp"

namespace flashlab::cuda::FLASHLAB_CUDA_TARGET {

namespace {

// One strided device-to-device copy: the low 4 bytes of every int64 (CUDA devices and hosts are
// little-endian, and a length in [0, 2^31) is its own low 32 bits), packed into consecutive ints. No kernel
// of our own is needed for it.
const int* narrow(const int64_t* lengths, size_t count, int* out, cudaStream_t stream) {
  if (lengths == nullptr) return nullptr;
  FLASHLAB_CUDA_CHECK(cudaMemcpy2DAsync(out, sizeof(int32_t), lengths, sizeof(int64_t), sizeof(int32_t),
                                        count, cudaMemcpyDeviceToDevice, stream));
  return out;
}

}  // namespace

IntLengths narrow_lengths(const Problem& problem, const DeviceTensors& tensors, void* workspace) {
  int* out = static_cast<int*>(workspace);
  IntLengths lengths;
  lengths.seqlens_q = narrow(problem.seqlens_q.empty() ? nullptr : tensors.seqlens_q,
                             problem.seqlens_q.size(), out, tensors.stream);
  out += problem.seqlens_q.size();
  lengths.seqlens_k = narrow(problem.seqlens_k.empty() ? nullptr : tensors.seqlens_k,
                             problem.seqlens_k.size(), out, tensors.stream);
  out += problem.seqlens_k.size();
  lengths.cu_seqlens_q = narrow(problem.packed() ? tensors.cu_seqlens_q : nullptr,
                                problem.cu_seqlens_q.size(), out, tensors.stream);
  out += problem.cu_seqlens_q.size();
  lengths.cu_seqlens_k = narrow(problem.packed() ? tensors.cu_seqlens_k : nullptr,
                                problem.cu_seqlens_k.size(), out, tensors.stream);
  return lengths;
}

}  // namespace flashlab::cuda::FLASHLAB_CUDA_TARGET
