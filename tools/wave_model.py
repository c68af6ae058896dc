#!/usr/bin/env python3
"""How long a GPU waits on the last blocks of a grid: a model of the forward's tiles, in two orders.

    python3 tools/wave_model.py [--batch 2 --heads 16 --seqlen 8192 --block-m 128 --block-n 64]
                                [--blocks-per-sm 1] [--sms 132] [--fixed 1] [--causal] [--section 8]
    python3 tools/wave_model.py --report      # the report's forward shapes, causal, for split_q's tiles
    python3 tools/wave_model.py --check       # the model's own checks (a test runs them)

A forward kernel of split-Q (cuda_v2/split_q and its entries) launches one block per tile: a block of
`block_m` query rows of one (batch, head). Under a causal mask a tile's work grows with its row block: row
block m sees (m + 1) block_m keys, in tiles of `block_n`. The model takes a block's time to be its key tiles
plus `fixed` (its Q load and O store, in key tiles), and the GPU to hold `sms` x `blocks_per_sm` blocks at once,
each starting the next block in launch order as soon as one ends (greedy list scheduling). It compares two
launch orders of the same tiles:
  grid     (row block, head, batch), the row block fastest: split_q's and FlashAttention-2's grid;
  longest  common/cuda/tile_order.hpp's: heads in L2 sections, within a section row block by row block from
           the last (the longest) to the first: cuda_v2/split_q_longest_first, and FA3's scheduler's rule.
It prints each order's makespan against the ideal (all work spread evenly over the slots) and their ratio, the
speed-up the model predicts. What it leaves out: that blocks sharing an SM slow each other (a lone block runs
faster), cut tiles' masks (slower than full tiles), L2 and DRAM, and the hardware's real order of starting
blocks, which CUDA does not document (the launch order is what is observed). It predicts; a GPU measures.
"""
import argparse
import heapq
import sys


