#!/usr/bin/env bash
# Plants each bug of this folder in turn into cuda_v2/split_q_bwd64x128's backward kernel
# (cuda_v2/backward_64x128.cu), rebuilds the tests and runs the harness's backward check of that entry in the
# emulator as `harness_emulated` runs it (in-order schedule, the race detector on, the case matrix at the
# emulator's sizes), then takes the bug out again. From the repository root, on a clean tree:
#
#   bash docs/results/gpu-backward-64x128-2026-12-01/planted/run.sh [BUILD_DIR]     (default: build)
#
# For each bug it prints the harness's tally, or the emulator's report that stopped the run.
set -euo pipefail
build=${1:-build}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../../../.."
if [[ -n "$(git status --porcelain -- cuda_v2)" ]]; then
  echo "cuda_v2/ has uncommitted changes: run this on a clean tree" >&2
  exit 2
fi
for patch in "$here"/*.patch; do
  echo "== $(basename "$patch" .patch)"
  git apply "$patch"
  trap 'git apply -R "$patch"' EXIT
  cmake --build "$build" --target flashlab_tests >/dev/null
  log=$(mktemp)
  FLASHLAB_DEVICE=cuda FLASHLAB_EMULATE=1 FLASHLAB_EMULATOR_SCHEDULE=in-order FLASHLAB_CASE_SIZES=emulator \
    FLASHLAB_IMPL='cuda_v2/split_q_bwd64x128$' "$build/tests/flashlab_tests" --test-case="every backward*" \
    >"$log" 2>&1 || true
  grep -E "^  cuda_v2/split_q_bwd64x128 +backward:" "$log" ||
    grep -m1 -oE "THREW exception: .*" "$log" | cut -c1-400 || echo "  (no tally and no report)"
  rm -f "$log"
  git apply -R "$patch"
  trap - EXIT
done
cmake --build "$build" --target flashlab_tests >/dev/null
