// The compiled half of the Python module `flashlab` (python/flashlab/__init__.py is the other): the registry,
// and any implementation's forward and backward on host arrays (NumPy, PyTorch CPU tensors, anything that
// speaks DLPack), through nanobind's ndarray; and the GPU stages on tensors in GPU memory (PyTorch CUDA
// tensors), in place, enqueued on the caller's stream. Problems are built by the tool's own option parser
// (tools/args.cpp), from the keyword arguments turned into its flags, so every option means what it means on
// the command line and every mistake raises ValueError with the tool's message, naming the field.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/cuda/device.hpp"
#include "common/cuda/gpu_stage.hpp"
#include "common/cuda/storage.hpp"
#include "common/error.hpp"
#include "common/number_format.hpp"
#include "common/paged_kv.hpp"
#include "common/registry.hpp"
#include "tools/args.hpp"

namespace nb = nanobind;

namespace flashlab::python {
namespace {

using Array = nb::ndarray<nb::ro>;  // any dtype, shape, strides and device; checked by read_array()
using Output = nb::ndarray<>;       // the same, written: a CUDA call's outputs (device_data())

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

template <typename Tensor>
std::vector<int64_t> shape_of(const Tensor& array) {
  std::vector<int64_t> shape(array.ndim());
  for (size_t i = 0; i < array.ndim(); ++i) shape[i] = static_cast<int64_t>(array.shape(i));
  return shape;
}

// Checks that the array is on the host in a dtype read here, refusing it by `name` otherwise: float16,
// bfloat16, float32 or float64, and bool where `bool_too` (a mask or a bias, whose dtype rule is the tool's:
// cli::attach_mask, cli::attach_bias).
void check_array(const Array& array, const std::string& name, bool bool_too = false) {
  if (array.device_type() != nb::device::cpu::value)
    fail(name, ": the array is not in host memory (this module runs on host arrays; move it with .cpu())");
  const nb::dlpack::dtype type = array.dtype();
  const auto code = static_cast<nb::dlpack::dtype_code>(type.code);
  const bool known =
      type.lanes == 1 &&
      ((code == nb::dlpack::dtype_code::Float && (type.bits == 16 || type.bits == 32 || type.bits == 64)) ||
       (code == nb::dlpack::dtype_code::Bfloat && type.bits == 16) ||
       (bool_too && code == nb::dlpack::dtype_code::Bool && type.bits == 8));
  if (!known) {
    static const char* const kinds[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
    const std::string kind = type.code < 7 ? kinds[type.code] : "code " + std::to_string(type.code);
    fail(name, ": dtype ", kind, int{type.bits}, type.lanes == 1 ? "" : " in vectors",
         " is not supported (float16, bfloat16, float32 or float64", bool_too ? "; bool for a mask)" : ")");
  }
}

// The array's dtype as .npy names it ("<f4", "|b1", ...; "bfloat16"), for the checks it shares with the
// tool's files (cli::attach_mask, cli::attach_bias).
std::string npy_dtype(const Array& array) {
  const nb::dlpack::dtype type = array.dtype();
  if (type.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bool)) return "|b1";
  if (type.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat)) return "bfloat16";
  return "<f" + std::to_string(type.bits / 8);
}

// Whether the array's elements lie in C order without gaps (extents of 1 take any stride).
template <typename Tensor>
bool c_contiguous(const Tensor& array) {
  for (size_t d = array.ndim(), expected = 1; d-- > 0; expected *= array.shape(d))
    if (array.shape(d) != 1 && array.stride(d) != static_cast<int64_t>(expected)) return false;
  return true;
}

// Writes the array's elements in C order to `out` (float for the inputs, double for a mask or bias), whatever
// its strides and dtype (check_array() first); a C-contiguous array of `Out` itself is one copy.
template <typename Out>
void read_array(const Array& array, Out* out) {
  const nb::dlpack::dtype type = array.dtype();
  const auto code = static_cast<nb::dlpack::dtype_code>(type.code);
  const size_t count = array.size(), rank = array.ndim(), bytes = type.bits / 8;
  if (count == 0) return;
  if (c_contiguous(array) && code == nb::dlpack::dtype_code::Float && bytes == sizeof(Out)) {
    std::memcpy(out, array.data(), count * sizeof(Out));
    return;
  }
  std::vector<size_t> index(rank, 0);
  const auto* base = static_cast<const uint8_t*>(array.data());
  for (size_t n = 0; n < count; ++n) {
    int64_t offset = 0;  // in elements
    for (size_t d = 0; d < rank; ++d) offset += static_cast<int64_t>(index[d]) * array.stride(d);
    const uint8_t* element = base + offset * static_cast<int64_t>(bytes);
    if (code == nb::dlpack::dtype_code::Bool) {
      out[n] = *element != 0;
    } else if (bytes == 2) {
      uint16_t bits;
      std::memcpy(&bits, element, 2);
      out[n] =
          static_cast<Out>(code == nb::dlpack::dtype_code::Bfloat ? decode_bf16(bits) : decode_fp16(bits));
    } else if (bytes == 4) {
      float x;
      std::memcpy(&x, element, 4);
      out[n] = static_cast<Out>(x);
    } else {
      double x;
      std::memcpy(&x, element, 8);
      out[n] = static_cast<Out>(x);
    }
    for (size_t d = rank; d-- > 0;) {  // the next index in C order
      if (++index[d] < array.shape(d)) break;
      index[d] = 0;
    }
  }
}

// `array` into `tensor`, whose shape the problem fixed (`layout` names it in the message).
void load(const Array& array, const std::string& name, HostTensor& tensor, const char* layout) {
  if (shape_of(array) != tensor.shape)
    fail(name, ": shape ", shape_text(shape_of(array)), " does not match ", layout, " = ",
         shape_text(tensor.shape));
  check_array(array, name);
  read_array(array, tensor.ptr());
}

NpyArray as_npy(const Array& array, const std::string& name) {
  check_array(array, name, true);
  NpyArray result{shape_of(array), std::vector<double>(array.size()), npy_dtype(array)};
  read_array(array, result.values.data());
  return result;
}

nb::ndarray<nb::numpy, float> to_numpy(HostTensor&& tensor) {
  auto* owned = new HostTensor(std::move(tensor));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<HostTensor*>(p); });
  std::vector<size_t> shape(owned->shape.begin(), owned->shape.end());
  return nb::ndarray<nb::numpy, float>(owned->ptr(), shape.size(), shape.data(), owner);
}

