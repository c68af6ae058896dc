#!/usr/bin/env python3
"""flashlab's CPU stages against the CPU attention people would otherwise call, timed alternately in one run.

Peers: ONNX Runtime's fused attention operators (com.microsoft MultiHeadAttention, and GroupQueryAttention for
grouped heads and decoding), and PyTorch's scaled_dot_product_attention when asked for (--with-torch: a large
install). They are installed, pinned, into a virtual environment under the build folder (build/peers/), which
this script creates on first use and re-runs itself in.

    python3 bench/peers_cpu.py OUTDIR [--with-torch] [--rounds 5] [--repeat 3] [--quick] [--only REGEX]

Steps: (1) on small shapes, each peer and flashlab compute attention from the same .npy inputs and their
outputs must agree (max abs difference, recorded; the run stops when a peer disagrees), and so must the
gradients dQ, dK and dV of the peers with a backward; (2) every shape is
timed in `--rounds` rounds, each round running every contender once (median of `--repeat` calls after a
warm-up), in an order that rotates from round to round; the figure is the median over the rounds. flashlab is
timed by its own tool (`flashlab run IMPL ... --repeat R --no-check --json`, `flashlab grad` for the backward),
the peers in this process. Every contender uses the same number of threads: OMP_NUM_THREADS when set, else
every core. Writes OUTDIR/peers.json (machine, command, rows) and OUTDIR/peers.md (one table: shape,
contender, ms, flashlab's speed-up over it).
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, "build", "peers")
TOOL = os.path.join(ROOT, "build", "bin", "flashlab")
PINNED = ["onnxruntime==1.32.0", "onnx==1.23.2", "numpy==2.4.6"]
# From the package index pip is configured with: PyPI's Linux wheel pulls NVIDIA's CUDA libraries too (several GB);
# PIP_INDEX_URL=https://download.pytorch.org/whl/cpu gets the CPU-only wheel of the same version.
TORCH = ["torch==2.15.0"]


def ensure_venv(with_torch):
    """Re-runs this script in build/peers/ (created and filled on first use) unless it already runs there."""
    python = os.path.join(VENV, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        return
    if not os.path.exists(python):
        print(f"creating {os.path.relpath(VENV, ROOT)} with {' '.join(PINNED)}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q"] + PINNED, check=True)
    if with_torch and subprocess.run([python, "-c", "import torch"], capture_output=True).returncode != 0:
        print(f"installing {' '.join(TORCH)} into {os.path.relpath(VENV, ROOT)}", flush=True)
        subprocess.run([python, "-m", "pip", "install", "-q"] + TORCH, check=True)
    os.execv(python, [python] + sys.argv)


# ---------------------------------------------------------------- shapes


def shape(batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, causal=False, backward=False):
    kind = "backward" if backward else ("decode" if seqlen_q == 1 else "prefill")
    name = (f"{batch}x{heads}/{kv_heads} heads {seqlen_q}x{seqlen_k} d{head_dim}" + (" causal" if causal else "")
            + (" backward" if backward else ""))
    return dict(name=name, kind=kind, batch=batch, heads=heads, kv_heads=kv_heads, seqlen_q=seqlen_q,
                seqlen_k=seqlen_k, head_dim=head_dim, causal=causal)


def timed_shapes(quick):
    """The issue's rows, then the bench's grid (batch 1, 8 heads; d 64 and 128; causal off and on)."""
    if quick:
        return [shape(1, 8, 8, 1024, 1024, 64), shape(1, 8, 8, 1024, 1024, 64, causal=True),
                shape(1, 32, 8, 1, 16384, 128), shape(1, 4, 4, 1024, 1024, 128, backward=True)]
    rows = [shape(1, 4, 4, 4096, 4096, 128), shape(1, 4, 4, 4096, 4096, 128, causal=True),
            shape(1, 32, 8, 1, 131072, 128), shape(1, 4, 4, 4096, 4096, 128, backward=True)]
    for seqlen in (1024, 2048, 4096):
        for head_dim in (64, 128):
            for causal in (False, True):
                rows.append(shape(1, 8, 8, seqlen, seqlen, head_dim, causal))
    return rows


# ---------------------------------------------------------------- flashlab


def flashlab_impl(s):
    return {"prefill": "cpu_tiled/forward", "decode": "decoding/split_kv", "backward": "cpu_tiled/backward"}[s["kind"]]


def problem_flags(s):
    flags = ["--batch", s["batch"], "--heads", s["heads"], "--kv-heads", s["kv_heads"], "--seqlen-q", s["seqlen_q"],
             "--seqlen-k", s["seqlen_k"], "--head-dim", s["head_dim"]]
    return [str(f) for f in flags] + (["--causal"] if s["causal"] else [])


def flashlab_command(s, repeat):
    verb = "grad" if s["kind"] == "backward" else "run"
    return [TOOL, verb, flashlab_impl(s)] + problem_flags(s) + ["--repeat", str(repeat), "--no-check", "--json"]


def run_json(command, env):
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed (exit {result.returncode}):\n{result.stdout}{result.stderr}")
    return json.loads(result.stdout)


# ---------------------------------------------------------------- peers


def ort_model(op, s):
    """A one-node ONNX model of ONNX Runtime's fused attention on [batch, seq, heads * head_dim] tensors."""
    from onnx import TensorProto, helper
    b, h, hkv, sq, sk, d = (s[k] for k in ("batch", "heads", "kv_heads", "seqlen_q", "seqlen_k", "head_dim"))
    f = TensorProto.FLOAT
    scale = 1.0 / d ** 0.5
    if op == "mha":
        attrs = dict(num_heads=h, scale=scale)
        if s["causal"]:
            attrs["unidirectional"] = 1
        node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["o"], domain="com.microsoft", **attrs)
        inputs = [helper.make_tensor_value_info(n, f, [b, length, h * d]) for n, length in (("q", sq), ("k", sk),
                                                                                          ("v", sk))]
        outputs = [helper.make_tensor_value_info("o", f, [b, sq, h * d])]
    else:  # GroupQueryAttention: always causal (bottom-right); the keys before the query rows come as the past
        past = sk - sq
        node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total"],
                                ["o", "present_k", "present_v"], domain="com.microsoft", num_heads=h,
                                kv_num_heads=hkv, scale=scale)
        inputs = [helper.make_tensor_value_info("q", f, [b, sq, h * d]),
                  helper.make_tensor_value_info("k", f, [b, sq, hkv * d]),
                  helper.make_tensor_value_info("v", f, [b, sq, hkv * d]),
                  helper.make_tensor_value_info("past_k", f, [b, hkv, past, d]),
                  helper.make_tensor_value_info("past_v", f, [b, hkv, past, d]),
                  helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [b]),
                  helper.make_tensor_value_info("total", TensorProto.INT32, [])]
        outputs = [helper.make_tensor_value_info("o", f, [b, sq, h * d]),
                   helper.make_tensor_value_info("present_k", f, None),
                   helper.make_tensor_value_info("present_v", f, None)]
    graph = helper.make_graph([node], op, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return model.SerializeToString()


class OrtPeer:
    def __init__(self, op, threads):
        self.op, self.threads = op, threads
        self.name = f"onnxruntime/{op}"

    def why_not(self, s):
        if s["kind"] == "backward":
            return "no attention backward operator"
        if self.op == "mha" and s["heads"] != s["kv_heads"]:
            return "MultiHeadAttention takes no grouped heads"
        if self.op == "gqa" and not s["causal"] and s["seqlen_q"] > 1:
            return "GroupQueryAttention is causal only"
        return ""

    def prepare(self, s, q, k, v):
        """q [B, SQ, H, D], k and v [B, SK, HKV, D] (flashlab's layout): returns a call computing O like it."""
        import numpy as np
        import onnxruntime as ort
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(ort_model(self.op, s), options, providers=["CPUExecutionProvider"])
        b, sq, sk = s["batch"], s["seqlen_q"], s["seqlen_k"]
        if self.op == "mha":
            feeds = dict(q=q.reshape(b, sq, -1), k=k.reshape(b, sk, -1), v=v.reshape(b, sk, -1))
        else:
            past = sk - sq
            feeds = dict(q=q.reshape(b, sq, -1), k=np.ascontiguousarray(k[:, past:].reshape(b, sq, -1)),
                         v=np.ascontiguousarray(v[:, past:].reshape(b, sq, -1)),
                         past_k=np.ascontiguousarray(k[:, :past].transpose(0, 2, 1, 3)),
                         past_v=np.ascontiguousarray(v[:, :past].transpose(0, 2, 1, 3)),
                         seqlens_k=np.full(b, sk - 1, np.int32), total=np.array(sk, np.int32))
        return lambda: session.run(["o"], feeds)[0].reshape(q.shape)


class TorchPeer:
    name = "torch/sdpa"

    def __init__(self, threads):
        import torch
        torch.set_num_threads(threads)
        self.version = torch.__version__

    def why_not(self, s):
        return ""

    def prepare(self, s, q, k, v, d_out=None):
        """The forward, or for a backward row the backward alone (the forward's graph kept), with d_out
        ([B, S, H, D]; random when None) as the output's gradient; the backward returns (dQ, dK, dV) in BSHD."""
        import torch
        import torch.nn.functional as F
        tq, tk, tv = (torch.from_numpy(x).transpose(1, 2).contiguous() for x in (q, k, v))  # [B, H, S, D]
        # Square causal shapes only (top-left == bottom-right); decode rows see every key.
        causal = s["causal"] and s["seqlen_q"] > 1
        gqa = s["heads"] != s["kv_heads"]
        if s["kind"] != "backward":
            return lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, enable_gqa=gqa).transpose(
                1, 2).numpy()
        tq.requires_grad_(True), tk.requires_grad_(True), tv.requires_grad_(True)
        out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, enable_gqa=gqa)
        grad = torch.randn_like(out) if d_out is None else torch.from_numpy(d_out).transpose(1, 2).contiguous()

        def backward():
            tq.grad = tk.grad = tv.grad = None
            out.backward(grad, retain_graph=True)
            return tuple(t.grad.transpose(1, 2).numpy() for t in (tq, tk, tv))
        return backward


