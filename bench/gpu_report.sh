#!/usr/bin/env bash
# The one script to run on a GPU machine:
#
#   bash bench/gpu_report.sh OUTDIR
#
# 1. builds (release preset, CUDA on) if needed;
# 2. runs the tests that need the GPU: the shared harness over every GPU implementation on the GPU
#    (harness_gpu: the Hopper kernels' ablation rungs included), and the `harness` entry, whose emulator tests
#    then run their kernels on the GPU too and compare the emulator's shuffles, votes, ldmatrix, mma.sync and
#    cp.async with the hardware's, and whose FP8 tests (test_hopper_fp8.cpp) check the Hopper FP8 pre-pass
#    bit for bit and its kernel within the derived bound on the GPU as in the emulator;
# 3. runs `flashlab fp8-accuracy --device cuda` (FA3's Table 3 with the FP8 rows from the Hopper kernel); the
#    stages' former self-tests are folded into the harness, where the emulator runs them too;
# 4. runs compute-sanitizer: memcheck on the FP8 tests and on the shared harness over the GPU implementations
#    on the GPU (the case matrix, small shapes), racecheck on a small case of every GPU implementation
#    (`flashlab run IMPL ...`: awkward lengths, GQA, causal, padding), and the same on cuda_v2's backward
#    (memcheck over the case matrix, racecheck on `flashlab grad cuda_v2/split_q`);
# 5. times our GPU implementations on device pointers (`flashlab gpu-bench --json`) and the PyTorch SDPA peers
#    (bench/peers_torch.py) on the same shapes, same device, same run;
# 6. writes OUTDIR/results-<device>-<date>.json (SPEC's results schema) and a Markdown table next to it, plus
#    the logs of every step (OUTDIR/*.log, each step's exit code in OUTDIR/exit_codes.txt), `flashlab machine`
#    (machine.txt, machine.json: the GPU rows), the GPU roofline (roofline_gpu.txt, roofline_gpu.svg) and
#    cuda_v2's backward checked and timed on the GPU (grad_gpu_*.txt). Copy
#    the .json, .md and .svg into docs/results/ and commit them. FA3's ablation ladder is in the tables: its
#    rungs (cuda_v3_hopper/ws, ws_no_overlap, ws_no_pingpong, ws_no_producer) are implementations like any.
#
# Every step has its own time limit; the whole run stays within 10 minutes on an H100 (typical: build 1.5 min
# from scratch, tests 1, self-tests 1, compute-sanitizer 2-3, our benchmarks at most 2.5, peers at most 2).
# A failing step is reported in the summary (and the exit code is 1), and the later steps still run. An
# implementation this GPU cannot run (cuda_v3_hopper/ws and /fp8 off Hopper) is reported and left out of the
# steps.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: bash bench/gpu_report.sh OUTDIR" >&2
  exit 2
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(mkdir -p "$1" && cd "$1" && pwd)"
cd "$root"
flashlab=build/bin/flashlab
started=$(date +%s)
status=0
summary=()
note() { summary+=("$1"); echo "== $1"; }
elapsed() { echo "$(( $(date +%s) - started ))s"; }
# step NAME LOG SECONDS COMMAND...: runs a command under a time limit with its output in OUTDIR/LOG, records
# its exit code in OUTDIR/exit_codes.txt and the summary; a non-zero exit marks the run failed and the script
# goes on.
step() {
  local name=$1 log=$2 seconds=$3
  shift 3
  timeout "$seconds" "$@" >"$out/$log" 2>&1
  local rc=$?
  echo "$rc $name" >>"$out/exit_codes.txt"
  if [[ $rc -eq 0 ]]; then
    note "$name: ok ($(elapsed))"
  else
    [[ $rc -eq 124 ]] && echo "(timed out after ${seconds}s)" >>"$out/$log"
    note "$name: FAILED, exit code $rc$([[ $rc -eq 124 ]] && echo ", timed out") (see $log)"
    status=1
  fi
}
: >"$out/exit_codes.txt"

nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true  # driver, clocks and what else runs on the device

# ---- 1. build (CUDA required: configuring with FLASHLAB_CUDA=ON fails clearly when nvcc is missing)
if [[ -f build/CMakeCache.txt ]]; then
  configure=(cmake -S . -B build -DFLASHLAB_CUDA=ON)
else
  configure=(cmake --preset release -DFLASHLAB_CUDA=ON)