// A call's problem: the shapes from q and k (4-D, or 3-D with cu_seqlens_q: packed), the options from `flags`
// (the keyword arguments as the tool's flags, python/flashlab/__init__.py), mask and bias from host arrays.
Problem problem_of(const Array& q, const Array& k, std::vector<std::string> flags, const nb::object& mask,
                   const nb::object& bias) {
  const bool packed = std::find(flags.begin(), flags.end(), "--cu-seqlens-q") != flags.end();
  const size_t rank = packed ? 3 : 4;
  if (q.ndim() != rank)
    fail("q: must be ",
         packed ? "3-D [total_q, heads, head_dim] (packed)" : "4-D [batch, seqlen_q, heads, head_dim]",
         ", got shape ", shape_text(shape_of(q)));
  if (k.ndim() != rank)
    fail("k: must be ",
         packed ? "3-D [total_k, kv_heads, head_dim] (packed)" : "4-D [batch, seqlen_k, kv_heads, head_dim]",
         ", got shape ", shape_text(shape_of(k)));
  const auto size = [](size_t extent) { return std::to_string(extent); };
  flags.insert(flags.end(), {"--heads", size(q.shape(rank - 2)), "--head-dim", size(q.shape(rank - 1)),
                             "--kv-heads", size(k.shape(rank - 2))});
  if (!packed)
    flags.insert(flags.end(), {"--batch", size(q.shape(0)), "--seqlen-q", size(q.shape(1)), "--seqlen-k",
                               size(k.shape(1))});
  const cli::Args args(flags, cli::problem_flags(), cli::problem_switches());
  Problem p = cli::problem_from_args(args, false).problem;
  if (!mask.is_none()) cli::attach_mask(p, as_npy(nb::cast<Array>(mask), "mask"), "mask");
  if (!bias.is_none()) cli::attach_bias(p, as_npy(nb::cast<Array>(bias), "bias"), "bias");
  p.validate();
  if (packed && q.shape(0) != static_cast<size_t>(p.cu_seqlens_q.back()))
    fail("q: holds ", q.shape(0), " tokens but cu_seqlens_q ends at ", p.cu_seqlens_q.back());
  if (packed && k.shape(0) != static_cast<size_t>(p.cu_seqlens_k.back()))
    fail("k: holds ", k.shape(0), " tokens but cu_seqlens_k ends at ", p.cu_seqlens_k.back());
  return p;
}

