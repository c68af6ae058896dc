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
    exercise.py not-done                  for the build: the exercises whose lines this tree lacks (a handout's)
"""
import argparse
import concurrent.futures
import csv
import difflib
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
TODO = re.compile(r"^\s*// TODO\(exercise [a-z0-9-]+\): write the lines described above\.\s*$")
FIELD = re.compile(r"^\s*//\s*(teaches|difficulty|docs|hint|hint2|hint3|grades|checks):\s?(.*)$")
# The hints a student may ask for, one level at a time (`exercise hint ID LEVEL`): the first names the idea and
# never the code, the second the functions and data to use, the third nearly the lines. Only the first is in the
# student's copy and TASK.md.
HINT_LEVELS = ("hint", "hint2", "hint3")
# In a handout (`exercise handout`): the hints past the first, and the mark that the tree holds no solutions.
HINTS = os.path.join(ROOT, "tools", "exercise_hints.json")
HANDOUT = os.path.join(ROOT, "HANDOUT.md")
# Each exercise's write-up (docs/exercises/ID.md): the question it teaches, its chapter section, self-check
# questions and, from the ANSWERS mark on, their answers, which a handout leaves out.
WRITEUPS = os.path.join(ROOT, "docs", "exercises")
ANSWERS = "<!-- answers:"
# What a difficulty means (docs/exercises.md, "Difficulty").
DIFFICULTY = {"1": "one idea in a few lines, with the chapter open beside it",
              "2": "one idea whose indexing or edge cases need care: a mask, a fully masked row, a NaN",
              "3": "hardware detail beyond the paper: a fragment layout, a barrier's phase, a format's scale"}
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
                # The description: comment lines up to the solution (in a handout, up to the TODO that stands for it).
                while (n < len(lines) and lines[n].strip().startswith("//") and not END.match(lines[n])
                       and not TODO.match(lines[n])):
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
    if os.path.exists(HINTS):  # a handout: the hints past the first are kept apart from the sources
        for exercise_id, levels in json.load(open(HINTS)).items():
            if exercise_id in exercises:
                for field, text in levels.items():
                    exercises[exercise_id].setdefault(field, text)
    for entry in exercises.values():
        for field in ("teaches", "difficulty") + HINT_LEVELS:
            if field not in entry:
                raise Failure(f"exercise {entry['id']} has no '{field}:' line after its first BEGIN")
        if entry["difficulty"] not in DIFFICULTY:
            raise Failure(f"exercise {entry['id']}: difficulty '{entry['difficulty']}' is not one of 1, 2, 3")
    return exercises


def find(exercise_id):
    exercises = scan()
    if exercise_id not in exercises:
        close = difflib.get_close_matches(exercise_id, exercises, n=1)
        maybe = f"did you mean {close[0]}? " if close else ""
        raise Failure(f"unknown exercise '{exercise_id}' ({maybe}./flashlab exercise list names them all)")
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


LINK = re.compile(r"\]\(([^)#:\s]+)(#[^)]*)?\)")


def relink(markdown, source_dir, target_dir, copied=()):
    """Markdown whose relative links were written from source_dir, rewritten to work from target_dir. A link to
    one of `copied` (paths from the repository's root that target_dir holds a copy of, at the same path: a
    workspace's stage sources) goes to that copy, the student's own file, not the tree's."""
    def fix(match):
        linked = os.path.normpath(os.path.join(source_dir, match.group(1)))
        if os.path.relpath(linked, ROOT) in copied:
            linked = os.path.join(target_dir, os.path.relpath(linked, ROOT))
        target = os.path.relpath(linked, target_dir)
        return f"]({target}{match.group(2) or ''})"
    return LINK.sub(fix, markdown)


def writeup_path(exercise_id):
    return os.path.join(WRITEUPS, exercise_id + ".md")


def without_answers(text):
    """A write-up as a handout holds it: everything before the answers' mark."""
    return text.split(ANSWERS, 1)[0].rstrip() + "\n"


def writeup_problems(exercise_id):
    """What the exercise's write-up lacks ("" when it has it all): the question, a chapter link, two or three
    self-check questions and as many answers."""
    path = writeup_path(exercise_id)
    if not os.path.exists(path):
        return f"no write-up {os.path.relpath(path, ROOT)}"
    text = open(path).read()
    before, _, answers = text.partition(ANSWERS)
    questions = re.findall(r"^\d+\. ", before.split("## Check yourself", 1)[-1], re.M)
    problems = []
    if "## The question" not in before:
        problems.append("no '## The question'")
    if not re.search(r"\*\*Chapter:\*\* \[", before):
        problems.append("no '**Chapter:** [...]' link")
    if "## Check yourself" not in before or not 2 <= len(questions) <= 3:
        problems.append(f"{len(questions)} self-check questions (2 or 3 wanted)")
    if len(re.findall(r"^\d+\. ", answers, re.M)) != len(questions):
        problems.append("the answers do not match the questions")
    return "; ".join(problems)


def description(lines):
    """An exercise region's description lines as the student sees them: without the hints past the first
    (their continuation lines included), which `exercise hint ID LEVEL` gives one level at a time."""
    kept, hidden = [], False
    for line in lines:
        field = FIELD.match(line)
        if field:
            hidden = field.group(1) in HINT_LEVELS[1:]
        elif not line.strip().startswith("//   "):
            hidden = False
        if not hidden:
            kept.append(line)
    return kept


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


def copied_kernels(entry):
    """The stage's kernels that hold or include the exercise's lines: a workspace compiles them from its copy for
    the emulator, with every registration that calls them (cmake/exercises.cmake)."""
    return [path for path in stage_sources(entry["stage"]) if path.endswith(".cu") and touches_exercise(entry, path)]


def write_workspace(entry, folder, keep_solution, fill=None, quick=False, dir_flag="", stage_objects=False):
    """Copies the stage's sources into the workspace; the exercise's regions become TODOs unless keep_solution,
    or hold `fill`'s lines ({path: [lines of each region]}, a submission's, for grading). `quick`: compiled at
    -O1 (QUICK, cmake/exercises.cmake), for a copy that only has to fail. `dir_flag`: the ` --dir DIR` that
    TASK.md's check command needs for a workspace started outside exercises/. `stage_objects`: the program links
    the stage's own objects for every file (REUSE, no kernel copied): for a copy whose code is the stage's (the
    self-test's solutions, which it checks with only_comments_dropped), compiling it again would build the same
    code."""
    exercise_id, stage = entry["id"], entry["stage"]
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.makedirs(os.path.join(folder, stage))
    todo_files = []
    for path in stage_sources(stage):
        lines = open(os.path.join(ROOT, path)).read().split("\n")
        regions = entry["files"].get(path, [])
        for index, (start, solution_start, end) in reversed(list(enumerate(regions))):
            if fill is not None:
                replacement = fill[path][index]
            elif keep_solution:
                replacement = lines[solution_start:end]
            else:
                replacement = [todo_for(lines[solution_start:end], exercise_id)]
            lines[start:end + 1] = description(lines[start:solution_start]) + replacement + [lines[end]]
        if path in entry["files"]:
            todo_files.append(path)
        with open(os.path.join(folder, path), "w") as out:
            out.write("\n".join(lines))
    cpp = [path for path in stage_sources(stage) if path.endswith(".cpp")]
    own = [] if stage_objects else [path for path in cpp if touches_exercise(entry, path)]
    kernels = [] if stage_objects else copied_kernels(entry)
    target = target_name(exercise_id, folder)
    with open(os.path.join(folder, "exercise.cmake"), "w") as out:
        out.write("# Generated by ./flashlab exercise start: the student's copy of the stage, checked by the harness.\n")
        if stage_objects:
            out.write("# REUSE: every file, as this copy's code is the stage's (a solution): the program links the\n")
        else:
            out.write("# REUSE: files that neither hold nor include the exercise's lines; the program links the\n")
        out.write("# stage's own objects for them instead of compiling the copies again.\n")
        out.write(f"flashlab_add_exercise({target} {exercise_id} ${{CMAKE_CURRENT_LIST_DIR}}\n  ")
        out.write("\n  ".join(own))
        reused = [path for path in cpp if path not in own]
        out.write("\n  REUSE " + "\n  ".join(reused) if reused else "")
        out.write(("\n  CUDA " + "\n  ".join(kernels) if kernels else "") + ("\n  QUICK" if quick else "") + ")\n")
    with open(os.path.join(folder, "exercise.json"), "w") as out:
        json.dump({"id": exercise_id, "stage": stage, "target": target, "files": todo_files,
                   "grades": entry.get("grades"), "checks": entry.get("checks")}, out, indent=2)
    with open(os.path.join(folder, "TASK.md"), "w") as out:
        level = entry["difficulty"]
        out.write(f"# Exercise {exercise_id} ({stage}, difficulty {level} of 3: {DIFFICULTY[level]})\n\n")
        out.write(f"**What it teaches:** {entry['teaches']}\n\n")
        out.write("**Your task:** fill in the TODO in " + ", ".join(f"`{f}`" for f in todo_files) + ".\n\n")
        out.write(f"**Hint:** {entry['hint']}. More, one level at a time: `./flashlab exercise hint {exercise_id} 2`, "
                  "then 3.\n\n")
        out.write(f"**Check:** `./flashlab exercise check {exercise_id}{dir_flag}` builds your copy and runs the shared "
                  "test\n")
        out.write(f"harness on it (`exercise/{exercise_id}/...`); it passes when every case matches the fp64 reference.\n")
        out.write("A failing check ends with a short summary and the likely cause; the whole log is in check.log here.\n")
        if os.path.exists(writeup_path(exercise_id)):
            page = os.path.relpath(writeup_path(exercise_id), folder)
            out.write(f"\n**Check yourself:** the questions of [the exercise's page]({page}).\n")
        section = docs_section(entry.get("docs", ""))
        if section:
            chapter = entry["docs"].partition("#")[0]
            section = relink(section, os.path.join(ROOT, os.path.dirname(chapter)), folder, stage_sources(stage))
            out.write(f"\n## Background (from {chapter})\n\n{section}\n")
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
        print("Your copy does not compile:\n" + compile_errors(result.stdout))
    return result.returncode == 0


def compile_errors(output):
    """The compiler's errors, each once: a header in the copy is compiled by several of its programs (the
    emulator's build of a kernel, the registration), which report the same error each."""
    errors = list(dict.fromkeys(line for line in output.split("\n")
                                if "error" in line or "note:" in line or "undefined reference" in line))
    return "\n".join(errors[:20] or output.split("\n")[-30:])


def is_cuda(folder):
    """Whether the workspace in `folder` holds a CUDA stage's copy (its kernels run in the emulator)."""
    return "\n  CUDA " in open(os.path.join(folder, "exercise.cmake")).read()


def run_harness(build_dir, target, exercise_id, grades=None, first_failure=False, checks=None, tests=None,
                first_dtype=False, emulated=False, timeout=None, env=None, prefix=(), registered_as=None):
    """Runs the harness on exercise/ID only (and there on the implementations the exercise's optional 'grades:'
    field names, a regular expression: the ones whose code runs its lines; its optional 'checks:' field picks the
    checks, test_cases()); returns (passed, output). With first_failure, it stops at the
    first failing check (enough to see a skeleton fail). `tests` replaces the harness's test-case filter. With
    first_dtype, each implementation runs in its first dtype only. `emulated`: a CUDA exercise graded in the
    emulator, on the case matrix with its long lengths reduced as in the emulated test entries (every kind of
    case, tests/case_matrix.cpp). `registered_as`: the exercise whose name the program registers under, when it
    is not `exercise_id` (the self-test's one solution copy per stage)."""
    selected = f"^exercise/{registered_as or exercise_id}/" + (f"({grades})" if grades else "")
    env = dict(env or os.environ, FLASHLAB_IMPL=selected, FLASHLAB_VERBOSE="1")
    if first_dtype:
        env["FLASHLAB_DTYPES"] = "first"
    if emulated:
        env["FLASHLAB_CASE_SIZES"] = "emulator"
    program = os.path.join(build_dir, "exercises", target)
    stop = ["--abort-after=1"] if first_failure else []
    cases = tests or test_cases(checks)
    result = subprocess.run(list(prefix) + [program, f"--test-case={cases}", "--no-version"] + stop, env=env,
                            capture_output=True, text=True, timeout=timeout)
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


COURSE_GUIDE = os.path.join(ROOT, "docs", "exercises.md")
COURSE_ROW = re.compile(r"^\| (\d+) \| \[`([a-z0-9-]+)`\]")


def course_order():
    """The exercises' ids in the course's order: the table of docs/exercises.md, "The course", the one place
    that order is written."""
    rows = [COURSE_ROW.match(line) for line in open(COURSE_GUIDE).read().split("\n")]
    return [row.group(2) for row in rows if row]


def course_problems(exercises):
    """What is wrong with the course table against the exercises the sources hold: one missing, one unknown, one
    twice, numbers out of order."""
    rows = [COURSE_ROW.match(line) for line in open(COURSE_GUIDE).read().split("\n")]
    numbers = [int(row.group(1)) for row in rows if row]
    order = course_order()
    problems = [f"{e} is not in the course table" for e in sorted(set(exercises) - set(order))]
    problems += [f"{e} is in the course table but in no source" for e in sorted(set(order) - set(exercises))]
    problems += [f"{e} is in the course table twice" for e in sorted({e for e in order if order.count(e) > 1})]
    if numbers != list(range(1, len(numbers) + 1)):
        problems.append(f"the course table's numbers are {numbers}, not 1 to {len(numbers)}")
    return problems


def course_position(exercise_id):
    order = course_order()
    return order.index(exercise_id) if exercise_id in order else len(order)


def numbered(ids):
    """Exercises named with their places in the course: "one-pass (#2), backward-ds (#13)"."""
    return ", ".join(f"{i} (#{course_position(i) + 1})" for i in sorted(ids, key=course_position))


def command_list(_):
    exercises = scan()
    print(f"{'#':>2} {'exercise':22} {'stage':14} {'level':5}  what it teaches")
    for entry in sorted(exercises.values(), key=lambda e: (course_position(e["id"]), e["id"])):
        print(f"{course_position(entry['id']) + 1:>2} {entry['id']:22} {entry['stage']:14} {entry['difficulty']:5}  "
              f"{entry['teaches']}")


def command_start(args):
    entry = find(args.id)
    folder = workspace_dir(args.id, args.dir)
    if os.path.exists(folder) and not args.force:
        raise Failure(f"{os.path.relpath(folder, os.getcwd())} already exists and may hold your work: check it, or "
                      f"start again with --force (which overwrites it)")
    extra = f" --dir {args.dir}" if args.dir else ""
    write_workspace(entry, folder, keep_solution=False, dir_flag=extra)
    print(f"wrote {os.path.relpath(folder, os.getcwd())}/: your copy of {entry['stage']}/ with the TODO, and TASK.md")
    if os.path.exists(HANDOUT):
        # The stage's exercises before this one in the course that are not done: a later one's lines run
        # through theirs. One after it in the course is no concern yet.
        earlier = [other for other in graft_own_work(entry, folder)
                   if course_position(other) < course_position(args.id)]
        if earlier:
            print(f"  note: {entry['stage']}/ also holds {numbered(earlier)}, earlier in the course and not done "
                  f"yet: do {'them' if len(earlier) > 1 else 'it'} first where the same implementations run both "
                  "(docs/exercises.md gives the order)")
    for path in json.load(open(os.path.join(folder, "exercise.json")))["files"]:
        print(f"  edit {os.path.relpath(os.path.join(folder, path), os.getcwd())}")
    print(f"then: ./flashlab exercise check {args.id}{extra}")


def gpu_name():
    """The first GPU nvidia-smi lists, or None (no driver, no GPU)."""
    try:
        result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line for line in result.stdout.split("\n") if line.startswith("GPU ")]
    return lines[0] if result.returncode == 0 and lines else None


RUN = re.compile(r"^  (PASS|FAIL) (\S+) \[(\w+)\] (backward )?on '(.*)' \((.*)\)$")
# The groups a check's runs fall in, each scored all or nothing (a group holds cases that need the idea, so
# an error in the idea fails every group, while a slip that only one kind of case shows costs that group),
# and their weights: docs/exercises.md, "Grading".
GROUP_WEIGHTS = {"shapes": 30, "masks": 25, "special rows and values": 15, "variants": 10, "other dtypes": 10,
                 "properties": 10, "traffic": 20}
SPECIAL = ("large magnitude", "outliers", "fully masked", "seqlen_k 0", "no key", "no query token", "-inf")
VARIANT = ("softcap", "alibi", "dropout", "bias", "explicit scale")
MASKED = ("causal", "window", "padding", "mask", "ragged", "packed", "tree", "rows outside")


def parse_runs(output):
    """The harness's verdicts, one per implementation, dtype and case (FLASHLAB_VERBOSE): each a dict with
    status, impl, dtype, backward, case, shape and the failure's lines."""
    runs, current = [], None
    for line in output.split("\n"):
        match = RUN.match(line)
        if match:
            current = {"status": match.group(1), "impl": match.group(2), "dtype": match.group(3),
                       "backward": bool(match.group(4)), "case": match.group(5), "shape": match.group(6),
                       "detail": []}
            runs.append(current)
        elif line.startswith("    ") and current is not None:
            current["detail"].append(line.strip())
    return runs


def run_group(run, first_dtype):
    if run["dtype"] != first_dtype[run["impl"]]:
        return "other dtypes"
    name = run["case"].lower()
    for group, words in (("special rows and values", SPECIAL), ("variants", VARIANT), ("masks", MASKED)):
        if any(word in name for word in words):
            return group
    return "shapes"


def failed_test_cases(output):
    """The names of the doctest test cases that failed (their 'TEST CASE:' blocks)."""
    return list(dict.fromkeys(line.split(":", 1)[1].strip() for line in output.split("\n")
                              if line.startswith("TEST CASE:")))


def grade(output, passed, tests):
    """A check's result from the harness's output: its groups, score (0-100), first failing case and the likely
    cause of the failure, read from which outputs and which cases failed."""
    runs = parse_runs(output)
    first_dtype = {}
    for run in runs:
        first_dtype.setdefault(run["impl"], run["dtype"])
    groups = {}
    for run in runs:
        group = groups.setdefault(run_group(run, first_dtype), {"passed": 0, "failed": 0})
        group["passed" if run["status"] == "PASS" else "failed"] += 1
    failed_cases = failed_test_cases(output)
    for group, words, asked in (("properties", ("adding a constant", "permuting keys"), "adding a constant" in tests),
                                ("traffic", ("traffic models",), "traffic models" in tests)):
        if asked:
            failures = sum(any(word in name for word in words) for name in failed_cases)
            groups[group] = {"passed": 0 if failures else 1, "failed": failures}
    failures = [run for run in runs if run["status"] == "FAIL"]
    crashed = not passed and not failures and not any(
        "traffic models" in name or "adding a constant" in name or "permuting keys" in name for name in failed_cases)
    if crashed:  # no verdict names the failure: the program stopped (a crash, an uncaught error)
        groups = {name: {"passed": 0, "failed": 1} for name in groups} or {"shapes": {"passed": 0, "failed": 1}}
    total = sum(GROUP_WEIGHTS[name] for name in groups)
    earned = sum(GROUP_WEIGHTS[name] for name, group in groups.items() if group["failed"] == 0)
    score = round(100 * earned / total) if total and not crashed else 0
    if passed and not crashed:
        score = 100
    first = None
    if failures:
        run = failures[0]
        first = {"case": run["case"], "shape": run["shape"], "impl": run["impl"], "dtype": run["dtype"],
                 "error": run["detail"][:3]}
    return {"passed": passed, "score": score, "crashed": crashed,
            "groups": {name: dict(group, weight=GROUP_WEIGHTS[name]) for name, group in groups.items()},
            "first_failure": first,
            "cause": "" if score == 100 else likely_cause(runs, groups, failed_cases, output, crashed)}


ERRORS = re.compile(r"max error O (\S+) \(tolerance (\S+)\), LSE (\S+) \(tolerance (\S+)\)")


def likely_cause(runs, groups, failed_cases, output, crashed):
    """One sentence on where to look, from the pattern of the failure (never from the submission's text)."""
    failures = [run for run in runs if run["status"] == "FAIL"]
    text = "\n".join(line for run in failures for line in run["detail"]) + "\n" + output[-4000:]
    if "deadlock" in text:
        return ("the emulator found a deadlock: a wait for a phase that never completes; check the parity each "
                "wait names, and who arrives on that barrier")
    if "data race" in text or "while a cp.async" in text or "before its wait" in text:
        return ("the emulator found a race: memory read while another thread (or a copy in flight) writes it; "
                "a barrier or a wait is missing, or in the wrong place")
    if "undefined until written" in text:
        return ("the emulator saw shared memory read before anything was written there: a wait or a barrier that "
                "returns before the data has landed, or none at all")
    if crashed:
        return "the program stopped before any verdict: see the end of the log for the error"
    if not failures:
        if groups.get("traffic", {}).get("failed"):
            more = "more: it loads what no row needs" in output
            return ("every result is right, but the kernel moves " + ("more" if more else "fewer") + " bytes than "
                    "its model: " + ("it loads tiles no row needs; is a bound rounded one tile too far (a range "
                    "that ends exactly on a tile boundary)?" if more else "it skips tiles some row needs"))
        return "every case is right but a property check failed: see its message in the log"
    o_wrong = lse_wrong = 0
    for run in failures:
        for line in run["detail"]:
            match = ERRORS.search(line)
            if match:
                o_wrong += float(match.group(1)) > float(match.group(2)) or match.group(1) == "nan"
                lse_wrong += float(match.group(3)) > float(match.group(4)) or match.group(3) == "nan"
    if any("nan" in line.lower() for run in failures for line in run["detail"][1:]):
        nan = " (some outputs are NaN: an exp(-inf - (-inf)), or a 0 x inf, where a row sees no key?)"
    else:
        nan = ""
    failing = {name for name, group in groups.items() if group["failed"]}
    if failing == {"other dtypes"}:
        return "only the runs in a second dtype fail: a conversion or a rounding in that format" + nan
    if failing <= {"special rows and values"} or (nan and failing <= {"special rows and values", "variants", "masks"}):
        return ("only the cases with special rows fail: a row that sees no key has O = 0 and LSE = -inf, and a "
                "-inf score weighs 0 (docs/conventions.md §4)" + nan)
    if failing <= {"masks"}:
        return "only masked cases fail: check the bounds of the key ranges your lines use" + nan
    if o_wrong and not lse_wrong:
        return ("O is wrong but the LSE is right: the max and the sum are right, so look at the output "
                "accumulator: is it rescaled by exp(m_old - m_new) when the max grows, like l?" + nan)
    if lse_wrong and not o_wrong:
        return ("the LSE is wrong but O is right: O's normalization is right, so look at the LSE itself: "
                "m + ln(l), the natural log (not log2), with m and l in the same units" + nan)
    one_key = [run for run in failures if re.search(r"\bsk=1\b", run["shape"])]
    if o_wrong and lse_wrong and one_key:
        return ("even a case with a single key is wrong, where the softmax has nothing to rescale or merge: look at "
                "what your lines read, and when: an index, a load, or a wait that returns before the data is there"
                + nan)
    single = [run for run in runs if re.search(r"\bsk=(\d+)", run["shape"])
              and int(re.search(r"\bsk=(\d+)", run["shape"]).group(1)) <= 32]
    if single and all(run["status"] == "PASS" for run in single):
        return ("the cases with a few keys pass and the longer ones fail: look at what happens from one tile or "
                "split to the next (the rescale when the max grows, the merge of partial results)" + nan)
    return "O and the LSE are both wrong: the running max or the running sum is off; check how m and l are updated" + nan


def summary(exercise_id, result, log_path=None):
    """At most about 15 lines: the groups, the first failing case with its error, the likely cause."""
    lines = []
    if result["passed"]:
        lines.append(f"exercise {exercise_id}: every case passed (score 100).")
        return lines
    groups = result["groups"]
    lines.append(f"exercise {exercise_id}: failed; score {result['score']} of 100 (a group counts when all its cases pass)")
    for name, group in groups.items():
        runs = group["passed"] + group["failed"]
        state = "ok" if group["failed"] == 0 else f"FAIL ({group['failed']} of {runs})"
        lines.append(f"  {name:25} {state}")
    first = result["first_failure"]
    if first:
        lines.append(f"first failing case: '{first['case']}' ({first['shape']}), {first['impl']} [{first['dtype']}]")
        lines += ["  " + line for line in first["error"][:2]]
    lines.append(f"likely cause: {result['cause']}")
    if log_path:
        lines.append(f"the whole log: {log_path}")
    return lines


def check_workspace(exercise_id, folder, build_dir, meta, emulator_only=False, timeout=None, quiet=False):
    """Builds and grades one workspace; returns its record (compiled, passed, score, groups, first failure,
    likely cause, seconds) and writes the harness's whole output to check.log in the workspace."""
    started = time.monotonic()
    record = {"exercise": exercise_id, "compiled": False, "passed": False, "score": 0, "groups": {},
              "first_failure": None, "cause": "", "seconds": 0.0}
    result = subprocess.run(["cmake", "--build", build_dir, "--target", meta["target"]], capture_output=True,
                            text=True)
    if result.returncode != 0:
        record.update(cause="does not compile:\n" + compile_errors(result.stdout))
        record["seconds"] = round(time.monotonic() - started, 1)
        return record
    record["compiled"] = True
    # A CUDA exercise is graded in the emulator on every machine (a deadlock or a race is named there; on a GPU
    # a deadlock would hang).
    tests = test_cases(meta.get("checks"))
    try:
        passed, output = run_harness(build_dir, meta["target"], exercise_id, meta.get("grades"),
                                     checks=meta.get("checks"), emulated=is_cuda(folder), timeout=timeout)
    except subprocess.TimeoutExpired:
        record.update(cause=f"timed out after {timeout} s (a loop that never ends, or a hang)")
        record["seconds"] = round(time.monotonic() - started, 1)
        return record
    with open(os.path.join(folder, "check.log"), "w") as log:
        log.write(output)
    record.update(grade(output, passed, tests))
    record.pop("crashed", None)
    record["seconds"] = round(time.monotonic() - started, 1)
    if not emulator_only and record["passed"] and is_cuda(folder):
        gpu = gpu_name()
        compiler = cache_value(build_dir, "CMAKE_CUDA_COMPILER") or "NOTFOUND"
        if gpu and "NOTFOUND" not in compiler:
            if not quiet:
                print(f"now on the GPU ({gpu}): building your copy for it ({meta['target']}_gpu) ...", flush=True)
            configure_with(build_dir, [folder], gpu=True)
            if not build_target(build_dir, meta["target"] + "_gpu", quiet=quiet):
                record.update(passed=False, cause="the GPU build of your copy does not compile")
                return record
            passed, output = run_harness(build_dir, meta["target"] + "_gpu", exercise_id, meta.get("grades"),
                                         checks=meta.get("checks"), timeout=timeout)
            with open(os.path.join(folder, "check-gpu.log"), "w") as log:
                log.write(output)
            record["gpu"] = dict(grade(output, passed, tests), device=gpu)
            record["passed"] = record["passed"] and passed
    return record


def command_check(args):
    find(args.id)  # an unknown (or misspelled) exercise is named as such, before any workspace is looked for
    folder = workspace_dir(args.id, args.dir)
    meta_path = os.path.join(folder, "exercise.json")
    if not os.path.exists(meta_path):
        extra = f" --dir {args.dir}" if args.dir else ""
        raise Failure(f"no workspace for {args.id} in {folder} (run ./flashlab exercise start {args.id}{extra} first)")
    meta = json.load(open(meta_path))
    missing = graft_own_work(find(args.id), folder) if os.path.exists(HANDOUT) else []
    build_dir = os.path.join(ROOT, "build")
    configure_with(build_dir, [folder])
    if not args.json:
        print(f"building your copy ({meta['target']}) ...", flush=True)
    record = check_workspace(args.id, folder, build_dir, meta, emulator_only=args.emulator_only, quiet=args.json)
    if missing:
        record["not_done_here"] = missing
        if not args.json:
            print(f"note: your copy of {meta['stage']}/ also holds the lines of {numbered(missing)}, not done yet "
                  f"(no answer in exercises/{min(missing, key=course_position)}/): the implementations that run them fail until they "
                  "are (docs/exercises.md gives the order)")
    if args.json:
        print(json.dumps(record, indent=2))
    elif not record["compiled"]:
        print("Your copy " + record["cause"])
    else:
        log = os.path.relpath(os.path.join(folder, "check.log"), os.getcwd())
        print("\n".join(summary(args.id, record, log)))
        if "gpu" in record:
            print("\n".join(summary(args.id + " on the GPU", record["gpu"])))
    return 0 if record["passed"] else 1


def command_hint(args):
    entry = find(args.id)
    level = args.level
    if not 1 <= level <= len(HINT_LEVELS):
        raise Failure(f"hint level {level}: the levels are 1 to {len(HINT_LEVELS)}")
    print(f"{args.id}, hint {level} of {len(HINT_LEVELS)}: {entry[HINT_LEVELS[level - 1]]}")
    if level < len(HINT_LEVELS):
        print(f"(more: ./flashlab exercise hint {args.id} {level + 1})")


def command_solution(args):
    entry = find(args.id)
    if os.path.exists(HANDOUT):
        raise Failure("this tree is a handout: it holds no solutions (the instructor's tree does)")
    for path, regions in entry["files"].items():
        lines = open(os.path.join(ROOT, path)).read().split("\n")
        for _, solution_start, end in regions:
            print(f"--- {path}:{solution_start + 1}-{end}")
            print("\n".join(lines[solution_start:end]))


# ---- Class grading

def region_bodies(lines, exercise_id):
    """[(first, end)] line indexes of the body of each region of the exercise in `lines` (a copy of a stage file:
    past the description's comments, and the TODO line, up to the END marker), or None when a region has no END."""
    bodies, n = [], 0
    while n < len(lines):
        begin = BEGIN.match(lines[n])
        n += 1
        if not begin or begin.group(1) != exercise_id:
            continue
        while n < len(lines) and lines[n].strip().startswith("//") and not END.match(lines[n]):
            n += 1  # the description (and the TODO line)
        first = n
        while n < len(lines) and not END.match(lines[n]):
            if BEGIN.match(lines[n]):
                return None
            n += 1
        if n == len(lines):
            return None
        bodies.append((first, n))
        n += 1
    return bodies


def submitted_regions(entry, submission):
    """The student's lines of each of the exercise's regions, read from a submission folder that holds their
    copy of the stage's files (a workspace exercises/ID/, a handout tree, or just the changed files, at their
    paths in the project): ({path: [lines of each region]}, "") or (None, why not). Only the lines inside the
    regions are taken, past the description's comments; everything else in the submission is ignored."""
    fill = {}
    for path, regions in entry["files"].items():
        candidates = [os.path.join(submission, "exercises", entry["id"], path), os.path.join(submission, path)]
        found = next((c for c in candidates if os.path.isfile(c)), None)
        if found is None:
            return None, f"not submitted ({path} is missing)"
        lines = open(found, errors="replace").read().split("\n")
        bodies = region_bodies(lines, entry["id"])
        if bodies is None:
            return None, f"{path}: a region of {entry['id']} has no END marker"
        if len(bodies) != len(regions):
            return None, f"{path}: {len(bodies)} regions of {entry['id']}, the exercise has {len(regions)}"
        fill[path] = [lines[first:end] for first, end in bodies]
    return fill, ""


def holds_code(lines, first, end):
    """Whether a region's body (region_bodies()) holds code: a line that is neither blank nor a comment. A body
    that does not is not done (its skeleton's TODO, or nothing)."""
    return any(line.strip() and not line.strip().startswith("//") for line in lines[first:end])


def todo_line(exercise_id):
    return f"// TODO(exercise {exercise_id}): write the lines described above."


def todo_for(solution, exercise_id):
    """The TODO line that stands for a region's solution lines, indented as the first of them that is not a
    preprocessor line (`#pragma unroll` sits in column 0)."""
    code = next((line for line in solution if not line.lstrip().startswith("#")), solution[0] if solution else "")
    return re.match(r"^\s*", code).group(0) + todo_line(exercise_id)


def graft_own_work(entry, folder):
    """In a handout, the stage's other exercises are TODOs in the copy too. Where the student has a workspace
    for one (exercises/OTHER/), its lines are put into this copy, so that the implementations that run both
    are checked with the student's own answers. Returns the other exercises still not done in the copy."""
    missing = []
    for other in scan().values():
        if other["id"] == entry["id"] or other["stage"] != entry["stage"]:
            continue
        fill, _ = submitted_regions(other, os.path.join(ROOT, "exercises", other["id"]))
        for path in other["files"]:
            copy = os.path.join(folder, path)
            lines = open(copy).read().split("\n")
            bodies = region_bodies(lines, other["id"]) or []
            for index, (first, end) in reversed(list(enumerate(bodies))):
                if fill is not None and index < len(fill[path]):
                    lines[first:end] = fill[path][index]
            with open(copy, "w") as out:
                out.write("\n".join(lines))
            if not all(holds_code(lines, first, end) for first, end in bodies) and other["id"] not in missing:
                missing.append(other["id"])
    return missing


def unfinished(exercises):
    """{stage: [ids]}: the exercises whose lines are not in this tree's stage sources, where some region of the
    exercise holds no code (its skeleton: the TODO comment only). In the instructor's tree none; in a handout, every
    one until the student writes the lines into the stage itself."""
    result = {}
    for exercise_id, entry in sorted(exercises.items()):
        for path in entry["files"]:
            lines = open(os.path.join(ROOT, path)).read().split("\n")
            bodies = region_bodies(lines, exercise_id) or []
            if not all(holds_code(lines, first, end) for first, end in bodies):
                result.setdefault(entry["stage"], []).append(exercise_id)
                break
    return result


def test_sources():
    """The harness's sources (tests/*.cpp, *.cu, *.hpp), relative to the root."""
    folder = os.path.join(ROOT, "tests")
    return sorted(os.path.join("tests", name) for name in os.listdir(folder) if name.endswith(SOURCE_SUFFIXES))


def stages_used(path, seen=None):
    """The stages a harness source uses directly: it includes one of their files or names one of their
    implementations ("stage/..."), itself or through a helper of tests/ it includes (the helper's header, and the
    source beside it that defines what the header declares)."""
    seen = set() if seen is None else seen
    if path in seen or not os.path.isfile(os.path.join(ROOT, path)):
        return set()
    seen.add(path)
    text = open(os.path.join(ROOT, path)).read()
    used = {stage for stage in STAGES if f'"{stage}/' in text}
    for helper in re.findall(r'#include "(tests/[\w.]+)\.h(?:pp)?"', text):
        for suffix in (".hpp", ".h", ".cpp", ".cu"):
            used |= stages_used(helper + suffix, seen)
    return used


def command_not_done(args):
    """For the build (CMakeLists.txt): the exercises not done in this tree, and what leaves them out of the tests.
    One JSON object: 'not_done' {stage: [ids]}; 'test_files', the harness sources that use one of those stages
    directly (left out of the harness's runs); 'watch', the files whose edit changes the answer."""
    exercises = scan()
    not_done = unfinished(exercises)
    tests = [path for path in test_sources() if stages_used(path) & set(not_done)]
    watch = sorted({path for entry in exercises.values() for path in entry["files"]})
    print(json.dumps({"not_done": not_done, "test_files": tests, "watch": watch}))
    return 0


def isolated():
    """The command prefix that runs a submission without network (a new network namespace), or () where the
    machine cannot make one."""
    try:
        ok = subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return ("unshare", "-rn") if ok else ()


def one_line_reason(record):
    """A record's reason on one line: the cause, and for a copy that does not compile its first error."""
    lines = [line.strip() for line in (record["cause"] or "").split("\n") if line.strip()]
    return " ".join(lines[:2]) if lines and lines[0].endswith(":") else (lines[0] if lines else "")


def command_grade(args):
    """Grades a folder of submissions (one folder a student) in one go: JSON and CSV, per student and exercise."""
    if os.path.exists(HANDOUT):
        raise Failure("this tree is a handout: grade in the instructor's tree, which holds the other exercises' "
                      "solutions that a submission is grafted into")
    exercises = scan()
    wanted = args.exercise or sorted(exercises)
    for exercise_id in wanted:
        find(exercise_id)
    submissions = os.path.abspath(args.submissions)
    if not os.path.isdir(submissions):
        raise Failure(f"{args.submissions} is not a folder of submissions (one folder a student)")
    students = sorted(d for d in os.listdir(submissions) if os.path.isdir(os.path.join(submissions, d)))
    if not students:
        raise Failure(f"{args.submissions} holds no submission folder")
    out = os.path.abspath(args.out)
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    build_dir = os.path.abspath(args.build_dir)
    jobs = args.jobs or os.cpu_count() or 1
    prefix = isolated()
    scratch = tempfile.mkdtemp(prefix="flashlab-grading-")
    original = cache_value(build_dir, "FLASHLAB_EXERCISE_DIRS") or ""
    records, plans = [], []
    started = time.monotonic()
    try:
        for n, student in enumerate(students):
            for exercise_id in wanted:
                entry = exercises[exercise_id]
                fill, reason = submitted_regions(entry, os.path.join(submissions, student))
                record = {"student": student, "exercise": exercise_id, "compiled": False, "passed": False,
                          "score": 0, "first_failure": None, "cause": reason, "seconds": 0.0, "groups": {}}
                records.append(record)
                if fill is None:
                    continue
                folder = os.path.join(scratch, f"s{n}", exercise_id)
                target = write_workspace(entry, folder, keep_solution=False, fill=fill)
                plans.append((record, folder, target))
        if plans:
            configure_with(build_dir, [folder for _, folder, _ in plans])
            print(f"building {len(plans)} submissions against {os.path.relpath(build_dir, os.getcwd())} "
                  f"({jobs} jobs) ...", flush=True)
            build = subprocess.run(["cmake", "--build", build_dir, "-j", str(jobs), "--target"]
                                   + [target for _, _, target in plans] + ["--", "-k", "0"],
                                   capture_output=True, text=True)

            def run(plan):
                record, folder, target = plan
                exercise_id = record["exercise"]
                begun = time.monotonic()
                if not os.path.exists(os.path.join(build_dir, "exercises", target)):
                    mine = "\n".join(line for line in build.stdout.split("\n") if folder + os.sep in line)
                    record["cause"] = "does not compile:\n" + compile_errors(mine or build.stdout)
                    return
                record["compiled"] = True
                entry = exercises[exercise_id]
                tests = test_cases(entry.get("checks"))
                env = dict(os.environ, OMP_NUM_THREADS="1")
                try:
                    passed, output = run_harness(build_dir, target, exercise_id, entry.get("grades"),
                                                 checks=entry.get("checks"), emulated=is_cuda(folder),
                                                 timeout=args.timeout, env=env, prefix=prefix)
                except subprocess.TimeoutExpired:
                    record["cause"] = f"timed out after {args.timeout} s (a loop that never ends, or a hang)"
                    record["seconds"] = round(time.monotonic() - begun, 1)
                    return
                with open(os.path.join(out, "logs", f"{record['student']}-{exercise_id}.log"), "w") as log:
                    log.write(output)
                result = grade(output, passed, tests)
                record.update({k: result[k] for k in ("passed", "score", "groups", "first_failure", "cause")})
                if "deadlock" in result["cause"] or result["crashed"]:
                    record["score"] = 0  # a hang or a crash earns nothing, whatever else passed
                record["seconds"] = round(time.monotonic() - begun, 1)

            with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
                list(pool.map(run, plans))
    finally:
        original = ";".join(d for d in original.split(";") if d and os.path.isdir(d))
        subprocess.run(["cmake", "-S", ROOT, "-B", build_dir, "-DFLASHLAB_EXERCISE_DIRS=" + original],
                       stdout=subprocess.DEVNULL)
        shutil.rmtree(scratch, ignore_errors=True)
    with open(os.path.join(out, "grades.json"), "w") as handle:
        json.dump({"weights": GROUP_WEIGHTS, "isolated_network": bool(prefix), "grades": records}, handle,
                  indent=2)
    with open(os.path.join(out, "grades.csv"), "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "exercise", "score", "compiled", "passed", "first_failure", "reason",
                         "seconds"])
        for r in records:
            first = r["first_failure"]
            writer.writerow([r["student"], r["exercise"], r["score"], r["compiled"], r["passed"],
                             f"{first['case']} ({first['shape']})" if first else "",
                             "" if r["passed"] else one_line_reason(r), r["seconds"]])
    print(f"{'student':20} {'exercise':22} {'score':>5}  reason")
    for r in records:
        print(f"{r['student']:20} {r['exercise']:22} {r['score']:5}  {'' if r['passed'] else one_line_reason(r)}")
    print(f"graded {len(records)} in {time.monotonic() - started:.0f} s"
          + ("" if prefix else " (this machine cannot cut the network: submissions ran with it)")
          + f"; wrote {os.path.relpath(out, os.getcwd())}/grades.json and grades.csv, logs in logs/")
    return 0


