#!/usr/bin/env bash
# Plants each bug of this folder in turn into the Hopper kernel or its launcher (cuda_v3_hopper/ws_kernel.cuh,
# ws_launch.cu), rebuilds the tests and runs, in the emulator, the checks of cuda_v3_hopper/ws_persistent: its
# O and LSE against ws's on 1, 2 and 5 CTAs, 2 also shuffled, and on V tails back to back with TMA loads
# slowed (tests/test_gpu_launchers.cpp); and the forward's case matrix at the emulator's sizes under both
# schedules (in order, and the seeded shuffle), as `harness_emulated` and `harness_emulated_shuffled` run it;
# then takes the bug out again. Patches 1 to 4 and 9 are bugs of the next tile's loads under the last tile's
# epilogue, 5 to 8 of the dynamic tile scheduler. From the repository root, on a clean tree:
#
#   bash docs/results/hopper-persistent-2026-12-04/planted/run.sh [BUILD_DIR]     (default: build)
#
# For each bug and check it prints doctest's tally, or the emulator's report that stopped the run.
set -euo pipefail
build=${1:-build}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../../../.."
if [[ -n "$(git status --porcelain -- cuda_v3_hopper)" ]]; then
  echo "cuda_v3_hopper/ has uncommitted changes: run this on a clean tree" >&2
  exit 2
fi
tests=(--test-case="every implementation*,adding a constant*,permuting keys*,every stage agrees*,packed batches*,NaN and Inf*")
report() {  # the tally, or the first report of the emulator
  grep -m1 -E "^\[doctest\] test cases:" "$1" ||
    true
  grep -m1 -oE "(THREW exception|ERROR): .*" "$1" | cut -c1-400 || true
}
for patch in "$here"/*.patch; do
  echo "== $(basename "$patch" .patch)"
  git apply "$patch"
  trap 'git apply -R "$patch"' EXIT
  cmake --build "$build" --target flashlab_tests >/dev/null
  log=$(mktemp)
  echo "-- against ws on a few CTAs: on 1, 2 and 5 CTAs, then V tails back to back with TMA loads slowed"
  timeout 300 "$build/tests/flashlab_tests" --test-case="cuda_v3_hopper/ws_persistent on*,cuda_v3_hopper/ws_persistent loads*" \
    >"$log" 2>&1 || true
  report "$log"
  for schedule in in-order shuffled:2026; do
    echo "-- the case matrix, $schedule"
    FLASHLAB_DEVICE=cuda FLASHLAB_EMULATE=1 FLASHLAB_EMULATOR_SCHEDULE=$schedule FLASHLAB_CASE_SIZES=emulator \
      FLASHLAB_DTYPES=first FLASHLAB_IMPL='^cuda_v3_hopper/ws_persistent$' timeout 300 "$build/tests/flashlab_tests" \
      "${tests[@]}" >"$log" 2>&1 || true
    report "$log"
  done
  rm -f "$log"
  git apply -R "$patch"
  trap - EXIT
done
cmake --build "$build" --target flashlab_tests >/dev/null
