#!/usr/bin/env python3
"""The Python module (python/flashlab/, docs/python.md), as built in build/python: run by ctest as
`python_module`, with the tool's path as its argument.

- The registry is what `flashlab list --json` says.
- A forward and a backward on NumPy arrays give the tool's answers bit for bit (the same inputs written as .npy
  files and run by `flashlab run` / `flashlab grad`), for options of every kind, and match a NumPy fp64 reference.
- The dtype rule, non-contiguous arrays, the emulator, the GIL released during a run.
- Bad input raises ValueError or TypeError naming the field, and never crashes the interpreter."""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

try:
    import numpy as np
except ImportError:  # the driver installs it into build/deps/; without network it may be missing
    print("skipped: NumPy is not installed (./flashlab setup installs it into build/deps/)")
    sys.exit(77)

import flashlab

TOOL = sys.argv[1]
failures = []


def expect(condition, what):
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        failures.append(what)


def raises(kind, words, call, what):
    try:
        call()
    except kind as error:
        expect(all(w in str(error) for w in words), f"{what}: {kind.__name__}: {error}")
        return
    except Exception as error:  # noqa: BLE001 - a wrong kind of error is a failure to report, not to raise
        expect(False, f"{what}: expected {kind.__name__}, got {type(error).__name__}: {error}")
        return
    expect(False, f"{what}: expected {kind.__name__}, nothing was raised")


def inputs(batch=2, sq=37, sk=53, heads=4, kv_heads=2, d=16, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, sq, heads, d), dtype=np.float32)
    k = rng.standard_normal((batch, sk, kv_heads, d), dtype=np.float32)
    v = rng.standard_normal((batch, sk, kv_heads, d), dtype=np.float32)
    return q, k, v


def reference(q, k, v, causal=False, scale=None):
    """O and LSE in fp64 (BSHD, GQA, bottom-right causal), for a plain problem."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    batch, sq, heads, d = q.shape
    sk, kv_heads = k.shape[1], k.shape[2]
    scale = 1 / np.sqrt(d) if scale is None else scale
    group = heads // kv_heads
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) * scale
    if causal:
        visible = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
        s = np.where(visible, s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0)
    p = np.exp(s - top)
    total = p.sum(axis=-1, keepdims=True)
    o = np.einsum("bhij,bjhd->bihd", np.divide(p, total, out=np.zeros_like(p), where=total > 0), v)
    with np.errstate(divide="ignore"):
        lse = (np.log(total) + top)[..., 0]
    return o, lse


def tool_run(q, k, v, impl, flags, command="run", extra=()):
    """The tool's O and LSE for the same inputs (and, for `grad`, its gradients), read back from .npy files."""
    with tempfile.TemporaryDirectory(prefix="flashlab-python-") as folder:
        paths = {}
        for name, array in (("q", q), ("k", k), ("v", v)) + tuple(extra):
            paths[name] = os.path.join(folder, name + ".npy")
            np.save(paths[name], array)
        outs = ("out", "lse") if command == "run" else ("dq", "dk", "dv")
        argv = [TOOL, command, impl, "--q", paths["q"], "--k", paths["k"], "--v", paths["v"], "--no-check"]
        for name in outs:
            argv += ["--" + name, os.path.join(folder, name + ".npy")]
        for name, _ in extra:
            argv += ["--" + name.replace("_", "-"), paths[name]]
        done = subprocess.run(argv + flags, capture_output=True, text=True)
        if done.returncode != 0:
            return None, done.stderr.strip()
        return [np.load(os.path.join(folder, name + ".npy")) for name in outs], ""


# --- the registry
listed = json.loads(subprocess.run([TOOL, "list", "--json"], capture_output=True, text=True, check=True).stdout)
mine = flashlab.implementations()
expect(mine == listed, f"implementations() is `flashlab list --json` ({len(mine)} implementations)")

