#!/usr/bin/env bash
# The FLOP and byte counts the tool writes for others to divide by (common/flops.cpp, the one place they are made):
# `gpu-bench --list-shapes` gives each shape its counts (bench/peers_torch.py takes its rates from them), and
# `run --json` gives the problem's (bench/peers_cpu.py does). Here: the counts of known shapes, worked out by hand.
# Usage: tool_counts.sh FLASHLAB_BINARY
set -euo pipefail
tool=$1
fail() { echo "counts: $*" >&2; exit 1; }

# The quick set: 2 x 4 heads, 1024 x 1024; d 64 non-causal, then d 128 causal (row i sees i + 1 keys).
"$tool" gpu-bench --list-shapes --shapes quick | python3 -c '
import json, sys
shapes = json.load(sys.stdin)
pairs = [1024 * 1024, 1024 * 1025 // 2]
for s, d, visible in zip(shapes, (64, 128), pairs):
    c = s["counts"]
    flops = 4 * 2 * 4 * visible * d
    assert c["forward_flops"] == flops, (s, flops)
    assert c["backward_flops"] == flops * 5 // 2, (s, flops * 5 // 2)
    qkvo = 4 * 2 * 1024 * 4 * d  # Q, K, V and O, each 2 x 1024 x 4 x d
    lse = 4 * 2 * 4 * 1024       # float32
    expected = {"bf16": 2 * qkvo + lse, "f16": 2 * qkvo + lse, "f32": 4 * qkvo + lse}
    assert c["forward_min_bytes"] == expected, (s, expected)
' || fail "gpu-bench --list-shapes: the counts are not the shapes' own"

# GQA: 8 query heads over 2 KV heads, 1 x 100 queries over 300 keys, d 32, fp32.
"$tool" run naive/one_pass --heads 8 --kv-heads 2 --seqlen-q 100 --seqlen-k 300 --head-dim 32 --repeat 1 \
  --no-check --json | python3 -c '
import json, sys
p = json.load(sys.stdin)["problem"]
assert abs(p["gflop"] - 4 * 8 * 100 * 300 * 32 / 1e9) < 1e-12, p
assert p["min_bytes"] == 4 * (2 * 8 * 100 * 32 + 2 * 2 * 300 * 32) + 4 * 8 * 100, p
' || fail "run --json: the problem's counts are not its own"
# profile --pass backward: one backward pass counted (its four launches), the backward's FLOPs (2.5x the forward's)
# and its minimum bytes (Q, K, V, O, dO and LSE read once, dQ, dK and dV written once), here in bf16. The
# sanitizer's build refuses to count (its emulated code does not see every access): there this check says so
# and does not run.
rc=0
errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
profiled=$("$tool" profile cuda_v2/split_q_bwd64x128 --pass backward --heads 2 --kv-heads 1 --seqlen-q 100 \
  --seqlen-k 150 --head-dim 64 --dtype bf16 --json 2>"$errors") || rc=$?
if [[ $rc == 2 && $(<"$errors") == *"the sanitizer's"* ]]; then
  echo "counts: profile --pass backward not checked in this build: $(sed 's/^flashlab: //' "$errors")"
else
  [[ $rc == 0 ]] || fail "profile --pass backward: exit $rc, $(<"$errors")"
  python3 -c '
import json, sys
c = json.load(sys.stdin)
assert c["pass"] == "backward" and c["passed"] and c["launches"] == 4, c
assert c["flops"] == 2.5 * 4 * 2 * 100 * 150 * 64, c["flops"]
q, kv = 100 * 2 * 64, 150 * 1 * 64
assert c["model_bytes"] == 2 * (4 * q + 4 * kv) + 4 * 2 * 100, c["model_bytes"]
' <<<"$profiled" || fail "profile --pass backward: the counts are not the backward's"
fi
rc=0
message=$("$tool" profile cuda_v2/split_q --pass sideways 2>&1) || rc=$?
[[ $rc == 2 && $message == *"--pass (sideways)"* ]] || fail "profile --pass sideways: exit $rc, '$message'"
echo "counts: ok"
