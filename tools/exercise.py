#!/usr/bin/env python3
"""Course exercises made from the real stage sources (docs/exercises.md).

An exercise is a region of a stage's source between two marker comments:

    // EXERCISE BEGIN online-softmax
    // teaches: the running max and sum in one pass
    // difficulty: 1
    // docs: docs/01-softmax.md#3. The online normalizer
    // hint: raise the running max with state.raise_max, then add exp(x - max)
    ...the lines the student writes...
    // EXERCISE END online-softmax

The comment lines right after BEGIN are the exercise's description (kept in the student's copy); the rest of the
region is the solution (replaced by a TODO in the student's copy). An exercise may have several regions, in one or
more files of one stage; the description is given once. No solution exists anywhere but in the stage itself.

    exercise.py list
    exercise.py start ID [--dir DIR] [--force]   write a workspace (default exercises/ID)
    exercise.py check ID [--dir DIR] [--emulator-only]
                                          build it and run the shared harness on exercise/ID only (a CUDA
                                          exercise in the emulator, then on the GPU where there is one)
    exercise.py solution ID               print the reference lines
    exercise.py selftest --build-dir DIR  every skeleton builds and fails; with the solution pasted back it passes
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The stages whose sources can be turned into exercises. The CUDA stages' exercises are built and graded in the
# CPU emulator of the CUDA execution model (emulator/), on any machine.
STAGES = ["naive", "cpu_tiled", "decoding", "cuda_v1", "cuda_v2", "cuda_v3_hopper"]
SOURCE_SUFFIXES = (".cpp", ".hpp", ".h", ".cu", ".cuh")
BEGIN = re.compile(r"^\s*//\s*EXERCISE BEGIN\s+([a-z0-9-]+)\s*$")
END = re.compile(r"^\s*//\s*EXERCISE END\s+([a-z0-9-]+)\s*$")
FIELD = re.compile(r"^\s*//\s*(teaches|difficulty|docs|hint|grades|checks):\s?(.*)$")
# The harness's test cases a student's copy is checked by: the case matrix, the invariance properties and, for
# implementations with a backward pass, the backward on the case matrix (tests/test_backward.cpp).
PROPERTIES = "*adding a constant*,*permuting keys*"
TEST_CASES = "*case matrix*," + PROPERTIES
# The optional 'checks:' field, a comma-separated list, changes that: 'forward' grades by the forward's checks
# only (for lines the forward takes through every case already, without the backward's check, slow in the
# emulator); 'traffic' adds the GPU stages' traffic models, counted in the emulator (for lines that decide what
# a kernel loads: a copy that loads what no row needs moves more bytes than its model).
FORWARD_TEST_CASES = "*every implementation matches the fp64 reference on the case matrix*," + PROPERTIES
TRAFFIC_TEST_CASES = "*move the global bytes their traffic models say*"


def test_cases(checks):
    """The harness's test-case filter for an exercise's 'checks:' field."""
    wanted = {word.strip() for word in (checks or "").split(",") if word.strip()}
    unknown = wanted - {"forward", "traffic"}
    if unknown:
        raise Failure(f"unknown 'checks:' value(s) {', '.join(sorted(unknown))} (forward, traffic)")
    cases = FORWARD_TEST_CASES if "forward" in wanted else TEST_CASES
    return cases + ("," + TRAFFIC_TEST_CASES if "traffic" in wanted else "")

class Failure(Exception):
    """A user mistake: printed as one line, exit code 2."""


def stage_sources(stage):
    folder = os.path.join(ROOT, stage)
    if not os.path.isdir(folder):
        return []
    return sorted(os.path.join(stage, name) for name in os.listdir(folder) if name.endswith(SOURCE_SUFFIXES))


def scan():
    """All exercises: id -> {stage, files: {path: [regions]}, teaches, difficulty, docs, hint}."""
    exercises = {}
    for stage in STAGES:
        for path in stage_sources(stage):
            lines = open(os.path.join(ROOT, path)).read().split("\n")
            n = 0
            while n < len(lines):
                begin = BEGIN.match(lines[n])
                n += 1
                if not begin:
                    continue
                exercise_id = begin.group(1)
                entry = exercises.setdefault(exercise_id, {"id": exercise_id, "stage": stage, "files": {}})
                if entry["stage"] != stage:
                    raise Failure(f"exercise {exercise_id} spans stages {entry['stage']} and {stage}")
                start = n - 1
                field = None
                while n < len(lines) and lines[n].strip().startswith("//") and not END.match(lines[n]):
                    match = FIELD.match(lines[n])
                    if match:
                        field = match.group(1)
                        entry[field] = match.group(2).strip()
                    elif field:  # a continuation line of the previous field
                        entry[field] += " " + lines[n].strip().lstrip("/").strip()
                    n += 1
                solution_start = n
                while n < len(lines) and not END.match(lines[n]):
                    if BEGIN.match(lines[n]):
                        raise Failure(f"{path}:{n + 1}: exercise regions cannot nest")
                    n += 1
                if n == len(lines) or END.match(lines[n]).group(1) != exercise_id:
                    raise Failure(f"{path}:{start + 1}: EXERCISE BEGIN {exercise_id} has no matching END")
                entry["files"].setdefault(path, []).append((start, solution_start, n))
                n += 1
    for entry in exercises.values():
        for field in ("teaches", "difficulty", "hint"):
            if field not in entry:
                raise Failure(f"exercise {entry['id']} has no '{field}:' line after its first BEGIN")
    return exercises


def find(exercise_id):
    exercises = scan()
    if exercise_id not in exercises:
        raise Failure(f"unknown exercise '{exercise_id}' (see ./flashlab exercise list)")
    return exercises[exercise_id]


def workspace_dir(exercise_id, given):
    return os.path.abspath(given or os.path.join(ROOT, "exercises", exercise_id))


def target_name(exercise_id, folder):
    """A CMake target per workspace: the default folder gets the plain name, others a short hash of their path."""
    name = "flashlab_exercise_" + exercise_id.replace("-", "_")
    if folder != os.path.join(ROOT, "exercises", exercise_id):
        name += "_" + hashlib.sha1(folder.encode()).hexdigest()[:8]
    return name


def docs_section(reference):
    """The text of docs section 'docs/FILE.md#Heading start', from its heading to the next of the same level."""
    if not reference:
        return ""
    path, _, heading = reference.partition("#")
    full = os.path.join(ROOT, path)
    if not os.path.exists(full):
        return ""
    lines, out, level, fenced = open(full).read().split("\n"), [], None, False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else re.match(r"^(#+)\s+(.*)$", line)  # a "# comment" in a code block is no heading
        if level is None:
            if match and match.group(2).startswith(heading.strip()):
                level = len(match.group(1))
                out.append(line)
        elif match and len(match.group(1)) <= level:
            break
        else:
            out.append(line)
    return "\n".join(out).strip()


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def touches_exercise(entry, path, seen=None):
    """Whether `path` holds one of the exercise's regions or includes (transitively, within the stage) a file that
    does. Such a file must be compiled from the student's copy: an object of the real stage built from it would
    carry the real definitions of the header's inline functions, and the linker could pick those."""
    seen = seen if seen is not None else set()
    if path in entry["files"]:
        return True
    seen.add(path)
    for line in open(os.path.join(ROOT, path)):
        match = INCLUDE.match(line)
        if match and match.group(1).startswith(entry["stage"] + "/") and match.group(1) not in seen:
            if os.path.exists(os.path.join(ROOT, match.group(1))) and touches_exercise(entry, match.group(1), seen):
                return True
    return False


