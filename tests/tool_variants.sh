#!/usr/bin/env bash
# `flashlab compare` on the attention variants (docs/01 §5): every stage that supports the variant runs within
# tolerance, cuda_v2/split_q in its own dtype (f16) when no --dtype is given (emulated where there is no GPU,
# within the limit for a problem that only one GPU stage takes), and every other stage refuses it by name.
# Usage: tool_variants.sh FLASHLAB_BINARY
set -uo pipefail
tool=$1
fail() { echo "variants: $*" >&2; exit 1; }

check() {  # check "the refusal up to 'not supported by'" compare flags...
  local refusal=$1
  shift
  local out
  out=$("$tool" compare "$@" --repeat 1 2>&1) || fail "compare $* failed: $out"
  for impl in cpu_tiled/forward naive/standard_gemm; do
    grep -qE "^$impl +cpu +[0-9.e+-]+ +[0-9.e+-]+ +yes .* f32$" <<<"$out" || fail "compare $*: $impl not within tolerance: $out"
  done
  grep -qE "^cuda_v2/split_q +(emu|cuda) +[0-9.e+-]+ +[0-9.e+-]+ +yes .* f16$" <<<"$out" ||
    fail "compare $*: cuda_v2/split_q did not run in f16 within tolerance: $out"
  for impl in cuda_v1/split_k cuda_v3_hopper/ws naive/three_pass; do
    grep -qF "skipped: $refusal not supported by $impl" <<<"$out" ||
      fail "compare $*: $impl does not refuse by name: $out"
  done
}

check "softcap (30) is" --softcap 30 --causal
check "dropout_p (0.1) is" --dropout 0.1 --seed 7 --heads 4 --seqlen-q 512 --seqlen-k 512
check "cu_seqlens_q/k (packed variable-length batches) are" --cu-seqlens-q 0,100,157,157,300 --heads 4 --causal
# An explicit --dtype is kept: the stages that do not offer it say so.
out=$("$tool" compare cpu_tiled/forward cuda_v2/split_q --softcap 30 --dtype f32 --seqlen-q 64 --repeat 1 2>&1) ||
  fail "compare --dtype f32 failed: $out"
grep -qE "^cuda_v2/split_q +(emu|cuda) +skipped: dtype f32 is not offered" <<<"$out" ||
  fail "--dtype f32 did not keep f32: $out"
# Without --dtype, run, grad and profile take a 16-bit stage in its own first dtype, as compare does.
for command in run grad profile; do
  out=$("$tool" $command cuda_v2/split_q --heads 1 --seqlen-q 64 --head-dim 64 2>&1) ||
    fail "$command of a 16-bit stage without --dtype failed: $out"
  grep -q "d=64 f16" <<<"$out" || fail "$command did not run cuda_v2/split_q in f16: $out"
done
# Named stages none of which can take the problem: invalid input (exit 2), each one's reason named, not a
# table of skipped rows that exits 0; forward and backward alike.
for pass in "" --backward; do
  out=$("$tool" compare cpu_tiled/forward cpu_tiled/backward $pass --dtype bf16 --seqlen-q 64 --repeat 1 2>&1)
  rc=$?
  [[ $rc == 2 ]] && grep -qF "dtype bf16 is not offered" <<<"$out" ||
    fail "compare $pass of stages that all refuse bf16 exited $rc: $out"
done
# A mask is bool: a float one is refused by name (PyTorch's float masks are additive, 0 keeps and -inf hides, the
# opposite of reading nonzero as visible), and a bool bias likewise.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp" <<'PY' || fail "could not write the mask files"
import struct, sys
def write(path, descr, data):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (4, 4), }" % descr
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data)
write(f"{sys.argv[1]}/float_mask.npy", "<f4", struct.pack("<16f", *([0.0] * 8 + [float("-inf")] * 8)))
write(f"{sys.argv[1]}/bool_bias.npy", "|b1", bytes([1] * 16))
PY
small=(--heads 1 --seqlen-q 4 --seqlen-k 4 --head-dim 16)
out=$("$tool" run cpu_tiled/forward "${small[@]}" --mask "$tmp/float_mask.npy" 2>&1)
[[ $? -eq 2 ]] && grep -q "^flashlab: --mask: .*must be bool" <<<"$out" || fail "a float --mask was not refused: $out"
out=$("$tool" run cpu_tiled/forward "${small[@]}" --bias "$tmp/bool_bias.npy" 2>&1)
[[ $? -eq 2 ]] && grep -q "^flashlab: --bias: .*must be float" <<<"$out" || fail "a bool --bias was not refused: $out"
exit 0
