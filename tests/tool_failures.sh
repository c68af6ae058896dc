#!/usr/bin/env bash
# What an implementation that fails as it runs costs in the tool's tables: its own row, never the table. The
# failure is injected (FLASHLAB_INJECT=fault:IMPL, tools/command.hpp) as a GPU fault that leaves the device
# unusable: the row says FAILED with the error, each later GPU implementation is refused with the reason (a new
# process can run it), a CPU one still runs, and the exit code is 1. gpu-bench --json-lines streams the same rows,
# each measurement announced first (bench/gpu_report.py reads them so).
# Usage: tool_failures.sh FLASHLAB_BINARY [--no-ladder]   (--no-ladder: the sanitizer build, where the whole
# ladder's CPU stages take two minutes; the failure paths it takes are the ones checked above it)
set -uo pipefail
tool=$1
ladder=${2:-}
fail() { echo "failures: $*" >&2; exit 1; }
small=(--heads 2 --seqlen-q 64 --head-dim 64 --repeat 1)
lost="not run: the GPU was left unusable by cuda_v2/split_q's failure (an injected fault)"

for pass in "" --backward; do
  # The forward's and the backward's: the failing stage, a GPU stage after it, a CPU stage.
  [[ $pass == --backward ]] && stages=(cuda_v2/split_q cuda_v2/split_q_bwd128 cpu_tiled/backward) ||
    stages=(cuda_v2/split_q cuda_v2/split_q_simt cpu_tiled/forward)
  out=$(FLASHLAB_INJECT=fault:cuda_v2/split_q "$tool" compare "${stages[@]}" $pass "${small[@]}" 2>&1)
  rc=$?
  [[ $rc == 1 ]] || fail "compare $pass with a failing implementation exited $rc: $out"
  grep -qE "^cuda_v2/split_q +(emu|cuda) +FAILED: an injected fault" <<<"$out" ||
    fail "compare $pass: the failure is not in its row: $out"
  grep -qF "skipped: $lost" <<<"$out" || fail "compare $pass: the GPU stage after it is not refused: $out"
  grep -qE "^${stages[2]} +cpu +[0-9.e+-]+ +[0-9.e+-]+ " <<<"$out" || fail "compare $pass: the CPU stage did not run: $out"
done

# The whole ladder (compare with no arguments) runs one table per problem in one process: the lost GPU is the
# process's, so a GPU stage in a later table is refused too, and the later tables' CPU stages still run.
if [[ $ladder != --no-ladder ]]; then
  out=$(FLASHLAB_INJECT=fault:cuda_v2/split_q "$tool" compare 2>&1)
  rc=$?
  [[ $rc == 1 ]] || fail "the ladder with a failing implementation exited $rc: $out"
  grep -qF "decoding/cuda_split_kv" <<<"$(grep -F "skipped: $lost" <<<"$out")" ||
    fail "the ladder: a GPU stage in a later table is not refused: $out"
  grep -qE "^decoding/split_kv +cpu +[0-9.e+-]+ +[0-9.e+-]+ +yes" <<<"$out" ||
    fail "the ladder: a later table's CPU stage did not run: $out"
fi

# gpu-bench: the rows as they come, the failed one with its error, the ones after it refused; exit 1.
out=$(FLASHLAB_INJECT=fault:cuda_v2/split_q "$tool" gpu-bench cuda_v2/split_q cuda_v2/split_q_simt --emulate \
  --batch 1 --heads 2 --seqlen-q 64 --head-dim 64 --json-lines 2>/dev/null)
rc=$?
[[ $rc == 1 ]] || fail "gpu-bench with a failing implementation exited $rc: $out"
python3 -c '
import json, sys
records = [json.loads(line) for line in sys.stdin if line.strip()]
assert records[0] == {"measuring": "cuda_v2/split_q", "dtype": "f16"}, records[0]
assert records[1]["impl"] == "cuda_v2/split_q" and records[1]["failed"].startswith("an injected fault"), records[1]
assert records[1]["time_ms"] is None and "skipped" not in records[1], records[1]
assert records[2]["impl"] == "cuda_v2/split_q_simt" and records[2]["skipped"].startswith(sys.argv[1]), records[2]
assert len(records) == 3, records
' "$lost" <<<"$out" || fail "gpu-bench --json-lines with a failing implementation: $out"
# Without a failure: each measurement announced, then its row with a time; exit 0.
out=$("$tool" gpu-bench cuda_v2/split_q --emulate --batch 1 --heads 2 --seqlen-q 64 --head-dim 64 --json-lines \
  2>/dev/null) || fail "gpu-bench --json-lines exited $?: $out"
python3 -c '
import json, sys
records = [json.loads(line) for line in sys.stdin if line.strip()]
assert [r.get("measuring") for r in records] == ["cuda_v2/split_q", None], records
assert records[1]["time_ms"] > 0 and "failed" not in records[1] and "skipped" not in records[1], records
' <<<"$out" || fail "gpu-bench --json-lines without a failure: $out"

# A problem too large for the GPU's memory (FLASHLAB_INJECT=oom:IMPL, as a failed device allocation throws) is
# the problem's size, not a failure: its row says so as a refusal's would, the device stays usable (the next GPU
# stage runs), and the exit code is 0 (`run`, one stage, exits 2 with the message).
too_large="the problem is too large for this device's memory"
out=$(FLASHLAB_INJECT=oom:cuda_v2/split_q "$tool" gpu-bench cuda_v2/split_q cuda_v2/split_q_simt --emulate \
  --batch 1 --heads 2 --seqlen-q 64 --head-dim 64 --json-lines 2>/dev/null) ||
  fail "gpu-bench with a shape too large for one implementation exited $?: $out"
python3 -c '
import json, sys
rows = [json.loads(line) for line in sys.stdin if line.strip() and "measuring" not in json.loads(line)]
assert rows[0]["impl"] == "cuda_v2/split_q" and sys.argv[1] in rows[0]["skipped"], rows[0]
assert rows[0]["time_ms"] is None and "failed" not in rows[0], rows[0]
assert rows[1]["impl"] == "cuda_v2/split_q_simt" and rows[1]["time_ms"] > 0 and "skipped" not in rows[1], rows[1]
assert len(rows) == 2, rows
' "$too_large" <<<"$out" || fail "gpu-bench --json-lines with a shape too large for one implementation: $out"
for pass in "" --backward; do
  [[ $pass == --backward ]] && stages=(cuda_v2/split_q cuda_v2/split_q_bwd128) ||
    stages=(cuda_v2/split_q cuda_v2/split_q_simt)
  out=$(FLASHLAB_INJECT=oom:cuda_v2/split_q "$tool" compare "${stages[@]}" $pass "${small[@]}" 2>&1) ||
    fail "compare $pass with a problem too large for one implementation exited $?: $out"
  grep -qE "^cuda_v2/split_q +(emu|cuda) +skipped: .*$too_large" <<<"$out" ||
    fail "compare $pass: the problem's size is not in its row: $out"
  grep -qE "^${stages[1]} +(emu|cuda) +[0-9.e+-]+ " <<<"$out" || fail "compare $pass: the GPU stage after it did not run: $out"
done

# A drill written wrong is refused by name (exit 2).
out=$(FLASHLAB_INJECT=crash:x "$tool" compare cpu_tiled/forward "${small[@]}" 2>&1)
[[ $? == 2 ]] && grep -qF "FLASHLAB_INJECT (crash:x) must be fault:IMPL, hang:IMPL or oom:IMPL" <<<"$out" ||
  fail "a bad FLASHLAB_INJECT was not refused by name: $out"
exit 0