def write_workspace(entry, folder, keep_solution):
    """Copies the stage's sources into the workspace; the exercise's regions become TODOs unless keep_solution."""
    exercise_id, stage = entry["id"], entry["stage"]
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.makedirs(os.path.join(folder, stage))
    todo_files = []
    for path in stage_sources(stage):
        lines = open(os.path.join(ROOT, path)).read().split("\n")
        for start, solution_start, end in reversed(entry["files"].get(path, [])):
            # The TODO takes the indentation of the first solution line that is not a preprocessor line
            # (`#pragma unroll` sits in column 0).
            code = next((line for line in lines[solution_start:end] if not line.lstrip().startswith("#")),
                        lines[solution_start])
            indent = re.match(r"^\s*", code).group(0)
            if keep_solution:
                replacement = lines[solution_start:end]
            else:
                replacement = [f"{indent}// TODO(exercise {exercise_id}): write the lines described above."]
            lines[start:end + 1] = lines[start:solution_start] + replacement + [lines[end]]
        if path in entry["files"]:
            todo_files.append(path)
        with open(os.path.join(folder, path), "w") as out:
            out.write("\n".join(lines))
    cpp = [path for path in stage_sources(stage) if path.endswith(".cpp")]
    own = [path for path in cpp if touches_exercise(entry, path)]
    # Kernels that hold or include the exercise's lines: compiled from the copy for the emulator, with every
    # registration that calls them (cmake/exercises.cmake).
    kernels = [path for path in stage_sources(stage) if path.endswith(".cu") and touches_exercise(entry, path)]
    target = target_name(exercise_id, folder)
    with open(os.path.join(folder, "exercise.cmake"), "w") as out:
        out.write("# Generated by ./flashlab exercise start: the student's copy of the stage, checked by the harness.\n")
        out.write("# REUSE: files that neither hold nor include the exercise's lines; the program links the stage's own\n")
        out.write("# objects for them instead of compiling the copies again.\n")
        out.write(f"flashlab_add_exercise({target} {exercise_id} ${{CMAKE_CURRENT_LIST_DIR}}\n  ")
        out.write("\n  ".join(own))
        reused = [path for path in cpp if path not in own]
        out.write("\n  REUSE " + "\n  ".join(reused) if reused else "")
        out.write(("\n  CUDA " + "\n  ".join(kernels) if kernels else "") + ")\n")
    with open(os.path.join(folder, "exercise.json"), "w") as out:
        json.dump({"id": exercise_id, "stage": stage, "target": target, "files": todo_files,
                   "grades": entry.get("grades"), "checks": entry.get("checks")}, out, indent=2)
    with open(os.path.join(folder, "TASK.md"), "w") as out:
        out.write(f"# Exercise {exercise_id} ({stage}, difficulty {entry['difficulty']})\n\n")
        out.write(f"**What it teaches:** {entry['teaches']}\n\n")
        out.write("**Your task:** fill in the TODO in " + ", ".join(f"`{f}`" for f in todo_files) + ".\n\n")
        out.write(f"**Hint:** {entry['hint']}\n\n")
        out.write(f"**Check:** `./flashlab exercise check {exercise_id}` builds your copy and runs the shared test\n")
        out.write(f"harness on it (`exercise/{exercise_id}/...`); it passes when every case matches the fp64 reference.\n")
        section = docs_section(entry.get("docs", ""))
        if section:
            out.write(f"\n## Background (from {entry['docs'].partition('#')[0]})\n\n{section}\n")
    return target


