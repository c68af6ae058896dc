#include "common/cuda/device_problem.hpp"

#include <algorithm>
#include <functional>
#include <utility>

#include "common/cuda/gpu_stage.hpp"
#include "common/error.hpp"
#include "common/paged_kv.hpp"

namespace flashlab::cuda::FLASHLAB_CUDA_TARGET {

namespace {

// Uploads host floats in the storage format of `dtype`.
DeviceBuffer<std::byte> upload(DType dtype, const float* values, size_t count) {
  const std::vector<std::byte> stored = to_storage(dtype, values, count);
  DeviceBuffer<std::byte> buffer(stored.size());
  if (!stored.empty()) buffer.copy_from_host(stored.data());
  return buffer;
}

// The block table as a dense int32 [batch, stride] matrix, -1 where a sequence has fewer pages.
std::vector<int32_t> dense_block_table(const PagedKV& paged, int64_t stride) {
  std::vector<int32_t> table(paged.block_table.size() * static_cast<size_t>(stride), -1);
  for (size_t b = 0; b < paged.block_table.size(); ++b)
    for (size_t n = 0; n < paged.block_table[b].size(); ++n)
      table[b * static_cast<size_t>(stride) + n] = static_cast<int32_t>(paged.block_table[b][n]);
  return table;
}

}  // namespace

ProblemTensors::ProblemTensors(const Problem& problem, cudaStream_t stream, bool ordered) {
  const auto up = [stream, ordered](const auto& host) {
    return ordered ? upload(host, stream) : upload(host);
  };
  seqlens_q_ = up(problem.seqlens_q);
  seqlens_k_ = up(problem.seqlens_k);
  cu_seqlens_q_ = up(problem.cu_seqlens_q);
  cu_seqlens_k_ = up(problem.cu_seqlens_k);
  if (problem.mask) mask_ = up(*problem.mask);
  if (!problem.alibi_slopes.empty()) alibi_slopes_ = up(problem.alibi_slopes);
  if (problem.bias) bias_ = up(*problem.bias);
}

void ProblemTensors::point(const Problem& problem, DeviceTensors& tensors) const {
  tensors.mask = problem.mask ? mask_.get() : nullptr;
  tensors.alibi_slopes = problem.alibi_slopes.empty() ? nullptr : alibi_slopes_.get();
  tensors.bias = problem.bias ? bias_.get() : nullptr;
  tensors.seqlens_q = problem.seqlens_q.empty() ? nullptr : seqlens_q_.get();
  tensors.seqlens_k = problem.seqlens_k.empty() ? nullptr : seqlens_k_.get();
  tensors.cu_seqlens_q = problem.packed() ? cu_seqlens_q_.get() : nullptr;
  tensors.cu_seqlens_k = problem.packed() ? cu_seqlens_k_.get() : nullptr;
}

DeviceProblem::DeviceProblem(const Problem& problem, const AttentionInputs& inputs, size_t workspace_bytes)
    : dtype_(problem.dtype),
      q_(upload(problem.dtype, inputs.q.ptr(), inputs.q.data.size())),
      k_(upload(problem.dtype, inputs.k.ptr(), inputs.k.data.size())),
      v_(upload(problem.dtype, inputs.v.ptr(), inputs.v.data.size())),
      o_(static_cast<size_t>(problem.q_elements()) * storage_bytes(problem.dtype)),
      workspace_(workspace_bytes),
      lse_(static_cast<size_t>(problem.lse_elements())),
      small_(problem) {
  if (inputs.q.size() != problem.q_elements() || inputs.k.size() != problem.kv_elements() ||
      inputs.v.size() != problem.kv_elements())
    fail("inputs do not match the problem's shapes (", problem.describe(), ")");
  tensors_.q = q_.get();
  tensors_.k = k_.get();
  tensors_.v = v_.get();
  tensors_.o = o_.get();
  tensors_.lse = lse_.get();
  small_.point(problem, tensors_);
  tensors_.workspace = workspace_.get();
  if (inputs.paged) {
    const PagedKV& paged = *inputs.paged;
    k_pages_ = upload(problem.dtype, paged.k_pages.data(), paged.k_pages.size());
    v_pages_ = upload(problem.dtype, paged.v_pages.data(), paged.v_pages.size());
    // Every row covers seqlen_k, as kernels that read a whole row's pages expect (unused slots hold -1).
    int64_t stride = std::max<int64_t>(1, (problem.seqlen_k + paged.page_size - 1) / paged.page_size);
    for (const auto& pages : paged.block_table) stride = std::max(stride, static_cast<int64_t>(pages.size()));
    block_table_ = upload(dense_block_table(paged, stride));
    tensors_.k_pages = k_pages_.get();
    tensors_.v_pages = v_pages_.get();
    tensors_.block_table = block_table_.get();
    tensors_.block_table_stride = stride;
  }
}

void DeviceProblem::download(AttentionOutputs& outputs) const {
  if (static_cast<size_t>(outputs.o.size()) * storage_bytes(dtype_) != o_.bytes() ||
      static_cast<size_t>(outputs.lse.size()) != lse_.size())
    fail("outputs do not match the problem's shapes");
  std::vector<std::byte> stored(o_.bytes());
  if (!stored.empty()) o_.copy_to_host(stored.data());
  from_storage(dtype_, stored.data(), outputs.o.data.size(), outputs.o.ptr());
  if (lse_.size() > 0) lse_.copy_to_host(outputs.lse.ptr());
}

void DeviceProblem::upload_forward(const AttentionOutputs& outputs) {
  if (static_cast<size_t>(outputs.o.size()) * storage_bytes(dtype_) != o_.bytes() ||
      static_cast<size_t>(outputs.lse.size()) != lse_.size())
    fail("the forward's outputs do not match the problem's shapes");
  const std::vector<std::byte> stored = to_storage(dtype_, outputs.o.ptr(), outputs.o.data.size());
  if (!stored.empty()) o_.copy_from_host(stored.data());
  if (lse_.size() > 0) lse_.copy_from_host(outputs.lse.ptr());
}

DeviceGradients::DeviceGradients(const Problem& problem, const HostTensor& d_out)
    : dtype_(problem.dtype),
      d_out_(upload(problem.dtype, d_out.ptr(), d_out.data.size())),
      dq_(static_cast<size_t>(problem.q_elements()) * storage_bytes(problem.dtype)),
      dk_(static_cast<size_t>(problem.kv_elements()) * storage_bytes(problem.dtype)),
      dv_(static_cast<size_t>(problem.kv_elements()) * storage_bytes(problem.dtype)) {
  if (d_out.size() != problem.q_elements())
    fail("dO does not match the problem's shapes (", problem.describe(), ")");
}

BackwardTensors DeviceGradients::tensors(const DeviceProblem& device) const {
  BackwardTensors tensors;
  tensors.forward = device.tensors();
  tensors.d_out = d_out_.get();
  tensors.dq = dq_.get();
  tensors.dk = dk_.get();
  tensors.dv = dv_.get();
  return tensors;
}

void DeviceGradients::download(AttentionGradients& gradients) const {
  for (const auto& [buffer, tensor] :
       {std::pair{&dq_, &gradients.dq}, {&dk_, &gradients.dk}, {&dv_, &gradients.dv}}) {
    if (static_cast<size_t>(tensor->size()) * storage_bytes(dtype_) != buffer->bytes())
      fail("gradients do not match the problem's shapes");
    std::vector<std::byte> stored(buffer->bytes());
    if (!stored.empty()) buffer->copy_to_host(stored.data());
    from_storage(dtype_, stored.data(), tensor->data.size(), tensor->ptr());
  }
}

void run_backward_on_device(const Problem& problem, const AttentionInputs& inputs,
                            const AttentionOutputs& forward, const HostTensor& d_out,
                            AttentionGradients& gradients, size_t workspace_bytes,
                            const std::function<void(const BackwardTensors&)>& launch) {
  DeviceProblem device(problem, inputs, workspace_bytes);
  device.upload_forward(forward);
  const DeviceGradients device_gradients(problem, d_out);
  launch(device_gradients.tensors(device));
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  device_gradients.download(gradients);
}

void run_on_device(const Problem& problem, const AttentionInputs& inputs, AttentionOutputs& outputs,
                   size_t workspace_bytes, const std::function<void(const DeviceTensors&)>& launch) {
  const DeviceProblem device(problem, inputs, workspace_bytes);
  launch(device.tensors());
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());  // a fault inside the kernel surfaces here, checked
  device.download(outputs);
}

namespace {

// Makes `device` the current GPU while it lives, and the previous one current again after.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    FLASHLAB_CUDA_CHECK(cudaGetDevice(&previous_));
    FLASHLAB_CUDA_CHECK(cudaSetDevice(device));
  }
  ~CurrentDevice() { cudaSetDevice(previous_); }  // no throw from a destructor
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

void run_on_stream(const Problem& problem, int device, DeviceTensors tensors,
                   const std::function<void(const DeviceTensors&)>& launch) {
  if (problem.page_size > 0) fail("page_size: a paged KV cache is built from host arrays");
  const CurrentDevice current(device);
  const ProblemTensors small(problem, tensors.stream);  // freed on the stream, after the launch
  small.point(problem, tensors);
  launch(tensors);
}

void run_backward_on_stream(const Problem& problem, int device, BackwardTensors tensors,
                            const std::function<void(const BackwardTensors&)>& launch) {
  run_on_stream(problem, device, tensors.forward, [&](const DeviceTensors& forward) {
    tensors.forward = forward;  // with the small tensors the forward's path uploaded
    launch(tensors);
  });
}

}  // namespace flashlab::cuda::FLASHLAB_CUDA_TARGET