const char* q_layout(const Problem& p) {
  return p.packed() ? "[total_q, heads, head_dim]" : "[batch, seqlen_q, heads, head_dim]";
}
const char* kv_layout(const Problem& p) {
  return p.packed() ? "[total_k, kv_heads, head_dim]" : "[batch, seqlen_k, kv_heads, head_dim]";
}
const char* lse_layout(const Problem& p) {
  return p.packed() ? "[heads, total_q]" : "[batch, heads, seqlen_q]";
}

// A call on host arrays: its problem and inputs.
struct Call {
  Problem problem;
  AttentionInputs inputs;
};

Call prepare(const Array& q, const Array& k, const Array& v, const std::vector<std::string>& flags,
             const nb::object& mask, const nb::object& bias) {
  Call call{problem_of(q, k, flags, mask, bias), {}};
  Problem& p = call.problem;
  call.inputs = empty_inputs(p);
  load(q, "q", call.inputs.q, q_layout(p));
  load(k, "k", call.inputs.k, kv_layout(p));
  load(v, "v", call.inputs.v, kv_layout(p));
  attach_paged_kv(p, call.inputs);  // page_size=P: K and V also stored in pages behind a shuffled block table
  return call;
}

const Implementation& named(const std::string& name) {
  const Implementation* impl = find_implementation(name);
  if (impl == nullptr)
    fail("impl: unknown implementation '", name, "' (flashlab.implementations() lists them)");
  return *impl;
}

// One run at a time: `emulate` is process-wide state (common/cuda/device.hpp), and a run already uses every
// core. The GIL is released while it runs, so other Python threads go on.
std::mutex runs;

// Runs `body` without the GIL, with the emulation forced when `emulate`, and puts it back as it was.
template <typename Body>
void run(bool emulate, Body&& body) {
  nb::gil_scoped_release unlocked;
  const std::lock_guard<std::mutex> one_at_a_time(runs);
  const bool before = cuda::emulation_forced();
  cuda::force_emulation(before || emulate);
  try {
    body();
  } catch (...) {
    cuda::force_emulation(before);
    throw;
  }
  cuda::force_emulation(before);
}

nb::tuple attention(const Array& q, const Array& k, const Array& v, const std::string& impl_name,
                    const std::vector<std::string>& flags, const nb::object& mask, const nb::object& bias,
                    bool emulate) {
  const Implementation& impl = named(impl_name);
  Call call = prepare(q, k, v, flags, mask, bias);
  require_can_run(impl, call.problem);
  AttentionOutputs out;
  run(emulate, [&] { out = run_forward(impl, call.problem, call.inputs); });
  return nb::make_tuple(to_numpy(std::move(out.o)), to_numpy(std::move(out.lse)));
}

