#!/usr/bin/env python3
"""flashlab's stages beside PyTorch's torch.nn.functional.scaled_dot_product_attention, on the same tensors.

    python3 examples/sdpa.py                                  # every stage that can run here
    python3 examples/sdpa.py --seqlen 1024 --heads 8 --head-dim 64 --causal --impl cpu_tiled/forward

For each stage: the largest difference of its O from SDPA's, relative to SDPA's largest |O|, and the time of one
call on this machine (the median of --repeat calls, after one warm-up) beside SDPA's. The GPU stages run in the
CPU emulator here (their time is the emulator's, not a GPU's, and is not printed). Square and bottom-right
causal: flashlab's causal mask is aligned bottom-right (docs/conventions.md §3), SDPA's is_causal top-left, and
the two agree when the query and key lengths are equal, which this example keeps.
"""
import argparse
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("skipped: PyTorch is not installed (this example compares with torch's SDPA)")
    sys.exit(77)

import flashlab

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def median_time(call, repeat):
    call()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seqlen", type=int, default=256)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    parser.add_argument("--impl", action="append", help="a stage (repeatable; default: every one that runs)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    generator = torch.Generator().manual_seed(0)
    shape = (args.batch, args.seqlen, args.heads, args.head_dim)
    q, k, v = (torch.randn(shape, generator=generator).to(DTYPES[args.dtype]) for _ in range(3))
    # SDPA takes [batch, heads, seqlen, head_dim]: the same tensors, transposed views.
    sdpa_call = lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                       is_causal=args.causal).transpose(1, 2)
    reference = sdpa_call().float()
    scale = float(reference.abs().max())
    sdpa_time = median_time(sdpa_call, args.repeat)
    print(f"q, k, v {list(shape)} {args.dtype}{', causal' if args.causal else ''}; torch {torch.__version__}")
    print(f"{'stage':30} {'max |O - SDPA| / max |O|':>25} {'time':>10} {'SDPA':>10}")
    names = args.impl or [entry["name"] for entry in flashlab.implementations()
                          if args.dtype in entry["dtypes"] and (entry["available"] or entry["emulated"])]
    for name in names:
        emulated = name.startswith(("cuda", "decoding/cuda"))
        call = lambda: flashlab.attention(q, k, v, impl=name, causal=args.causal, emulate=emulated)
        try:
            o, _ = call()
        except ValueError as error:
            print(f"{name:30} refused: {error}")
            continue
        error = float((o.float() - reference).abs().max()) / scale
        timing = "emulated" if emulated else f"{median_time(call, args.repeat) * 1e3:8.2f}ms"
        print(f"{name:30} {error:25.2e} {timing:>10} {sdpa_time * 1e3:8.2f}ms")


if __name__ == "__main__":
    main()
