#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention as a peer, each backend forced in turn (flash, cudnn, efficient, math).

Same shapes as `flashlab gpu-bench` (read from `flashlab gpu-bench --list-shapes --json`), CUDA events, median of
repeats after warm-up, inputs rotated between enough copies that the L2 cache does not flatter anyone. A backend
that refuses a shape (or runs out of memory) is recorded with its reason, never a crash.

    python3 bench/peers_torch.py --shapes shapes.json --dtypes bf16 --out peers.json

Rows follow the results schema of SPEC "Measuring"; refused ones carry "skipped": REASON and null figures.
Causal: the shapes are square (seqlen_q == seqlen_k), where PyTorch's top-left is_causal equals the
bottom-right rule of flashlab.
"""
import argparse
import json
import math
import sys
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# None where this PyTorch has no such backend (cuDNN attention arrived in 2.2): recorded as refused.
BACKENDS = {
    "torch/sdpa_flash": getattr(SDPBackend, "FLASH_ATTENTION", None),
    "torch/sdpa_cudnn": getattr(SDPBackend, "CUDNN_ATTENTION", None),
    "torch/sdpa_efficient": getattr(SDPBackend, "EFFICIENT_ATTENTION", None),
    "torch/sdpa_math": getattr(SDPBackend, "MATH", None),
}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def forward_flops(s):
    """4 * batch * heads * visible (row, key) pairs * head_dim, as common/flops.cpp counts them."""
    sq, sk = s["seqlen_q"], s["seqlen_k"]
    if s["causal"]:
        pairs = sum(max(0, min(sk, i + 1 + sk - sq)) for i in range(sq))
    else:
        pairs = sq * sk
    return 4.0 * s["batch"] * s["heads"] * pairs * s["head_dim"]


def min_bytes(s, element_bytes):
    """Q and O, K and V once each, plus the float32 LSE (common/flops.cpp forward_min_bytes)."""
    q = s["batch"] * s["seqlen_q"] * s["heads"] * s["head_dim"]
    kv = s["batch"] * s["seqlen_k"] * s["kv_heads"] * s["head_dim"]
    return (2 * q + 2 * kv) * element_bytes + 4 * s["batch"] * s["heads"] * s["seqlen_q"]


def make_inputs(s, dtype, generator):
    """q [B, H, SQ, D], k and v [B, HKV, SK, D] (SDPA's layout), N(0, 1)."""
    shape_q = (s["batch"], s["heads"], s["seqlen_q"], s["head_dim"])
    shape_kv = (s["batch"], s["kv_heads"], s["seqlen_k"], s["head_dim"])
    return [torch.randn(shape, device="cuda", dtype=torch.float32, generator=generator).to(dtype)
            for shape in (shape_q, shape_kv, shape_kv)]


def reference_rows(s, q, k, v, rows):
    """fp64 attention for the query rows `rows` only (bottom-right causal), the ground truth of max_err_o."""
    q64, k64, v64 = (t.double() for t in (q, k, v))
    group = s["heads"] // s["kv_heads"]
    if group > 1:
        k64, v64 = k64.repeat_interleave(group, dim=1), v64.repeat_interleave(group, dim=1)
    scores = q64[:, :, rows, :] @ k64.transpose(-1, -2) / math.sqrt(s["head_dim"])
    if s["causal"]:
        keys = torch.arange(s["seqlen_k"], device="cuda")
        hidden = keys[None, :] > (rows[:, None] + s["seqlen_k"] - s["seqlen_q"])
        scores = scores.masked_fill(hidden, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v64


def run_one(s, dtype_name, backend, repeats, l2_bytes):
    if backend is None:
        raise RuntimeError(f"this PyTorch ({torch.__version__}) has no such SDPA backend")
    dtype = DTYPES[dtype_name]
    generator = torch.Generator(device="cuda").manual_seed(7)
    first = make_inputs(s, dtype, generator)
    copy_bytes = sum(t.numel() * t.element_size() for t in first) * 4 // 3  # inputs + output
    copies = [first] + [make_inputs(s, dtype, generator) for _ in range(min(15, 2 * l2_bytes // copy_bytes))]
    gqa = s["kv_heads"] != s["heads"]

    def call(n):
        q, k, v = copies[n % len(copies)]
        kwargs = {"enable_gqa": True} if gqa else {}
        return F.scaled_dot_product_attention(q, k, v, is_causal=s["causal"], **kwargs)

    with sdpa_kernel([backend]):
        out = call(0)  # also the warm-up; refusals raise here
        torch.cuda.synchronize()
        for n in range(2):
            call(n + 1)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        stops = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for n in range(repeats):
            starts[n].record()
            call(n + 3)
            stops[n].record()
        torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in zip(starts, stops))
    time_ms = times[len(times) // 2]

    step = max(1, s["seqlen_q"] // 128)
    rows = torch.arange(0, s["seqlen_q"], step, device="cuda")
    q, k, v = copies[0]
    ref = reference_rows(s, q, k, v, rows)
    got = out[:, :, rows, :].double()
    max_err_o = ((got - ref).abs() / ref.abs().clamp(min=1.0)).max().item()
    del copies, out
    return {
        "time_ms": time_ms,
        "tflops": forward_flops(s) / (time_ms * 1e-3) / 1e12,
        "gbps": min_bytes(s, torch.finfo(dtype).bits // 8) / (time_ms * 1e-3) / 1e9,
        "max_err_o": max_err_o,
        "repeat": repeats,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", required=True, help="JSON list from flashlab gpu-bench --list-shapes")
    parser.add_argument("--dtypes", default="bf16", help="comma-separated: bf16, f16, f32")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated impl names")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args()

    shapes = json.load(open(args.shapes))
    props = torch.cuda.get_device_properties(0)
    rows = []
    for dtype_name in args.dtypes.split(","):
        for name in args.backends.split(","):
            for s in shapes:
                row = {"impl": name, "dtype": dtype_name, **{k: s[k] for k in (
                    "batch", "heads", "kv_heads", "seqlen_q", "seqlen_k", "head_dim", "causal")}}
                print(f"{name} {dtype_name} {s}", file=sys.stderr, flush=True)
                try:
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        row.update(run_one(s, dtype_name, BACKENDS[name], args.repeat, props.L2_cache_size))
                except Exception as error:  # any refusal is recorded, never a crash
                    # The backend refused the shape (or memory ran out): its own reasons are in the warnings.
                    reasons = [str(w.message).strip().splitlines()[0] for w in caught] + [str(error).splitlines()[0]]
                    row.update({"time_ms": None, "tflops": None, "gbps": None, "max_err_o": None,
                                "skipped": " | ".join(dict.fromkeys(r for r in reasons if r))})
                    torch.cuda.empty_cache()
                rows.append(row)
    result = {"device": props.name, "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
