#!/usr/bin/env python3
"""How long a GPU waits on the last blocks of a grid: a model of a kernel's tiles, in two orders.

    python3 tools/wave_model.py [--batch 2 --heads 16 --seqlen 8192 --block-m 128 --block-n 64]
                                [--blocks-per-sm 1] [--sms 132] [--fixed 1] [--causal] [--section 8]
                                [--pass backward [--kv-heads 16]]
    python3 tools/wave_model.py --persistent [--batch 2 --heads 16 --seqlen 8192 --block-m 128 --block-n 128]
    python3 tools/wave_model.py --report      # the report's shapes, causal, for split_q's tiles, the 64 x 128
                                              # backward's and cuda_v3_hopper/ws_persistent's
    python3 tools/wave_model.py --check       # the model's own checks (a test runs them)

A forward kernel of split-Q (cuda_v2/split_q and its entries) launches one block per tile: a block of
`block_m` query rows of one (batch, head). Under a causal mask a tile's work grows with its row block: row
block m sees (m + 1) block_m keys, in tiles of `block_n`. The model takes a block's time to be its key tiles
plus `fixed` (its Q load and O store, in key tiles), and the GPU to hold `sms` x `blocks_per_sm` blocks at once,
each starting the next block in launch order as soon as one ends (greedy list scheduling). It compares two
launch orders of the same tiles:
  grid     (row block, head, batch), the row block fastest: split_q's and FlashAttention-2's grid;
  longest  common/cuda/tile_order.hpp's: heads in L2 sections, within a section row block by row block from
           the last (the longest) to the first: cuda_v2/split_q_longest_first, and FA3's
           scheduler's rule.
It prints each order's makespan against the ideal (all work spread evenly over the slots) and their ratio, the
speed-up the model predicts.

The backward (--pass backward; cuda_v2's backward kernels) launches one block per key tile of `block_n` keys
of one (batch, kv head), which walks the Q tiles of `block_m` rows that see its keys: under a causal mask key
tile j is visited from the row that sees key j block_n on, so the first key tile is the longest, and a block's
time is taken to be its Q tiles plus `fixed` (its K and V load, dK and dV store). Its grid is (key tile, kv
head, batch), the key tile fastest; the longest-first order (cuda_v2/split_q_bwd64x128_longest_first) hands out
tile_order.hpp's row block b as key tile blocks - 1 - b, mirrored, so that the first key tiles start first. Its
sections are sized by what every key tile of a pair reads: the Q, dO and fp32 dQ of the group's query heads.

The persistent kernel (--persistent; cuda_v3_hopper/ws_persistent) launches one CTA per SM, each computing
tiles of tile_order.hpp's order one after another. Two ways to hand them out: static, CTA c takes tiles c, c +
sms, c + 2 sms, ... (a fixed share each, whatever its tiles' lengths), and dynamic, each CTA takes the next
tile of the order when it finishes one (FA3's scheduler for causal masks, an atomic counter: greedy list
scheduling in that order). The grid kernel (cuda_v3_hopper/ws) is a grid of tiles whose row block runs fastest
from the last (its grid_tile), which the GPU starts in launch order as CTAs end. It prints the three against
the ideal, and the static schedule's makespan over the dynamic one's.

What it leaves out: that blocks sharing an SM slow each other (a lone block runs
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


def query_tiles(j, block_m, block_n, seqlen_q, seqlen_k, causal):
    """Q tiles that visit key tile j in the backward: those with a row that sees one of its keys."""
    q_tiles = -(-seqlen_q // block_m)
    if not causal:
        return q_tiles
    first_row = max(0, j * block_n - (seqlen_k - seqlen_q))  # the first row that sees key j * block_n
    return max(0, q_tiles - first_row // block_m)


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


def ws_grid_order(blocks, pairs):
    """cuda_v3_hopper/ws's grid: (row block, head, batch), blockIdx.x fastest, row block blocks - 1 - x."""
    for pair in range(pairs):
        for x in range(blocks):
            yield blocks - 1 - x, pair


def static_makespan(costs, slots):
    """Slot c takes costs c, c + slots, c + 2 slots, ...: the largest of the slots' sums."""
    sums = [0.0] * slots
    for i, cost in enumerate(costs):
        sums[i % slots] += cost
    return max(sums)


