"""flashlab from Python: every stage of the library on NumPy arrays and PyTorch CPU tensors (docs/python.md).

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
    return problem, mask, bias, emulate


def _is_torch(array):
    return type(array).__module__.startswith("torch")


def _check_arrays(**arrays):
    for name, array in arrays.items():
        if not (hasattr(array, "__dlpack__") or hasattr(array, "__array_interface__")):
            raise TypeError(f"{name}: expected a NumPy array or a PyTorch tensor, got {type(array).__name__}")
        # A tensor on a device DLPack cannot export (meta, mps, ...) would fail inside the binding with a
        # message that names no argument: refused here by name. CUDA tensors reach the module, which says
        # what it does with them.
        device = getattr(array, "device", None)
        if _is_torch(array) and getattr(device, "type", "cpu") not in ("cpu", "cuda"):
            raise ValueError(f"{name}: a tensor on device '{device.type}' cannot be read (host memory only)")


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
    problem, mask, bias, emulate = _split(problem)
    o, lse = _flashlab.attention(*map(_readable, (q, k, v)), impl, _flags(q, problem), mask, bias, emulate)
    return _like(o, q), _like(lse, q, keep_float32=True)


def attention_backward(q, k, v, o, lse, do, impl="cpu_tiled/backward", **problem):
    """dQ, dK and dV of attention (the same problem as attention()'s) from its inputs, its O and LSE and the
    gradient dO of the output, by the implementation `impl`. Returns (dq like q, dk like k, dv like v)."""
    _check_arrays(q=q, k=k, v=v, o=o, lse=lse, do=do)
    problem, mask, bias, emulate = _split(problem)
    dq, dk, dv = _flashlab.attention_backward(*map(_readable, (q, k, v, o, lse, do)), impl, _flags(q, problem), mask,
                                              bias, emulate)
    return _like(dq, q), _like(dk, k), _like(dv, v)
