// The implementation registry. Every implementation registers once, in its own stage directory, under a
// stable name "stage/variant"; the harness, the tool and the benchmarks iterate the registry, so adding a
// stage needs no change to any of them.
//
//   static const flashlab::Registration one_pass{{
//       .name = "naive/one_pass", .summary = "...", .forward = run_one_pass}};
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/cuda/stream.hpp"
#include "common/problem.hpp"
#include "common/tensor.hpp"

namespace flashlab {

enum class Device { cpu, cuda };
std::string_view to_string(Device device);

// A problem's tensors in GPU memory, for the launchers of GPU implementations (DeviceBuild). Q, K, V and O
// hold elements of the problem's dtype (float for f32, __half for f16, __nv_bfloat16 for bf16) in the
// problem's layout (BSHD or packed); LSE is float32 Problem::lse_shape(). The mask, the per-batch lengths and
// the cumulative lengths are the problem's own, copied to the device; nullptr when the problem has none.
// common/cuda/device_problem.hpp builds one from host inputs, or around tensors already on the device.
struct DeviceTensors {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  const uint8_t* mask = nullptr;          // [seqlen_q, seqlen_k]
  const int64_t* seqlens_q = nullptr;     // [batch]
  const int64_t* seqlens_k = nullptr;     // [batch]
  const int64_t* cu_seqlens_q = nullptr;  // [batch + 1], packed problems only
  const int64_t* cu_seqlens_k = nullptr;
  // The score modification's tensors (common/score_mod.hpp), float, or nullptr: ALiBi's slopes [heads_q],
  // the bias [bias_batch, bias_heads, seqlen_q, seqlen_k].
  const float* alibi_slopes = nullptr;
  const float* bias = nullptr;
  void* workspace = nullptr;  // device_workspace_bytes(problem) bytes, contents undefined
  // The paged KV cache when problem.page_size > 0 (AttentionInputs::paged, common/paged_kv.hpp), else
  // nullptr: K and V pages [pages, page_size, heads_kv, head_dim] in the storage format, and the block table
  // int32 [batch, block_table_stride] (a sequence's physical pages; unused slots hold -1).
  const void* k_pages = nullptr;
  const void* v_pages = nullptr;
  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0;
  // The CUDA stream the launch is enqueued on, after the work that wrote the inputs; nullptr:
  // the default stream.
  cudaStream_t stream = nullptr;
};

// The backward's device tensors (GPU implementations): the forward's, with O and LSE as the forward wrote
// them, dO in the storage format, and the gradients to write (storage format, the shapes of Q, K and V).
struct BackwardTensors {
  DeviceTensors forward;
  const void* d_out = nullptr;  // [batch, seqlen_q, heads_q, head_dim]
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
};

// One build of a GPU implementation's kernels (common/cuda/target.hpp: nvcc's for the GPU, or the same source
// compiled for the CPU emulator): its launchers on device pointers, enqueued on DeviceTensors::stream with no
// copy and no synchronization, and the scratch each needs. Benchmarks time these alone.
struct DeviceBuild {
  std::function<void(const Problem&, const DeviceTensors&)> forward;  // empty: not in this build
  std::function<size_t(const Problem&)> workspace;                    // forward's scratch; empty = none
  // A forward made of a pre-pass and a main kernel (cuda_v3_hopper/fp8): the main kernel alone, on a
  // workspace that `forward` has prepared for the same problem and tensors. Empty: the forward has no such
  // part. Benchmarks time it beside the whole forward (FA3 reports its FP8 kernel so).
  std::function<void(const Problem&, const DeviceTensors&)> forward_main;
  std::function<void(const Problem&, const BackwardTensors&)> backward;  // empty: no backward
  std::function<size_t(const Problem&)> backward_workspace;              // empty = none
};

struct Implementation {
  std::string name;     // "stage/variant", e.g. "naive/three_pass"
  std::string summary;  // the one idea, in one line
  Device device = Device::cpu;
  std::vector<DType> dtypes{DType::f32};
  std::string constraints = "any shape, every mask";  // what it accepts, for `flashlab list`
  // True when the kernel rounds P to its dtype before the P V product (tensor cores): the tolerance baseline
  // then rounds P the same way.
  bool rounds_p = false;
  // True when its passes apply the score modifications (soft-capping, ALiBi; common/score_mod.hpp); a problem
  // with one is refused by name otherwise.
  bool score_mods = false;
  // True when its passes apply dropout (common/dropout.hpp); refused by name otherwise.
  bool dropout = false;
  // True when it takes packed variable-length batches (Problem::cu_seqlens_q/k): it reaches elements through
  // the problem's offsets and visits only the stored rows. Refused by name otherwise.
  bool packed = false;
  // False when it takes causal, window and padding but not an explicit mask (Problem::mask): refused by
  // name. The cores (one per stage: the paper's algorithm for the plain case) set it false.
  bool explicit_mask = true;