def cache_value(build_dir, name):
    cache = os.path.join(build_dir, "CMakeCache.txt")
    if not os.path.exists(cache):
        return None
    for line in open(cache):
        if line.startswith(name + ":"):
            return line.split("=", 1)[1].strip()
    return None


def configure_with(build_dir, folders, gpu=False):
    """Adds workspace folders to the build's FLASHLAB_EXERCISE_DIRS (dropping ones that no longer exist); with
    `gpu`, their CUDA copies get a GPU build too (FLASHLAB_EXERCISE_GPU, cmake/exercises.cmake)."""
    current = [d for d in (cache_value(build_dir, "FLASHLAB_EXERCISE_DIRS") or "").split(";") if d and os.path.isdir(d)]
    wanted = current + [f for f in folders if f not in current]
    args = ["cmake", "-S", ROOT, "-B", build_dir, "-DFLASHLAB_EXERCISE_DIRS=" + ";".join(wanted)]
    if gpu:
        args.append("-DFLASHLAB_EXERCISE_GPU=ON")
    if cache_value(build_dir, "CMAKE_BUILD_TYPE") is None:
        args[1:1] = ["--preset", "release"]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)


def build_target(build_dir, target, quiet=False):
    result = subprocess.run(["cmake", "--build", build_dir, "--target", target], capture_output=True, text=True)
    if result.returncode != 0 and not quiet:
        errors = [line for line in result.stdout.split("\n")
                  if "error" in line or "note:" in line or "undefined reference" in line]
        print("Your copy does not compile:\n" + "\n".join(errors[:20] or result.stdout.split("\n")[-30:]))
    return result.returncode == 0


