#!/usr/bin/env bash
# The tool on packed variable-length batches (--cu-seqlens-q/-k, common/problem.hpp): a run from .npy files
# in the packed layout and the shapes of what it writes, `compare` on a packed problem, and the mistakes it
# refuses with exit 2 and a message naming the field. Usage: tool_packed.sh FLASHLAB_BINARY
set -uo pipefail
tool=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "packed: $*" >&2; exit 1; }

# Inputs: two sequences of 5 and 7 query tokens against 9 and 5 keys, 2 query heads and 1 kv head of 32.
python3 - "$tmp" <<'PY'
import random, struct, sys
def write(path, shape, values):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % "".join(f"{n}, " for n in shape)
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack(f"<{len(values)}f", *values))
random.seed(1)
for name, shape in (("q", (12, 2, 32)), ("k", (14, 1, 32)), ("v", (14, 1, 32)), ("q11", (11, 2, 32))):
    count = shape[0] * shape[1] * shape[2]
    write(f"{sys.argv[1]}/{name}.npy", shape, [random.gauss(0, 1) for _ in range(count)])
PY
[[ $? -eq 0 ]] || fail "could not write the inputs"
shape_of() { python3 -c "import ast,sys; h=open(sys.argv[1],'rb').read(256); print(ast.literal_eval(h[10:h.index(b'}')+1].decode())['shape'])" "$1"; }

files=(--q "$tmp/q.npy" --k "$tmp/k.npy" --v "$tmp/v.npy")
for impl in naive/standard_gemm cpu_tiled/forward; do
  "$tool" run "$impl" --cu-seqlens-q 0,5,12 --cu-seqlens-k 0,9,14 --causal "${files[@]}" \
    --out "$tmp/o.npy" --lse "$tmp/lse.npy" >"$tmp/run.txt" 2>&1 || fail "$impl: the packed run did not pass: $(cat "$tmp/run.txt")"
  grep -q "b=2 h=2/1 sq=7 sk=9 d=32 causal packed=12/14" "$tmp/run.txt" || fail "$impl: not the packed problem: $(head -1 "$tmp/run.txt")"
  [[ $(shape_of "$tmp/o.npy") == "(12, 2, 32)" ]] || fail "$impl: O is not [total_q, heads, head_dim]"
  [[ $(shape_of "$tmp/lse.npy") == "(2, 12)" ]] || fail "$impl: LSE is not [heads, total_q]"
done

# No query token at all (every sequence empty): nothing to compute, and no stage may fail on empty tensors.
for impl in cpu_tiled/forward cuda_v2/split_q; do
  "$tool" run "$impl" --dtype "$([[ $impl == cuda* ]] && echo f16 || echo f32)" --cu-seqlens-q 0,0,0 \
    --cu-seqlens-k 0,7,9 --heads 2 --head-dim 64 --out "$tmp/o.npy" >"$tmp/run.txt" 2>&1 ||
    fail "$impl: no query token: $(cat "$tmp/run.txt")"
  [[ $(shape_of "$tmp/o.npy") == "(0, 2, 64)" ]] || fail "$impl: O is not [0, heads, head_dim]"
done

# compare: the stages that take packed batches agree with the reference, the others refuse by name.
out=$("$tool" compare naive/standard_gemm cpu_tiled/forward naive/three_pass --cu-seqlens-q 0,40,40,97 \
  --heads 2 --head-dim 16 --repeat 1 2>&1) || fail "compare on a packed problem failed: $out"
grep -qE '^cpu_tiled/forward +cpu +[0-9.e+-]+ +[0-9.e+-]+ +yes' <<<"$out" || fail "cpu_tiled/forward not within tolerance: $out"
grep -q 'naive/three_pass.*skipped: cu_seqlens_q/k (packed variable-length batches) are not supported by naive/three_pass' \
  <<<"$out" || fail "naive/three_pass does not refuse by name: $out"

# Mistakes: exit 2, one line naming the field.
refuses() {
  local want=$1
  shift
  local message
  message=$("$tool" "$@" 2>&1 >/dev/null)
  local code=$?
  [[ $code -eq 2 ]] || fail "exit $code, not 2, for: $* ($message)"
  grep -qF -- "$want" <<<"$message" || fail "'$message' does not say '$want' for: $*"
}
refuses "cu_seqlens_q ends at 12 but --q holds 11 tokens" run cpu_tiled/forward --cu-seqlens-q 0,5,12 \
  --cu-seqlens-k 0,9,14 --q "$tmp/q11.npy" --k "$tmp/k.npy" --v "$tmp/v.npy"
refuses "--q: $tmp/q.npy: must be 4-D" run cpu_tiled/forward "${files[@]}"
refuses "--heads (4) does not match the input files (2)" run cpu_tiled/forward --cu-seqlens-q 0,5,12 \
  --cu-seqlens-k 0,9,14 "${files[@]}" --heads 4
refuses "cu_seqlens_q must not decrease: cu_seqlens_q[2] (3) < cu_seqlens_q[1] (5)" run cpu_tiled/forward \
  --cu-seqlens-q 0,5,3
refuses "cu_seqlens_q[0] (2) must be 0" run cpu_tiled/forward --cu-seqlens-q 2,5
refuses "--cu-seqlens-q needs at least two entries" run cpu_tiled/forward --cu-seqlens-q 0
refuses "cu_seqlens_k ends at 12 but --k holds 14 tokens (without --cu-seqlens-k, K and V are packed like Q)" \
  run cpu_tiled/forward --cu-seqlens-q 0,5,12 "${files[@]}"
refuses "--cu-seqlens-q entry 'x' is not an integer" run cpu_tiled/forward --cu-seqlens-q 0,x
refuses "cu_seqlens_q has 3 entries but must have batch + 1 = 5" run cpu_tiled/forward --cu-seqlens-q 0,3,7 --batch 4
refuses "cu_seqlens_q: sequence 1 has 10 tokens, more than seqlen_q (8)" run cpu_tiled/forward \
  --cu-seqlens-q 0,3,13 --seqlen-q 8
refuses "--cu-seqlens-q and --seqlens-q/--seqlens-k" run cpu_tiled/forward --cu-seqlens-q 0,3 --seqlens-q 3
refuses "--cu-seqlens-k needs --cu-seqlens-q" run cpu_tiled/forward --cu-seqlens-k 0,3
refuses "cu_seqlens_q/k (packed variable-length batches) are not supported by cpu_tiled/fa1_order" \
  run cpu_tiled/fa1_order --cu-seqlens-q 0,3,9
exit 0