# ---- Handouts

HANDOUT_LEFT_OUT = ("tools/exercise_mistakes.json",)  # the known mistakes are edited solution lines


def normalized(line):
    return " ".join(line.split())


def region_lines(exercises):
    """{path: set of line indexes} of every region's solution lines in the instructor's tree."""
    inside = {}
    for entry in exercises.values():
        for path, regions in entry["files"].items():
            for _, solution_start, end in regions:
                inside.setdefault(path, set()).update(range(solution_start, end))
    return inside


def meaningful(line):
    """A line whitespace-normalized, its comment dropped; "" for one that says nothing (blank, a brace, a
    pragma, a bare keyword)."""
    text = normalized(line.split("//")[0])
    return text if len(text) >= 6 and re.search(r"[A-Za-z]", text) and not text.startswith("#") else ""


def solution_lines(exercises, files):
    """The solution lines a handout must not hold, and the files that hold the same lines as ordinary code.
    A solution line that also stands outside every region of the instructor's tree (a loop header, the same
    combine written again in another stage) is the same mathematics written elsewhere, not the solution: the
    course guide names those files, and the line is not searched for. Returns ({line: exercise},
    {file: [exercises]})."""
    inside = region_lines(exercises)
    found = {}
    for entry in exercises.values():
        for path, regions in entry["files"].items():
            lines = open(os.path.join(ROOT, path)).read().split("\n")
            for _, solution_start, end in regions:
                for line in lines[solution_start:end]:
                    if meaningful(line):
                        found.setdefault(meaningful(line), entry["id"])
    owner, elsewhere = dict(found), {}
    own = {entry["id"]: set(entry["files"]) for entry in exercises.values()}
    for path in files:
        if not path.endswith(SOURCE_SUFFIXES + (".py", ".sh", ".cmake", ".txt")):
            continue
        mine = inside.get(path, set())
        for number, line in enumerate(open(os.path.join(ROOT, path), errors="replace").read().split("\n")):
            text = meaningful(line)
            if text in owner and number not in mine:
                found[text] = None
                # A loop or branch header shared with other code gives nothing away; a file of the exercise's
                # own is one the student reads anyway.
                if not re.match(r"(for|if|while|else|\} else)\b", text) and path not in own[owner[text]]:
                    elsewhere.setdefault(path, set()).add(owner[text])
    return ({line: eid for line, eid in found.items() if eid},
            {path: sorted(ids) for path, ids in sorted(elsewhere.items())})


