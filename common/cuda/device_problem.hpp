// A problem's tensors in device memory: what the registry adapter hands to an implementation's device entry.
// Host tensors are float32; on the device Q, K, V and O are in the problem's storage format
// (common/cuda/storage.hpp), converted here, once for every stage. One build per target
// (common/cuda/target.hpp): GPU memory, or the emulator's device memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/cuda/device_buffer.hpp"
#include "common/cuda/storage.hpp"
#include "common/cuda/target.hpp"
#include "common/registry.hpp"
#include "common/tensor.hpp"

namespace flashlab::cuda {
namespace FLASHLAB_CUDA_TARGET {

// A problem's small tensors on the device: the explicit mask, the per-batch lengths, the packed offsets,
// ALiBi's slopes and the bias (each absent where the problem has none). Uploaded at once (cudaMalloc,
// cudaMemcpy), or ordered on a stream: allocated and copied on it, and freed on it when this goes, so that
// nothing waits on the host (run_on_stream(), for tensors that already live on the device).
class ProblemTensors {
 public:
  explicit ProblemTensors(const Problem& problem) : ProblemTensors(problem, nullptr, false) {}
  ProblemTensors(const Problem& problem, cudaStream_t stream) : ProblemTensors(problem, stream, true) {}
  // Points `tensors` at them (nullptr for those the problem has none of).
  void point(const Problem& problem, DeviceTensors& tensors) const;

 private:
  ProblemTensors(const Problem& problem, cudaStream_t stream, bool ordered);
  DeviceBuffer<float> alibi_slopes_, bias_;
  DeviceBuffer<uint8_t> mask_;
  DeviceBuffer<int64_t> seqlens_q_, seqlens_k_, cu_seqlens_q_, cu_seqlens_k_;
};

class DeviceProblem {
 public:
  // Allocates every tensor of `problem`, uploads the inputs (converted), the mask, the per-batch lengths, the
  // paged copy of K and V when the inputs have one, and `workspace_bytes` of scratch. O and LSE are left
  // uninitialized: the implementation writes them.
  DeviceProblem(const Problem& problem, const AttentionInputs& inputs, size_t workspace_bytes);

  const DeviceTensors& tensors() const { return tensors_; }
  // Copies O (converted to float32) and LSE into host outputs of the problem's shapes.
  void download(AttentionOutputs& outputs) const;
  // Uploads a forward's O and LSE (for the backward, which reads them).
  void upload_forward(const AttentionOutputs& outputs);
  // Bytes of Q, K, V, O and LSE on the device (what one copy of the problem occupies).
  size_t tensor_bytes() const { return q_.bytes() + k_.bytes() + v_.bytes() + o_.bytes() + lse_.bytes(); }

 private:
  DType dtype_;
  DeviceBuffer<std::byte> q_, k_, v_, o_, workspace_, k_pages_, v_pages_;
  DeviceBuffer<float> lse_;
  ProblemTensors small_;
  DeviceBuffer<int32_t> block_table_;
  DeviceTensors tensors_;
};

// The backward's own device tensors: dO (uploaded in the storage format) and the gradients to write, beside a
// DeviceProblem that holds the inputs and the forward's O and LSE.
class DeviceGradients {
 public:
  DeviceGradients(const Problem& problem, const HostTensor& d_out);
  // The backward's tensors over `device`'s (which must hold the forward's O and LSE, upload_forward).
  BackwardTensors tensors(const DeviceProblem& device) const;
  // Copies dQ, dK and dV (converted to float32) into host gradients of the problem's shapes.
  void download(AttentionGradients& gradients) const;

 private:
  DType dtype_;
  DeviceBuffer<std::byte> d_out_, dq_, dk_, dv_;
};

}  // namespace FLASHLAB_CUDA_TARGET
using namespace FLASHLAB_CUDA_TARGET;
}  // namespace flashlab::cuda
