#!/usr/bin/env bash
# Compile-time evidence for cuda_v3_hopper/ws and the FP8 pre-pass, no GPU needed (HOPPER.md, docs/06-fp8.md):
#  1. the PTX holds wgmma.mma_async, cp.async.bulk.tensor, mbarrier.try_wait.parity and setmaxnreg;
#  2. ptxas -v reports no spills, no stack frame and no C7508 (setmaxnreg ignored) / C7513 (wgmma serialized)
#     warnings, for each of the three sources;
#  3. the SASS holds HGMMA and no local-memory loads or stores;
#  4. the same for the FP8 pre-pass and main kernel (e4m3 wgmma, QGMMA in the SASS).
# Usage: cuda_v3_hopper/check_ptx.sh [output-dir]   (from the repository root; nvcc from /usr/local/cuda)
set -euo pipefail
out=${1:-build/hopper_evidence}
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
mkdir -p "$out"
flags=(-std=c++20 -O3 -I. -gencode arch=compute_90a,code=sm_90a)

# The six compiles are independent: run them at once (about one compile's time where there are cores). Each
# source's PTX is SOURCE.ptx, its object SOURCE.o and ptxas's report SOURCE.ptxas.txt.
compiles=()
for source in ws_launch fp8_prepass fp8_launch; do
  "$nvcc" "${flags[@]}" -ptx "cuda_v3_hopper/$source.cu" -o "$out/$source.ptx" &
  compiles+=($!)
  "$nvcc" "${flags[@]}" -Xptxas -v -c "cuda_v3_hopper/$source.cu" -o "$out/$source.o" 2> "$out/$source.ptxas.txt" &
  compiles+=($!)
done
for pid in "${compiles[@]}"; do
  wait "$pid" || { echo "FAIL: a compile failed (see $out)"; exit 1; }
done
status=0

# ptxas's report of one source: some kernels, none with a spill or a stack frame (a stack frame is local memory
# without a spill: an array indexed at run time, what LDL/STL in the SASS show), and no C7508 (setmaxnreg
# ignored), C7513/C7519 (wgmma serialized) or other warning.
ptxas_clean() {  # LABEL SOURCE
  local report="$out/$2.ptxas.txt" kernels spilling stacks warnings
  kernels=$(grep -c "Compiling entry function" "$report" || true)
  spilling=$(grep "spill" "$report" | grep -vc "0 bytes spill stores, 0 bytes spill loads" || true)
  stacks=$(grep -cE "[1-9][0-9]* bytes stack frame" "$report" || true)
  warnings=$(grep -cE "C7508|C7513|C7519|warning" "$report" || true)
  echo "ptxas  $1kernels: $kernels, with spills: $spilling, with a stack frame: $stacks, C75xx/other warnings: $warnings"
  [[ $kernels -gt 0 && $spilling -eq 0 && $stacks -eq 0 && $warnings -eq 0 ]] || status=1
}
for instruction in wgmma.mma_async cp.async.bulk.tensor mbarrier.try_wait.parity setmaxnreg; do
  count=$(grep -c "$instruction" "$out/ws_launch.ptx" || true)
  echo "PTX  $instruction: $count"
  [[ $count -gt 0 ]] || status=1
done

ptxas_clean "" ws_launch
grep -E "Used [0-9]+ registers" "$out/ws_launch.ptxas.txt" | sort | uniq -c

# The SASS (cuobjdump reads the cubin without a GPU): tensor-core wgmma is HGMMA; LDL/STL would be local memory.
cuobjdump=${CUOBJDUMP:-/usr/local/cuda/bin/cuobjdump}
if [[ -x $cuobjdump ]]; then
  "$cuobjdump" -sass "$out/ws_launch.o" > "$out/ws_launch.sass"
  hgmma=$(grep -c "HGMMA" "$out/ws_launch.sass" || true)
  local_memory=$(grep -cE "\b(LDL|STL)\b" "$out/ws_launch.sass" || true)
  echo "SASS  HGMMA: $hgmma, LDL/STL: $local_memory"
  [[ $hgmma -gt 0 && $local_memory -eq 0 ]] || status=1
else
  echo "SASS  not checked: $cuobjdump is not installed here"
fi
# The FP8 pre-pass (fp8_prepass.cu): the e4m3 cast is the saturating PTX conversion, every float division the
# IEEE one (bit-exactness with the emulation), no contracted multiply-add, no spills.
cvt=$(grep -c "cvt.rn.satfinite.e4m3x2.f32" "$out/fp8_prepass.ptx" || true)
approximate=$(grep -cE "div.(approx|full).f32|fma.rn" "$out/fp8_prepass.ptx" || true)
echo "PTX  fp8 pre-pass cvt.rn.satfinite.e4m3x2.f32: $cvt, approximate divisions or fma: $approximate"
[[ $cvt -gt 0 && $approximate -eq 0 ]] || status=1
ptxas_clean "fp8 pre-pass " fp8_prepass

# The FP8 main kernel (fp8_launch.cu): e4m3 wgmma (k32) for both products, the TMA/mbarrier/setmaxnreg
# machinery of the bf16 kernel, no spills, no serialized wgmma (C7513) or ignored setmaxnreg (C7508).
for instruction in "wgmma.mma_async.sync.aligned.m64n[0-9]*k32.f32.e4m3.e4m3" cp.async.bulk.tensor setmaxnreg \
  cvt.rn.satfinite.e4m3x2.f32; do
  count=$(grep -c "$instruction" "$out/fp8_launch.ptx" || true)
  echo "PTX  fp8 kernel $instruction: $count"
  [[ $count -gt 0 ]] || status=1
done
ptxas_clean "fp8 " fp8_launch
if [[ -x $cuobjdump ]]; then
  "$cuobjdump" -sass "$out/fp8_launch.o" > "$out/fp8_launch.sass"
  qgmma=$(grep -c "QGMMA" "$out/fp8_launch.sass" || true)
  local_memory=$(grep -cE "\b(LDL|STL)\b" "$out/fp8_launch.sass" || true)
  echo "SASS  fp8 kernel QGMMA: $qgmma, LDL/STL: $local_memory"
  [[ $qgmma -gt 0 && $local_memory -eq 0 ]] || status=1
fi

echo "$([[ $status -eq 0 ]] && echo PASS || echo FAIL): compile-time evidence"
exit $status