nb::tuple attention_backward(const Array& q, const Array& k, const Array& v, const Array& o, const Array& lse,
                             const Array& d_out, const std::string& impl_name,
                             const std::vector<std::string>& flags, const nb::object& mask,
                             const nb::object& bias, bool emulate) {
  const Implementation& impl = named(impl_name);
  Call call = prepare(q, k, v, flags, mask, bias);
  const Problem& p = call.problem;
  require_can_run(impl, p, true);
  AttentionOutputs forward{HostTensor(p.q_shape()), HostTensor(p.lse_shape())};
  HostTensor d_o(p.q_shape());
  load(o, "o", forward.o, q_layout(p));
  load(lse, "lse", forward.lse, lse_layout(p));
  load(d_out, "do", d_o, q_layout(p));
  AttentionGradients gradients;
  run(emulate, [&] { gradients = run_backward(impl, p, call.inputs, forward, d_o); });
  return nb::make_tuple(to_numpy(std::move(gradients.dq)), to_numpy(std::move(gradients.dk)),
                        to_numpy(std::move(gradients.dv)));
}

// ---- Tensors in GPU memory (PyTorch CUDA tensors): the GPU stages in place, on the caller's stream.

const char* storage_name(DType stored) {
  return stored == DType::bf16 ? "bfloat16" : stored == DType::f16 ? "float16" : "float32";
}

// `array`'s device pointer (const for an Array, writable for an Output), refusing it by `name` unless it lies
// in the memory of GPU `device`, has `shape` (`layout` names it) and is C-contiguous in `stored`
// (common/cuda/storage.hpp: the format the stage keeps its tensors in; float32 for the LSE).
template <typename Tensor>
auto device_data(const Tensor& array, const std::string& name, const std::vector<int64_t>& shape,
                 const char* layout, DType stored, int device) {
  if (array.device_type() != nb::device::cuda::value)
    fail(name, ": not in GPU memory, and q is (a call's tensors share one device)");
  if (array.device_id() != device) fail(name, ": on cuda:", array.device_id(), ", and q on cuda:", device);
  if (shape_of(array) != shape)
    fail(name, ": shape ", shape_text(shape_of(array)), " does not match ", layout, " = ", shape_text(shape));
  const nb::dlpack::dtype type = array.dtype();
  const auto code = static_cast<nb::dlpack::dtype_code>(type.code);
  const bool bf16 = stored == DType::bf16;
  if (type.lanes != 1 || type.bits != cuda::storage_bytes(stored) * 8 ||
      code != (bf16 ? nb::dlpack::dtype_code::Bfloat : nb::dlpack::dtype_code::Float))
    fail(name, ": must be ", storage_name(stored), " (what the stage keeps in GPU memory for this dtype)");
  if (!c_contiguous(array)) fail(name, ": not contiguous (.contiguous() gives a copy that is)");
  return array.data();
}

// A call on CUDA tensors, checked before anything runs: its problem, the GPU build that runs it, and what the
// caller allocates beside the outputs (the LSE's shape, the workspace's bytes): the forward's or, with
// `backward`, the backward's.
struct CudaCall {
  Problem problem;
  const DeviceBuild* build = nullptr;
  size_t workspace_bytes = 0;
};

CudaCall plan(const Array& q, const Array& k, const std::string& impl_name,
              const std::vector<std::string>& flags, const nb::object& mask, const nb::object& bias,
              bool backward) {
  const Implementation& impl = named(impl_name);
  if (impl.device != Device::cuda)  // before the problem's checks: the dtype rule is the GPU stages'
    fail("impl: ", impl.name, " runs on the host; pass host tensors (.cpu()) or choose a GPU stage");
  CudaCall call{problem_of(q, k, flags, mask, bias)};
  const Problem& p = call.problem;
  require_can_run(impl, p, backward);
  if (const std::string why = emulation_reason(impl); !why.empty())
    fail("impl: ", impl.name, " cannot run on a GPU here (", why, "), and CUDA tensors need its GPU build");
  if (p.page_size > 0) fail("page_size: a paged KV cache is built from host arrays; pass host tensors");
  call.build = &impl.gpu_build;
  const auto& bytes = backward ? call.build->backward_workspace : call.build->workspace;
  call.workspace_bytes = bytes ? bytes(p) : 0;
  return call;
}

nb::tuple cuda_plan(const Array& q, const Array& k, const std::string& impl_name,
                    const std::vector<std::string>& flags, const nb::object& mask, const nb::object& bias,
                    bool backward) {
  const CudaCall call = plan(q, k, impl_name, flags, mask, bias, backward);
  return nb::make_tuple(call.problem.lse_shape(), call.workspace_bytes);
}

