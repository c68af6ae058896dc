#!/usr/bin/env python3
"""The Python module with PyTorch (python/flashlab/, docs/python.md): run by ctest as `python_torch`, skipped
(exit code 77, with the reason) where PyTorch is not installed; the driver does not install it.

- PyTorch CPU tensors give the same O and LSE, bit for bit, as the same values in NumPy arrays; bfloat16 and
  float16 tensors run the 16-bit stages and come back in their dtype.
- flashlab.autograd.attention(): the gradients autograd gives q, k and v are the backward stage's, bit for bit,
  and match PyTorch's own autograd through an fp64 attention written in torch; with dropout, the forward and
  the backward drop the same elements.
- torch.nn.functional.scaled_dot_product_attention agrees with the stages (fp32: within the same-dtype rule's
  tolerance, docs/conventions.md §7, here 1e-5 relative to the largest output).
- NumPy bfloat16 arrays (ml_dtypes, where installed) give the bfloat16 tensors' results bit for bit.
- A tensor on a device the module cannot read is refused by name."""
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as error:
    print(f"skipped: {error.name} is not installed (PyTorch is optional: docs/python.md)")
    sys.exit(77)

import flashlab
from flashlab.autograd import attention as trained_attention

failures = []


def expect(condition, what):
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        failures.append(what)


def tensors(batch=2, sq=37, sk=53, heads=4, kv_heads=2, d=32, dtype=torch.float32, seed=0, grad=False):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(batch, sq, heads, d), (batch, sk, kv_heads, d), (batch, sk, kv_heads, d)]
    return [torch.randn(s, generator=generator, dtype=torch.float32).to(dtype).requires_grad_(grad) for s in shapes]


def reference(q, k, v, causal=False):
    """O and LSE in fp64 through torch's own operations (BSHD, GQA, bottom-right causal): autograd's truth."""
    q, k, v = (x.double() for x in (q, k, v))
    heads, kv_heads, sq, sk = q.shape[2], k.shape[2], q.shape[1], k.shape[1]
    k = k.repeat_interleave(heads // kv_heads, dim=2)
    v = v.repeat_interleave(heads // kv_heads, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) / q.shape[-1] ** 0.5
    if causal:
        rows = torch.arange(sq)[:, None] + (sk - sq)
        s = s.masked_fill(torch.arange(sk)[None, :] > rows, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = torch.einsum("bhij,bjhd->bihd", torch.exp(s - lse[..., None]), v)
    return o, lse


def close(a, b, relative):
    return float((a.double() - b.double()).abs().max()) <= relative * float(b.double().abs().max())


# PyTorch CPU tensors are read as NumPy arrays are.
q, k, v = tensors()
o, lse = flashlab.attention(q, k, v, impl="cpu_tiled/forward", causal=True)
o_np, lse_np = flashlab.attention(q.numpy(), k.numpy(), v.numpy(), impl="cpu_tiled/forward", causal=True)
expect(isinstance(o, torch.Tensor) and o.dtype == torch.float32 and lse.dtype == torch.float32,
       "torch float32 in: O and LSE come back as float32 tensors")
expect(np.array_equal(o.numpy(), o_np) and np.array_equal(lse.numpy(), lse_np),
       "torch CPU tensors give the NumPy arrays' O and LSE bit for bit")
o_ref, lse_ref = reference(q, k, v, causal=True)
expect(close(o, o_ref, 1e-5) and close(lse, lse_ref, 1e-5), "and they match the fp64 reference")
strided = q.transpose(1, 2).contiguous().transpose(1, 2)  # the same values, another memory order
expect(torch.equal(flashlab.attention(strided, k, v, impl="cpu_tiled/forward", causal=True)[0], o),
       "a non-contiguous tensor gives the contiguous one's O")

for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "f16")):
    q16, k16, v16 = tensors(dtype=dtype)
    o16, lse16 = flashlab.attention(q16, k16, v16, impl="cuda_v2/split_q", emulate=True, causal=True)
    o_ref, _ = reference(q16, k16, v16, causal=True)
    expect(o16.dtype == dtype and close(o16, o_ref, 2e-2),
           f"{name} tensors run cuda_v2/split_q (emulated) and come back {name}, within {name}'s tolerance")

# NumPy bfloat16 (ml_dtypes) goes the same way as torch's: the same O and LSE, bit for bit.
try:
    import ml_dtypes
except ImportError:
    print("not checked: ml_dtypes is not installed (NumPy bfloat16 arrays)")
else:
    q16, k16, v16 = tensors(dtype=torch.bfloat16, seed=4)
    o_torch, lse_torch = flashlab.attention(q16, k16, v16, impl="cuda_v2/split_q", emulate=True, causal=True)
    arrays = [x.float().numpy().astype(ml_dtypes.bfloat16) for x in (q16, k16, v16)]
    o_np, lse_np = flashlab.attention(*arrays, impl="cuda_v2/split_q", emulate=True, causal=True)
    expect(o_np.dtype == ml_dtypes.bfloat16 and np.array_equal(o_np.astype(np.float32), o_torch.float().numpy())
           and np.array_equal(lse_np, lse_torch.numpy()),
           "ml_dtypes bfloat16 arrays give torch bfloat16's O and LSE bit for bit, and come back bfloat16")

# Training through a stage: autograd's gradients are the backward stage's.
q, k, v = tensors(grad=True, seed=1)
d_o = torch.randn(q.shape, generator=torch.Generator().manual_seed(2))
o, lse = trained_attention(q, k, v, impl="cpu_tiled/forward", causal=True)
(o * d_o).sum().backward()
dq, dk, dv = flashlab.attention_backward(q.detach(), k.detach(), v.detach(), o.detach(), lse, d_o,
                                         impl="cpu_tiled/backward", causal=True)
expect(torch.equal(q.grad, dq) and torch.equal(k.grad, dk) and torch.equal(v.grad, dv),
       "autograd's dQ, dK, dV through flashlab.autograd are cpu_tiled/backward's, bit for bit")
q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
(reference(q64, k64, v64, causal=True)[0] * d_o.double()).sum().backward()
expect(all(close(mine, truth, 1e-5) for mine, truth in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad))),
       "and they match torch's own autograd through fp64 attention (GQA: dK, dV summed over the group)")