def leaks(tree, lines):
    """(file, line number, exercise) for each line of a file under `tree` that is a solution line."""
    hits = []
    for folder, dirs, names in os.walk(tree):
        dirs[:] = [d for d in dirs if d not in (".git", "build", "build-asan")]
        for name in names:
            path = os.path.join(folder, name)
            try:
                text = open(path, encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            for number, line in enumerate(text.split("\n"), 1):
                exercise = lines.get(meaningful(line))
                if exercise:
                    hits.append((os.path.relpath(path, tree), number, exercise))
    return hits


def tracked_files():
    result = subprocess.run(["git", "-C", ROOT, "ls-files"], capture_output=True, text=True)
    if result.returncode == 0:
        return [line for line in result.stdout.split("\n") if line]
    raise Failure("the handout is made from the instructor's git checkout (git ls-files found none)")


def command_handout(args):
    """Writes a student handout: the project with every exercise region holding its skeleton."""
    if os.path.exists(HANDOUT):
        raise Failure("this tree is already a handout: make handouts from the instructor's tree")
    out = os.path.abspath(args.dir)
    if os.path.exists(out) and os.listdir(out):
        raise Failure(f"{args.dir} exists and is not empty")
    exercises = scan()
    files = tracked_files()
    searched, elsewhere = solution_lines(exercises, files)
    for path in files:
        if path in HANDOUT_LEFT_OUT or not os.path.isfile(os.path.join(ROOT, path)):
            continue
        os.makedirs(os.path.dirname(os.path.join(out, path)) or out, exist_ok=True)
        shutil.copy2(os.path.join(ROOT, path), os.path.join(out, path))
    by_file = {}
    for entry in exercises.values():
        for path, regions in entry["files"].items():
            by_file.setdefault(path, []).extend((start, solution_start, end, entry["id"])
                                                for start, solution_start, end in regions)
    for path, regions in by_file.items():
        lines = open(os.path.join(ROOT, path)).read().split("\n")
        for start, solution_start, end, exercise_id in sorted(regions, reverse=True):
            todo = [todo_for(lines[solution_start:end], exercise_id)]
            lines[start:end + 1] = description(lines[start:solution_start]) + todo + [lines[end]]
        with open(os.path.join(out, path), "w") as handle:
            handle.write("\n".join(lines))
    for exercise_id in exercises:  # the write-ups' answers stay in the instructor's tree
        page = os.path.relpath(writeup_path(exercise_id), ROOT)
        if os.path.exists(os.path.join(out, page)):
            text = open(os.path.join(out, page)).read()
            with open(os.path.join(out, page), "w") as handle:
                handle.write(without_answers(text))
    with open(os.path.join(out, "tools", "exercise_hints.json"), "w") as handle:
        json.dump({eid: {level: entry[level] for level in HINT_LEVELS[1:]} for eid, entry in sorted(exercises.items())},
                  handle, indent=2)
    with open(os.path.join(out, "HANDOUT.md"), "w") as handle:
        handle.write(HANDOUT_TEXT)
        handle.write("\nThese files hold some of the same lines as ordinary code (the same mathematics written for "
                     "another\nstage or check); reading them while you work on the exercise spoils it:\n\n")
        for path, ids in elsewhere.items():
            handle.write(f"- `{path}`: {', '.join(ids)}\n")
    hits = leaks(out, searched)
    for folder, _, names in os.walk(os.path.join(out, os.path.relpath(WRITEUPS, ROOT))):
        hits += [(os.path.relpath(os.path.join(folder, name), out), 0, "an answer")
                 for name in names if ANSWERS in open(os.path.join(folder, name)).read()]
    for path, number, exercise in hits[:20]:
        print(f"  LEAK {path}:{number}: a solution line of {exercise}")
    if hits:
        raise Failure(f"the handout in {args.dir} holds {len(hits)} solution line(s): not safe to hand out")
    print(f"wrote the handout {os.path.relpath(out, os.getcwd())}/: {len(exercises)} exercises as skeletons; "
          f"no solution line anywhere in it ({len(searched)} lines searched for; HANDOUT.md names the "
          f"{len(elsewhere)} files that hold the same mathematics)")
    return 0


HANDOUT_TEXT = """# This is a course handout

Every exercise region of the stages holds its skeleton (a TODO): the solutions are not in this tree, its docs
or its history. Start an exercise with `./flashlab exercise start ID` (`./flashlab exercise list` names them;
docs/exercises.md is the course guide), write your lines in the copy it makes, and check them with
`./flashlab exercise check ID`. `./flashlab exercise hint ID 2` (then 3) gives more help, one level at a time.

Hand in the files of your workspace (exercises/ID/...): only the lines inside the exercise regions are graded.

`./flashlab test` and `./flashlab compare` report each stage whose exercise is not done in this tree (its region
still holds the TODO) as "exercise not done" instead of running it. Paste your passing lines into the stage's own
file to get the stage back in them, checked by the whole test harness.
"""


MISTAKES = os.path.join(ROOT, "tools", "exercise_mistakes.json")


def write_mistake(entry, mistake, folder):
    """A workspace holding the solution with the mistake's replacements made in the exercise's lines."""
    target = write_workspace(entry, folder, keep_solution=True, quick=True)
    for old, new in mistake["replace"].items():
        found = 0
        for path in entry["files"]:
            lines = open(os.path.join(folder, path)).read().split("\n")
            for first, end in region_bodies(lines, entry["id"]):
                for n in range(first, end):
                    found += lines[n].count(old)
                    lines[n] = lines[n].replace(old, new)
            with open(os.path.join(folder, path), "w") as out:
                out.write("\n".join(lines))
        if not found:
            raise Failure(f"{MISTAKES}: '{old}' is not in the lines of exercise {entry['id']}")
    return target


def only_comments_dropped(original, copy):
    """Whether the lines of `copy` are those of `original` less some whole-line // comments: the same code for the
    compiler, but for line numbers. No line next to a dropped one may be joined to it by a backslash (a dropped
    comment continued onto code, or code continued onto the dropped comment)."""
    n, previous = 0, ""
    for line in original:
        if n < len(copy) and line == copy[n]:
            n += 1
        elif not line.strip().startswith("//") or line.rstrip().endswith("\\") or previous.rstrip().endswith("\\"):
            return False
        previous = line
    return n == len(copy)


def task_link_problems(folder, stage):
    """What is wrong with a workspace's TASK.md links: one that leads nowhere, or one to the tree's copy of a
    file the workspace holds its own copy of (in the instructor's tree, that copy is the solution)."""
    problems = []
    for link, _ in LINK.findall(open(os.path.join(folder, "TASK.md")).read()):
        target = os.path.normpath(os.path.join(folder, link))
        if not os.path.exists(target):
            problems.append(f"{link} leads nowhere")
        elif os.path.relpath(target, ROOT) in stage_sources(stage):
            problems.append(f"{link} is the tree's {os.path.relpath(target, ROOT)}, not the workspace's copy")
    return problems


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
        if args.only:
            wanted = set(args.only.split(","))
            for exercise_id in wanted - set(exercises):
                raise Failure(f"--only: unknown exercise '{exercise_id}'")
            exercises = {k: v for k, v in exercises.items() if k in wanted}
        kernels_of = {exercise_id: copied_kernels(entry) for exercise_id, entry in exercises.items()}
        for exercise_id, entry in sorted(exercises.items()):
            folder = os.path.join(scratch, "skeleton", exercise_id)
            plans.append((exercise_id, "skeleton", folder, write_workspace(entry, folder, False, quick=True)))
            for problem in task_link_problems(folder, entry["stage"]):
                raise Failure(f"{exercise_id}: TASK.md: {problem}")
        # The solutions: a stage's copy with every region's solution is the same program for each of its
        # exercises (the CPU ones and those with kernels apart), so it is built once and graded once per exercise,
        # as that exercise's check grades it.
        solutions = {}
        for exercise_id, entry in sorted(exercises.items()):
            kernels = bool(kernels_of[exercise_id])
            group = solutions.setdefault((entry["stage"], kernels), dict(entry, files={}, members=[]))
            group["members"].append(exercise_id)
            for path, regions in entry["files"].items():
                group["files"][path] = sorted(group["files"].get(path, []) + regions)
        # Its code is the stage's: the regions' solutions as they are, less the hints past the first (comment
        # lines). So the program links the stage's own objects, which the build compiled with the project's
        # warnings (errors in CI, FLASHLAB_WERROR), rather than compiling the same code again; the copy is checked
        # to be that code.
        registered_as, not_the_stage = {}, {}
        for group in solutions.values():
            folder = os.path.join(scratch, "solution", group["id"])
            target = write_workspace(group, folder, keep_solution=True, stage_objects=True)
            differs = [path for path in stage_sources(group["stage"])
                       if not only_comments_dropped(open(os.path.join(ROOT, path)).read().split("\n"),
                                                    open(os.path.join(folder, path)).read().split("\n"))]
            for exercise_id in group["members"]:
                plans.append((exercise_id, "solution", folder, target))
                registered_as[exercise_id] = group["id"]
                not_the_stage[exercise_id] = differs
        # The path a student's right answer takes through cmake/exercises.cmake, for a CUDA exercise (its kernels
        # compiled from the copy, the registrations that call them too): one solution compiled from its copy,
        # that of the exercise with the fewest kernels to compile. A CPU exercise's takes exercise_grading's.
        cuda = [exercise_id for exercise_id in exercises if kernels_of[exercise_id]]
        if cuda:
            entry = exercises[min(cuda, key=lambda exercise_id: (len(kernels_of[exercise_id]), exercise_id))]
            folder = os.path.join(scratch, "copy", entry["id"])
            plans.append((entry["id"], "copy", folder, write_workspace(entry, folder, keep_solution=True, quick=True)))
        mistakes = json.load(open(MISTAKES))["mistakes"]
        for n, mistake in enumerate(mistakes):
            if mistake["exercise"] not in scan():
                raise Failure(f"{MISTAKES}: no exercise '{mistake['exercise']}'")
            if mistake["exercise"] not in exercises:
                continue
            folder = os.path.join(scratch, f"mistake{n}", mistake["exercise"])
            plans.append((mistake["exercise"], f"mistake{n}", folder,
                          write_mistake(exercises[mistake["exercise"]], mistake, folder)))
        configure_with(build_dir, list(dict.fromkeys(plan[2] for plan in plans)))
        targets = list(dict.fromkeys(plan[3] for plan in plans))
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
            if writeup_problems(exercise_id):
                failed += 1
                print(f"  BAD  {exercise_id}: its write-up: {writeup_problems(exercise_id)}")
        # A solution is the stage's own code, which the harness checks in every dtype: here the stage's objects,
        # registered as the exercise, pass its check in the first dtype (and one copy, compiled, does too).
        # Skeletons and mistakes keep every dtype.
        # Exercises of one stage whose checks grade the same implementations by the same cases share the stage's
        # solution program, so their checks are one run, made once, by the first of them.
        def run_key(plan):
            exercise_id, variant, _, target = plan
            entry = exercises[exercise_id]
            return (target, entry.get("grades"), entry.get("checks")) if variant == "solution" else plan

        first_of = {}  # run key -> the plan that runs it
        for plan in plans:
            first_of.setdefault(run_key(plan), plan)

        def run(plan):  # -> ((passed, output), seconds)
            exercise_id, variant, folder, target = plan
            mistake = mistakes[int(variant[len("mistake"):])] if variant.startswith("mistake") else None
            entry = exercises[exercise_id]
            started = time.monotonic()
            # One thread each: the runs share the machine's cores, as a class's grading does. A CUDA exercise's
            # kernels run in the emulator, as its check runs them: a solution program links the stage's link
            # libraries, which hold the GPU build too where the build has CUDA, so it is told to (FLASHLAB_EMULATE).
            env = dict(os.environ, OMP_NUM_THREADS="1")
            kernels = bool(kernels_of[exercise_id])
            if kernels:
                env["FLASHLAB_EMULATE"] = "1"
            right = variant in ("solution", "copy")
            result = run_harness(build_dir, target, exercise_id, entry.get("grades"),
                                 first_failure=not right, checks=entry.get("checks"),
                                 tests=mistake.get("tests") if mistake else None,
                                 first_dtype=right, emulated=kernels, env=env,
                                 registered_as=registered_as.get(exercise_id) if variant == "solution" else None)
            return result, time.monotonic() - started

        jobs = args.jobs or os.cpu_count() or 1
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            runs = dict(zip(first_of, pool.map(run, first_of.values())))
        print(f"  ran {len(runs)} checks in {time.monotonic() - started:.0f} s, {jobs} at a time")
        for plan in plans:
            exercise_id, variant, folder, target = plan
            mistake = mistakes[int(variant[len("mistake"):])] if variant.startswith("mistake") else None
            # Warning-free, so that a skeleton also compiles where warnings are errors (the ci preset's stages).
            warnings = list(dict.fromkeys(line for line in build.stdout.split("\n")  # once each, in order
                                          if folder + os.sep in line and "warning:" in line))
            (ok, output), seconds = runs[run_key(plan)]
            shared = first_of[run_key(plan)][0] if first_of[run_key(plan)] is not plan else None
            expected = variant in ("solution", "copy")
            # A skeleton must fail some check of the harness: a case on its numbers or with a fault the emulator
            # names (a deadlock, a race), or a property; not by crashing the program. A mistake must fail with
            # the words that name it.
            wrong_numbers = re.search(r"^  FAIL ", output, re.M) is not None or property_failures(output) != ""
            named = mistake is None or mistake["says"] in output
            # A failing check's summary fits a screen and names a likely cause (for a mistake, the one expected).
            tests = (mistake.get("tests") if mistake else None) or test_cases(exercises[exercise_id].get("checks"))
            lines = summary(exercise_id, grade(output, ok, tests)) if not ok else []
            cause = next((line for line in lines if line.startswith("likely cause:")), "")
            explained = ok or (len(lines) <= 15 and cause != "" and (mistake is None or mistake["cause"] in cause))
            differs = not_the_stage.get(exercise_id, []) if variant == "solution" else []
            good = ok == expected and not warnings and (ok or wrong_numbers) and named and explained and not differs
            passed, failed = passed + good, failed + (not good)
            verdict = "passes" if ok else "fails"
            what = f"the mistake '{mistake['mistake']}'" if mistake else f"the {variant}"
            what = "the solution compiled from its copy" if variant == "copy" else what
            what += " (first dtype)" if expected else ""
            timing = f"the run of {shared}'s check" if shared else f"{seconds:.1f} s"
            print(f"  {'ok  ' if good else 'BAD '} {exercise_id}: {what} {verdict} the check ({timing})"
                  + (f", but compiles with {len(warnings)} warning(s):" if warnings else "")
                  + ("" if named else f", but without saying '{mistake['says']}'")
                  + ("" if explained else f", but its summary ({len(lines)} lines) names no expected cause")
                  + (f", but the copy's code is not the stage's in {', '.join(differs)}" if differs else ""))
            if mistake and not ok:
                print("       " + cause)
            for line in warnings:
                print("       " + line)
            if not ok and not wrong_numbers:
                print("       but no case failed (a crash, or a property check?):")
            if not explained:
                print("\n".join("       " + line for line in lines))
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
            p.add_argument("--json", action="store_true", help="print the result as one JSON record")
    p = sub.add_parser("hint", help="a hint, one level at a time (1: the idea, 2: what to use, 3: nearly the lines)")
    p.add_argument("id")
    p.add_argument("level", nargs="?", type=int, default=1)
    p = sub.add_parser("solution", help="print the reference lines (for instructors)")
    p.add_argument("id")
    p = sub.add_parser("grade", help="grade a folder of submissions (one folder a student): JSON and CSV")
    p.add_argument("submissions")
    p.add_argument("--out", required=True, help="where grades.json, grades.csv and the logs go")
    p.add_argument("--exercise", action="append", help="grade this exercise (repeatable; default: all)")
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build"), help="the prebuilt tree (default build/)")
    p.add_argument("--timeout", type=int, default=600, help="seconds a submission's check may run (600)")
    p.add_argument("--jobs", type=int, help="parallel builds and checks (default: the machine's cores)")
    p = sub.add_parser("handout", help="write a student handout: the project with every solution replaced")
    p.add_argument("dir")
    sub.add_parser("not-done", help="for the build: the exercises whose lines this tree lacks (JSON)")
    p = sub.add_parser("selftest", help="prove the mechanism on every exercise")
    p.add_argument("--build-dir", required=True)
    p.add_argument("--only", help="these exercises only (comma-separated ids)")
    p.add_argument("--jobs", type=int, help="checks run at once (default: the machine's cores)")
    args = parser.parse_args()
    handlers = {"list": command_list, "start": command_start, "check": command_check, "hint": command_hint,
                "solution": command_solution, "selftest": command_selftest, "grade": command_grade,
                "handout": command_handout, "not-done": command_not_done}
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