# ---------------------------------------------------------------- steps


def random_inputs(s, seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((s["batch"], s["seqlen_q"], s["heads"], s["head_dim"]), dtype=np.float32)
    k = rng.standard_normal((s["batch"], s["seqlen_k"], s["kv_heads"], s["head_dim"]), dtype=np.float32)
    v = rng.standard_normal((s["batch"], s["seqlen_k"], s["kv_heads"], s["head_dim"]), dtype=np.float32)
    return q, k, v


def save_arrays(folder, **arrays):
    """Each array to folder/NAME.npy; returns {NAME: path}."""
    import numpy as np
    files = {}
    for name, x in arrays.items():
        files[name] = os.path.join(folder, name + ".npy")
        np.save(files[name], x)
    return files


def check_agreement(peers, env):
    """Each peer's output against flashlab's on the same .npy inputs: the max abs difference per (peer, shape)."""
    import numpy as np
    checks = []
    small = [shape(2, 4, 4, 200, 200, 64), shape(2, 4, 4, 200, 200, 128, causal=True),
             shape(1, 8, 2, 256, 256, 64, causal=True), shape(1, 32, 8, 1, 3000, 128)]
    with tempfile.TemporaryDirectory() as folder:
        for s in small:
            q, k, v = random_inputs(s, 11)
            files = save_arrays(folder, q=q, k=k, v=v)
            out = os.path.join(folder, "o.npy")
            run_json([TOOL, "run", flashlab_impl(s)] + problem_flags(s) +
                     ["--q", files["q"], "--k", files["k"], "--v", files["v"], "--out", out, "--json"], env)
            ours = np.load(out)
            for peer in peers:
                if peer.why_not(s):
                    continue
                theirs = peer.prepare(s, q, k, v)()
                diff = float(np.abs(theirs.astype(np.float64) - ours).max())
                checks.append(dict(shape=s["name"], peer=peer.name, max_abs_diff=diff))
                print(f"  agree: {peer.name:24} {s['name']:40} max |diff| {diff:.2e}", flush=True)
                if not diff < 1e-4:
                    raise SystemExit(f"{peer.name} disagrees with flashlab on {s['name']} (max |diff| {diff})")
        # The peers with a backward: dQ, dK and dV from the same inputs and output gradient.
        s = shape(2, 4, 4, 200, 200, 64, causal=True, backward=True)
        q, k, v = random_inputs(s, 11)
        d_out = np.random.default_rng(12).standard_normal(q.shape, dtype=np.float32)
        files = save_arrays(folder, q=q, k=k, v=v, do=d_out)
        outs = [os.path.join(folder, name + ".npy") for name in ("dq", "dk", "dv")]
        run_json([TOOL, "grad", flashlab_impl(s)] + problem_flags(s) +
                 [a for name in ("q", "k", "v", "do") for a in ("--" + name, files[name])] +
                 [a for name, path in zip(("dq", "dk", "dv"), outs) for a in ("--" + name, path)] + ["--json"], env)
        ours = [np.load(path) for path in outs]
        for peer in peers:
            if peer.why_not(s):
                continue
            theirs = peer.prepare(s, q, k, v, d_out)()
            diff = max(float(np.abs(t.astype(np.float64) - o).max()) for t, o in zip(theirs, ours))
            checks.append(dict(shape=s["name"], peer=peer.name, max_abs_diff=diff))
            print(f"  agree: {peer.name:24} {s['name']:40} max |diff| of dQ, dK, dV {diff:.2e}", flush=True)
            if not diff < 1e-4:
                raise SystemExit(f"{peer.name} disagrees with flashlab on {s['name']} (max |diff| {diff})")
    return checks


def time_peer(call, repeat):
    call()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--with-torch", action="store_true", help="also PyTorch (installs it: several GB)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="four small shapes (a smoke test of the script)")
    parser.add_argument("--only", help="time only the shapes whose name this regular expression finds")
    args = parser.parse_args()
    ensure_venv(args.with_torch)
    import onnxruntime

    if not os.path.exists(TOOL):
        raise SystemExit(f"{TOOL} is missing: build flashlab first (./flashlab test, or cmake --build build)")
    threads = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count())
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    peers = [OrtPeer("mha", threads), OrtPeer("gqa", threads)]
    versions = {"onnxruntime": onnxruntime.__version__}
    if args.with_torch:
        peers.append(TorchPeer(threads))
        versions["torch"] = peers[-1].version
    os.makedirs(args.outdir, exist_ok=True)
    machine = run_json([TOOL, "machine", "--json"], env)["machine"]
    print(f"{machine['cpu']}, {threads} threads; peers: {versions}", flush=True)

    checks = check_agreement(peers, env)
    rows = []
    for s in timed_shapes(args.quick):
        if args.only and not re.search(args.only, s["name"]):
            continue
        q, k, v = random_inputs(s, 7)
        contenders = [("flashlab/" + flashlab_impl(s), None)]
        skipped = []
        for peer in peers:
            why = peer.why_not(s)
            if why:
                skipped.append(dict(shape=s["name"], contender=peer.name, skipped=why))
            else:
                contenders.append((peer.name, peer.prepare(s, q, k, v)))
        times = {name: [] for name, _ in contenders}
        record = None  # flashlab's own row: the shape's FLOP and byte counts (common/flops.cpp), for every row
        for round_ in range(args.rounds):
            order = contenders[round_ % len(contenders):] + contenders[:round_ % len(contenders)]
            for name, call in order:
                if call is None:
                    record = run_json(flashlab_command(s, args.repeat), env)
                    times[name].append(record["time_ms"])
                else:
                    times[name].append(time_peer(call, args.repeat))
        ours = statistics.median(times[contenders[0][0]])
        # The backward counts 2.5x the forward's FLOPs; the bytes are the forward's inputs read and outputs
        # written once (float32), the decode's bound.
        flops = 1e9 * (record["backward_gflop"] if s["kind"] == "backward" else record["problem"]["gflop"])
        for name, _ in contenders:
            ms = statistics.median(times[name])
            row = dict(shape=s["name"], kind=s["kind"], contender=name, ms=ms, rounds=times[name],
                       speedup_of_flashlab=ms / ours, gflops=flops / (ms * 1e-3) / 1e9,
                       gbps=record["problem"]["min_bytes"] / (ms * 1e-3) / 1e9)
            rows.append(row)
            print(f"  {s['name']:40} {name:30} {ms:10.2f} ms  x{ms / ours:5.2f}", flush=True)
        rows.extend(skipped)

    command = "python3 bench/peers_cpu.py " + " ".join(sys.argv[1:])
    result = dict(device=machine["cpu"], date=time.strftime("%Y-%m-%d", time.gmtime()),
                  commit=subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True).stdout.strip(),
                  command=command, threads=threads, machine=machine, peers=versions, python=platform.python_version(),
                  agreement=checks, rows=rows)
    with open(os.path.join(args.outdir, "peers.json"), "w") as out:
        json.dump(result, out, indent=1)
    with open(os.path.join(args.outdir, "peers.md"), "w") as out:
        out.write(f"# flashlab against CPU peers\n\n- machine: {machine['cpu']}, {threads} threads "
                  f"(FMA peak {machine['fma_gflops_all']:.0f} GFLOP/s, copy {machine['copy_gbps']:.1f} GB/s, "
                  f"measured by `flashlab machine` in this run)\n- peers: " +
                  ", ".join(f"{k} {v}" for k, v in versions.items()) + f"\n- command: `{command}`\n"
                  f"- date {result['date']}, commit {result['commit']}; median of {args.rounds} alternating rounds, "
                  f"each the median of {args.repeat} calls\n\n"
                  "| shape | contender | ms | flashlab's speed-up | GFLOP/s | GB/s (minimum bytes) |\n"
                  "|---|---|---|---|---|---|\n")
        for row in rows:
            if "skipped" in row:
                out.write(f"| {row['shape']} | {row['contender']} | - | - | - | skipped: {row['skipped']} |\n")
            else:
                out.write(f"| {row['shape']} | {row['contender']} | {row['ms']:.2f} | {row['speedup_of_flashlab']:.2f}x"
                          f" | {row['gflops']:.1f} | {row['gbps']:.1f} |\n")
    print(f"wrote {args.outdir}/peers.json and peers.md")


if __name__ == "__main__":
    main()
