"""flashlab from Python: every stage of the library on NumPy arrays and PyTorch tensors (docs/python.md).

    import numpy as np
    import flashlab
    q, k, v = (np.random.randn(2, 128, 8, 64).astype(np.float32) for _ in range(3))
    o, lse = flashlab.attention(q, k, v, impl="cpu_tiled/forward", causal=True)

The keyword arguments are the tool's problem flags with underscores (`flashlab run --help`): causal, window_left,
window_right, seqlens_q, seqlens_k, cu_seqlens_q, cu_seqlens_k, scale, softcap, alibi, alibi_slopes, dropout,
seed, page_size, dtype; and mask and bias as arrays. The shapes come from the arrays. A mistake raises ValueError
with the tool's one-line message, naming the field (TypeError for something that is not an array).

The dtype rule: `dtype` (the precision the stage computes in) defaults to the inputs' (bfloat16 -> "bf16",
float16 -> "f16", float32 and float64 -> "f32"). O and the gradients come back in q's dtype, LSE in float32, as
NumPy arrays for NumPy inputs and as tensors for PyTorch ones. With PyTorch, flashlab.autograd.attention() is
the same call, differentiable (a model trains through the stage).

PyTorch CUDA tensors run a GPU stage's GPU build in place: nothing passes through the host, the outputs are new
tensors on q's GPU, and the kernels are enqueued on PyTorch's current stream, so the call returns before they
finish, like PyTorch's own operations. q, k, v (and o, lse, do for the backward) must all be on that GPU, in
the stage's storage format for the dtype (bfloat16 for bf16 and e4m3, float16 for f16, float32 for f32); a
mask or bias is read on the host (a CUDA one is copied there first). Paged KV and emulate=True take host
arrays only.
"""
from . import _flashlab

__all__ = ["attention", "attention_backward", "implementations"]

_VALUED, _SWITCHES = (set(flags) for flags in _flashlab.problem_flags())
# Given by the arrays themselves, not as options.
_FROM_ARRAYS = {"batch", "heads", "kv_heads", "seqlen_q", "seqlen_k", "head_dim", "q", "k", "v", "distribution"}


def implementations():
    """Every implementation, as `flashlab list --json` lists it: name, device, dtypes, summary, constraints,
    available and reason, emulated and emulation_reason, backward."""
    return _flashlab.implementations()


def _dtype_name(array):
    text = str(getattr(array, "dtype", ""))
    return "bf16" if "bfloat16" in text else "f16" if "float16" in text else "f32"


def _flags(array, problem):
    """The keyword arguments as the tool's flags; the arrays (mask, bias) and `emulate` apart."""
    flags = []
    if "dtype" not in problem:
        flags += ["--dtype", _dtype_name(array)]
    for name, value in problem.items():
        flag = "--" + name.replace("_", "-")
        if name in _FROM_ARRAYS or (flag not in _VALUED and flag not in _SWITCHES):
            options = {f[2:].replace("-", "_") for f in _VALUED | _SWITCHES} - _FROM_ARRAYS
            raise ValueError(f"{name}: not an option here (the shapes come from the arrays; the options: "
                             f"{', '.join(sorted(options | {'emulate', 'mask', 'bias'}))})")
        if flag in _SWITCHES:
            if not isinstance(value, bool):
                raise ValueError(f"{name} ({value!r}) must be True or False")
            flags += [flag] if value else []
        elif isinstance(value, bool) or value is None:
            raise ValueError(f"{name} ({value!r}) takes a value, not {value!r}")
        elif isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
            values = value.tolist() if hasattr(value, "tolist") else value
            flags += [flag, ",".join(str(x) for x in values)]
        else:
            flags += [flag, str(value)]
    return flags


def _split(problem):
    problem = dict(problem)
    mask, bias, emulate = problem.pop("mask", None), problem.pop("bias", None), problem.pop("emulate", False)
    if not isinstance(emulate, bool):
        raise ValueError(f"emulate ({emulate!r}) must be True or False")
    _check_arrays(**{name: array for name, array in (("mask", mask), ("bias", bias)) if array is not None})
    return problem, mask, bias, emulate


def _is_torch(array):
    return type(array).__module__.startswith("torch")


def _on_gpu(*arrays):
    return any(_is_torch(array) and array.device.type == "cuda" for array in arrays)


def _host(array):
    """A mask or bias as the module reads it: on the host."""
    return array.cpu() if _is_torch(array) and array.device.type == "cuda" else array