# --- forward: the tool's answers bit for bit, and the fp64 reference
q, k, v = inputs()
o64, lse64 = reference(q, k, v, causal=True)
cpu_forwards = [i["name"] for i in mine if i["device"] == "cpu" and "f32" in i["dtypes"] and i["available"]]
for impl in cpu_forwards:
    try:
        o, lse = flashlab.attention(q, k, v, impl=impl, causal=True)
    except ValueError as error:  # a stage that cannot run this problem says why, as the tool does
        outputs, message = tool_run(q, k, v, impl, ["--causal"])
        expect(outputs is None and str(error) in message, f"{impl} refuses as the tool does: {error}")
        continue
    outputs, message = tool_run(q, k, v, impl, ["--causal"])
    same = outputs is not None and np.array_equal(o, outputs[0]) and np.array_equal(lse, outputs[1])
    error = np.abs(o - o64).max()
    expect(same and o.dtype == np.float32 and lse.shape == (2, 4, 37) and error < 1e-5,
           f"{impl}: the tool's O and LSE bit for bit, {error:.1e} from the fp64 reference {message}")

# Every kind of option reaches the stage as the tool's flag would (cpu_tiled/forward takes them all).
rng = np.random.default_rng(1)
mask = rng.random((37, 53)) < 0.7
bias = rng.standard_normal((4, 37, 53)).astype(np.float32)
cases = [
    ({"window_left": 5, "window_right": 3}, ["--window-left", "5", "--window-right", "3"], ()),
    ({"seqlens_q": [37, 20], "seqlens_k": [0, 41]}, ["--seqlens-q", "37,20", "--seqlens-k", "0,41"], ()),
    ({"scale": 0.3, "softcap": 20.0}, ["--scale", "0.3", "--softcap", "20.0"], ()),
    ({"alibi": True}, ["--alibi"], ()),
    ({"dropout": 0.2, "seed": 7}, ["--dropout", "0.2", "--seed", "7"], ()),
    ({"mask": mask}, [], (("mask", mask),)),
    ({"bias": bias}, [], (("bias", bias),)),
]
for options, flags, files in cases:
    impl = "cpu_tiled/forward"
    o, lse = flashlab.attention(q, k, v, impl=impl, **options)
    outputs, message = tool_run(q, k, v, impl, flags, extra=files)
    same = outputs is not None and np.array_equal(o, outputs[0]) and np.array_equal(lse, outputs[1], equal_nan=True)
    expect(same, f"{impl} with {sorted(options)}: the tool's answer bit for bit {message}")

# A paged KV cache behind a block table, as the tool makes it (a decoding stage: at most 16 query rows).
qd, kd, vd = inputs(sq=4, sk=90, seed=2)
o, lse = flashlab.attention(qd, kd, vd, impl="decoding/split_kv", causal=True, page_size=16)
outputs, message = tool_run(qd, kd, vd, "decoding/split_kv", ["--causal", "--page-size", "16"])
expect(outputs is not None and np.array_equal(o, outputs[0]) and np.array_equal(lse, outputs[1]),
       f"decoding/split_kv with page_size=16: the tool's answer bit for bit {message}")

# Packed batches: [total, heads, d] with cu_seqlens_q.
packed_q, packed_k, packed_v = (x.reshape(-1, x.shape[2], x.shape[3]) for x in (q, k[:, :37], v[:, :37]))
o, lse = flashlab.attention(packed_q, packed_k, packed_v, impl="cpu_tiled/forward", cu_seqlens_q=[0, 37, 74],
                            causal=True)
o_padded, _ = flashlab.attention(q, k[:, :37], v[:, :37], impl="cpu_tiled/forward", causal=True)
expect(o.shape == (74, 4, 16) and np.abs(o - o_padded.reshape(74, 4, 16)).max() < 1e-5,
       "packed batches (cu_seqlens_q) give the padded batch's rows")

# --- the dtype rule, strides
raises(ValueError, ["dtype f16 is not offered (f32)"],
       lambda: flashlab.attention(*(x.astype(np.float16) for x in (q, k, v)), impl="naive/three_pass"),
       "float16 inputs ask for f16, which a CPU stage does not offer")
