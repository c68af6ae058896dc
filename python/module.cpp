// The compiled half of the Python module `flashlab` (python/flashlab/__init__.py is the other): the registry,
// and any implementation's forward and backward on host arrays (NumPy, PyTorch CPU tensors, anything that
// speaks DLPack), through nanobind's ndarray. Problems are built by the tool's own option parser
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
#include "common/error.hpp"
#include "common/number_format.hpp"
#include "common/paged_kv.hpp"
#include "common/registry.hpp"
#include "tools/args.hpp"

namespace nb = nanobind;

namespace flashlab::python {
namespace {

using Array = nb::ndarray<nb::ro>;  // any dtype, shape, strides and device; checked by read_array()

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::vector<int64_t> shape_of(const Array& array) {
  std::vector<int64_t> shape(array.ndim());
  for (size_t i = 0; i < array.ndim(); ++i) shape[i] = static_cast<int64_t>(array.shape(i));
  return shape;
}

// Checks that the array is on the host in a dtype read here (float16, bfloat16, float32, float64, or bool for
// a mask), refusing it by `name` otherwise.
void check_array(const Array& array, const std::string& name) {
  if (array.device_type() != nb::device::cpu::value)
    fail(name, ": the array is not in host memory (this module runs on host arrays; move it with .cpu())");
  const nb::dlpack::dtype type = array.dtype();
  const auto code = static_cast<nb::dlpack::dtype_code>(type.code);
  const bool known =
      type.lanes == 1 &&
      ((code == nb::dlpack::dtype_code::Float && (type.bits == 16 || type.bits == 32 || type.bits == 64)) ||
       (code == nb::dlpack::dtype_code::Bfloat && type.bits == 16) ||
       (code == nb::dlpack::dtype_code::Bool && type.bits == 8));
  if (!known) {
    static const char* const kinds[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
    const std::string kind = type.code < 7 ? kinds[type.code] : "code " + std::to_string(type.code);
    fail(name, ": dtype ", kind, int{type.bits}, type.lanes == 1 ? "" : " in vectors",
         " is not supported (float16, bfloat16, float32, float64, or bool for a mask)");
  }
}

// Writes the array's elements in C order to `out` (float for the inputs, double for a mask or bias), whatever
// its strides and dtype (check_array() first); a C-contiguous array of `Out` itself is one copy.
template <typename Out>
void read_array(const Array& array, Out* out) {
  const nb::dlpack::dtype type = array.dtype();
  const auto code = static_cast<nb::dlpack::dtype_code>(type.code);
  const size_t count = array.size(), rank = array.ndim(), bytes = type.bits / 8;
  if (count == 0) return;
  bool contiguous = true;
  for (size_t d = rank, expected = 1; d-- > 0; expected *= array.shape(d))
    contiguous &= array.shape(d) == 1 || array.stride(d) == static_cast<int64_t>(expected);
  if (contiguous && code == nb::dlpack::dtype_code::Float && bytes == sizeof(Out)) {
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
  check_array(array, name);
  NpyArray result{shape_of(array), std::vector<double>(array.size()), ""};
  read_array(array, result.values.data());
  return result;
}

nb::ndarray<nb::numpy, float> to_numpy(HostTensor&& tensor) {
  auto* owned = new HostTensor(std::move(tensor));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<HostTensor*>(p); });
  std::vector<size_t> shape(owned->shape.begin(), owned->shape.end());
  return nb::ndarray<nb::numpy, float>(owned->ptr(), shape.size(), shape.data(), owner);
}

// A call's problem and inputs: the shapes from q and k (4-D, or 3-D with cu_seqlens_q: packed), the options
// from `flags` (the keyword arguments as the tool's flags, python/flashlab/__init__.py), mask and bias from
// arrays.
struct Call {
  Problem problem;
  AttentionInputs inputs;
};

Call prepare(const Array& q, const Array& k, const Array& v, std::vector<std::string> flags,
             const nb::object& mask, const nb::object& bias) {
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
  Call call{cli::problem_from_args(args, false).problem, {}};
  Problem& p = call.problem;
  if (!mask.is_none()) cli::attach_mask(p, as_npy(nb::cast<Array>(mask), "mask"), "mask");
  if (!bias.is_none()) cli::attach_bias(p, as_npy(nb::cast<Array>(bias), "bias"), "bias");
  p.validate();
  if (packed && q.shape(0) != static_cast<size_t>(p.cu_seqlens_q.back()))
    fail("q: holds ", q.shape(0), " tokens but cu_seqlens_q ends at ", p.cu_seqlens_q.back());
  if (packed && k.shape(0) != static_cast<size_t>(p.cu_seqlens_k.back()))
    fail("k: holds ", k.shape(0), " tokens but cu_seqlens_k ends at ", p.cu_seqlens_k.back());
  call.inputs = empty_inputs(p);
  const char* q_layout = packed ? "[total_q, heads, head_dim]" : "[batch, seqlen_q, heads, head_dim]";
  const char* kv_layout = packed ? "[total_k, kv_heads, head_dim]" : "[batch, seqlen_k, kv_heads, head_dim]";
  load(q, "q", call.inputs.q, q_layout);
  load(k, "k", call.inputs.k, kv_layout);
  load(v, "v", call.inputs.v, kv_layout);
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
  if (const std::string reason = why_cannot_run(impl, call.problem); !reason.empty()) fail(reason);
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
  if (const std::string reason = why_cannot_run_backward(impl, p); !reason.empty()) fail(reason);
  AttentionOutputs forward{HostTensor(p.q_shape()), HostTensor(p.lse_shape())};
  HostTensor d_o(p.q_shape());
  const char* q_layout = p.packed() ? "[total_q, heads, head_dim]" : "[batch, seqlen_q, heads, head_dim]";
  load(o, "o", forward.o, q_layout);
  load(lse, "lse", forward.lse, p.packed() ? "[heads, total_q]" : "[batch, heads, seqlen_q]");
  load(d_out, "do", d_o, q_layout);
  AttentionGradients gradients;
  run(emulate, [&] { gradients = run_backward(impl, p, call.inputs, forward, d_o); });
  return nb::make_tuple(to_numpy(std::move(gradients.dq)), to_numpy(std::move(gradients.dk)),
                        to_numpy(std::move(gradients.dv)));
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
  // A mistake in the input (flashlab::Error, the tool's exit code 2) is a ValueError with the tool's message.
  nb::register_exception_translator([](const std::exception_ptr& error, void*) {
    try {
      std::rethrow_exception(error);
    } catch (const flashlab::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  m.def("implementations", &implementations_here);
  m.def("attention", &attention, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("impl"), nb::arg("flags"),
        nb::arg("mask").none(), nb::arg("bias").none(), nb::arg("emulate"));
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
