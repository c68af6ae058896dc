#!/usr/bin/env bash
# Plants each bug of this folder in turn into the Hopper kernels, rebuilds the tests and runs the harness on the
# emulated kernel the bug is in (in-order schedule), then takes the bug out again. From the repository root, on
# a clean tree:
#
#   bash docs/results/hopper-emulation-2026-11-24/planted/run.sh [BUILD_DIR]     (default: build)
#
# For each bug it prints the harness's tally for the implementation and the first failure's message.
set -euo pipefail
build=${1:-build}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../../../.."
if [[ -n "$(git status --porcelain -- cuda_v3_hopper)" ]]; then
  echo "cuda_v3_hopper/ has uncommitted changes: run this on a clean tree" >&2
  exit 2
fi
for patch in "$here"/*.patch; do
  name=$(basename "$patch" .patch)
  impl='cuda_v3_hopper/ws$'
  [[ $name == *e4m3* ]] && impl='cuda_v3_hopper/fp8$'
  echo "== $name ($impl)"
  git apply "$patch"
  trap 'git apply -R "$patch"' EXIT
  cmake --build "$build" --target flashlab_tests >/dev/null
  log=$(mktemp)
  FLASHLAB_DEVICE=cuda FLASHLAB_EMULATE=1 FLASHLAB_EMULATOR_SCHEDULE=in-order FLASHLAB_IMPL="$impl" \
    "$build/tests/flashlab_tests" --test-case="every implementation*" >"$log" 2>&1 || true
  grep -E "^  cuda_v3_hopper/(ws|fp8) " "$log" || echo "  (no tally: the run stopped)"
  grep -m1 -E "logged: " "$log" | cut -c1-1200 || true
  rm -f "$log"
  git apply -R "$patch"
  trap - EXIT
done
cmake --build "$build" --target flashlab_tests >/dev/null