def _gpu_call(arrays, impl, problem, mask, bias, emulate, backward):
    """A call on CUDA tensors (q first): its tensors made contiguous on q's GPU, LSE's shape, and the binding's
    last arguments: the scratch from PyTorch's allocator, PyTorch's current stream, impl, flags, mask, bias."""
    q = arrays[0]
    if not _on_gpu(q):
        raise ValueError("q: in host memory, and another tensor of the call is a CUDA tensor (a call's tensors "
                         "share one device)")
    if emulate:
        raise ValueError("emulate: the emulator runs on host arrays; CUDA tensors run on the GPU (pass .cpu())")
    import torch
    stream = torch.cuda.current_stream(q.device).cuda_stream
    arrays = [x.contiguous() for x in arrays]
    flags, mask, bias = _flags(arrays[0], problem), _host(mask), _host(bias)
    lse_shape, workspace_bytes = _flashlab.cuda_plan(arrays[0], arrays[1], impl, flags, mask, bias, backward)
    workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=q.device)
    return arrays, lse_shape, (workspace, stream, impl, flags, mask, bias)


def _check_arrays(**arrays):
    for name, array in arrays.items():
        if not (hasattr(array, "__dlpack__") or hasattr(array, "__array_interface__")):
            raise TypeError(f"{name}: expected a NumPy array or a PyTorch tensor, got {type(array).__name__}")
        # A tensor on a device DLPack cannot export (meta, mps, ...) would fail inside the binding with a
        # message that names no argument: refused here by name. CUDA tensors take the GPU stages' path.
        device = getattr(array, "device", None)
        if _is_torch(array) and getattr(device, "type", "cpu") not in ("cpu", "cuda"):
            raise ValueError(f"{name}: a tensor on device '{device.type}' cannot be read (host or CUDA memory only)")


def _check_impl(impl):
    if not isinstance(impl, str):
        raise TypeError(f"impl: expected a str naming an implementation (flashlab.implementations() lists them), "
                        f"got {type(impl).__name__}")


def _readable(array):
    """The array as the binding reads it. NumPy cannot hand ml_dtypes' bfloat16 through DLPack or the buffer
    protocol, so such an array goes as float32, which holds every bfloat16 value exactly (the stage still
    computes in bf16: the dtype rule takes the dtype from the original array)."""
    if not _is_torch(array) and str(getattr(array, "dtype", "")) == "bfloat16":
        return array.astype("float32")
    return array


def _like(result, array, keep_float32=False):
    """A float32 NumPy result in the framework (and, unless keep_float32, the dtype) of `array`."""
    if _is_torch(array):
        import torch
        tensor = torch.from_numpy(result)
        return tensor if keep_float32 else tensor.to(array.dtype)
    return result if keep_float32 or str(array.dtype) == "float32" else result.astype(array.dtype)


def attention(q, k, v, impl="cpu_tiled/forward", **problem):
    """O and LSE of attention over q [B, SQ, H, D], k and v [B, SK, KVH, D] (packed: [total, heads, D] with
    cu_seqlens_q) by the implementation `impl` (flashlab.implementations() lists them). `emulate=True` runs a GPU
    stage in the CPU emulator even where a GPU could run it. Returns (o like q, lse float32 [B, H, SQ])."""
    _check_arrays(q=q, k=k, v=v)
    _check_impl(impl)
    problem, mask, bias, emulate = _split(problem)
    if _on_gpu(q, k, v):
        import torch
        (q, k, v), lse_shape, rest = _gpu_call((q, k, v), impl, problem, mask, bias, emulate, False)
        o, lse = torch.empty_like(q), torch.empty(lse_shape, dtype=torch.float32, device=q.device)
        _flashlab.attention_cuda(q, k, v, o, lse, *rest)
        return o, lse
    o, lse = _flashlab.attention(*map(_readable, (q, k, v)), impl, _flags(q, problem), mask, bias, emulate)
    return _like(o, q), _like(lse, q, keep_float32=True)


def attention_backward(q, k, v, o, lse, do, impl="cpu_tiled/backward", **problem):
    """dQ, dK and dV of attention (the same problem as attention()'s) from its inputs, its O and LSE and the
    gradient dO of the output, by the implementation `impl`. Returns (dq like q, dk like k, dv like v)."""
    _check_arrays(q=q, k=k, v=v, o=o, lse=lse, do=do)
    _check_impl(impl)
    problem, mask, bias, emulate = _split(problem)
    if _on_gpu(q, k, v, o, lse, do):
        import torch
        arrays, _, rest = _gpu_call((q, k, v, o, lse, do), impl, problem, mask, bias, emulate, True)
        dq, dk, dv = (torch.empty_like(x) for x in arrays[:3])
        _flashlab.attention_backward_cuda(*arrays, dq, dk, dv, *rest)
        return dq, dk, dv
    dq, dk, dv = _flashlab.attention_backward(*map(_readable, (q, k, v, o, lse, do)), impl, _flags(q, problem), mask,
                                              bias, emulate)
    return _like(dq, q), _like(dk, k), _like(dv, v)
