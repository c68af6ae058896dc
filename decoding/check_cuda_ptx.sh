#!/usr/bin/env bash
# Compile-time evidence for decoding/cuda_split_kv and cuda_split_kv_mma, no GPU needed (decoding/CUDA.md):
#  1. the PTX (compute_80) holds cp.async of 16 bytes (cp.async.cg.shared.global ... 16), cp.async groups, the
#     16-byte global load of Q (ld.global.v4) and 16-byte shared loads of K/V (ld.shared.v4.u32); and, for the
#     tensor-core kernel, mma.sync m16n8k16 with ldmatrix (.trans for V);
#  2. ptxas -v for sm_80 and sm_90a reports no spills;
#  3. the SASS holds LDGSTS.E.BYPASS.128 (cp.async.cg, 16 bytes) and no local-memory loads or stores.
# Usage: decoding/check_cuda_ptx.sh [output-dir]   (from the repository root; nvcc from /usr/local/cuda)
set -euo pipefail
out=${1:-build/decoding_evidence}
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
mkdir -p "$out"
flags=(-std=c++20 -O3 -I. --expt-relaxed-constexpr)
gencode=(-gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a)

"$nvcc" "${flags[@]}" -gencode=arch=compute_80,code=compute_80 -ptx decoding/cuda_split_kv.cu \
  -o "$out/cuda_split_kv.ptx"
status=0
for instruction in "cp.async.cg.shared.global" "cp.async.commit_group" "cp.async.wait_group" "ld.global.v4" \
  "ld.shared.v4.u32" "mma.sync.aligned.m16n8k16" "ldmatrix.sync.aligned.m8n8.x4.shared.b16" \
  "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"; do
  count=$(grep -c "$instruction" "$out/cuda_split_kv.ptx" || true)
  echo "PTX  $instruction: $count"
  [[ $count -gt 0 ]] || status=1
done
narrow=$(grep -c "ld.shared.v[24].u16" "$out/cuda_split_kv.ptx" || true)
echo "PTX  split 16-byte shared loads (ld.shared.v2/v4.u16): $narrow"
[[ $narrow -eq 0 ]] || status=1

"$nvcc" "${flags[@]}" "${gencode[@]}" -Xptxas -v -c decoding/cuda_split_kv.cu -o "$out/cuda_split_kv.o" \
  2> "$out/ptxas.txt"
kernels=$(grep -c "Compiling entry function" "$out/ptxas.txt" || true)
spilling=$(grep "spill" "$out/ptxas.txt" | grep -vc "0 bytes spill stores, 0 bytes spill loads" || true)
echo "ptxas  kernels (both architectures): $kernels, with spills: $spilling"
paste - - - < <(grep -E "Compiling entry|spill|Used [0-9]+ registers" "$out/ptxas.txt") |
  sed -E 's/.*kernels[0-9]+(mma[0-9]+)?([a-z_]+)I([_a-z0-9]+)Li([0-9]+).*for .(sm_[0-9a]+).*Used ([0-9]+) registers.*/\2 \3 d\4 \5: \6 registers/'
[[ $kernels -gt 0 && $spilling -eq 0 ]] || status=1

cuobjdump=${CUOBJDUMP:-/usr/local/cuda/bin/cuobjdump}
if [[ -x $cuobjdump ]]; then
  "$cuobjdump" -sass "$out/cuda_split_kv.o" > "$out/cuda_split_kv.sass"
  ldgsts=$(grep -c "LDGSTS.E.BYPASS.128\|LDGSTS.E.BYPASS.LTC128B.128" "$out/cuda_split_kv.sass" || true)
  local_memory=$(grep -cE "\b(LDL|STL)\b" "$out/cuda_split_kv.sass" || true)
  echo "SASS  LDGSTS 16-byte (cp.async.cg): $ldgsts, LDL/STL: $local_memory"
  [[ $ldgsts -gt 0 && $local_memory -eq 0 ]] || status=1
else
  echo "SASS  not checked: $cuobjdump is not installed here"
fi
echo "$([[ $status -eq 0 ]] && echo PASS || echo FAIL): compile-time evidence"
exit $status
