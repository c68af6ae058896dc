#!/usr/bin/env python3
"""The Python module on a GPU with PyTorch CUDA tensors (docs/python.md), in a few seconds: the GPU report's
check phase runs it (bench/gpu_report.py), and anyone with a CUDA GPU and PyTorch can:

    PYTHONPATH=build/python python3 bench/gpu_python_smoke.py

- CUDA tensors go through the module into a GPU stage in place: the outputs are new tensors on the inputs'
  GPU, in their dtype, and every one meets the same-dtype rule of docs/conventions.md §7 against fp64
  attention computed in torch (baseline: naive attention at the stage's precision). PyTorch SDPA's error on the
  same inputs is printed beside it.
- The kernels are enqueued on PyTorch's current stream: inputs written on a side stream behind a long sleep
  are read only after it (a launch on another stream would read them unwritten), and the call returns before
  the sleep ends (nothing waits on the host).
- Per-batch lengths, which the module uploads on the stream, give each batch element's rows within the rule.
- The backward through flashlab.autograd (cuda_v2/split_q's, on the GPU) meets the same rule for dQ, dK, dV.
- A tensor on the wrong device, emulate=True and a dtype the stage does not keep are refused by name.

Exit code 0 when every check passes, 1 otherwise, 77 (with the reason) where PyTorch, a CUDA device or the
module is missing."""
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("unavailable: PyTorch is not installed")
    sys.exit(77)
if not torch.cuda.is_available():
    print("unavailable: PyTorch sees no CUDA device")
    sys.exit(77)
try:
    import flashlab
    from flashlab.autograd import attention as trained_attention
except ImportError as error:
    print(f"unavailable: the module does not import ({error}); the build has no Python module")
    sys.exit(77)

FLOOR = {torch.bfloat16: 1e-3, torch.float16: 1e-4, torch.float32: 2e-5}  # docs/conventions.md §7
failures = []


def expect(condition, what):
    print(("ok   " if condition else "FAIL ") + what, flush=True)
    if not condition:
        failures.append(what)


def attention_in(q, k, v, causal, compute, low=None, round_p=False):
    """O and LSE in `compute` arithmetic, BSHD, GQA, bottom-right causal (with equal lengths, also SDPA's):
    float64 for the reference; float32 with O (and P where the stage rounds it) rounded to the stage's dtype
    `low` for the baseline."""
    q, k, v = (x.to(compute) for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) / q.shape[-1] ** 0.5
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        rows = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
        s = s.masked_fill(torch.arange(sk, device=q.device)[None, :] > rows, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    if low is not None and round_p:
        p = p.to(low).to(compute)
    o = torch.einsum("bhij,bjhd->bihd", p, v)
    return (o if low is None else o.to(low).to(compute)), lse


def max_err(x, ref):
    return float(((x.double() - ref).abs() / ref.abs().clamp(min=1)).max())


def within_rule(name, out, baseline, ref, dtype):
    """The same-dtype rule: max_err(out) <= 2 max_err(baseline) + floor(dtype)."""
    err, bound = max_err(out, ref), 2 * max_err(baseline, ref) + FLOOR[dtype]
    return err <= bound, f"{name} {err:.2e} <= {bound:.2e}"


def sdpa(q, k, v, causal):
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=causal).transpose(1, 2)


def inputs(batch, seqlen_q, seqlen_k, heads, kv_heads, d, dtype, seed):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    shapes = [(batch, seqlen_q, heads, d), (batch, seqlen_k, kv_heads, d), (batch, seqlen_k, kv_heads, d)]
    return [torch.randn(s, generator=generator, device="cuda", dtype=torch.float32).to(dtype) for s in shapes]


available = {e["name"]: e for e in flashlab.implementations() if e["available"] and not e["emulated"]}
print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; GPU stages here: "
      f"{', '.join(n for n, e in available.items() if e['device'] == 'cuda') or 'none'}", flush=True)

# (implementation, dtype, head dim, causal, rounds P, query rows, keys)
CASES = [("cuda_v2/split_q", torch.bfloat16, 128, True, True, 300, 300),
         ("cuda_v2/split_q", torch.float16, 64, False, True, 257, 257),
         ("cuda_v2/split_q", torch.bfloat16, 80, True, True, 200, 200),
         ("cuda_v3_hopper/ws", torch.bfloat16, 128, True, True, 384, 384),
         ("cuda_v3_hopper/ws", torch.bfloat16, 64, False, True, 500, 500),
         ("cuda_v2/split_q_simt", torch.float32, 64, True, False, 130, 130),
         ("decoding/cuda_split_kv", torch.float16, 128, False, False, 1, 4000),
         ("decoding/cuda_split_kv_mma", torch.bfloat16, 128, False, True, 1, 4000)]
