#!/usr/bin/env bash
# Writes profiles.txt beside this script: `flashlab profile` of each GPU stage (counted in the CPU emulator),
# then split_q with its swizzle planted out (planted/split-q-unswizzled.patch) and taken back. From the
# repository root, on a clean tree, after `./flashlab test` or a release build:
#
#   bash docs/results/emulator-counts-2026-11-24/run.sh [BUILD_DIR]     (default: build)
set -euo pipefail
build=${1:-build}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../../.."
if [[ -n "$(git status --porcelain -- cuda_v2)" ]]; then
  echo "cuda_v2/ has uncommitted changes: run this on a clean tree" >&2
  exit 2
fi
out="$here/profiles.txt"
profile() {
  echo "\$ $build/bin/flashlab profile $*"
  local start=$SECONDS
  "$build/bin/flashlab" profile "$@" 2>&1
  echo "($((SECONDS - start)) s on this CPU)"
  echo
}
cmake --build "$build" --target flashlab >/dev/null
{
  echo "# commit $(git rev-parse --short HEAD), $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  echo
  profile cuda_v1/split_k --heads 2 --seqlen-q 1024 --head-dim 64
  profile cuda_v2/split_q_simt --heads 2 --seqlen-q 1024 --head-dim 64
  profile cuda_v2/split_q --heads 2 --seqlen-q 1024 --head-dim 128 --dtype bf16
  profile cuda_v3_hopper/ws --heads 2 --seqlen-q 1024 --head-dim 128 --dtype bf16
  profile decoding/cuda_split_kv --heads 32 --kv-heads 8 --seqlen-q 1 --seqlen-k 8192 --head-dim 128 --dtype bf16
  profile cuda_v1/split_k --seqlen-q 1024 --seqlen-k 1024 --head-dim 128
  profile cuda_v2/split_q --seqlen-q 1024 --seqlen-k 1024 --head-dim 128 --dtype bf16
  echo "# the swizzle planted out of split_q: git apply planted/split-q-unswizzled.patch"
  git apply "$here/planted/split-q-unswizzled.patch"
  trap 'git apply -R "$here/planted/split-q-unswizzled.patch"; cmake --build "$build" --target flashlab flashlab_tests >/dev/null' EXIT
  cmake --build "$build" --target flashlab flashlab_tests >/dev/null
  profile cuda_v2/split_q --heads 2 --seqlen-q 1024 --head-dim 128 --dtype bf16
  echo "\$ $build/tests/flashlab_tests --test-case='the swizzled GPU stages*'"
  "$build/tests/flashlab_tests" --test-case='the swizzled GPU stages*' 2>&1 | grep -v '^\[doctest\] \(doctest\|run\)' || true
} >"$out"
echo "wrote $out"