def makespan(costs, slots):
    """Greedy list scheduling: each cost starts on the slot that frees first, in the order given."""
    free = [0.0] * slots
    heapq.heapify(free)
    for cost in costs:
        heapq.heappush(free, heapq.heappop(free) + cost)
    return max(free)


def model(batch, heads, seqlen_q, seqlen_k, block_m, block_n, causal, slots, fixed, section, backward=False,
          group=1):
    """(grid order's makespan, longest first's, the ideal). `heads`: query heads, or kv heads for the backward,
    whose block walks the Q tiles of the `group` query heads that share its kv head."""
    pairs = batch * heads
    if backward:
        blocks = -(-seqlen_k // block_n)
        cost = [group * query_tiles(j, block_m, block_n, seqlen_q, seqlen_k, causal) + fixed
                for j in range(blocks)]
        handed_out = [cost[blocks - 1 - b] for b in range(blocks)]  # the order's block b is key tile blocks-1-b
    else:
        blocks = -(-seqlen_q // block_m)
        cost = [key_tiles(m, block_m, block_n, seqlen_q, seqlen_k, causal) + fixed for m in range(blocks)]
        handed_out = cost
    grid = makespan((cost[m] for m, _ in grid_order(blocks, pairs)), slots)
    longest = makespan((handed_out[b] for b, _ in tile_order(blocks, pairs, section)), slots)
    ideal = sum(cost) * pairs / slots
    return grid, longest, ideal


def persistent_model(batch, heads, seqlen, block_m, block_n, causal, sms, fixed, section):
    """(ws's grid, the persistent kernel static, dynamic, the ideal): makespans of the forward's tiles."""
    pairs, blocks = batch * heads, -(-seqlen // block_m)
    cost = [key_tiles(m, block_m, block_n, seqlen, seqlen, causal) + fixed for m in range(blocks)]
    in_order = [cost[m] for m, _ in tile_order(blocks, pairs, section)]
    grid = makespan((cost[m] for m, _ in ws_grid_order(blocks, pairs)), sms)
    return grid, static_makespan(in_order, sms), makespan(in_order, sms), sum(cost) * pairs / sms


def l2_section(heads, batch, seqlen_k, head_dim, l2_bytes=32 << 20):
    """common/cuda/tile_order.hpp's l2_sectioned_order: pairs whose K and V fit l2_bytes together."""
    return max(1, min(l2_bytes // max(4 * seqlen_k * head_dim, 1), heads * batch))


def backward_l2_section(kv_heads, batch, group, seqlen_q, head_dim, l2_bytes=32 << 20):
    """cuda_v2's split_q_bwd_longest_first_order: pairs whose Q, dO (2 bytes each) and fp32 dQ of the group's
    query heads fit l2_bytes together."""
    return max(1, min(l2_bytes // max(8 * group * seqlen_q * head_dim, 1), kv_heads * batch))


def row(label, args, causal, slots, backward=False, group=1):
    grid, longest, ideal = model(args.batch, args.heads, args.seqlen, args.seqlen, args.block_m, args.block_n,
                                 causal, slots, args.fixed, args.section, backward, group)
    print(f"| {label} | {grid / ideal:.3f} | {longest / ideal:.3f} | {grid / longest:.3f} |")


# The report's forward shapes (bench/gpu_report.py, `flashlab gpu-bench --list-shapes --shapes report`): batch,
# heads, seqlen, head dim; and the blocks a SM holds of each entry that runs them (ptxas, nvcc 13, sm_90a).
REPORT = [(2, 16, 8192, 128), (4, 16, 4096, 128), (1, 16, 16384, 128), (8, 16, 2048, 128), (16, 16, 1024, 128),
          (2, 32, 8192, 64), (4, 32, 4096, 64), (1, 32, 16384, 64), (8, 32, 2048, 64), (16, 32, 1024, 64)]
ENTRIES = {128: [("split_q_8warps (1 block a SM)", 128, 64, 1), ("split_q (4 warps, 2 blocks a SM)", 128, 64, 2)],
           64: [("split_q_bc64 (2 blocks a SM)", 128, 64, 2), ("split_q (128 keys, 2 blocks a SM)", 128, 128, 2)]}


# The backward: the report's causal shape (`flashlab gpu-bench --list-shapes --shapes backward`) and its
# neighbours, for the backward kernels' tiles (block_m query rows a step, block_n keys a block) and the blocks
# a SM holds (ptxas, nvcc 13, sm_90a).
BACKWARD_REPORT = [(2, 16, 8192, 128), (4, 16, 4096, 128), (1, 16, 16384, 128), (8, 16, 2048, 128),
                   (2, 32, 8192, 64), (4, 32, 4096, 64)]
BACKWARD_ENTRIES = {128: [("split_q_bwd64x128 (1 block a SM)", 64, 128, 1),
                          ("split_q_bwd128 (1 block a SM)", 32, 128, 1)],
                    64: [("split_q_bwd64x128 (1 block a SM)", 64, 128, 1)]}


# cuda_v3_hopper/ws_persistent's tiles (ws_block_n: 128 x 128 at d 64 and 128), one CTA a SM, on the report's
# shapes with a causal mask.
PERSISTENT_REPORT = [(2, 16, 8192, 128), (1, 16, 16384, 128), (4, 16, 4096, 128), (8, 16, 2048, 128),
                     (16, 16, 1024, 128), (2, 32, 8192, 64), (1, 32, 16384, 64), (16, 32, 1024, 64)]


def persistent_row(batch, heads, seqlen, head_dim, sms, fixed, causal=True, block_m=128, block_n=128):
    grid, static, dynamic, ideal = persistent_model(batch, heads, seqlen, block_m, block_n, causal, sms, fixed,
                                                    l2_section(heads, batch, seqlen, head_dim))
    print(f"| {batch} x {heads} x {seqlen // 1024}k, d {head_dim}, {'causal' if causal else 'non-causal'} | "
          f"{grid / ideal:.3f} | {static / ideal:.3f} | {dynamic / ideal:.3f} | {static / dynamic:.3f} |")


def persistent_header(title):
    print(title)
    print("| shape | ws's grid | persistent, static | persistent, dynamic | static / dynamic |")
    print("|---|---:|---:|---:|---:|")


def report(sms, fixed):
    tables = [(f"Causal, {sms} SMs, a block's fixed part {fixed} key tile(s); makespan / ideal, and the ratio",
               REPORT, ENTRIES, False, l2_section),
              (f"\nThe backward, causal: a block's fixed part {fixed} Q tile(s)", BACKWARD_REPORT,
               BACKWARD_ENTRIES, True, lambda heads, batch, seqlen, head_dim:
               backward_l2_section(heads, batch, 1, seqlen, head_dim))]
    for title, shapes, entries, backward, section in tables:
        print(title)
        print("| shape, entry | grid order | longest first | predicted speed-up |")
        print("|---|---:|---:|---:|")
        for batch, heads, seqlen, head_dim in shapes:
            for name, block_m, block_n, per_sm in entries[head_dim]:
                args = argparse.Namespace(batch=batch, heads=heads, seqlen=seqlen, block_m=block_m,
                                          block_n=block_n, fixed=fixed,
                                          section=section(heads, batch, seqlen, head_dim))
                row(f"{batch} x {heads} x {seqlen // 1024}k, d {head_dim}, {name}", args, True, sms * per_sm,
                    backward)
    persistent_header(f"\ncuda_v3_hopper: ws's grid and ws_persistent's two schedules, 128 x 128 tiles, {sms} "
                      f"CTAs, a tile's fixed part {fixed} key tile(s); makespan / ideal")
    for batch, heads, seqlen, head_dim in PERSISTENT_REPORT:
        persistent_row(batch, heads, seqlen, head_dim, sms, fixed)


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
    # The backward: key tile j of 128 keys is visited from row 128 j on (square causal), the first by every Q
    # tile; bottom-right aligned, with more keys than rows every row sees the first keys, with fewer only the
    # last rows see any.
    assert [query_tiles(j, 64, 128, 512, 512, True) for j in range(4)] == [8, 6, 4, 2]
    assert query_tiles(0, 64, 128, 100, 612, True) == query_tiles(4, 64, 128, 100, 612, True) == 2
    assert query_tiles(0, 64, 128, 612, 100, True) == 2  # rows 512 to 611 of 10 Q tiles
    assert query_tiles(3, 64, 128, 512, 512, False) == 8
    # Its grid already starts each pair's longest key tile first, so with one pair the orders are the same;
    # with many, longest first is within 4/3 of the ideal and the grid is not better.
    assert model(1, 1, 2048, 2048, 64, 128, True, 132, 1, 1, True)[:2] == \
        model(1, 1, 2048, 2048, 64, 128, True, 132, 1, 1, True)[1::-1]
    grid, longest, ideal = model(2, 16, 8192, 8192, 64, 128, True, 132, 1, 4, True)
    assert longest <= ideal * 4 / 3 and grid > longest
    assert backward_l2_section(7, 3, 2, 1000, 128) == 16  # as tests/test_gpu_backward.cpp's order test
    # GQA: a kv head's block walks its group's Q tiles, so 4 query heads over 1 kv head are 4 times the work.
    assert model(1, 1, 512, 512, 64, 128, True, 1, 0, 1, True, 4)[0] == 4 * (8 + 6 + 4 + 2)
    # The persistent kernel: equal tiles (non-causal) in a number of whole waves are the same in every
    # schedule; one CTA takes them all in any; the dynamic schedule is greedy LPT in the order, within 4/3 of
    # the ideal, and the static one is no better than it on the report's causal shapes.
    grid, static, dynamic, ideal = persistent_model(2, 16, 8192, 128, 128, False, 128, 1, 8)
    assert grid == static == dynamic == ideal
    grid, static, dynamic, ideal = persistent_model(1, 2, 512, 128, 128, True, 1, 0, 1)
    assert grid == static == dynamic == ideal == 2 * (1 + 2 + 3 + 4)
    for batch, heads, seqlen, head_dim in PERSISTENT_REPORT:
        grid, static, dynamic, ideal = persistent_model(batch, heads, seqlen, 128, 128, True, 132, 1,
                                                        l2_section(heads, batch, seqlen, head_dim))
        assert dynamic <= ideal * 4 / 3 and static >= dynamic
    assert list(ws_grid_order(3, 2)) == [(2, 0), (1, 0), (0, 0), (2, 1), (1, 1), (0, 1)]
    assert static_makespan([3, 1, 1, 1], 2) == 4 and makespan([3, 1, 1, 1], 2) == 3
    print("wave_model: checks passed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=16, help="query heads (default: 16)")
    parser.add_argument("--kv-heads", type=int, default=0, help="kv heads, the backward's pairs (default: --heads)")
    parser.add_argument("--pass", dest="pass_", choices=["forward", "backward"], default="forward")
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--head-dim", type=int, default=128, help="sizes the L2 sections (default: 128)")
    parser.add_argument("--block-m", type=int, default=128)
    parser.add_argument("--block-n", type=int, default=64)
    parser.add_argument("--blocks-per-sm", type=int, default=1)
    parser.add_argument("--sms", type=int, default=132, help="H100 SXM and H200: 132")
    parser.add_argument("--fixed", type=float, default=1.0, help="a block's own cost, in key tiles (default 1)")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--section", type=int, default=0, help="pairs a section (default: as L2 sizes them)")
    parser.add_argument("--persistent", action="store_true",
                        help="cuda_v3_hopper/ws_persistent's schedules beside ws's grid (--block-n 128 for it)")
    parser.add_argument("--report", action="store_true", help="the report's forward shapes, causal")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if args.check:
        return check()
    if args.report:
        return report(args.sms, args.fixed)
    if args.persistent:
        persistent_header(f"{args.sms} CTAs")
        return persistent_row(args.batch, args.heads, args.seqlen, args.head_dim, args.sms, args.fixed,
                              args.causal, args.block_m, args.block_n)
    backward, group = args.pass_ == "backward", 1
    if backward:  # the blocks are (batch, kv head) pairs' key tiles, each over its group's query heads
        kv_heads = args.kv_heads or args.heads
        if args.heads % kv_heads:
            parser.error(f"--heads ({args.heads}) must be a multiple of --kv-heads ({kv_heads})")
        group = args.heads // kv_heads
        if args.section <= 0:
            args.section = backward_l2_section(kv_heads, args.batch, group, args.seqlen, args.head_dim)
        args.heads = kv_heads
    elif args.section <= 0:
        args.section = l2_section(args.heads, args.batch, args.seqlen, args.head_dim)
    print("| shape | grid order | longest first | predicted speed-up |")
    print("|---|---:|---:|---:|")
    row(f"{args.batch} x {args.heads} x {args.seqlen}, {'causal' if args.causal else 'non-causal'}"
        f"{', backward' if backward else ''}", args, args.causal, args.sms * args.blocks_per_sm, backward, group)


if __name__ == "__main__":
    sys.exit(main())