def is_cuda(folder):
    """Whether the workspace in `folder` holds a CUDA stage's copy (its kernels run in the emulator)."""
    return "\n  CUDA " in open(os.path.join(folder, "exercise.cmake")).read()


def run_harness(build_dir, target, exercise_id, grades=None, first_failure=False, checks=None, tests=None,
                first_dtype=False, emulated=False):
    """Runs the harness on exercise/ID only (and there on the implementations the exercise's optional 'grades:'
    field names, a regular expression: the ones whose code runs its lines; its optional 'checks:' field picks the
    checks, test_cases()); returns (passed, output). With first_failure, it stops at the
    first failing check (enough to see a skeleton fail). `tests` replaces the harness's test-case filter. With
    first_dtype, each implementation runs in its first dtype only. `emulated`: a CUDA exercise graded in the
    emulator, on the case matrix with its long lengths reduced as in the emulated test entries (every kind of
    case, tests/case_matrix.cpp)."""
    selected = f"^exercise/{exercise_id}/" + (f"({grades})" if grades else "")
    env = dict(os.environ, FLASHLAB_IMPL=selected, FLASHLAB_VERBOSE="1")
    if first_dtype:
        env["FLASHLAB_DTYPES"] = "first"
    if emulated:
        env["FLASHLAB_CASE_SIZES"] = "emulator"
    program = os.path.join(build_dir, "exercises", target)
    stop = ["--abort-after=1"] if first_failure else []
    cases = tests or test_cases(checks)
    result = subprocess.run([program, f"--test-case={cases}", "--no-version"] + stop, env=env,
                            capture_output=True, text=True)
    return result.returncode == 0, result.stdout + result.stderr


def property_failures(output):
    """The failed checks of the harness's property tests (doctest's 'TEST CASE:' blocks), each as its name and
    what it logged; "" when there is none (a crash)."""
    lines, name, shown = [], None, None
    for line in output.split("\n"):
        if line.startswith("TEST CASE:"):
            name = line.split(":", 1)[1].strip()
        elif name and line.strip().startswith("logged:"):
            if name != shown:
                lines.append(f"  FAIL  {name}")
                shown = name
            lines.append("        " + line.strip()[len("logged:"):].strip())
    return "\n".join(lines)


def command_list(_):
    exercises = scan()
    print(f"{'exercise':22} {'stage':14} {'level':5}  what it teaches")
    for entry in sorted(exercises.values(), key=lambda e: (STAGES.index(e["stage"]), e["difficulty"], e["id"])):
        print(f"{entry['id']:22} {entry['stage']:14} {entry['difficulty']:5}  {entry['teaches']}")


