#!/usr/bin/env python3
"""A student handout holds no solution: `exercise handout` into a scratch folder must succeed (it searches every
file of the handout for every solution line, whitespace-normalized), every exercise region there must hold its
TODO, and the write-ups' answers and the known mistakes must be left out. The search itself is shown to work:
a solution line planted in the handout, reindented, is found."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import exercise  # noqa: E402

failures = []


def expect(condition, what):
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        failures.append(what)


with tempfile.TemporaryDirectory(prefix="flashlab-handout-") as scratch:
    tree = os.path.join(scratch, "handout")
    made = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "exercise.py"), "handout", tree],
                          capture_output=True, text=True)
    print(made.stdout + made.stderr, end="")
    expect(made.returncode == 0, "the handout is written and its search finds no solution line")

    exercises = exercise.scan()
    # The course's order (docs/exercises.md), which `exercise list` and start's notes follow, names each once.
    problems = exercise.course_problems(exercises)
    expect(not problems, "the course table names every exercise once, numbered in order" +
           "".join(f"\n     {p}" for p in problems))
    searched, _ = exercise.solution_lines(exercises, exercise.tracked_files())
    expect(len(searched) >= len(exercises), f"{len(searched)} solution lines searched for, from every exercise")
    for entry in exercises.values():
        todo = exercise.todo_line(entry["id"])
        regions = sum(len(r) for r in entry["files"].values())
        found = sum(open(os.path.join(tree, path)).read().count(todo) for path in entry["files"])
        expect(found == regions, f"{entry['id']}: {found} of {regions} regions hold the TODO in the handout")
    expect(not os.path.exists(os.path.join(tree, "tools", "exercise_mistakes.json")), "the known mistakes are left out")
    expect(os.path.exists(os.path.join(tree, "HANDOUT.md")), "HANDOUT.md marks the tree")
    pages = [os.path.join(tree, "docs", "exercises", e + ".md") for e in exercises]
    expect(all(os.path.exists(p) and exercise.ANSWERS not in open(p).read() for p in pages),
           "every write-up is there, without its answers")
    expect(exercise.leaks(tree, searched) == [], "no file of the handout holds a solution line")

    # In the handout, `start` writes a copy with one TODO a region and the hint as written (a handout's TODO is
    # no part of the description), and `hint` gives the later levels from tools/exercise_hints.json.
    for entry in exercises.values():
        started = subprocess.run([sys.executable, os.path.join(tree, "tools", "exercise.py"), "start", entry["id"],
                                  "--dir", os.path.join(scratch, "ws", entry["id"])], capture_output=True, text=True)
        todo = exercise.todo_line(entry["id"])
        copies = [open(os.path.join(scratch, "ws", entry["id"], path)).read() for path in entry["files"]]
        regions = sum(len(r) for r in entry["files"].values())
        found = sum(text.count(todo) for text in copies)
        task = open(os.path.join(scratch, "ws", entry["id"], "TASK.md")).read() if started.returncode == 0 else ""
        expect(started.returncode == 0 and found == regions and "TODO(exercise" not in task,
               f"{entry['id']}: started in the handout, {found} TODOs for {regions} regions, TASK.md without one")
    hint = subprocess.run([sys.executable, os.path.join(tree, "tools", "exercise.py"), "hint", "one-pass", "3"],
                          capture_output=True, text=True)
    expect(hint.returncode == 0 and exercise.find("one-pass")["hint3"] in " ".join(hint.stdout.split()),
           "`hint one-pass 3` in the handout gives the third level")

    # The negative control: a solution line, reindented and with a comment, planted in a doc and in a source.
    line, owner = sorted(searched.items())[0]
    with open(os.path.join(tree, "README.md"), "a") as out:
        out.write("\n        " + line.replace(" ", "   ") + "   // planted\n")
    found = exercise.leaks(tree, searched)
    expect([(p, e) for p, _, e in found] == [("README.md", owner)],
           f"a planted solution line of {owner} is found: {found}")
    refused = subprocess.run([sys.executable, os.path.join(tree, "tools", "exercise.py"), "solution",
                              sorted(exercises)[0]], capture_output=True, text=True)
    expect(refused.returncode == 2 and "handout" in refused.stderr, "`solution` refuses in the handout")

    # What the handout's own build leaves out (cmake/handout.cmake): every exercise is not done, so every stage
    # is; the harness sources that use a stage directly are named. An exercise whose lines are written into its
    # stage (here the solution, pasted as a student would paste theirs) is done, and only then.
    def not_done():
        listed = subprocess.run([sys.executable, os.path.join(tree, "tools", "exercise.py"), "not-done"],
                                capture_output=True, text=True)
        return json.loads(listed.stdout) if listed.returncode == 0 else {}
    state = not_done()
    listed = sorted(i for ids in state.get("not_done", {}).values() for i in ids)
    expect(listed == sorted(exercises), f"`not-done` in the handout lists every exercise: {listed}")
    expect("tests/test_softmax.cpp" in state.get("test_files", []) and "tests/test_matrix.cpp" not in
           state.get("test_files", []), "the harness sources that use a stage directly are left out, not the others")
    entry = exercises["one-pass"]
    for path, regions in entry["files"].items():
        mine = open(os.path.join(ROOT, path)).read().split("\n")
        theirs = open(os.path.join(tree, path)).read().split("\n")
        bodies = exercise.region_bodies(theirs, "one-pass")
        for (first, end), (_, solution_start, solution_end) in reversed(list(zip(bodies, regions))):
            theirs[first:end] = mine[solution_start:solution_end]
        with open(os.path.join(tree, path), "w") as handle:
            handle.write("\n".join(theirs))
    state = not_done()
    expect("one-pass" not in state.get("not_done", {}).get("naive", ["one-pass"]) and
           "online-softmax" in state.get("not_done", {}).get("naive", []),
           "with its lines written into naive/attention.cpp, one-pass is done and naive's other exercises are not")

print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