// A call's device tensors from the arrays: q, k, v, O and LSE (written by a forward, read by a backward), the
// workspace (at least the planned bytes of uint8) and the stream (a cudaStream_t as an integer), each checked
// against the problem.
template <typename Outputs>
DeviceTensors device_tensors(const CudaCall& call, const Array& q, const Array& k, const Array& v,
                             const Outputs& o, const Outputs& lse, const Output& workspace,
                             uintptr_t stream) {
  const Problem& p = call.problem;
  const DType stored = cuda::storage_dtype(p.dtype);
  const int device = q.device_id();
  DeviceTensors t;
  t.q = device_data(q, "q", p.q_shape(), q_layout(p), stored, device);
  t.k = device_data(k, "k", p.kv_shape(), kv_layout(p), stored, device);
  t.v = device_data(v, "v", p.kv_shape(), kv_layout(p), stored, device);
  // The backward reads O and LSE through the same (writable) fields the forward writes them through.
  t.o = const_cast<void*>(
      static_cast<const void*>(device_data(o, "o", p.q_shape(), q_layout(p), stored, device)));
  t.lse = static_cast<float*>(const_cast<void*>(
      static_cast<const void*>(device_data(lse, "lse", p.lse_shape(), lse_layout(p), DType::f32, device))));
  const nb::dlpack::dtype type = workspace.dtype();
  if (workspace.device_type() != nb::device::cuda::value || workspace.device_id() != device ||
      workspace.ndim() != 1 || type.code != static_cast<uint8_t>(nb::dlpack::dtype_code::UInt) ||
      type.bits != 8 || !c_contiguous(workspace) || workspace.size() < call.workspace_bytes)
    fail("workspace: must be ", call.workspace_bytes, " contiguous uint8 bytes on q's GPU (cuda_plan)");
  t.workspace = call.workspace_bytes > 0 ? workspace.data() : nullptr;
  t.stream = reinterpret_cast<cudaStream_t>(stream);
  return t;
}

// Runs `body`, which enqueues work on the GPU, without the GIL (one run at a time, like run()).
template <typename Body>
void enqueue(Body&& body) {
  nb::gil_scoped_release unlocked;
  const std::lock_guard<std::mutex> one_at_a_time(runs);
  body();
}

void attention_cuda(const Array& q, const Array& k, const Array& v, const Output& o, const Output& lse,
                    const Output& workspace, uintptr_t stream, const std::string& impl_name,
                    const std::vector<std::string>& flags, const nb::object& mask, const nb::object& bias) {
  const CudaCall call = plan(q, k, impl_name, flags, mask, bias, false);
  const DeviceTensors tensors = device_tensors(call, q, k, v, o, lse, workspace, stream);
#if FLASHLAB_LINKS_GPU_BUILDS
  enqueue([&] {
    cuda::gpu::run_on_stream(call.problem, q.device_id(), tensors,
                             [&](const DeviceTensors& t) { call.build->forward(call.problem, t); });
  });
#else
  (void)tensors;  // plan() refused it: no GPU build to run
#endif
}

void attention_backward_cuda(const Array& q, const Array& k, const Array& v, const Array& o, const Array& lse,
                             const Array& d_out, const Output& dq, const Output& dk, const Output& dv,
                             const Output& workspace, uintptr_t stream, const std::string& impl_name,
                             const std::vector<std::string>& flags, const nb::object& mask,
                             const nb::object& bias) {
  const CudaCall call = plan(q, k, impl_name, flags, mask, bias, true);
  const Problem& p = call.problem;
  const DType stored = cuda::storage_dtype(p.dtype);
  const int device = q.device_id();
  BackwardTensors tensors;
  tensors.forward = device_tensors(call, q, k, v, o, lse, workspace, stream);
  tensors.d_out = device_data(d_out, "do", p.q_shape(), q_layout(p), stored, device);
  tensors.dq = device_data(dq, "dq", p.q_shape(), q_layout(p), stored, device);
  tensors.dk = device_data(dk, "dk", p.kv_shape(), kv_layout(p), stored, device);
  tensors.dv = device_data(dv, "dv", p.kv_shape(), kv_layout(p), stored, device);
#if FLASHLAB_LINKS_GPU_BUILDS
  enqueue([&] {
    cuda::gpu::run_backward_on_stream(p, device, tensors,
                                      [&](const BackwardTensors& t) { call.build->backward(p, t); });
  });
#else
  (void)tensors;
#endif
}