fi
"${configure[@]}" >"$out/configure.log" 2>&1 || { note "configure FAILED (see configure.log)"; exit 1; }
if ! timeout 300 cmake --build build -j"$(nproc)" >"$out/build.log" 2>&1; then
  note "build FAILED (see build.log)"
  exit 1
fi
note "build ok ($(elapsed))"

# The GPU implementations and the dtype each is benchmarked in, from the registry. One that would run in the
# CPU emulator here (this GPU cannot run its build) counts as unavailable: nothing below measures emulation.
mapfile -t gpu_impls < <("$flashlab" list --json | python3 -c '
import json, sys
for impl in json.load(sys.stdin):
    if impl["device"] == "cuda":
        reason = impl["reason"] if not impl["available"] else impl["emulation_reason"]
        print(impl["name"], impl["dtypes"][0], "ok" if not reason else reason.replace(" ", "_"))')
if [[ ${#gpu_impls[@]} -eq 0 ]]; then
  note "no GPU implementation is registered"
  exit 1
fi
available=()
for line in "${gpu_impls[@]}"; do
  read -r name dtype availability <<<"$line"
  if [[ "$availability" == ok ]]; then
    available+=("$line")
  elif [[ "$availability" == no_CUDA_device* || "$availability" == built_without_CUDA* ]]; then
    note "$name is unavailable here: ${availability//_/ } (a CUDA build on a GPU machine is needed)"
    exit 1
  else  # this GPU cannot run it (e.g. an architecture it needs): reported, and left out of the steps below
    note "$name is left out: ${availability//_/ }"
  fi
done
gpu_impls=("${available[@]}")

# ---- 2. CUDA tests: the harness on the GPU, and the emulator's kernels on the GPU beside the emulator
if timeout 300 ctest --test-dir build -R '^(harness|harness_gpu)$' --output-on-failure >"$out/ctest_cuda.log" 2>&1; then
  note "ctest harness, harness_gpu passed ($(elapsed))"
else
  note "ctest harness, harness_gpu FAILED (see ctest_cuda.log)"
  status=1
fi

# ---- 3. FA3's Table 3 with the FP8 rows from the Hopper kernel
has_fp8=0  # whether cuda_v3_hopper/fp8 runs here (compute capability 9.0)
for line in "${gpu_impls[@]}"; do
  [[ $line == "cuda_v3_hopper/fp8 "* ]] && has_fp8=1
done
if [[ $has_fp8 -eq 1 ]]; then
  step "flashlab fp8-accuracy --device cuda" fp8_accuracy_cuda.log 240 "$flashlab" fp8-accuracy --device cuda
else
  note "fp8-accuracy --device cuda not run: this GPU is not compute capability 9.0"
fi

# ---- 4. compute-sanitizer: memcheck on the self-tests and the harness, racecheck on every implementation
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer \
  /usr/local/cuda*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
small_cases=("--batch 2 --heads 4 --kv-heads 2 --seqlen-q 97 --seqlen-k 203 --head-dim 64 --causal"
             "--batch 3 --heads 8 --kv-heads 2 --seqlen-q 4 --seqlen-k 700 --head-dim 128 --causal --seqlens-k 700,0,333")
if [[ -z "$sanitizer" ]]; then
  note "compute-sanitizer NOT FOUND: memcheck and racecheck were not run"
  echo "127 compute-sanitizer (not found)" >>"$out/exit_codes.txt"
  status=1
else
  memcheck=("$sanitizer" --tool memcheck --error-exitcode 3)
  if [[ $has_fp8 -eq 1 ]]; then  # the FP8 pre-pass and kernel checks (their GPU subcases)
    step "memcheck the FP8 tests" sanitizer_memcheck_fp8.log 180 \
      "${memcheck[@]}" build/tests/flashlab_tests --test-case="the FP8*"
  fi
  # Every GPU implementation through the registry adapter on the GPU, on the harness's case matrix (small
  # shapes, paged K/V included).
  step "memcheck flashlab_tests (the GPU implementations)" sanitizer_memcheck_flashlab_tests.log 240 \
    env FLASHLAB_DEVICE=cuda FLASHLAB_REQUIRE_GPU=1 "${memcheck[@]}" build/tests/flashlab_tests \
    --test-case="every implementation matches the fp64 reference on the case matrix"
  # The GPU backward (cuda_v2/split_q's) on the case matrix, and racecheck on one of its small cases.
  step "memcheck flashlab_tests (the GPU backward)" sanitizer_memcheck_backward.log 150 \
    env FLASHLAB_DEVICE=cuda FLASHLAB_REQUIRE_GPU=1 FLASHLAB_IMPL='cuda_v2/split_q$' "${memcheck[@]}" \
    build/tests/flashlab_tests --test-case="every backward matches the fp64 reference backward on the case matrix"
  # shellcheck disable=SC2086
  step "racecheck flashlab grad cuda_v2/split_q" sanitizer_racecheck_backward.log 90 \
    "$sanitizer" --tool racecheck --error-exitcode 3 "$flashlab" grad cuda_v2/split_q ${small_cases[0]} \
    --dtype bf16 --repeat 1
  for line in "${gpu_impls[@]}"; do
    read -r name dtype _ <<<"$line"
    log="$out/sanitizer_racecheck_${name//\//_}.log"
    : >"$log"
    ok=1
    ran=0
    for case_flags in "${small_cases[@]}"; do
      # shellcheck disable=SC2086
      timeout 90 "$sanitizer" --tool racecheck --error-exitcode 3 "$flashlab" run "$name" $case_flags \
        --dtype "$dtype" --repeat 1 >>"$log" 2>&1
      rc=$?
      echo "(exit code $rc: $case_flags)" >>"$log"
      if [[ $rc -eq 2 ]]; then  # the implementation refuses this case (e.g. seqlen_q 97 for decoding)
        continue
      fi
      ran=$((ran + 1))
      [[ $rc -ne 0 ]] && ok=0
      break  # racecheck is the slow one: one case that the implementation runs
    done
    echo "$([[ $ok -eq 1 && $ran -gt 0 ]] && echo 0 || echo 1) racecheck $name" >>"$out/exit_codes.txt"
    if [[ $ran -eq 0 ]]; then
      note "compute-sanitizer racecheck $name: no small case runs on it (see $(basename "$log"))"
      status=1
    elif [[ $ok -eq 1 ]]; then
      note "compute-sanitizer racecheck $name: clean ($(elapsed))"
    else
      note "compute-sanitizer racecheck $name: FAILED (see $(basename "$log"))"
      status=1
    fi
  done
fi

# ---- 5. benchmarks: ours, then the peers on the same shapes
"$flashlab" gpu-bench --list-shapes --shapes all >"$out/shapes.json"
: >"$out/gpu_bench.log"
# Each set separately, with a budget after which gpu-bench stops starting shapes (and still writes its JSON),
# and a hard limit above it.
for set_and_budget in sweep:110 occupancy:30 decode:30; do
  set_name=${set_and_budget%%:*}
  budget=${set_and_budget##*:}
  if timeout $((budget + 40)) "$flashlab" gpu-bench --json --shapes "$set_name" --max-seconds "$budget" \
      >"$out/ours_$set_name.json" \
      2>>"$out/gpu_bench.log"; then
    note "flashlab gpu-bench --shapes $set_name done ($(elapsed))"
  else
    note "flashlab gpu-bench --shapes $set_name FAILED or timed out (see gpu_bench.log)"
    echo '{"rows": []}' >"$out/ours_$set_name.json"
    status=1
  fi
done
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>"$out/peers.log"; then
  if timeout 110 python3 bench/peers_torch.py --shapes "$out/shapes.json" --dtypes bf16 --repeat 10 --out "$out/peers.json" \
      2>>"$out/peers.log"; then
    note "PyTorch SDPA peers done ($(elapsed))"
  else
    note "PyTorch SDPA peers FAILED or timed out (see peers.log)"
    status=1
  fi
else
  note "PyTorch with CUDA is not installed: no peers measured (see peers.log)"
fi

# The machine's ceilings with its GPU rows, and the GPU implementations on the roofline (bf16, FA2's shape).
step "flashlab machine" machine.txt 120 "$flashlab" machine
step "flashlab machine --json" machine.json 120 "$flashlab" machine --json
gpu_names=()
for line in "${gpu_impls[@]}"; do
  read -r name _ <<<"$line"
  gpu_names+=("$name")
done
step "flashlab roofline (GPU, bf16)" roofline_gpu.txt 180 "$flashlab" roofline "${gpu_names[@]}" --dtype bf16 \
  --batch 4 --heads 16 --seqlen-q 4096 --head-dim 128 --svg "$out/roofline_gpu.svg"

# The GPU backward: checked against the fp64 reference backward and timed on device (FA2's backward shape).
step "flashlab grad cuda_v2/split_q (GPU, bf16, causal)" grad_gpu_causal.txt 90 "$flashlab" grad cuda_v2/split_q \
  --dtype bf16 --causal --batch 2 --heads 16 --seqlen-q 2048 --head-dim 128
step "flashlab grad cuda_v2/split_q (GPU, f16, d 64)" grad_gpu_d64.txt 90 "$flashlab" grad cuda_v2/split_q \
  --dtype f16 --batch 2 --heads 16 --kv-heads 4 --seqlen-q 2048 --head-dim 64

# ---- 6. results JSON and Markdown table
command_line="bash bench/gpu_report.sh $1"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[[ -n "$(git status --porcelain 2>/dev/null)" ]] && commit="$commit (with uncommitted changes)"
printf '%s\n' "${summary[@]}" >"$out/summary.txt"
python3 - "$out" "$commit" "$command_line" <<'EOF'
import datetime, json, os, re, sys
out, commit, command = sys.argv[1:4]
sweep = json.load(open(os.path.join(out, "ours_sweep.json")))
occupancy = json.load(open(os.path.join(out, "ours_occupancy.json")))
decode = json.load(open(os.path.join(out, "ours_decode.json")))
ours = dict(occupancy, **{k: v for k, v in sweep.items() if v is not None})
ours["rows"] = sweep["rows"] + occupancy["rows"] + decode["rows"]
peers_path = os.path.join(out, "peers.json")
peers = json.load(open(peers_path)) if os.path.exists(peers_path) else {"rows": []}
device = ours.get("device") or peers.get("device") or "unknown GPU"
date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
result = {"device": device, "date": date, "commit": commit, "command": command,
          "copy_gbps": ours.get("copy_gbps"), "bf16_gemm_tflops": ours.get("bf16_gemm_tflops"),
          "rows": ours["rows"] + peers["rows"]}
if "torch" in peers:
    result["peers"] = {"torch": peers["torch"], "cudnn": peers["cudnn"]}
stem = "results-" + re.sub(r"[^A-Za-z0-9]+", "-", device).strip("-").lower() + "-" + date
json.dump(result, open(os.path.join(out, stem + ".json"), "w"), indent=1)

def fmt(x, spec):
    return "-" if x is None else format(x, spec)
lines = [f"# GPU results: {device}, {date}", "",
         f"- commit: `{commit}`", f"- command: `{command}`",
         f"- measured ceilings: device-to-device copy {fmt(result['copy_gbps'], '.0f')} GB/s, "
         f"cuBLAS bf16 GEMM {fmt(result['bf16_gemm_tflops'], '.0f')} TFLOP/s", ""]
lines += ["## Checks", ""] + ["- " + s for s in open(os.path.join(out, "summary.txt")).read().splitlines()] + [""]
lines += ["## Forward pass", "",
          "time: median of CUDA-event timings on device pointers, inputs rotated past the L2; "
          "err O: max |O - ref64| / max(1, |ref64|) on sampled rows.", "",
          "| impl | dtype | batch | heads | seqlen | d | causal | ms | TFLOP/s | GB/s | err O |",
          "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
for r in result["rows"]:
    seqlen = str(r["seqlen_q"]) if r["seqlen_q"] == r["seqlen_k"] else f"{r['seqlen_q']}x{r['seqlen_k']}"
    heads = str(r["heads"]) if r["heads"] == r["kv_heads"] else f"{r['heads']}/{r['kv_heads']}"
    if r.get("skipped"):
        tail = f"| refused: {r['skipped'][:120].replace('|', '/')} | | | |"
    else:
        tail = f"| {r['time_ms']:.3f} | {r['tflops']:.2f} | {r['gbps']:.0f} | {r['max_err_o']:.1e} |"
    lines.append(f"| {r['impl']} | {r['dtype']} | {r['batch']} | {heads} | {seqlen} | {r['head_dim']} | "
                 f"{'yes' if r['causal'] else 'no'} " + tail)
open(os.path.join(out, stem + ".md"), "w").write("\n".join(lines) + "\n")
print(os.path.join(out, stem + ".json"))
print(os.path.join(out, stem + ".md"))
EOF
note "report written ($(elapsed) in all)"
printf '%s\n' "${summary[@]}" >"$out/summary.txt"
exit $status