wide = np.ascontiguousarray(np.repeat(q, 2, axis=1))
strided = wide[:, ::2]
expect(not strided.flags["C_CONTIGUOUS"]
       and np.array_equal(flashlab.attention(strided, k, v, causal=True)[0],
                          flashlab.attention(q, k, v, causal=True)[0]),
       "a non-contiguous array is read through its strides: the same answer as its contiguous copy")
o, _ = flashlab.attention(q.astype(np.float64), k, v, causal=True)
expect(o.dtype == np.float64 and np.abs(o - o64).max() < 1e-5, "float64 inputs: computed in f32, O in float64")

# --- backward: the tool's gradients bit for bit, and the fp64 gradient
d_o = rng.standard_normal(q.shape).astype(np.float32)
o, lse = flashlab.attention(q, k, v, impl="cpu_tiled/backward", causal=True)  # the backward's own forward
dq, dk, dv = flashlab.attention_backward(q, k, v, o, lse, d_o, impl="cpu_tiled/backward", causal=True)
outputs, message = tool_run(q, k, v, "cpu_tiled/backward", ["--causal"], command="grad", extra=(("do", d_o),))
expect(outputs is not None and all(np.array_equal(a, b) for a, b in zip((dq, dk, dv), outputs)),
       f"cpu_tiled/backward: `flashlab grad`'s dQ, dK, dV bit for bit {message}")
group = 2
k2, v2 = np.repeat(k.astype(np.float64), group, axis=2), np.repeat(v.astype(np.float64), group, axis=2)
scale = 1 / np.sqrt(16)
s = np.einsum("bihd,bjhd->bhij", q.astype(np.float64), k2) * scale
visible = np.arange(53)[None, :] <= np.arange(37)[:, None] + 16
p = np.exp(np.where(visible, s, -np.inf) - lse64[..., None])
dp = np.einsum("bihd,bjhd->bhij", d_o.astype(np.float64), v2)
ds = p * (dp - np.einsum("bihd,bihd->bhi", d_o.astype(np.float64), o64)[..., None])
dq64 = np.einsum("bhij,bjhd->bihd", ds, k2) * scale
dk64 = np.einsum("bhij,bihd->bjhd", ds, q.astype(np.float64)).reshape(2, 53, 2, group, 16).sum(axis=3) * scale
dv64 = np.einsum("bhij,bihd->bjhd", p, d_o.astype(np.float64)).reshape(2, 53, 2, group, 16).sum(axis=3)
worst = max(np.abs(a - b).max() for a, b in ((dq, dq64), (dk, dk64), (dv, dv64)))
expect(worst < 1e-4, f"cpu_tiled/backward: dQ, dK, dV {worst:.1e} from the fp64 gradient")

# --- a GPU stage in the emulator, and the emulation put back as it was
before = [i["emulated"] for i in flashlab.implementations()]
qb, kb, vb = inputs(batch=1, sq=20, sk=70, heads=2, kv_heads=2, d=64, seed=3)
o, lse = flashlab.attention(qb, kb, vb, impl="cuda_v2/split_q", dtype="bf16", causal=True, emulate=True)
ob64, _ = reference(qb, kb, vb, causal=True)
expect(np.abs(o - ob64).max() < 3e-2, f"cuda_v2/split_q in bf16 in the emulator: {np.abs(o - ob64).max():.1e} "
       "from the fp64 reference")
expect([i["emulated"] for i in flashlab.implementations()] == before, "emulate=True lasts for its call only")
o16, lse16 = flashlab.attention(*(x.astype(np.float16) for x in (qb, kb, vb)), impl="cuda_v2/split_q",
                                causal=True, emulate=True)
expect(o16.dtype == np.float16 and lse16.dtype == np.float32 and np.abs(o16 - ob64).max() < 5e-3,
       "float16 inputs: computed in f16, O back in float16 and LSE in float32")

# --- the GIL is released while a stage runs
big = inputs(batch=1, sq=1500, sk=1500, heads=8, kv_heads=8, d=64, seed=5)
ticks, worker = 0, threading.Thread(target=lambda: flashlab.attention(*big, impl="naive/three_pass"))
started = time.monotonic()
worker.start()
while worker.is_alive():
    ticks += 1
    time.sleep(0.005)
