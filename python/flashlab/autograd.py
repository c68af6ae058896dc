"""flashlab's stages inside PyTorch's autograd, so that a model trains through one (docs/python.md).

    import torch
    from flashlab.autograd import attention
    q, k, v = (torch.randn(2, 128, 8, 64, requires_grad=True) for _ in range(3))
    o, lse = attention(q, k, v, impl="cpu_tiled/forward", causal=True)
    o.sum().backward()                 # q.grad, k.grad, v.grad from the backward stage

The forward runs `impl`; the backward runs `backward_impl`, by default `impl` itself where it has a backward
(`flashlab.implementations()`: "backward"), else cpu_tiled/backward (on CUDA tensors, cuda_v2/split_q's). The
backward needs only the inputs, O and the LSE of the forward, so any stage's forward pairs with any backward
that takes the same problem. The keyword arguments are flashlab.attention()'s; the same ones reach the backward
(dropout with its seed drops the same elements in both). LSE is returned for inspection and is not
differentiable.
"""
import torch

from . import attention as _attention
from . import attention_backward as _attention_backward
from . import implementations

__all__ = ["attention", "Attention"]


def _default_backward(impl, on_gpu):
    for entry in implementations():
        if entry["name"] == impl:
            return impl if entry["backward"] else "cuda_v2/split_q" if on_gpu else "cpu_tiled/backward"
    raise ValueError(f"impl: unknown implementation '{impl}' (flashlab.implementations() lists them)")


class Attention(torch.autograd.Function):
    """O, LSE = Attention.apply(q, k, v, impl, backward_impl, problem): attention() without its defaults."""

    @staticmethod
    def forward(ctx, q, k, v, impl, backward_impl, problem):
        # The module reads the tensors through DLPack, which refuses a tensor that requires grad: detach()
        # gives the same storage without the graph.
        o, lse = _attention(q.detach(), k.detach(), v.detach(), impl=impl, **problem)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.backward_impl, ctx.problem = backward_impl, problem
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, d_o, _d_lse):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _attention_backward(q.detach(), k.detach(), v.detach(), o, lse, d_o.contiguous(),
                                         impl=ctx.backward_impl, **ctx.problem)
        return dq, dk, dv, None, None, None


def attention(q, k, v, impl="cpu_tiled/forward", backward_impl=None, **problem):
    """flashlab.attention() on PyTorch tensors, differentiable in q, k and v. Returns (o, lse)."""
    return Attention.apply(q, k, v, impl, backward_impl or _default_backward(impl, q.is_cuda), problem)
