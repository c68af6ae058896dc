#!/usr/bin/env python3
"""The results schema of flashlab's GPU runs (docs/conventions.md "Results"), checked without any package.

    python3 bench/results_schema.py FILE.json...     exit 0 when every file follows it, else 1 with the reasons

bench/gpu_report.py checks what it writes against it (and its rehearsal checks that a broken file is refused).
"""
import json
import sys

NUMBER = (int, float)
STATUSES = ("ok", "failed", "unavailable")
PASSES = ("forward", "backward")

# key -> (types allowed, required)
TOP = {
    "device": (str, True),
    "date": (str, True),
    "commit": (str, True),
    "command": (str, True),
    "copy_gbps": (NUMBER + (type(None),), True),
    "bf16_gemm_tflops": (NUMBER + (type(None),), True),
    "rows": (list, True),
    "checks": (list, True),
    "gpu": (dict, False),        # nvidia-smi's view: driver, clocks, memory
    "peers": (dict, False),      # the peers' versions: torch, cudnn
    "rehearsal": (bool, False),  # true: emulated rows and dry steps, no GPU measurement
    "commands": (list, False),   # every command whose results were merged into this file
}
ROW = {
    "impl": (str, True),
    "dtype": (str, True),
    "batch": (int, True),
    "heads": (int, True),
    "kv_heads": (int, True),
    "seqlen_q": (int, True),
    "seqlen_k": (int, True),
    "head_dim": (int, True),
    "causal": (bool, True),
    "time_ms": (NUMBER + (type(None),), True),
    "tflops": (NUMBER + (type(None),), True),
    "gbps": (NUMBER + (type(None),), True),
    "max_err_o": (NUMBER + (type(None),), True),
    "pass": (str, False),       # "forward" (when absent) or "backward"
    "emulated": (bool, False),  # true only for rehearsal rows
    "skipped": (str, False),    # why it did not run; its figures are null
    "failed": (str, False),     # the error it stopped with as it ran; its figures are null
    "repeat": (int, False),
    "page_size": (int, False),
}
CHECK = {
    "step": (str, True),
    "status": (str, True),
    "seconds": (NUMBER + (type(None),), True),
    "budget_s": (NUMBER + (type(None),), True),
    "log": (str, True),
    "phase": (str, False),
    "emulated": (bool, False),
}


def _fields(where, record, spec, problems):
    if not isinstance(record, dict):
        problems.append(f"{where}: not an object")
        return False
    for key, (types, required) in spec.items():
        if key not in record:
            if required:
                problems.append(f"{where}: no '{key}'")
        elif isinstance(record[key], bool) and bool not in (types if isinstance(types, tuple) else (types,)):
            problems.append(f"{where}: '{key}' is a boolean")
        elif not isinstance(record[key], types):
            problems.append(f"{where}: '{key}' is {type(record[key]).__name__}")
    for key in record:
        if key not in spec:
            problems.append(f"{where}: unknown key '{key}'")
    return True


def problems_of(result):
    """Every way `result` (a parsed results file) breaks the schema; [] when it follows it."""
    problems = []
    if not _fields("results", result, TOP, problems):
        return problems
    for n, row in enumerate(result.get("rows", []) if isinstance(result.get("rows"), list) else []):
        where = f"rows[{n}] ({row.get('impl', '?') if isinstance(row, dict) else '?'})"
        if not _fields(where, row, ROW, problems):
            continue
        if row.get("pass", "forward") not in PASSES:
            problems.append(f"{where}: pass '{row['pass']}' is not one of {PASSES}")
        if row.get("emulated") is False:
            problems.append(f"{where}: 'emulated' is present only when true")
        measured = row.get("time_ms") is not None
        for why in ("skipped", "failed"):
            if why in row and measured:
                problems.append(f"{where}: {why}, yet it has a time")
        if "skipped" in row and "failed" in row:
            problems.append(f"{where}: both skipped and failed")
        if "skipped" not in row and "failed" not in row and not measured:
            problems.append(f"{where}: no time, and no reason it was skipped or failed")
        if row.get("emulated") and (row.get("tflops") is not None or row.get("gbps") is not None):
            problems.append(f"{where}: an emulated row carries a rate")
        if row.get("emulated") and not result.get("rehearsal"):
            problems.append(f"{where}: an emulated row in a result that is not a rehearsal")
    for n, check in enumerate(result.get("checks", []) if isinstance(result.get("checks"), list) else []):
        where = f"checks[{n}] ({check.get('step', '?') if isinstance(check, dict) else '?'})"
        if _fields(where, check, CHECK, problems) and check.get("status") not in STATUSES:
            problems.append(f"{where}: status '{check.get('status')}' is not one of {STATUSES}")
    return problems


def main(paths):
    status = 0
    for path in paths:
        try:
            with open(path) as f:
                problems = problems_of(json.load(f))
        except (OSError, ValueError) as error:
            problems = [str(error)]
        for problem in problems:
            print(f"{path}: {problem}")
        status |= bool(problems)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
