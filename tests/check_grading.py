#!/usr/bin/env python3
"""Class grading end to end (`exercise grade`), on one quick exercise, split-kv-combine: three submissions, each
the file the exercise changes, at its path in the project.

    right     the solution's lines, and a harness file rewritten     -> 100, passed: only the regions' lines are
              so that nothing compiles                                  taken from a submission
    log2      the solution with a base-2 LSE (a known mistake)      -> between 0 and 100, its first failing case
    broken    lines that do not compile                             -> 0, "does not compile"

    python3 tests/check_grading.py --build-dir build
"""
import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import exercise  # noqa: E402

EXERCISE = "split-kv-combine"
failures = []


def expect(condition, what):
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        failures.append(what)


def submit(root, student, replace=None, extra=None):
    """A submission folder holding the exercise's file with its region's lines (edited by `replace`)."""
    entry = exercise.find(EXERCISE)
    for path, regions in entry["files"].items():
        lines = open(os.path.join(ROOT, path)).read().split("\n")
        for _, first, end in regions:
            for n in range(first, end):
                for old, new in (replace or {}).items():
                    lines[n] = lines[n].replace(old, new)
        os.makedirs(os.path.dirname(os.path.join(root, student, path)), exist_ok=True)
        with open(os.path.join(root, student, path), "w") as out:
            out.write("\n".join(lines))
    for path, text in (extra or {}).items():
        os.makedirs(os.path.dirname(os.path.join(root, student, path)), exist_ok=True)
        with open(os.path.join(root, student, path), "w") as out:
            out.write(text)


parser = argparse.ArgumentParser()
parser.add_argument("--build-dir", required=True)
args = parser.parse_args()
mistake = next(m for m in json.load(open(exercise.MISTAKES))["mistakes"] if m["exercise"] == EXERCISE)
with tempfile.TemporaryDirectory(prefix="flashlab-grading-test-") as scratch:
    submissions, out = os.path.join(scratch, "submissions"), os.path.join(scratch, "grades")
    submit(submissions, "right", extra={"tests/harness.cpp": "#error the grader must not compile this\n"})
    submit(submissions, "log2", mistake["replace"])
    submit(submissions, "broken", {"state.lse();": "state.lse()"})
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "exercise.py"), "grade", submissions,
                             "--out", out, "--exercise", EXERCISE, "--build-dir", args.build_dir],
                            capture_output=True, text=True)
    print(result.stdout[-3000:] + result.stderr[-2000:])
    expect(result.returncode == 0, "grade exits 0")
    grades = {r["student"]: r for r in json.load(open(os.path.join(out, "grades.json")))["grades"]}
    rows = {r["student"]: r for r in csv.DictReader(open(os.path.join(out, "grades.csv")))}
    expect(set(rows) == {"right", "log2", "broken"}, "one CSV row per student")
    expect(grades["right"]["score"] == 100 and grades["right"]["passed"], "right: 100, passed (its harness edit ignored)")
    log2 = grades["log2"]
    expect(0 < log2["score"] < 100 and log2["compiled"] and not log2["passed"],
           f"log2: partial credit ({log2['score']})")
    expect(log2["first_failure"] is not None and rows["log2"]["first_failure"] != "",
           "log2: its first failing case is recorded")
    expect(mistake["cause"] in log2["cause"], f"log2: the likely cause names '{mistake['cause']}'")
    broken = grades["broken"]
    expect(broken["score"] == 0 and not broken["compiled"] and "does not compile" in broken["cause"],
           "broken: 0, does not compile, with the reason")
    expect(all(float(rows[s]["seconds"]) >= 0 for s in rows), "each row has its time")
    expect(os.path.exists(os.path.join(out, "logs", "log2-" + EXERCISE + ".log")), "the whole logs are kept")
print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
