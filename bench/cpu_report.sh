#!/usr/bin/env bash
# The CPU figures behind the README's stage table and the issues' goals, in one run, written to OUTDIR:
# report.md (every command with its output) and the JSON each command printed. Run it on a quiet machine:
# other work on the cores changes every number here.
#
#   bench/cpu_report.sh OUTDIR        (after ./flashlab test or any build)
set -euo pipefail
out=${1:?usage: bench/cpu_report.sh OUTDIR}
mkdir -p "$out"
out="$(cd "$out" && pwd)"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tool=build/bin/flashlab   # relative to the repository root, so that the report shows commands anyone can run
report="$out/report.md"
commit=$(git -C "$root" rev-parse --short HEAD)

{
  echo "# CPU results"
  echo
  echo "- machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
  echo "- date: $(date -u +%Y-%m-%d), commit: $commit"
  echo "- load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "- made by: bench/cpu_report.sh"
} >"$report"

# Runs one tool command, records it and its output in the report, and keeps its JSON (when --json is given).
step() {
  local title=$1 json=$2
  shift 2
  echo "== $title" >&2
  {
    echo
    echo "## $title"
    echo
    echo '```'
    echo "\$ $*"
  } >>"$report"
  local status=0
  if [[ -n "$json" ]]; then
    "$@" --json >"$out/$json" || status=$?
    echo "(JSON: $json, exit $status)" >>"$report"
  else
    "$@" >>"$report" 2>&1 || status=$?
    [[ $status -ne 0 ]] && echo "(exit $status)" >>"$report"
  fi
  echo '```' >>"$report"
}

cd "$root"
step "Machine ceilings" "" "$tool" machine
step "Machine ceilings (JSON)" machine.json "$tool" machine
step "Naive stage, default problem" "" "$tool" compare naive/three_pass naive/online_softmax naive/one_pass naive/standard_gemm
T="--heads 4 --seqlen-q 4096 --head-dim 128 --repeat 3"
step "cpu_tiled, 4 x 4096 x 4096, d 128, non-causal" "" "$tool" compare cpu_tiled/forward cpu_tiled/fa1_order naive/standard_gemm $T
step "cpu_tiled, causal" "" "$tool" compare cpu_tiled/forward cpu_tiled/fa1_order $T --causal
step "cpu_tiled, one thread" "" env OMP_NUM_THREADS=1 "$tool" compare cpu_tiled/forward $T
M="--heads 1 --seqlen-q 16384 --head-dim 64 --repeat 1 --no-check"
step "Memory at 16384 x 16384, d 64: cpu_tiled/forward" mem-forward.json "$tool" run cpu_tiled/forward $M
step "Memory at 16384 x 16384, d 64: cpu_tiled/fa1_order" mem-fa1.json "$tool" run cpu_tiled/fa1_order $M
step "Memory at 16384 x 16384, d 64: naive/standard_gemm" mem-gemm.json "$tool" run naive/standard_gemm $M
D="--batch 1 --heads 32 --kv-heads 8 --seqlen-q 1 --seqlen-k 131072 --head-dim 128 --repeat 11"
step "Decoding, 32/8 heads, 131072 keys, d 128" "" "$tool" compare decoding/split_kv decoding/unified_max cpu_tiled/forward $D
step "Decoding, paged (page 256)" "" "$tool" compare decoding/split_kv decoding/unified_max $D --page-size 256
step "Backward, 4 x 4096 x 4096, d 128" "" "$tool" compare --backward cpu_tiled/backward cpu_tiled/backward_dq_pass naive/backward $T
step "FP8 accuracy (FlashAttention-3 Table 3)" "" "$tool" fp8-accuracy
step "Roofline, default problem" "" "$tool" roofline --svg "${out#"$root"/}/roofline.svg"  # relative when OUTDIR is in the repository
echo "wrote $report" >&2