worker.join()
took = time.monotonic() - started
expect(took >= 0.1 and ticks >= 5, f"another Python thread ran {ticks} times during a {took:.2f} s run")

# --- mistakes: ValueError or TypeError naming the field; the interpreter survives all of them
raises(ValueError, ["q", "4-D"], lambda: flashlab.attention(q[0], k, v), "a 3-D q")
raises(ValueError, ["k", "shape"], lambda: flashlab.attention(q, k[:, :, :, :8], v), "k with another head_dim")
raises(ValueError, ["heads_q (4) must be a multiple of heads_kv (3)"],
       lambda: flashlab.attention(q, *inputs(kv_heads=3)[1:]), "heads not a multiple of kv heads")
raises(ValueError, ["q", "dtype"], lambda: flashlab.attention(q.astype(np.int32), k, v), "an int32 q")
raises(TypeError, ["q", "list"], lambda: flashlab.attention(q.tolist(), k, v), "a list for q")
raises(ValueError, ["softcap (30) is not supported by naive/three_pass"],
       lambda: flashlab.attention(q, k, v, impl="naive/three_pass", softcap=30), "an option the stage lacks")
raises(ValueError, ["impl", "no_such"], lambda: flashlab.attention(q, k, v, impl="naive/no_such"), "an unknown impl")
raises(TypeError, ["impl", "a str", "NoneType"], lambda: flashlab.attention(q, k, v, impl=None), "impl=None")
raises(TypeError, ["impl", "a str", "int"],
       lambda: flashlab.attention_backward(q, k, v, q, q, q, impl=3), "impl=3 for the backward")
raises(ValueError, ["causl", "not an option"], lambda: flashlab.attention(q, k, v, causl=True), "a misspelled option")
raises(ValueError, ["heads", "not an option"], lambda: flashlab.attention(q, k, v, heads=8), "a shape as an option")
raises(ValueError, ["causal", "True or False"], lambda: flashlab.attention(q, k, v, causal="yes"), "causal='yes'")
raises(ValueError, ["window_left"], lambda: flashlab.attention(q, k, v, window_left=-5), "window_left=-5")
raises(ValueError, ["mask", "shape"], lambda: flashlab.attention(q, k, v, mask=mask[:, :10]), "a mask too small")
raises(ValueError, ["seqlens_k"], lambda: flashlab.attention(q, k, v, seqlens_k=[60, 1]), "seqlens_k too long")
raises(ValueError, ["dropout"], lambda: flashlab.attention(q, k, v, dropout=1.5), "dropout=1.5")
raises(ValueError, ["lse", "shape"],
       lambda: flashlab.attention_backward(q, k, v, o64.astype(np.float32), lse[:, :1], d_o), "a backward's lse")
raises(ValueError, ["dtype"], lambda: flashlab.attention(q, k, v, dtype="f8"), "dtype='f8'")
# A float mask is refused: PyTorch's float masks are additive (0 keeps a key, -inf hides it), the opposite of
# reading nonzero as visible; such a mask is a bias.
additive = np.where(mask, 0.0, -np.inf).astype(np.float32)
raises(ValueError, ["mask", "must be bool"], lambda: flashlab.attention(q, k, v, mask=additive), "a float mask")
raises(TypeError, ["mask", "list"], lambda: flashlab.attention(q, k, v, mask=mask.tolist()), "a list for mask")
raises(TypeError, ["bias", "str"], lambda: flashlab.attention(q, k, v, bias="x"), "a string for bias")
raises(ValueError, ["bias", "bool"], lambda: flashlab.attention(q, k, v, bias=mask), "a bool bias")
raises(ValueError, ["q", "bool"], lambda: flashlab.attention(q > 0, k, v), "a bool q")
raises(ValueError, ["cpu_tiled/forward", "no backward pass"],
       lambda: flashlab.attention_backward(q, k, v, o64.astype(np.float32), lse, d_o, impl="cpu_tiled/forward"),
       "a backward from a stage without one")
expect(True, "the interpreter is still here after every mistake")

print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