expect(not lse.requires_grad, "LSE is returned, not differentiable")

q, k, v = tensors(grad=True, seed=3, d=16)
o, lse = trained_attention(q, k, v, impl="cpu_tiled/forward", dropout=0.2, seed=7)
o.sum().backward()
dq, dk, dv = flashlab.attention_backward(q.detach(), k.detach(), v.detach(), o.detach(), lse, torch.ones_like(o),
                                         impl="cpu_tiled/backward", dropout=0.2, seed=7)
dq_other, _, _ = flashlab.attention_backward(q.detach(), k.detach(), v.detach(), o.detach(), lse,
                                             torch.ones_like(o), impl="cpu_tiled/backward", dropout=0.2, seed=8)
expect(torch.equal(q.grad, dq) and torch.equal(k.grad, dk) and torch.equal(v.grad, dv)
       and not torch.equal(q.grad, dq_other),
       "with dropout the backward drops what the forward dropped (the seed reaches both; another seed differs)")

# Against PyTorch's scaled_dot_product_attention (its [B, H, S, D] layout). Square, so that SDPA's is_causal
# (aligned top-left) and flashlab's causal (bottom-right) are the same mask.
q, k, v = tensors(sq=64, sk=64, heads=4, kv_heads=4, seed=5)
for causal in (False, True):
    sdpa = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=causal).transpose(1, 2)
    for impl in ("naive/three_pass", "naive/online_softmax", "cpu_tiled/forward", "cuda_v1/split_k",
                 "cuda_v2/split_q_simt"):
        o, _ = flashlab.attention(q, k, v, impl=impl, causal=causal, emulate=impl.startswith("cuda"))
        expect(close(o, sdpa, 1e-5), f"{impl}{' causal' if causal else ''} agrees with torch's SDPA")

if torch.cuda.is_available():
    print("note: a GPU is present; the CUDA-tensor path is tested by the GPU report's smoke test")
else:
    try:
        flashlab.attention(q.to("meta"), k, v)
        expect(False, "a tensor not in host memory is refused")
    except (ValueError, TypeError, RuntimeError) as error:
        expect(isinstance(error, ValueError) and str(error).startswith("q: "),
               f"a tensor not in host memory is refused by name: {error}")

if failures:
    print(f"{len(failures)} failed")
    sys.exit(1)
print("all passed")
