#!/usr/bin/env bash
# The one script to run on a GPU machine, and its rehearsal on any machine (bench/gpu_report.py says how):
#
#   bash bench/gpu_report.sh [--phase all|check|speed|extra] [--commit SHA] [--kit DIR] OUTDIR
#   bash bench/gpu_report.sh --rehearse OUTDIR
#   bash bench/gpu_report.sh --merge OUTDIR RESULTS.json...
#
# On an offline GPU machine: bench/README.md "On an offline GPU machine" gives the commands and budgets.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if ! command -v python3 >/dev/null 2>&1; then
  echo "bench/gpu_report.sh: needs python3" >&2
  exit 2
fi
exec env PYTHONUNBUFFERED=1 python3 "$root/bench/gpu_report.py" "$@"