for impl, dtype, d, causal, round_p, sq, sk in CASES:
    what = f"{impl} {str(dtype)[6:]} d {d}{' causal' if causal else ''} {sq}x{sk}"
    if impl not in available:
        print(f"--   {what}: not run on this GPU ({impl} is not available here)")
        continue
    q, k, v = inputs(2, sq, sk, 8, 2, d, dtype, seed=d + sq)
    o, lse = flashlab.attention(q, k, v, impl=impl, causal=causal)
    torch.cuda.synchronize()
    ref_o, ref_lse = attention_in(q, k, v, causal, torch.float64)
    base_o, base_lse = attention_in(q, k, v, causal, torch.float32, dtype, round_p)
    ok_o, text_o = within_rule("O", o, base_o, ref_o, dtype)
    ok_lse, text_lse = within_rule("LSE", lse, base_lse, ref_lse, dtype)
    in_place = o.device == q.device and o.dtype == dtype and lse.device == q.device and lse.dtype == torch.float32
    peer = max_err(sdpa(q, k, v, causal and sq == sk), ref_o)
    expect(ok_o and ok_lse and in_place, f"{what}: {text_o}, {text_lse} (SDPA's O {peer:.2e})"
           + ("" if in_place else "; the outputs are not on q's GPU in its dtype"))

# The current stream: a side stream sleeps, then writes the inputs; the stage enqueued behind it on that stream
# must read them written, and the call must return while the stream still sleeps.
if "cuda_v2/split_q" in available:
    q, k, v = inputs(1, 256, 256, 4, 4, 64, torch.bfloat16, seed=7)
    flashlab.attention(q, k, v, impl="cuda_v2/split_q")  # warm: the first call loads the kernels
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # some 100 ms of GPU clock cycles
        q2, k2, v2 = (x.clone() for x in (q, k, v))  # written only after the sleep
        started = time.monotonic()
        o2, _ = flashlab.attention(q2, k2, v2, impl="cuda_v2/split_q")
        returned = time.monotonic() - started
        pending = not side.query()
    side.synchronize()
    o_ref, _ = flashlab.attention(q, k, v, impl="cuda_v2/split_q")
    torch.cuda.synchronize()
    expect(torch.equal(o2, o_ref), "on a side stream, the stage reads the inputs that stream wrote before it")
    expect(pending, f"the call returned in {returned * 1e3:.1f} ms while its stream was still busy (no host wait)")

    # Per-batch lengths: the module uploads them on the stream (stream-ordered allocations, run_on_stream).
    q, k, v = inputs(2, 300, 300, 8, 2, 128, torch.bfloat16, seed=11)
    lengths_q, lengths_k = [300, 200], [300, 177]
    o, lse = flashlab.attention(q, k, v, impl="cuda_v2/split_q", seqlens_q=lengths_q, seqlens_k=lengths_k)
    torch.cuda.synchronize()
    checks = []
    for b, (rows, keys) in enumerate(zip(lengths_q, lengths_k)):  # each batch element's valid rows and keys
        qs, ks, vs = q[b:b + 1, :rows], k[b:b + 1, :keys], v[b:b + 1, :keys]
        ref_o, ref_lse = attention_in(qs, ks, vs, False, torch.float64)
        base_o, base_lse = attention_in(qs, ks, vs, False, torch.float32, torch.bfloat16, True)
        checks += [within_rule(f"O[{b}]", o[b:b + 1, :rows], base_o, ref_o, torch.bfloat16),
                   within_rule(f"LSE[{b}]", lse[b:b + 1, :, :rows], base_lse, ref_lse, torch.bfloat16)]
    expect(all(ok for ok, _ in checks), "cuda_v2/split_q with per-batch lengths (uploaded on the stream): "
           + ", ".join(text for _, text in checks))

    # Training through the stage on the GPU: flashlab.autograd's gradients meet the rule against fp64 autograd.
    q, k, v = (x.requires_grad_() for x in inputs(2, 190, 190, 4, 2, 64, torch.bfloat16, seed=9))
    o, _ = trained_attention(q, k, v, impl="cuda_v2/split_q", causal=True)
    d_o = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), d_o)
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = torch.autograd.grad(attention_in(*leaves, True, torch.float64)[0], leaves, d_o.double())
    leaves32 = [x.detach().float().requires_grad_() for x in (q, k, v)]
    base = torch.autograd.grad(attention_in(*leaves32, True, torch.float32, torch.bfloat16, True)[0], leaves32,
                               d_o.float())
    base = [b.to(torch.bfloat16) for b in base]  # stored in the stage's dtype, as its gradients are
    checks = [within_rule(n, g, b, r, torch.bfloat16) for n, g, b, r in zip(("dQ", "dK", "dV"), grads, base, ref)]
    expect(all(ok for ok, _ in checks), "cuda_v2/split_q's backward through autograd: "
           + ", ".join(text for _, text in checks))

    # Mistakes are refused by name.
    def refused(field, call):
        try:
            call()
        except (ValueError, TypeError) as error:
            return str(error).startswith(field)
        return False
    q, k, v = inputs(1, 64, 64, 2, 2, 64, torch.bfloat16, seed=1)
    expect(refused("k", lambda: flashlab.attention(q, k.cpu(), v, impl="cuda_v2/split_q")),
           "k in host memory beside CUDA q: refused, naming k")
    expect(refused("emulate", lambda: flashlab.attention(q, k, v, impl="cuda_v2/split_q", emulate=True)),
           "emulate=True with CUDA tensors: refused, naming emulate")
    expect(refused("q", lambda: flashlab.attention(q, k, v, impl="cuda_v2/split_q", dtype="f16")),
           "bfloat16 tensors for dtype f16: refused, naming q")
    expect(refused("impl", lambda: flashlab.attention(q, k, v, impl="cpu_tiled/forward")),
           "a host stage on CUDA tensors: refused, naming impl")

print(f"{len(failures)} of the checks failed" if failures else "every check passed")
sys.exit(1 if failures else 0)