def command_start(args):
    entry = find(args.id)
    folder = workspace_dir(args.id, args.dir)
    if os.path.exists(folder) and not args.force:
        raise Failure(f"{os.path.relpath(folder, os.getcwd())} already exists and may hold your work: check it, or "
                      f"start again with --force (which overwrites it)")
    write_workspace(entry, folder, keep_solution=False)
    print(f"wrote {os.path.relpath(folder, os.getcwd())}/: your copy of {entry['stage']}/ with the TODO, and TASK.md")
    for path in json.load(open(os.path.join(folder, "exercise.json")))["files"]:
        print(f"  edit {os.path.relpath(os.path.join(folder, path), os.getcwd())}")
    extra = f" --dir {args.dir}" if args.dir else ""
    print(f"then: ./flashlab exercise check {args.id}{extra}")


def gpu_name():
    """The first GPU nvidia-smi lists, or None (no driver, no GPU)."""
    try:
        result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line for line in result.stdout.split("\n") if line.startswith("GPU ")]
    return lines[0] if result.returncode == 0 and lines else None


def report(exercise_id, passed, output):
    """Prints the harness's verdict per case (one line for a case every implementation passes, details for a
    failure) and for a failed property its name and what it logged; returns the exit code."""
    cases, order = {}, []
    current = None
    for line in output.split("\n"):
        match = re.match(r"^  (PASS|FAIL) (\S+) \[(\w+)\] (backward )?on '(.*)' \((.*)\)$", line)
        if match:
            key = ((match.group(4) or "") + match.group(5), match.group(6))
            if key not in cases:
                cases[key] = []
                order.append(key)
            current = [match.group(1), match.group(2), []]
            cases[key].append(current)
        elif line.startswith("    ") and current is not None:
            current[2].append(line)
    failed_cases = 0
    for key in order:
        runs = cases[key]
        if all(run[0] == "PASS" for run in runs):
            print(f"  PASS  {key[0]}  ({key[1]})")
            continue
        failed_cases += 1
        print(f"  FAIL  {key[0]}  ({key[1]})")
        for status, name, detail in runs:
            if status == "FAIL":
                print(f"        {name}:")
                for line in detail:
                    print("      " + line.strip())
    if passed:
        print(f"\nexercise {exercise_id}: every case passed.")
        return 0
    if failed_cases == 0:  # failed outside the case matrix (a property), or crashed: show the harness's own words
        failures = property_failures(output)
        print(failures or "\n".join(output.split("\n")[-40:]))
        if failures:
            print(f"\nexercise {exercise_id}: every case of the matrix passed, but the check above did not.")
    else:
        print(f"\nexercise {exercise_id}: {failed_cases} of {len(order)} cases failed. Start with the first: its shape "
              "and mask,\nand the first wrong element, with the reference's value beside yours.")
    return 1


def command_check(args):
    folder = workspace_dir(args.id, args.dir)
    meta_path = os.path.join(folder, "exercise.json")
    if not os.path.exists(meta_path):
        raise Failure(f"no workspace for {args.id} in {folder} (run ./flashlab exercise start {args.id} first)")
    meta = json.load(open(meta_path))
    target = meta["target"]
    build_dir = os.path.join(ROOT, "build")
    configure_with(build_dir, [folder])
    print(f"building your copy ({target}) ...", flush=True)
    if not build_target(build_dir, target):
        return 1
    # A CUDA exercise is graded in the emulator first on every machine (a deadlock or a race is named there; on a
    # GPU a deadlock would hang), then, where there is a GPU and the build has nvcc, on the GPU.
    cuda = is_cuda(folder)
    passed, output = run_harness(build_dir, target, args.id, meta.get("grades"), checks=meta.get("checks"),
                                 emulated=cuda)
    code = report(args.id, passed, output)
    gpu = gpu_name() if cuda and not args.emulator_only else None
    if code != 0 or gpu is None:
        return code
    if not cache_value(build_dir, "CMAKE_CUDA_COMPILER") or "NOTFOUND" in cache_value(build_dir, "CMAKE_CUDA_COMPILER"):
        print(f"\nThis machine has a GPU ({gpu}), but the build has no CUDA compiler: graded in the emulator only.")
        return code
    print(f"\nnow on the GPU ({gpu}): building your copy for it ({target}_gpu) ...", flush=True)
    configure_with(build_dir, [folder], gpu=True)
    if not build_target(build_dir, target + "_gpu"):
        return 1
    passed, output = run_harness(build_dir, target + "_gpu", args.id, meta.get("grades"), checks=meta.get("checks"))
    return report(args.id, passed, output)