def key_tiles(m, block_m, block_n, seqlen_q, seqlen_k, causal):
    """Key tiles that row block m visits (bottom-right aligned causal, as common/mask.hpp)."""
    if not causal:
        return -(-seqlen_k // block_n)
    last_row = min((m + 1) * block_m, seqlen_q) - 1
    keys = min(seqlen_k, last_row + 1 + seqlen_k - seqlen_q)
    return max(0, -(-keys // block_n))


def tile_order(blocks, pairs, section):
    """(row block, pair) in common/cuda/tile_order.hpp's order."""
    for first in range(0, pairs, section):
        here = min(section, pairs - first)
        for local in range(blocks * here):
            yield blocks - 1 - local // here, first + local % here


def grid_order(blocks, pairs):
    for pair in range(pairs):
        for m in range(blocks):
            yield m, pair


def makespan(costs, slots):
    """Greedy list scheduling: each cost starts on the slot that frees first, in the order given."""
    free = [0.0] * slots
    heapq.heapify(free)
    for cost in costs:
        heapq.heappush(free, heapq.heappop(free) + cost)
    return max(free)


def model(batch, heads, seqlen_q, seqlen_k, block_m, block_n, causal, slots, fixed, section):
    blocks, pairs = -(-seqlen_q // block_m), batch * heads
    cost = [key_tiles(m, block_m, block_n, seqlen_q, seqlen_k, causal) + fixed for m in range(blocks)]
    grid = makespan((cost[m] for m, _ in grid_order(blocks, pairs)), slots)
    longest = makespan((cost[m] for m, _ in tile_order(blocks, pairs, section)), slots)
    ideal = sum(cost) * pairs / slots
    return grid, longest, ideal


def l2_section(heads, batch, seqlen_k, head_dim, l2_bytes=32 << 20):
    """common/cuda/tile_order.hpp's l2_sectioned_order: pairs whose K and V fit l2_bytes together."""
    return max(1, min(l2_bytes // max(4 * seqlen_k * head_dim, 1), heads * batch))


def row(label, args, causal, slots):
    grid, longest, ideal = model(args.batch, args.heads, args.seqlen, args.seqlen, args.block_m, args.block_n,
                                 causal, slots, args.fixed, args.section)
    print(f"| {label} | {grid / ideal:.3f} | {longest / ideal:.3f} | {grid / longest:.3f} |")


# The report's forward shapes (bench/gpu_report.py, `flashlab gpu-bench --list-shapes --shapes report`): batch,
# heads, seqlen, head dim; and the blocks a SM holds of each entry that runs them (ptxas, nvcc 13, sm_90a).
REPORT = [(2, 16, 8192, 128), (4, 16, 4096, 128), (1, 16, 16384, 128), (8, 16, 2048, 128), (16, 16, 1024, 128),
          (2, 32, 8192, 64), (4, 32, 4096, 64), (1, 32, 16384, 64), (8, 32, 2048, 64), (16, 32, 1024, 64)]
ENTRIES = {128: [("split_q (8 warps, 1 block a SM)", 128, 64, 1), ("split_q_4warps (2 blocks a SM)", 128, 64, 2)],
           64: [("split_q (2 blocks a SM)", 128, 64, 2), ("split_q_bc128 (2 blocks a SM)", 128, 128, 2)]}


def report(sms, fixed):
    print(f"Causal, {sms} SMs, a block's fixed part {fixed} key tile(s); makespan / ideal, and the ratio")
    print("| shape, entry | grid order | longest first | predicted speed-up |")
    print("|---|---:|---:|---:|")
    for batch, heads, seqlen, head_dim in REPORT:
        for name, block_m, block_n, per_sm in ENTRIES[head_dim]:
            args = argparse.Namespace(batch=batch, heads=heads, seqlen=seqlen, block_m=block_m, block_n=block_n,
                                      fixed=fixed, section=l2_section(heads, batch, seqlen, head_dim))
            row(f"{batch} x {heads} x {seqlen // 1024}k, d {head_dim}, {name}", args, True, sms * per_sm)


def check():
    # Equal tiles (non-causal): both orders start the same costs, so the same makespan.
    assert model(2, 16, 8192, 8192, 128, 64, False, 132, 1, 8)[:2] == model(2, 16, 8192, 8192, 128, 64, False,
                                                                            132, 1, 8)[1::-1]
    # One slot: the makespan is the sum, whatever the order.
    grid, longest, ideal = model(1, 2, 512, 512, 128, 64, True, 1, 0, 1)
    assert grid == longest == ideal == 2 * (2 + 4 + 6 + 8)
    # Longest first is greedy LPT, within 4/3 of the ideal here; the grid order is not.
    grid, longest, ideal = model(2, 16, 8192, 8192, 128, 64, True, 264, 1, 8)
    assert longest <= ideal * 4 / 3 and grid > longest
    # The order hands out every tile once, sections short at the end.
    tiles = list(tile_order(8, 21, 8))
    assert len(tiles) == len(set(tiles)) == 8 * 21 and tiles[0] == (7, 0) and tiles[-1] == (0, 20)
    # Bottom-right aligned causal: with more keys than rows, the first row block sees the extra keys.
    assert key_tiles(0, 128, 64, 128, 256, True) == 4 and key_tiles(0, 128, 64, 256, 128, True) == 0
    print("wave_model: checks passed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--head-dim", type=int, default=128, help="sizes the L2 sections (default: 128)")
    parser.add_argument("--block-m", type=int, default=128)
    parser.add_argument("--block-n", type=int, default=64)
    parser.add_argument("--blocks-per-sm", type=int, default=1)
    parser.add_argument("--sms", type=int, default=132, help="H100 SXM and H200: 132")
    parser.add_argument("--fixed", type=float, default=1.0, help="a block's own cost, in key tiles (default 1)")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--section", type=int, default=0, help="pairs a section (default: as L2 sizes them)")
    parser.add_argument("--report", action="store_true", help="the report's forward shapes, causal")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if args.check:
        return check()
    if args.report:
        return report(args.sms, args.fixed)
    if args.section <= 0:
        args.section = l2_section(args.heads, args.batch, args.seqlen, args.head_dim)
    print("| shape | grid order | longest first | predicted speed-up |")
    print("|---|---:|---:|---:|")
    row(f"{args.batch} x {args.heads} x {args.seqlen}, {'causal' if args.causal else 'non-causal'}", args,
        args.causal, args.sms * args.blocks_per_sm)


if __name__ == "__main__":
    sys.exit(main())
