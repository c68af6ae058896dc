#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention as a peer, each backend forced in turn (flash, cudnn, efficient, math).

Same shapes as `flashlab gpu-bench` (its `--list-shapes` JSON), CUDA events, median of repeats after warm-up,
inputs rotated between enough copies that the L2 cache does not flatter anyone; the forward, or the backward
(dQ, dK, dV from dO through autograd, the forward not timed). A backend that refuses a shape (or runs out of
memory) gets a row with its reason ("skipped"), never a crash.

    python3 bench/peers_torch.py --shapes shapes.json --dtypes bf16 --out peers.json [--pass backward]
    python3 bench/peers_torch.py --serve [--dry-run]

--serve is how bench/gpu_report.py runs it: PyTorch is loaded once, then each line on stdin,
{"shape": {...}, "pass": "forward", "dtype": "bf16", "backends": [...], "seconds": 0.3}, is answered by one
line {"row": {...}} per backend and then {"done": true}. The first line out is {"ready": {"device", "torch",
"cudnn"}}, or {"unavailable": REASON} when PyTorch or its GPU is missing (exit code 3).

--dry-run (the report's rehearsal, on a machine without a GPU or PyTorch) answers the same lines with a
pure-Python stand-in: a few query rows in float32 arithmetic against float64, timed on the CPU. Its rows are
marked "emulated" and carry no rate; they exercise the protocol and the rows, never measure a peer.

Rows follow the results schema (docs/conventions.md "Results"). Causal shapes must be square
(seqlen_q == seqlen_k), where PyTorch's top-left is_causal equals flashlab's bottom-right rule.
"""
import argparse
import json
import math
import random
import struct
import sys
import time
import warnings

BACKEND_NAMES = ("torch/sdpa_flash", "torch/sdpa_cudnn", "torch/sdpa_efficient", "torch/sdpa_math")
SHAPE_KEYS = ("batch", "heads", "kv_heads", "seqlen_q", "seqlen_k", "head_dim", "causal")


def counts(s):
    """The shape's FLOP and byte counts, which flashlab gpu-bench --list-shapes writes from common/flops.cpp (the
    one place they are made): {"forward_flops", "backward_flops", "forward_min_bytes": {dtype: bytes}}."""
    if "counts" not in s:
        raise ValueError(f"shape {json.dumps(s)} has no 'counts': take the shapes from flashlab gpu-bench "
                         "--list-shapes, which writes them")
    return s["counts"]


def refusal(s):
    """Why the peers cannot run this shape as flashlab means it, or None."""
    if s["causal"] and s["seqlen_q"] != s["seqlen_k"]:
        return "causal with seqlen_q != seqlen_k: SDPA's is_causal is top-left aligned, flashlab's bottom-right"
    if s.get("page_size"):
        return "a paged KV cache: SDPA reads contiguous K and V only"
    return None


class TorchPeers:
    """The real peers: PyTorch's SDPA on the GPU."""

    def __init__(self):
        import torch  # noqa: deferred, so that --dry-run needs no PyTorch
        import torch.nn.functional as functional
        from torch.nn.attention import SDPBackend, sdpa_kernel
        if not torch.cuda.is_available():
            raise RuntimeError(f"PyTorch {torch.__version__} sees no CUDA device")
        self.torch, self.functional, self.sdpa_kernel = torch, functional, sdpa_kernel
        # None where this PyTorch has no such backend (cuDNN attention arrived in 2.2): recorded as refused.
        self.backends = {
            "torch/sdpa_flash": getattr(SDPBackend, "FLASH_ATTENTION", None),
            "torch/sdpa_cudnn": getattr(SDPBackend, "CUDNN_ATTENTION", None),
            "torch/sdpa_efficient": getattr(SDPBackend, "EFFICIENT_ATTENTION", None),
            "torch/sdpa_math": getattr(SDPBackend, "MATH", None),
        }
        self.dtypes = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
        props = torch.cuda.get_device_properties(0)
        self.l2_bytes = props.L2_cache_size
        self.info = {"device": props.name, "torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}

    def inputs(self, s, dtype, generator, grad=False):
        """q [B, H, SQ, D], k and v [B, HKV, SK, D] (SDPA's layout), N(0, 1)."""
        torch = self.torch
        shape_q = (s["batch"], s["heads"], s["seqlen_q"], s["head_dim"])
        shape_kv = (s["batch"], s["kv_heads"], s["seqlen_k"], s["head_dim"])
        return [torch.randn(shape, device="cuda", dtype=torch.float32, generator=generator).to(dtype)
                .requires_grad_(grad) for shape in (shape_q, shape_kv, shape_kv)]

    def reference_rows(self, s, q, k, v, rows):
        """fp64 attention for the query rows `rows` only (bottom-right causal), the ground truth of max_err_o."""
        torch = self.torch
        q64, k64, v64 = (t.detach().double() for t in (q, k, v))
        group = s["heads"] // s["kv_heads"]
        if group > 1:
            k64, v64 = k64.repeat_interleave(group, dim=1), v64.repeat_interleave(group, dim=1)
        scores = q64[:, :, rows, :] @ k64.transpose(-1, -2) / math.sqrt(s["head_dim"])
        if s["causal"]:
            keys = torch.arange(s["seqlen_k"], device="cuda")
            hidden = keys[None, :] > (rows[:, None] + s["seqlen_k"] - s["seqlen_q"])
            scores = scores.masked_fill(hidden, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v64

    def median_ms(self, call, repeats, first):
        torch = self.torch
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        stops = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for n in range(repeats):
            starts[n].record()
            call(first + n)
            stops[n].record()
        torch.cuda.synchronize()
        times = sorted(a.elapsed_time(b) for a, b in zip(starts, stops))
        return times[len(times) // 2]

    def measure(self, s, dtype_name, name, backward, seconds, max_repeats):
        torch = self.torch
        backend = self.backends[name]
        if backend is None:
            raise RuntimeError(f"this PyTorch ({torch.__version__}) has no such SDPA backend")
        dtype = self.dtypes[dtype_name]
        generator = torch.Generator(device="cuda").manual_seed(7)
        gqa = {"enable_gqa": True} if s["kv_heads"] != s["heads"] else {}
        first = self.inputs(s, dtype, generator, grad=backward)
        copy_bytes = sum(t.numel() * t.element_size() for t in first) * 4 // 3  # inputs + output
        copies = [first]
        if not backward:  # the backward's tensors are far beyond the L2: one copy
            copies += [self.inputs(s, dtype, generator) for _ in range(min(15, 2 * self.l2_bytes // copy_bytes))]

        def forward(n):
            q, k, v = copies[n % len(copies)]
            return self.functional.scaled_dot_product_attention(q, k, v, is_causal=s["causal"], **gqa)

        with self.sdpa_kernel([backend]):
            out = forward(0)  # also the warm-up; refusals raise here
            if backward:
                d_out = torch.randn_like(out)
                q, k, v = first

                def call(_):
                    torch.autograd.grad(out, (q, k, v), d_out, retain_graph=True)
            else:
                call = forward
            call(1)
            torch.cuda.synchronize()
            start = time.perf_counter()
            call(2)
            torch.cuda.synchronize()
            repeats = int(min(max_repeats, max(3, seconds / max(time.perf_counter() - start, 1e-6))))
            time_ms = self.median_ms(call, repeats, 3)
        row = {"time_ms": time_ms, "repeat": repeats}
        if backward:
            row.update({"tflops": counts(s)["backward_flops"] / (time_ms * 1e-3) / 1e12, "gbps": None,
                        "max_err_o": None})
        else:
            step = max(1, s["seqlen_q"] // 128)
            rows = torch.arange(0, s["seqlen_q"], step, device="cuda")
            q, k, v = copies[0]
            ref = self.reference_rows(s, q, k, v, rows)
            got = out[:, :, rows, :].detach().double()
            row.update({
                "tflops": counts(s)["forward_flops"] / (time_ms * 1e-3) / 1e12,
                "gbps": counts(s)["forward_min_bytes"][dtype_name] / (time_ms * 1e-3) / 1e9,
                "max_err_o": ((got - ref).abs() / ref.abs().clamp(min=1.0)).max().item(),
            })
        del copies, out
        return row

    def forget(self):
        self.torch.cuda.empty_cache()


class DryPeers:
    """The rehearsal's stand-in: no GPU, no PyTorch. A few query rows in float32 against float64."""

    info = {"device": "dry run: no GPU, no PyTorch (a pure-Python stand-in)", "torch": None, "cudnn": None}

    @staticmethod
    def f32(x):
        return struct.unpack("f", struct.pack("f", x))[0]

    def row_outputs(self, q_row, keys, values, scale, round32):
        scores = [sum(a * b for a, b in zip(q_row, key)) * scale for key in keys]
        if round32:
            scores = [self.f32(x) for x in scores]
        top = max(scores)
        weights = [math.exp(x - top) for x in scores]
        total = sum(weights)
        out = [sum(w * v[d] for w, v in zip(weights, values)) / total for d in range(len(q_row))]
        return [self.f32(x) for x in out] if round32 else out

    def measure(self, s, dtype_name, name, backward, seconds, max_repeats):
        if s["heads"] % s["kv_heads"]:
            raise RuntimeError("heads must be a multiple of kv_heads")
        rng = random.Random(7)
        d, sq, sk = s["head_dim"], s["seqlen_q"], s["seqlen_k"]
        scale = 1 / math.sqrt(d)
        rows = sorted({0, sq // 2, sq - 1})
        start = time.perf_counter()
        err = 0.0
        for i in rows:
            visible = sk if not s["causal"] else max(0, min(sk, i + 1 + sk - sq))
            if visible == 0:
                continue
            q_row = [rng.gauss(0, 1) for _ in range(d)]
            keys = [[rng.gauss(0, 1) for _ in range(d)] for _ in range(visible)]
            values = [[rng.gauss(0, 1) for _ in range(d)] for _ in range(visible)]
            got = self.row_outputs(q_row, keys, values, scale, True)
            ref = self.row_outputs(q_row, keys, values, scale, False)
            err = max(err, max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(got, ref)))
        time_ms = (time.perf_counter() - start) * 1e3
        return {"time_ms": time_ms, "tflops": None, "gbps": None, "max_err_o": None if backward else err,
                "repeat": 1, "emulated": True}

    def forget(self):
        pass


def make_row(peers, s, dtype_name, name, backward, seconds, max_repeats):
    counts(s)  # a shape without its counts is the caller's mistake, not a backend's refusal
    row = {"impl": name, "dtype": dtype_name, "pass": "backward" if backward else "forward",
           **{k: s[k] for k in SHAPE_KEYS}}
    reason = refusal(s)
    if reason is None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                row.update(peers.measure(s, dtype_name, name, backward, seconds, max_repeats))
            except Exception as error:  # any refusal is recorded, never a crash
                # The backend refused the shape (or memory ran out): its own reasons are in the warnings.
                reasons = [str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()]
                reasons.append(str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__)
                reason = " | ".join(dict.fromkeys(reasons))
                peers.forget()
    if reason is not None:
        row.update({"time_ms": None, "tflops": None, "gbps": None, "max_err_o": None, "skipped": reason})
    if isinstance(peers, DryPeers):
        row["emulated"] = True
    return row


def open_peers(dry_run):
    return DryPeers() if dry_run else TorchPeers()


def serve(dry_run):
    """The line protocol of --serve (see the module's docstring)."""
    try:
        peers = open_peers(dry_run)
    except Exception as error:
        print(json.dumps({"unavailable": f"{type(error).__name__}: {error}"}), flush=True)
        return 3
    print(json.dumps({"ready": peers.info}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        for name in request.get("backends", BACKEND_NAMES):
            row = make_row(peers, request["shape"], request.get("dtype", "bf16"), name,
                           request.get("pass") == "backward", request.get("seconds", 0.3),
                           request.get("max_repeats", 20))
            print(json.dumps({"row": row}), flush=True)
        print(json.dumps({"done": True}), flush=True)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help="answer shapes on stdin (bench/gpu_report.py)")
    parser.add_argument("--dry-run", action="store_true", help="a pure-Python stand-in: no GPU, no PyTorch")
    parser.add_argument("--shapes", help="JSON list from flashlab gpu-bench --list-shapes")
    parser.add_argument("--dtypes", default="bf16", help="comma-separated: bf16, f16, f32")
    parser.add_argument("--backends", default=",".join(BACKEND_NAMES), help="comma-separated impl names")
    parser.add_argument("--pass", dest="which", default="forward", choices=("forward", "backward"))
    parser.add_argument("--seconds", type=float, default=1.0, help="timed runs: as many as fit this long")
    parser.add_argument("--repeat", type=int, default=20, help="at most this many timed runs")
    parser.add_argument("--out", help="JSON file to write")
    args = parser.parse_args()
    if args.serve:
        return serve(args.dry_run)
    if not args.shapes or not args.out:
        parser.error("--shapes and --out are needed (or --serve)")
    peers = open_peers(args.dry_run)
    rows = []
    for dtype_name in args.dtypes.split(","):
        for name in args.backends.split(","):
            for s in json.load(open(args.shapes)):
                print(f"{name} {dtype_name} {s}", file=sys.stderr, flush=True)
                rows.append(make_row(peers, s, dtype_name, name, args.which == "backward", args.seconds,
                                     args.repeat))
    with open(args.out, "w") as f:
        json.dump({**peers.info, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