  // "" when the implementation can run on this machine, else why not (no GPU, built without CUDA, ...).
  std::function<std::string()> availability;
  // "" when it supports the (valid) problem, else the reason, naming the field: "head_dim (80) must be 64 or
  // 128".
  std::function<std::string(const Problem&)> supports;
  // Computes O and LSE. Inputs are host float32 BSHD tensors; outputs arrive poisoned (NaN) and must be
  // written entirely. GPU implementations copy to and from the device here (benchmarks time device pointers
  // separately).
  std::function<void(const Problem&, const AttentionInputs&, AttentionOutputs&)> forward;

  // The memory-traffic model: bytes this implementation moves to and from main memory (HBM on a GPU) for a
  // problem, e.g. materialized stages write and read S and P, tiled stages re-read K/V once per Q tile. Empty
  // = unknown.
  std::function<double(const Problem&)> bytes_moved;

  // GPU implementations only: the two builds of the kernels on device pointers. GPU stages set them with
  // gpu_implementation() (common/cuda/gpu_stage.hpp), which also derives `forward`, `availability` and
  // `emulation` from them. gpu_build is empty in a build without CUDA; both are empty for CPU
  // implementations.
  DeviceBuild gpu_build;
  DeviceBuild emulated_build;
  // GPU implementations only: "" when `forward` runs on a GPU here, else why it runs in the CPU emulator of
  // the CUDA execution model instead ("no CUDA device: ...", "emulation requested (--emulate)"). Empty for
  // CPU implementations.
  std::function<std::string()> emulation;

  // Optional backward pass: dQ, dK, dV from the inputs, the forward's O and LSE, and dO. Outputs arrive
  // poisoned.
  std::function<std::string(const Problem&)> supports_backward;  // "" when supported
  std::function<void(const Problem&, const AttentionInputs&, const AttentionOutputs& forward,
                     const HostTensor& d_out, AttentionGradients& gradients)>
      backward;
};

// Adds an implementation at static-initialization time; a duplicate name aborts the program with a message.
struct Registration {
  explicit Registration(Implementation implementation);
};

// In a course handout (`./flashlab exercise handout`), the stages whose exercise regions still hold their
// skeletons, each with those exercises' ids ("one-pass, online-softmax"); none in any other tree. Generated
// by the build (cmake/handout.cmake). Their implementations register as unavailable: "exercise not done".
struct UnfinishedStage {
  const char* stage;
  const char* exercises;
};
std::span<const UnfinishedStage> unfinished_stages();

// Every registered implementation, sorted by name.
const std::vector<Implementation>& implementations();
// nullptr when no implementation has that name.
const Implementation* find_implementation(std::string_view name);

// The build a GPU implementation runs in here: the emulator's when impl.emulation() gives a reason (no GPU
// that can run it, or emulation asked for), else the GPU's. Every caller that launches on device pointers
// (benchmarks, the registry's adapter) picks the build through this.
const DeviceBuild& device_build(const Implementation& impl);

// "" when `impl` can run on this machine, else why not (its `availability`).
std::string unavailable_reason(const Implementation& impl);
// "" when `impl` runs natively here (on the CPU, or on a GPU), else why it runs in the CPU emulator (its
// `emulation`).
std::string emulation_reason(const Implementation& impl);

// Whether `impl` takes inputs and outputs of this dtype.
bool offers(const Implementation& impl, DType dtype);

// "" when `impl` can run `problem` here; else the first reason it cannot: unavailable, dtype not offered,
// or refused by supports(). The problem must already be valid.
std::string why_cannot_run(const Implementation& impl, const Problem& problem);

// Validates, poisons the outputs, runs. Throws Error when the implementation cannot run the problem.
AttentionOutputs run_forward(const Implementation& impl, const Problem& problem,
                             const AttentionInputs& inputs);

// As why_cannot_run, for the backward pass: also "" only when the implementation provides `backward` and its
// supports_backward() accepts the problem.
std::string why_cannot_run_backward(const Implementation& impl, const Problem& problem);

// Throws Error("IMPL cannot run this problem[ backward]: why") when why_cannot_run (why_cannot_run_backward
// with `backward`) gives a reason: the one wording of that refusal for the tool, the module and run_*().
void require_can_run(const Implementation& impl, const Problem& problem, bool backward = false);

// Validates, poisons the gradients, runs the backward from the implementation's own forward outputs (O, LSE)
// and dO [batch, seqlen_q, heads_q, head_dim]. Throws Error when it cannot run the problem or dO has the
// wrong shape.
AttentionGradients run_backward(const Implementation& impl, const Problem& problem,
                                const AttentionInputs& inputs, const AttentionOutputs& forward,
                                const HostTensor& d_out);

}  // namespace flashlab
