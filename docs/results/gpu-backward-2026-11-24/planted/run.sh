#!/usr/bin/env bash
# Plants each bug of this folder in turn into cuda_v2's backward (cuda_v2/backward.cu), rebuilds the tests and
# runs the harness's backward check of cuda_v2/split_q in the emulator (in-order schedule), then takes the bug
# out again. From the repository root, on a clean tree:
#
#   bash docs/results/gpu-backward-2026-11-24/planted/run.sh [BUILD_DIR]     (default: build)
#
# For each bug it prints the harness's tally and the first failure's message.
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
  FLASHLAB_DEVICE=cuda FLASHLAB_EMULATE=1 FLASHLAB_EMULATOR_SCHEDULE=in-order FLASHLAB_IMPL='cuda_v2/split_q$' \
    "$build/tests/flashlab_tests" --test-case="every backward*" >"$log" 2>&1 || true
  grep -E "^  cuda_v2/split_q +backward:" "$log" || echo "  (no tally: the run stopped)"
  grep -m1 -E "logged: " "$log" | cut -c1-600 || true
  grep -m1 -A1 -E "first wrong: " "$log" | cut -c1-300 || true
  rm -f "$log"
  git apply -R "$patch"
  trap - EXIT
done
cmake --build "$build" --target flashlab_tests >/dev/null
