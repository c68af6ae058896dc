#!/usr/bin/env python3
"""A course exercise driven from Python: FlashAttention's central idea, the online softmax, written by you in
NumPy and checked through the module against flashlab's own stage and the fp64 reference, on the cases that
catch the usual mistakes (the course's C++ version of it: `./flashlab exercise start online-softmax`).

    python3 examples/exercise_online_softmax.py              # checks your online_softmax_attention() below
    python3 examples/exercise_online_softmax.py --solution   # checks the worked solution instead
    python3 examples/exercise_online_softmax.py --self-test  # the checker itself: the solution passes, a known
                                                             # mistake fails, the empty skeleton is reported

The task (docs/01-softmax.md, sections 3 and 4; docs/conventions.md §4 for the rows that see no key): compute
O = softmax(S) V and LSE = log(sum exp(S)) for S = scale Q K^T in ONE pass over the keys, a tile of `tile` keys
at a time, keeping per query row only a running max m, a running sum l and an unnormalized output acc. When a
tile raises the max, what was summed so far is in the old max's units: rescale l and acc by exp(m_old - m_new).
A row that sees no key (causal with more queries than keys) has O = 0 and LSE = -inf.
"""
import argparse
import sys

try:
    import numpy as np
except ImportError:
    print("skipped: NumPy is not installed (pip install numpy)")
    sys.exit(77)

import flashlab


def online_softmax_attention(q, k, v, visible, scale, tile):
    """Yours to write. q [sq, d], k and v [sk, d] (one head, float64), visible [sq, sk] bool (the mask), the
    softmax scale and the key tile. Returns O [sq, d] and LSE [sq]."""
    raise NotImplementedError("online_softmax_attention() is yours to write")


def solution(q, k, v, visible, scale, tile, rescale=True):
    sq, d = q.shape
    m = np.full(sq, -np.inf)
    l = np.zeros(sq)
    acc = np.zeros((sq, d))
    for j0 in range(0, k.shape[0], tile):
        s = np.where(visible[:, j0:j0 + tile], scale * q @ k[j0:j0 + tile].T, -np.inf)
        m_new = np.maximum(m, s.max(axis=1))
        m_used = np.where(m_new == -np.inf, 0.0, m_new)  # a row that has seen nothing: exp(-inf - 0) = 0
        factor = np.exp(m - m_used) if rescale else np.ones(sq)
        p = np.exp(s - m_used[:, None])
        l = l * factor + p.sum(axis=1)
        acc = acc * factor[:, None] + p @ v[j0:j0 + tile]
        m = m_new
    empty = l == 0
    o = np.where(empty[:, None], 0.0, acc / np.where(empty, 1.0, l)[:, None])
    lse = np.where(empty, -np.inf, m + np.log(np.where(empty, 1.0, l)))
    return o, lse


def mistake(q, k, v, visible, scale, tile):
    """A known mistake, for the self-test: the max is raised without rescaling what was accumulated."""
    return solution(q, k, v, visible, scale, tile, rescale=False)


# The cases: name, (batch, sq, sk, heads, kv_heads, d), causal, value scale, key tile.
CASES = [
    ("one tile", (1, 5, 7, 2, 2, 16), False, 1.0, 32),
    ("awkward lengths, tiles of 16", (2, 37, 53, 4, 2, 16), False, 1.0, 16),
    ("the max grows late: scores ~ 30", (1, 9, 70, 2, 2, 8), False, 10.0, 16),
    ("causal, bottom-right", (1, 33, 50, 2, 1, 16), True, 1.0, 16),
    ("causal, more queries than keys: rows that see no key", (1, 20, 12, 2, 2, 8), True, 1.0, 8),
]


def check(attention):
    """Runs `attention` on every case, head by head, against flashlab's naive/online_softmax and the fp64
    reference; returns the failures (one line each, with a hint)."""
    failures = []
    rng = np.random.default_rng(0)
    for name, (batch, sq, sk, heads, kv_heads, d), causal, magnitude, tile in CASES:
        q = (magnitude * rng.standard_normal((batch, sq, heads, d))).astype(np.float32)
        k = (magnitude * rng.standard_normal((batch, sk, kv_heads, d))).astype(np.float32)
        v = rng.standard_normal((batch, sk, kv_heads, d)).astype(np.float32)
        stage_o, stage_lse = flashlab.attention(q, k, v, impl="naive/online_softmax", causal=causal)
        scale = 1.0 / np.sqrt(d)
        rows = np.arange(sq)[:, None] + (sk - sq)  # bottom-right: row i sees keys up to i + sk - sq
        visible = np.arange(sk)[None, :] <= rows if causal else np.ones((sq, sk), bool)
        o_bad = lse_bad = 0
        for b in range(batch):
            for h in range(heads):
                kv = h // (heads // kv_heads)
                args = (q[b, :, h].astype(np.float64), k[b, :, kv].astype(np.float64),
                        v[b, :, kv].astype(np.float64))
                o, lse = attention(*args, visible, scale, tile)
                o_ref, lse_ref = solution(*args, visible, scale, k.shape[1])  # one tile: the plain softmax
                o_bad += not (np.allclose(o, o_ref, atol=1e-9, rtol=1e-9)
                              and np.allclose(o, stage_o[b, :, h], atol=1e-5, rtol=0))
                lse_bad += not (np.allclose(lse, lse_ref, atol=1e-9, rtol=1e-9, equal_nan=False)
                                and np.allclose(lse, stage_lse[b, h], atol=1e-4, rtol=1e-6))
        if o_bad or lse_bad:
            hint = ("O is wrong but the LSE is right: when the max grows, is acc rescaled by exp(m_old - m_new), "
                    "like l?" if o_bad and not lse_bad else
                    "the LSE is wrong but O is right: LSE = m + log(l), natural log, -inf for a row that sees "
                    "nothing" if lse_bad and not o_bad else
                    "O and the LSE are wrong: start from the one-tile case; a row that sees no key has O = 0")
            failures.append(f"{name}: {o_bad} heads with a wrong O, {lse_bad} with a wrong LSE. {hint}")
        print(("FAIL " if o_bad or lse_bad else "ok   ") + name)
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--solution", action="store_true", help="check the worked solution")
    parser.add_argument("--self-test", action="store_true", help="check the checker")
    args = parser.parse_args()
    if args.self_test:
        ok = not check(solution)
        print("the solution passes" if ok else "FAIL: the solution does not pass")
        caught = bool(check(mistake))
        print("the known mistake fails" if caught else "FAIL: the known mistake passes")
        try:
            check(online_softmax_attention)
            skeleton = False
        except NotImplementedError:
            skeleton = True
        print("the skeleton is reported as not written" if skeleton else "FAIL: the skeleton ran")
        sys.exit(0 if ok and caught and skeleton else 1)
    try:
        failures = check(solution if args.solution else online_softmax_attention)
    except NotImplementedError as error:
        print(f"not yet: {error} (or run with --solution)")
        sys.exit(1)
    for failure in failures:
        print("  " + failure)
    print("all cases pass" if not failures else f"{len(failures)} of {len(CASES)} cases fail")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