def command_solution(args):
    entry = find(args.id)
    for path, regions in entry["files"].items():
        lines = open(os.path.join(ROOT, path)).read().split("\n")
        for _, solution_start, end in regions:
            print(f"--- {path}:{solution_start + 1}-{end}")
            print("\n".join(lines[solution_start:end]))


MISTAKES = os.path.join(ROOT, "tools", "exercise_mistakes.json")


def write_mistake(entry, mistake, folder):
    """A workspace holding the solution with the mistake's replacements made in the exercise's lines."""
    target = write_workspace(entry, folder, keep_solution=True)
    for old, new in mistake["replace"].items():
        found = 0
        for path, regions in entry["files"].items():
            lines = open(os.path.join(folder, path)).read().split("\n")
            for _, solution_start, end in regions:  # the regions' lines are where they were in the stage
                for n in range(solution_start, end):
                    found += lines[n].count(old)
                    lines[n] = lines[n].replace(old, new)
            with open(os.path.join(folder, path), "w") as out:
                out.write("\n".join(lines))
        if not found:
            raise Failure(f"{MISTAKES}: '{old}' is not in the lines of exercise {entry['id']}")
    return target


def command_selftest(args):
    """For every exercise: the skeleton builds and fails the check; the solution pasted back passes; each known
    mistake (tools/exercise_mistakes.json) fails with the message that names it."""
    build_dir = os.path.abspath(args.build_dir)
    exercises = scan()
    if not exercises:
        raise Failure("no exercise regions found")
    scratch = tempfile.mkdtemp(prefix="flashlab-exercises-")
    original = cache_value(build_dir, "FLASHLAB_EXERCISE_DIRS") or ""
    passed = failed = 0
    try:
        plans = []
        for exercise_id, entry in sorted(exercises.items()):
            for variant, keep in (("skeleton", False), ("solution", True)):
                folder = os.path.join(scratch, variant, exercise_id)
                plans.append((exercise_id, variant, folder, write_workspace(entry, folder, keep)))
        mistakes = json.load(open(MISTAKES))["mistakes"]
        for n, mistake in enumerate(mistakes):
            if mistake["exercise"] not in exercises:
                raise Failure(f"{MISTAKES}: no exercise '{mistake['exercise']}'")
            folder = os.path.join(scratch, f"mistake{n}", mistake["exercise"])
            plans.append((mistake["exercise"], f"mistake{n}", folder,
                          write_mistake(exercises[mistake["exercise"]], mistake, folder)))
        configure_with(build_dir, [plan[2] for plan in plans])
        targets = [plan[3] for plan in plans]
        started = time.monotonic()
        build = subprocess.run(["cmake", "--build", build_dir, "--target"] + targets, capture_output=True, text=True)
        print(f"  built {len(targets)} exercise programs in {time.monotonic() - started:.0f} s")
        if build.returncode != 0:
            print(build.stdout[-5000:] + build.stderr[-2000:])
            raise Failure("the exercise programs do not build (a skeleton must compile: it fails when it runs)")
        for exercise_id, entry in sorted(exercises.items()):  # the task sheet's background must be found
            if entry.get("docs") and not docs_section(entry["docs"]):
                failed += 1
                print(f"  BAD  {exercise_id}: 'docs: {entry['docs']}' names no heading of that chapter")
        for exercise_id, variant, folder, target in plans:
            mistake = mistakes[int(variant[len("mistake"):])] if variant.startswith("mistake") else None
            # Warning-free, so that a skeleton also compiles where warnings are errors (the ci preset's stages).
            warnings = list(dict.fromkeys(line for line in build.stdout.split("\n")  # once each, in order
                                          if folder + os.sep in line and "warning:" in line))
            started = time.monotonic()
            # A solution is the stage's own code, which the harness checks in every dtype: here it shows that
            # a workspace's copy builds and passes, in the first dtype. Skeletons and mistakes keep every dtype.
            ok, output = run_harness(build_dir, target, exercise_id, exercises[exercise_id].get("grades"),
                                     first_failure=variant != "solution",
                                     checks=exercises[exercise_id].get("checks"),
                                     tests=mistake.get("tests") if mistake else None,
                                     first_dtype=variant == "solution", emulated=is_cuda(folder))
            seconds = time.monotonic() - started
            expected = variant == "solution"
            # A skeleton must fail some check of the harness: a case on its numbers or with a fault the emulator
            # names (a deadlock, a race), or a property; not by crashing the program. A mistake must fail with
            # the words that name it.
            wrong_numbers = re.search(r"^  FAIL ", output, re.M) is not None or property_failures(output) != ""
            named = mistake is None or mistake["says"] in output
            good = ok == expected and not warnings and (ok or wrong_numbers) and named
            passed, failed = passed + good, failed + (not good)
            verdict = "passes" if ok else "fails"
            what = f"the mistake '{mistake['mistake']}'" if mistake else f"the {variant}"
            what += " (first dtype)" if variant == "solution" else ""
            print(f"  {'ok  ' if good else 'BAD '} {exercise_id}: {what} {verdict} the check ({seconds:.1f} s)"
                  + (f", but compiles with {len(warnings)} warning(s):" if warnings else "")
                  + ("" if named else f", but without saying '{mistake['says']}'"))
            for line in warnings:
                print("       " + line)
            if not ok and not wrong_numbers:
                print("       but no case failed (a crash, or a property check?):")
            if ok != expected or not (ok or wrong_numbers) or not named:
                print(output[-3000:])
    finally:
        original = ";".join(d for d in original.split(";") if d and os.path.isdir(d))
        subprocess.run(["cmake", "-S", ROOT, "-B", build_dir, "-DFLASHLAB_EXERCISE_DIRS=" + original],
                       stdout=subprocess.DEVNULL)
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def main():
    parser = argparse.ArgumentParser(prog="flashlab exercise", description="course exercises from the stage sources")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the exercises, their stage, what they teach, difficulty")
    for name, text in (("start", "write a workspace with the TODO"), ("check", "build and grade a workspace")):
        p = sub.add_parser(name, help=text)
        p.add_argument("id")
        p.add_argument("--dir", help="workspace folder (default: exercises/ID)")
        if name == "start":
            p.add_argument("--force", action="store_true", help="overwrite an existing workspace")
        else:
            p.add_argument("--emulator-only", action="store_true",
                           help="grade a CUDA exercise in the emulator only, even where a GPU is")
    p = sub.add_parser("solution", help="print the reference lines (for instructors)")
    p.add_argument("id")
    p = sub.add_parser("selftest", help="prove the mechanism on every exercise")
    p.add_argument("--build-dir", required=True)
    args = parser.parse_args()
    handlers = {"list": command_list, "start": command_start, "check": command_check, "solution": command_solution,
                "selftest": command_selftest}
    try:
        return handlers[args.command](args) or 0
    except Failure as error:
        print(f"flashlab: {error}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as error:
        print(f"flashlab: {' '.join(error.cmd[:3])} ... failed (exit {error.returncode})", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