// What `flashlab list --json` says of each implementation (tools/commands_basic.cpp), as dicts.
nb::list implementations_here() {
  nb::list result;
  for (const Implementation& impl : implementations()) {
    const std::string reason = unavailable_reason(impl), emulation = emulation_reason(impl);
    nb::list dtypes;
    for (DType dtype : impl.dtypes) dtypes.append(std::string(to_string(dtype)));
    nb::dict entry;
    entry["name"] = impl.name;
    entry["device"] = std::string(to_string(impl.device));
    entry["dtypes"] = dtypes;
    entry["summary"] = impl.summary;
    entry["constraints"] = impl.constraints;
    entry["available"] = reason.empty();
    entry["reason"] = reason;
    entry["emulated"] = reason.empty() && !emulation.empty();
    entry["emulation_reason"] = emulation;
    entry["backward"] = bool(impl.backward);
    result.append(entry);
  }
  return result;
}

}  // namespace
}  // namespace flashlab::python

NB_MODULE(_flashlab, m) {
  using namespace flashlab::python;
  m.doc() = "flashlab's compiled core; use the package `flashlab` (python/flashlab/__init__.py)";
  // A mistake in the input (flashlab::Error, the tool's exit code 2) is a ValueError with the tool's message;
  // an implementation that failed as it ran (flashlab::ExecutionError, exit code 1: a kernel's fault, or what
  // the emulator found wrong in one), a RuntimeError; a problem too large for the GPU's memory
  // (flashlab::DeviceMemoryError), a MemoryError, as one too large for the host's memory is (std::bad_alloc).
  nb::register_exception_translator([](const std::exception_ptr& error, void*) {
    try {
      std::rethrow_exception(error);
    } catch (const flashlab::ExecutionError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (const flashlab::DeviceMemoryError& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    } catch (const flashlab::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  m.def("implementations", &implementations_here);
  m.def("attention", &attention, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("impl"), nb::arg("flags"),
        nb::arg("mask").none(), nb::arg("bias").none(), nb::arg("emulate"));
  m.def("cuda_plan", &cuda_plan, nb::arg("q"), nb::arg("k"), nb::arg("impl"), nb::arg("flags"),
        nb::arg("mask").none(), nb::arg("bias").none(), nb::arg("backward"));
  m.def("attention_cuda", &attention_cuda, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"),
        nb::arg("lse"), nb::arg("workspace"), nb::arg("stream"), nb::arg("impl"), nb::arg("flags"),
        nb::arg("mask").none(), nb::arg("bias").none());
  m.def("attention_backward_cuda", &attention_backward_cuda, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("o"), nb::arg("lse"), nb::arg("do"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"),
        nb::arg("workspace"), nb::arg("stream"), nb::arg("impl"), nb::arg("flags"), nb::arg("mask").none(),
        nb::arg("bias").none());
  m.def("attention_backward", &attention_backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"),
        nb::arg("lse"), nb::arg("do"), nb::arg("impl"), nb::arg("flags"), nb::arg("mask").none(),
        nb::arg("bias").none(), nb::arg("emulate"));
  // The tool's problem flags: (those that take a value, the switches).
  m.def("problem_flags", [] {
    const auto valued = flashlab::cli::problem_flags(), switches = flashlab::cli::problem_switches();
    return nb::make_tuple(std::vector<std::string>(valued.begin(), valued.end()),
                          std::vector<std::string>(switches.begin(), switches.end()));
  });
}
