#!/usr/bin/env python3
"""The GPU report: build, check and time flashlab on a GPU machine, in phases that fit a short, offline visit.

    bash bench/gpu_report.sh [--phase all|check|speed|extra] [--commit SHA] [--kit DIR] [--impls REGEX]
                             [--first-shape N] [--last-shape N] [--baseline-shapes N] [--seconds N] OUTDIR
    bash bench/gpu_report.sh --rehearse OUTDIR       every phase here, without a GPU (CI runs it)
    bash bench/gpu_report.sh --merge OUTDIR RESULTS.json...   one result from several calls' results

Phases and their budgets (bench/README.md "On an offline GPU machine"):
  check (330 s): the build for this GPU's architecture only; the harness on the GPU and the emulator's tests
                 against the hardware; compute-sanitizer memcheck and racecheck over a few small cases of every
                 GPU implementation, each tool in one process; the Python module with PyTorch CUDA tensors
                 (bench/gpu_python_smoke.py).
  speed (240 s): the GPU's copy bandwidth and bf16 GEMM rate; then shape by shape (the goals' shapes first),
                 our implementations (the Hopper rungs and the decode first) and right after them PyTorch SDPA's
                 flash, cuDNN, efficient and math backends on the same shape; the backward likewise.
  extra (240 s): what is not a speed: Nsight Compute's profile of one launch of each top kernel (split_q, ws,
                 fp8, the decode, the backward, then the candidate rungs), its clocks left alone; the FP8 kernel's
                 LSE against the emulation's on large inputs (bench/fp8_lse_seeds.py); FP8 accuracy on the GPU's
                 kernel; the Hopper kernels' SASS.
  all   (540 s): check, speed, then extra while time is left.
A phase run alone builds first when it finds no build. --seconds N replaces the call's budget: the 540 s of all, or
the one phase's own (a second call can take what the visit has left).

Everything a step finishes is written at once: OUTDIR always holds a complete, valid result of what has run
so far, in at most 8 files (results-DEVICE-DATE.json and .md, summary.txt, logs.tar.gz), so a call killed at its
time limit keeps every finished row. An earlier call's result in OUTDIR is replaced, whatever its date. A tool that does not work in this runtime (compute-sanitizer, cuBLAS,
PyTorch) is reported "unavailable", never as a kernel failure, and costs no other row. Exit code: 0 when no check
failed, 1 otherwise, 2 for a usage error.

--rehearse runs every phase on a machine without a GPU: the GPU stages in the CPU emulator on tiny shapes (rows
marked "emulated", no rate), the sanitizers and the peers in their dry form, through the same steps, files and
budgets; then it drills the failures a GPU visit can meet (a step that times out, no cuBLAS, no peers, a kernel
that faults or hangs) and checks that every finished row survives each, that the files follow the results schema
(bench/results_schema.py) and that OUTDIR holds at most 8 files.
"""
import argparse
import datetime
import glob
import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_schema  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_FILES = 8
PHASE_BUDGETS = {"check": 330, "speed": 240, "extra": 240}
ALL_BUDGET = 540
# Our implementations in the order they are timed on each shape: the Hopper rungs and the decode first (the
# stages a short visit must not leave untimed), then FA2, then the CUDA-core baselines.
PRIORITY = ["cuda_v3_hopper/ws", "cuda_v3_hopper/ws_bc176", "cuda_v3_hopper/ws_m192",
            "cuda_v3_hopper/ws_persistent", "cuda_v3_hopper/ws_no_overlap", "cuda_v3_hopper/ws_no_pingpong",
            "cuda_v3_hopper/ws_no_producer", "cuda_v3_hopper/fp8", "decoding/cuda_split_kv", "decoding/cuda_split_kv_mma",
            "decoding/cuda_split_kv_mma_two_pass", "cuda_v2/split_q", "cuda_v2/split_q_8warps",
            "cuda_v2/split_q_bc64", "cuda_v2/split_q_longest_first",
            "cuda_v2/split_q_bwd64x128", "cuda_v2/split_q_bwd64x128_tiled_dq", "cuda_v2/split_q_bwd64x128_longest_first",
            "cuda_v2/split_q_bwd64x128_tiled_dq_longest_first",
            "cuda_v2/split_q_bwd128",
            "cuda_v2/split_q_simt", "cuda_v1/split_k"]
# Entries whose forward is another entry's kernel (cuda_v2/split_q_bwd128's, split_q_bwd64x128's and its
# longest-first order's and tiled dQ's are split_q's): timed in the backward shapes only.
BACKWARD_RUNGS = {"cuda_v2/split_q_bwd128", "cuda_v2/split_q_bwd64x128", "cuda_v2/split_q_bwd64x128_longest_first",
                  "cuda_v2/split_q_bwd64x128_tiled_dq", "cuda_v2/split_q_bwd64x128_tiled_dq_longest_first"}
# The cores, the tensor-core ladder's lower rungs and the CUDA-core baselines: the papers' algorithms as written,
# and FA1 and FA2's schedules on fp32 CUDA cores. They are slow (cuda_v1/split_k takes 2.4 s a call at 16k keys on
# an H200) and not what a visit tunes, so they are timed on the first FORWARD_BASELINE_SHAPES forward shapes (the
# goals' three and the first one's causal twin: the ladder's table in docs/04 and the stage table's figures), and
# left out of the rest of the sweep with a row that says so. --baseline-shapes N times them on the first N.
BASELINES = {"cuda_v1/split_k", "cuda_v2/split_q_simt", "cuda_v2/mma", "cuda_v2/mma_ldmatrix", "cuda_v2/mma_cp_async",
             "cuda_v3_hopper/ws_core", "decoding/cuda_core"}
FORWARD_BASELINE_SHAPES = 4
PEERS = ["torch/sdpa_flash", "torch/sdpa_cudnn", "torch/sdpa_efficient", "torch/sdpa_math"]
# The harness's test cases each sanitizer runs, in one process: every GPU implementation's small cases (forward
# and backward, tests/test_small_cases.cpp); memcheck also the FP8 pre-pass and kernel checks.
SMALL_CASES = "every GPU implementation on the small cases*"
SANITIZED = {"memcheck": [SMALL_CASES, "the FP8*"], "racecheck": [SMALL_CASES]}


def now():
    return time.monotonic()


class Report:
    """The result being built, written whole (atomically) after every step."""

    def __init__(self, out, work, command, commit, rehearsal):
        self.out, self.work = out, work
        self.logs = os.path.join(work, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.result = {"device": "unknown", "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
                       "commit": commit, "command": command, "copy_gbps": None, "bf16_gemm_tflops": None,
                       "rows": [], "checks": []}
        if rehearsal:
            self.result["rehearsal"] = True
        self.notes = []  # lines for summary.txt beyond the checks
        # What an earlier call left in OUTDIR is replaced, whatever its date: OUTDIR holds one result.
        self.written = [os.path.basename(p) for p in glob.glob(os.path.join(out, "results-*.json")) +
                        glob.glob(os.path.join(out, "results-*.md"))]

    def stem(self):
        device = re.sub(r"[^A-Za-z0-9]+", "-", self.result["device"]).strip("-").lower()[:40] or "unknown"
        return f"results-{device}-{self.result['date']}"

    def check(self, step, status, seconds, budget, log, phase):
        record = {"step": step, "status": status, "seconds": None if seconds is None else round(seconds, 1),
                  "budget_s": budget, "log": log, "phase": phase}
        if self.result.get("rehearsal"):
            record["emulated"] = True
        self.result["checks"].append(record)
        mark = {"ok": "ok", "failed": "FAILED", "unavailable": "unavailable"}[status]
        timing = "" if seconds is None else f" ({seconds:.0f} s of {budget} s)" if budget else f" ({seconds:.0f} s)"
        print(f"== {step}: {mark}{timing}" + (f" [{log}]" if log else ""), flush=True)
        self.write()

    def rows(self, rows):
        self.result["rows"].extend(rows)
        self.write()

    def write(self):
        """results-*.json, results-*.md, summary.txt and logs.tar.gz, each replaced atomically."""
        stem = self.stem()
        files = {stem + ".json": json.dumps(self.result, indent=1) + "\n",
                 stem + ".md": markdown(self.result), "summary.txt": self.summary()}
        for old in self.written:  # the device's name may have arrived since the last write
            if old not in files and old != "logs.tar.gz":
                try:
                    os.remove(os.path.join(self.out, old))
                except FileNotFoundError:
                    pass
        for name, text in files.items():
            temporary = os.path.join(self.out, "." + name + ".tmp")
            with open(temporary, "w") as f:
                f.write(text)
            os.replace(temporary, os.path.join(self.out, name))
        temporary = os.path.join(self.out, ".logs.tar.gz.tmp")
        with tarfile.open(temporary, "w:gz") as tar:
            tar.add(self.logs, arcname="logs")
        os.replace(temporary, os.path.join(self.out, "logs.tar.gz"))
        self.written = list(files) + ["logs.tar.gz"]

    def summary(self):
        r = self.result
        lines = [f"{'REHEARSAL (emulated, no GPU measured): ' if r.get('rehearsal') else ''}{r['device']}, "
                 f"{r['date']}, commit {r['commit']}", f"command: {r['command']}"]
        for c in r["checks"]:
            if c["status"] != "ok" or c["step"].startswith(("build", "harness", "memcheck", "racecheck")):
                timing = "" if c["seconds"] is None else f" {c['seconds']:.0f}/{c['budget_s']} s"
                lines.append(f"{c['status']:>11}: {c['step']}{timing}" + (f" [{c['log']}]" if c["log"] else ""))
        measured = sum(row.get("time_ms") is not None for row in r["rows"])
        failed = sum("failed" in row for row in r["rows"])
        lines.append(f"rows: {measured} measured, {failed} failed, {len(r['rows']) - measured - failed} refused "
                     "or skipped")
        lines += self.notes
        failed = sum(c["status"] == "failed" for c in r["checks"])
        lines.append(f"checks: {len(r['checks'])}, failed: {failed}")
        return "\n".join(lines) + "\n"

    def failed(self):
        return [c for c in self.result["checks"] if c["status"] == "failed"]


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def shape_key(row):
    return (row.get("pass", "forward"), row["batch"], row["heads"], row["kv_heads"], row["seqlen_q"], row["seqlen_k"],
            row["head_dim"], row["causal"], row.get("page_size", 0))


def shape_title(key):
    passname, batch, heads, kv_heads, sq, sk, d, causal, page = key
    seqlen = str(sq) if sq == sk else f"{sq} x {sk}"
    text = f"{passname}: batch {batch}, heads {heads}" + ("" if heads == kv_heads else f"/{kv_heads}")
    text += f", seqlen {seqlen}, d {d}" + (", causal" if causal else "") + (f", pages of {page}" if page else "")
    return text


def load_predictions():
    """bench/predictions.json: what the changes prepared without a GPU are predicted to measure."""
    with open(os.path.join(ROOT, "bench", "predictions.json")) as f:
        return json.load(f)["predictions"]


def source_exists(source):
    """Whether a prediction's source, "docs/CHAPTER.md#anchor", names a heading of a chapter that exists (the
    anchor as a Markdown renderer forms it from the heading: lower case, punctuation dropped, spaces as
    hyphens)."""
    path, _, anchor = source.partition("#")
    path = os.path.join(ROOT, path)
    if not os.path.exists(path):
        return False
    with open(path) as f:
        headings = [line.lstrip("#").strip() for line in f if line.startswith("#")]
    return anchor in [re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings]


def measured_for(r, prediction):
    """The run's figure for one prediction, from its own rows on the predicted shape (None where the run has
    none: not reached, refused, or only emulated, whose time is the CPU's)."""
    key = shape_key(dict(prediction["shape"], **{"pass": prediction.get("pass", "forward")}))
    timed = {row["impl"]: row for row in r["rows"]
             if shape_key(row) == key and row.get("time_ms") is not None and not row.get("emulated")}
    row = timed.get(prediction["impl"])
    if row is None:
        return None
    metric = prediction["metric"]
    if metric == "tflops":
        return row.get("tflops")
    if metric == "time_ms":
        return row["time_ms"]
    if metric == "copy_share":
        return row["gbps"] / r["copy_gbps"] if row.get("gbps") and r.get("copy_gbps") else None
    if metric == "speedup":
        other = timed.get(prediction["over"])
        return other["time_ms"] / row["time_ms"] if other else None
    raise ValueError(f"bench/predictions.json: unknown metric {metric}")


def prediction_lines(r, predictions):
    lines = ["## Against the predictions written before the run", "",
             "From bench/predictions.json, each with the chapter that argues it. within: the run's figure lies in the "
             "predicted range; below or above: by how much it misses it.", "",
             "| impl | shape | metric | predicted | measured | verdict | source |", "|---|---|---|---:|---:|---|---|"]
    for p in predictions:
        value = measured_for(r, p)
        low, high = p["low"], p["high"]
        if value is None:
            verdict = "not measured"
        elif value < low:
            verdict = f"below ({value / low - 1:+.0%})"
        elif value > high:
            verdict = f"above ({value / high - 1:+.0%})"
        else:
            verdict = "within"
        metric = p["metric"] + (f" over {p['over']}" if p["metric"] == "speedup" else "")
        key = shape_key(dict(p["shape"], **{"pass": p.get("pass", "forward")}))
        lines.append(f"| {p['impl']} | {shape_title(key)} | {metric} | {low:g}-{high:g} | {fmt(value, '.3g')} | "
                     f"{verdict} | `{p['source']}` |")
    return lines + [""]


def markdown(r):
    """The result as a Markdown page: checks, then one table per shape with each row's speed-up over the peers."""
    lines = [f"# GPU results: {r['device']}, {r['date']}", ""]
    if r.get("rehearsal"):
        lines += ["**Rehearsal**: no GPU was used. GPU stages ran in the CPU emulator on tiny shapes and the peers "
                  "in a dry form; no time below is a GPU measurement.", ""]
    lines += [f"- commit: `{r['commit']}`", f"- command: `{r['command']}`"]
    for command in r.get("commands", []):
        lines.append(f"- merged from: `{command}`")
    if r.get("gpu"):
        lines.append("- GPU: " + ", ".join(f"{k} {v}" for k, v in r["gpu"].items()))
    if r.get("peers"):
        lines.append("- peers: " + ", ".join(f"{k} {v}" for k, v in r["peers"].items()))
    lines += [f"- measured ceilings: device-to-device copy {fmt(r['copy_gbps'], '.0f')} GB/s, "
              f"bf16 GEMM {fmt(r['bf16_gemm_tflops'], '.0f')} TFLOP/s", "", "## Checks", "",
              "| phase | step | status | seconds / budget | log |", "|---|---|---|---:|---|"]
    for c in r["checks"]:
        lines.append(f"| {c.get('phase', '')} | {c['step']} | {c['status']} | {fmt(c['seconds'], '.0f')} / "
                     f"{fmt(c['budget_s'], 'd')} | {c['log']} |")
    lines += [""] + prediction_lines(r, load_predictions())
    groups = {}
    for row in r["rows"]:
        groups.setdefault(shape_key(row), []).append(row)
    lines += ["## Speed", "", "Median of CUDA-event timings on device pointers, inputs rotated past the L2. "
              "err O: max |O - ref64| / max(1, |ref64|) on sampled rows. x flash, x cuDNN: that peer's time over "
              "this row's (above 1: faster than the peer).", ""]
    for key, rows in groups.items():
        # Speed-ups only between measured rows: an emulated time is the CPU's.
        peer = {row["impl"]: row["time_ms"] for row in rows
                if row["impl"].startswith("torch/") and row.get("time_ms") and not row.get("emulated")}
        lines += [f"### {shape_title(key)}", "", "| impl | dtype | ms | TFLOP/s | GB/s | x flash | x cuDNN | err O |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for row in rows:
            if row.get("time_ms") is None:
                skipped = row.get("skipped", "")
                why = f"FAILED: {row['failed']}" if "failed" in row else skipped if skipped.startswith(
                    ("left out", "not measured")) else f"refused: {skipped}"
                lines.append(f"| {row['impl']} | {row['dtype']} | {why.replace('|', '/')[:160]} | | | | | |")
                continue
            ratios = [fmt(peer[p] / row["time_ms"] if p in peer and not row.get("emulated") else None, ".2f")
                      for p in ("torch/sdpa_flash", "torch/sdpa_cudnn")]
            ms = fmt(row["time_ms"], ".3f") + (" (emulated)" if row.get("emulated") else "")
            lines.append(f"| {row['impl']} | {row['dtype']} | {ms} | {fmt(row.get('tflops'), '.1f')} | "
                         f"{fmt(row.get('gbps'), '.0f')} | {ratios[0]} | {ratios[1]} | {fmt(row.get('max_err_o'), '.1e')} |")
        lines.append("")
    return "\n".join(lines) + "\n"


class Visit:
    """One call of the report: the steps of its phases under their budgets."""

    def __init__(self, args, report):
        self.args, self.report = args, report
        self.rehearse = args.rehearse
        self.build = os.path.abspath(args.build_dir or os.environ.get("FLASHLAB_BUILD_DIR")
                                     or os.path.join(ROOT, "build"))
        self.flashlab = os.path.join(self.build, "bin", "flashlab")
        self.tests = os.path.join(self.build, "tests", "flashlab_tests")
        self.inject = set(filter(None, os.environ.get("FLASHLAB_REPORT_INJECT", "").split(",")))
        self.phase = None
        self.deadline = None
        self.compute_capability = None
        self.cublas = None
        self.sanitizer = None
        self.impls = None
        self.failing = {}  # pass -> {implementation: why}: those that failed or hung, left out of later shapes
        self.built = None
        self.build_stopped = False
        self.timed_out = False  # whether the last step run was stopped at its limit
        self.env = dict(os.environ)

    # ---- running a step
    def remaining(self):
        return max(0.0, self.deadline - now())

    def run(self, step, budget, argv, log, env=None, classify=None, stdin=None):
        """Runs argv with its output in logs/LOG, stopped at min(budget, the phase's time left). Returns
        (status, output). `classify(returncode, output)` maps a finished run to ok/failed/unavailable."""
        limit = min(budget, self.remaining())
        path = os.path.join(self.report.logs, log)
        if limit < 1:
            with open(path, "a") as f:
                f.write(f"not run: the {self.phase} phase's budget was spent\n")
            self.report.check(step, "failed", 0.0, budget, log, self.phase)
            return "failed", ""
        if f"timeout:{step}" in self.inject:  # the rehearsal's drill: a step that overruns its budget
            argv, limit = ["bash", "-c", 'sleep 600; exec "$@"', "sleep"] + list(argv), min(limit, 2)
        start = now()
        with open(path, "a") as f:
            f.write("$ " + " ".join(shlex.quote(a) for a in argv) + "\n")
            f.flush()
            process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       env={**self.env, **(env or {})}, cwd=ROOT, start_new_session=True,
                                       stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL)
            try:
                output, _ = process.communicate(stdin, timeout=limit)
                timed_out = False
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                output, _ = process.communicate()
                timed_out = True
            f.write(output or "")
            seconds = now() - start
            self.timed_out = timed_out
            if timed_out:
                f.write(f"\n(timed out after {limit:.0f} s; budget {budget} s)\n")
                status = "failed"
            else:
                status = classify(process.returncode, output) if classify else (
                    "ok" if process.returncode == 0 else "failed")
                f.write(f"\n(exit code {process.returncode}, {seconds:.1f} s)\n")
        self.report.check(step, status, seconds, budget, log, self.phase)
        return status, output or ""

    def note(self, step, status, log, text):
        """A check that runs no command (a tool looked for, a file found)."""
        with open(os.path.join(self.report.logs, log), "a") as f:
            f.write(text.rstrip() + "\n")
        self.report.check(step, status, None, None, log, self.phase)

    # ---- preflight: what this runtime has
    def preflight(self):
        r = self.report.result
        if self.rehearse:
            r["device"] = "rehearsal, no GPU: the CPU emulator of the CUDA execution model"
        smi = shutil.which("nvidia-smi")
        if smi:
            query = "name,compute_cap,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem"
            result = subprocess.run([smi, f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                                    text=True)
            with open(os.path.join(self.report.logs, "nvidia-smi.log"), "w") as f:
                f.write(result.stdout + result.stderr)
                f.write(subprocess.run([smi], capture_output=True, text=True).stdout)
            fields = [x.strip() for x in result.stdout.splitlines()[0].split(",")] if result.stdout.strip() else []
            if result.returncode == 0 and len(fields) == 7 and not self.rehearse:
                r["device"] = fields[0]
                self.compute_capability = fields[1]
                r["gpu"] = {"compute capability": fields[1], "driver": fields[2], "memory": fields[3],
                            "SM clock at start": fields[4], "max SM clock": fields[5], "memory clock": fields[6]}
                self.note("GPU", "ok", "nvidia-smi.log", result.stdout)
            else:
                self.note("GPU", "failed" if not self.rehearse else "unavailable", "nvidia-smi.log",
                          "nvidia-smi gave no device")
        else:
            self.note("GPU", "unavailable" if self.rehearse else "failed", "preflight.log", "nvidia-smi: not found")
        # CMake: the presets name the version they need.
        needed = json.load(open(os.path.join(ROOT, "CMakePresets.json")))["cmakeMinimumRequired"]
        needed = (needed["major"], needed["minor"])
        version = self.version(["cmake", "--version"], r"cmake version (\d+)\.(\d+)")
        if version is None:
            self.note("cmake", "failed", "preflight.log", "cmake: not found")
        else:
            status = "ok" if version >= needed else "failed"
            self.note(f"cmake {version[0]}.{version[1]} (the presets need {needed[0]}.{needed[1]})", status,
                      "preflight.log", f"cmake {version}, needed {needed}")
        for tool in ("nvcc", "ninja", "g++"):
            path = shutil.which(tool) or (tool == "nvcc" and os.path.exists("/usr/local/cuda/bin/nvcc")
                                          and "/usr/local/cuda/bin/nvcc")
            self.note(tool, "ok" if path else "failed", "preflight.log", f"{tool}: {path or 'not found'}")
        self.kit()
        self.find_cublas()
        self.sanitizer = shutil.which("compute-sanitizer") or next(iter(sorted(glob.glob(
            "/usr/local/cuda*/bin/compute-sanitizer") + glob.glob("/usr/local/cuda*/compute-sanitizer/compute-sanitizer"))), None)
        self.note("compute-sanitizer", "ok" if self.sanitizer else "unavailable", "preflight.log",
                  f"compute-sanitizer: {self.sanitizer or 'not found'}")

    @staticmethod
    def version(argv, pattern):
        try:
            text = subprocess.run(argv, capture_output=True, text=True).stdout
        except OSError:
            return None
        match = re.search(pattern, text)
        return tuple(int(x) for x in match.groups()) if match else None

    def kit(self):
        kit = self.args.kit or os.environ.get("FLASHLAB_KIT")
        if kit:
            kit = os.path.abspath(kit)
            if os.path.isdir(os.path.join(kit, "usr", "include")):
                self.env["FLASHLAB_KIT"] = kit
                self.note("kit", "ok", "preflight.log", f"the kit in {kit}:\n" + open(os.path.join(kit, "MANIFEST")).read()
                          if os.path.exists(os.path.join(kit, "MANIFEST")) else f"the kit in {kit}")
            else:
                self.note("kit", "failed", "preflight.log", f"{kit} holds no kit (make one: ./flashlab kit DIR)")
        elif os.path.exists("/usr/include/eigen3/Eigen/Dense"):
            self.note("kit", "ok", "preflight.log", "no kit: the system's packages (Eigen found in /usr/include)")
        else:
            self.note("kit", "failed", "preflight.log", "no kit and no system Eigen: make a kit with ./flashlab kit "
                      "kit on a machine with network, carry it, and pass --kit kit (bench/README.md)")

    def find_cublas(self):
        """libcublas.so.13 where the loader finds it, else inside a Python environment's nvidia wheels."""
        candidates = []
        if "no-cublas" not in self.inject:
            given = os.environ.get("FLASHLAB_CUBLAS")
            if given:
                candidates.append(given)
            ldconfig = subprocess.run(["sh", "-c", "ldconfig -p 2>/dev/null"], capture_output=True, text=True).stdout
            candidates += re.findall(r"=> (\S*libcublas\.so\.13)$", ldconfig, re.M)
            candidates += sorted(glob.glob("/usr/local/cuda*/lib64/libcublas.so.13"))
            script = ("import site, sys; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()] + "
                      "sys.path))")
            paths = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True).stdout.split()
            for path in paths:
                candidates += sorted(glob.glob(os.path.join(path, "nvidia", "**", "libcublas.so.13*"), recursive=True))
        found = next((c for c in candidates if os.path.exists(c)), None)
        if found:
            self.cublas = found
            self.env["FLASHLAB_CUBLAS"] = found
            folder = os.path.dirname(found)  # its libcublasLt beside it
            self.env["LD_LIBRARY_PATH"] = folder + (":" + self.env["LD_LIBRARY_PATH"]
                                                    if self.env.get("LD_LIBRARY_PATH") else "")
            self.note("cuBLAS", "ok", "preflight.log", f"cuBLAS: {found}")
        else:
            self.env["FLASHLAB_CUBLAS"] = "/nonexistent/libcublas.so.13" if "no-cublas" in self.inject else ""
            self.note("cuBLAS", "unavailable", "preflight.log",
                      "libcublas.so.13 not found (loader, /usr/local/cuda, Python's nvidia wheels): "
                      "the bf16 GEMM ceiling is not measured")

    # ---- the build
    def ensure_build(self, budget=200):
        # Once per call; but a build stopped at its budget goes on in the next phase (ninja resumes), so that a
        # slow compile costs the check phase and not the whole visit.
        if self.built is not None and not self.build_stopped:
            return self.built
        self.built = self.build_once(budget)
        self.build_stopped = not self.built and self.timed_out
        return self.built

    def build_once(self, budget):
        built = os.path.exists(self.flashlab) and os.path.exists(self.tests)
        if self.rehearse:
            if not os.path.exists(os.path.join(self.build, "CMakeCache.txt")):
                self.note("build", "failed", "build.log", f"no build in {self.build}: the rehearsal uses the "
                          "existing one (./flashlab test builds it)")
                return False
            status, _ = self.run("build (the existing build, brought up to date)", budget,
                                 ["cmake", "--build", self.build, "--target", "flashlab", "flashlab_tests"],
                                 "build.log")
            return status == "ok"
        if built and self.phase != "check":  # a later call on the same machine: the build is there
            return True
        if not os.path.exists(os.path.join(self.build, "CMakeCache.txt")):
            configure = ["cmake", "--preset", "release", "-B", self.build, "-DFLASHLAB_CUDA=ON"]
            if self.compute_capability:  # this GPU's architecture only (sm_90a on Hopper)
                arch = self.compute_capability.replace(".", "")
                arch += "a" if arch == "90" else ""
                configure.append(f"-DFLASHLAB_CUDA_GENCODE=-gencode=arch=compute_{arch},code=sm_{arch}")
            if self.env.get("FLASHLAB_KIT"):
                configure.append(f"-DFLASHLAB_KIT={self.env['FLASHLAB_KIT']}")
            status, _ = self.run("configure", 30, configure, "configure.log")
            if status != "ok":
                return False
        status, _ = self.run("build (flashlab, flashlab_tests)", budget,
                             ["cmake", "--build", self.build, "--parallel", str(os.cpu_count() or 2), "--target",
                              "flashlab", "flashlab_tests"], "build.log")
        return status == "ok"

    def gpu_implementations(self):
        """The GPU implementations to time here, in PRIORITY order, and their entries from `flashlab list`."""
        if self.impls is not None:
            return self.impls
        listing = json.loads(subprocess.run([self.flashlab, "list", "--json"], capture_output=True, text=True,
                                            check=True, env=self.env).stdout)
        entries = {e["name"]: e for e in listing if e["device"] == "cuda"}
        names = [n for n in PRIORITY if n in entries] + sorted(n for n in entries if n not in PRIORITY)
        if self.args.impls:
            names = [n for n in names if re.search(self.args.impls, n)]
        self.impls = []
        for name in names:
            entry = entries[name]
            if not self.rehearse and entry.get("emulation_reason"):
                self.report.notes.append(f"left out: {name} runs only in the emulator here ({entry['emulation_reason']})")
                continue
            self.impls.append(entry)
        return self.impls

    # ---- check phase
    def check_phase(self):
        if not self.ensure_build(130):
            return
        if self.rehearse:  # the emulated harness runs in CI's own tests: here the small cases, in the emulator
            self.run("harness (the small cases, emulated)", 180, [self.tests, "--test-case=" + SMALL_CASES],
                     "harness.log", env={"FLASHLAB_DEVICE": "cuda", "FLASHLAB_EMULATE": "1",
                                         "FLASHLAB_DTYPES": "first"})
        else:
            self.run("harness on the GPU, emulator against hardware", 70,
                     ["ctest", "--test-dir", self.build, "-R", "^(harness|harness_gpu)$", "--output-on-failure"],
                     "harness.log")
        for tool, budget in (("memcheck", 35), ("racecheck", 35)):
            self.sanitize(tool, budget)
        self.python_smoke()

    def python_smoke(self):
        """The Python module with PyTorch CUDA tensors (bench/gpu_python_smoke.py), after building it. Where
        the build has no module (Python's headers or nanobind not found) or PyTorch sees no GPU, the step is
        unavailable, never a failure."""
        def built(returncode, output):
            if returncode != 0 and re.search(r"unknown target|No rule to make target", output):
                return "unavailable"
            return "ok" if returncode == 0 else "failed"
        status, _ = self.run("build (the Python module)", 45,
                             ["cmake", "--build", self.build, "--parallel", str(os.cpu_count() or 2), "--target",
                              "flashlab_python"], "python.log", classify=built)
        if status != "ok":
            return
        self.run("python: CUDA tensors through the module, against SDPA", 30,
                 [sys.executable, os.path.join(ROOT, "bench", "gpu_python_smoke.py")], "python.log",
                 env={"PYTHONPATH": os.path.join(self.build, "python")},
                 classify=lambda code, _: "unavailable" if code == 77 else "ok" if code == 0 else "failed")

    def sanitize(self, tool, budget):
        patterns = SANITIZED[tool]
        step = f"{tool} (the small cases" + ("; the FP8 checks)" if len(patterns) > 1 else ")")
        log = f"sanitizer_{tool}.log"
        env = {"FLASHLAB_DEVICE": "cuda", "FLASHLAB_DTYPES": "first"}
        if self.rehearse:  # the dry form: the same program and test filters, each of which must select a test
            def listed(returncode, output):
                found = re.findall(r"\[doctest\] unskipped test cases passing the current filters: (\d+)", output)
                return "ok" if returncode == 0 and len(found) == len(patterns) and "0" not in found else "failed"
            script = "".join(f'"$0" --list-test-cases --test-case={shlex.quote(p)} && ' for p in patterns) + "true"
            self.run(step + ", dry: the filters", 30, ["sh", "-c", script, self.tests], log, env=env,
                     classify=listed)
            return
        if not self.sanitizer:
            self.note(step, "unavailable", log, "compute-sanitizer: not found")
            return

        def verdict(returncode, output):
            # memcheck ends with "ERROR SUMMARY: N errors", racecheck with "RACECHECK SUMMARY: N hazards
            # displayed (E errors, W warnings)". No summary: the tool never attached (e.g. "Device not
            # supported" in some runtimes).
            summary = re.search(r"ERROR SUMMARY: (\d+) error|RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) error",
                                output)
            if summary is None:
                return "unavailable"
            errors = summary.group(1) or summary.group(2)
            return "ok" if returncode == 0 and errors == "0" else "failed"
        env["FLASHLAB_REQUIRE_GPU"] = "1"
        self.run(step, budget, [self.sanitizer, "--tool", tool, "--error-exitcode", "3", self.tests,
                                "--test-case=" + ",".join(patterns)], log, env=env, classify=verdict)

    # ---- speed phase
    def speed_phase(self):
        if not self.ensure_build(200):
            return
        self.ceilings()
        peers = Peers(self)
        try:
            forward = self.shapes("rehearse" if self.rehearse else "report")
            backward = [] if self.rehearse and "no-backward" in self.inject else self.shapes(
                "rehearse" if self.rehearse else "backward")[:1 if self.rehearse else None]
            # The goals' forward shapes, the backward's (its largest measured loss; the H200 visit's budget ran
            # out before its second and third), then the rest of the forward sweep.
            # Each entry: the shape, whether it is a backward shape, and a forward shape's index in `forward`.
            plan = [(s, False, i) for i, s in enumerate(forward[:3])] + [(s, True, None) for s in backward] + \
                   [(s, False, i + 3) for i, s in enumerate(forward[3:])]
            backward_impls = [e["name"] for e in self.gpu_implementations() if e.get("backward")]
            for n, (shape, is_backward, forward_index) in enumerate(plan):
                if n < self.args.first_shape:  # measured by an earlier call
                    continue
                if self.args.last_shape is not None and n > self.args.last_shape:
                    self.report.notes.append(f"speed: shapes {n} to {len(plan) - 1} of the plan not measured "
                                             f"(--last-shape {self.args.last_shape}); --first-shape {n} measures them")
                    break
                if self.remaining() < 5:
                    self.report.notes.append(f"speed: {len(plan) - n} of {len(plan)} shapes not measured "
                                             "(the phase's budget was spent); a later --phase speed call measures them")
                    break
                names = backward_impls if is_backward else [e["name"] for e in self.gpu_implementations()
                                                             if e["name"] not in BACKWARD_RUNGS]
                if not is_backward:
                    first = self.args.baseline_shapes
                    names, left = baselines_left_out(names, forward_index, first)
                    dtypes = {e["name"]: e["dtypes"][0] for e in self.gpu_implementations()}
                    self.report.rows([self.unmeasured_row(
                        shape, name, dtypes[name], "forward",
                        skipped=f"left out: a core or baseline, timed on the first {first} forward shapes "
                                f"(--baseline-shapes {forward_index + 1} times it here)") for name in left])
                self.time_ours(n, shape, names, is_backward)
                peers.time(n, shape, is_backward)
        finally:
            peers.close()

    def shapes(self, name):
        text = subprocess.run([self.flashlab, "gpu-bench", "--list-shapes", "--shapes", name], capture_output=True,
                              text=True, check=True, env=self.env).stdout
        return json.loads(text)

    def ceilings(self):
        status, output = self.run("ceilings: device-to-device copy, bf16 GEMM", 30,
                                  [self.flashlab, "gpu-bench", "--ceilings", "--json"], "ceilings.log",
                                  classify=lambda rc, out: "ok" if rc == 0 else
                                  "unavailable" if "needs a GPU" in out else "failed")
        if status != "ok":
            return
        ceilings = json_line(output)
        self.report.result["copy_gbps"] = ceilings["copy_gbps"]
        self.report.result["bf16_gemm_tflops"] = ceilings.get("bf16_gemm_tflops")
        if ceilings.get("gemm_unavailable"):
            self.note("bf16 GEMM (cuBLAS)", "unavailable", "ceilings.log", ceilings["gemm_unavailable"])

    def time_ours(self, n, shape, names, backward):
        """Our implementations on one shape, in one gpu-bench process, its rows kept as they come. One that fails
        (a kernel's fault) or never finishes is left out of the later shapes of that pass; what a fault that left
        the GPU unusable, or a hang, kept from running is run again in a new process while the phase has time.
        Every name ends with a row: its figures, its failure, or why it has none."""
        pass_ = "backward" if backward else "forward"
        failing = self.failing.setdefault(pass_, {})  # a forward that fails leaves its backward to be timed
        for name in names:
            if name in failing:
                self.report.rows([self.unmeasured_row(shape, name, failing[name]["dtype"], pass_,
                                                      skipped="left out: it " + failing[name]["why"])])
        pending = [name for name in names if name not in failing]
        waiting = {}  # name -> the row that says why it has not run yet (a lost GPU's refusal)
        got = set(names) - set(pending)  # the names with a row for this shape
        culprit = None
        while pending:
            hang = next((i.split(":", 1)[1] for i in self.inject if i.startswith("hang:")), None)
            # The rehearsal's hang drill (gpu-bench hangs there, FLASHLAB_INJECT): its step cut short.
            budget = 10 if hang == pending[0] else 90 if self.rehearse else 45
            # gpu-bench starts no implementation after --max-seconds (the rest get rows that say so). The step
            # stops at its budget or at the phase's end, whichever comes first; the margin is the longest row,
            # cuda_v1/split_k at 16k keys, about 12 s on an H200 (2.4 s a run, 5 runs).
            max_seconds = max(1, min(budget, int(self.remaining())) - 20)
            argv = [self.flashlab, "gpu-bench"] + pending + shape_flags(shape) + [
                "--json-lines", "--seconds", "0.25", "--max-seconds", str(max_seconds)]
            if backward:  # in bf16, so that split_q's backward (f16 first) and split_q_bwd128's (bf16 only) compare
                argv += ["--pass", "backward", "--dtype", "bf16"]
            if self.rehearse:
                argv.append("--emulate")
            step = f"ours: {'backward ' if backward else ''}shape {n}" + (f", after {culprit}" if culprit else "")
            cut_by_phase = self.remaining() < budget  # a step stopped then was not given its whole budget
            status, output = self.run(step, budget, argv, "gpu_bench.log")
            rows, running = streamed_rows(output)
            # A lost GPU's refusals wait for the run in a new process below; the rest are kept.
            kept = [row for row in rows if LOST_DEVICE not in row.get("skipped", "")]
            waiting.update((row["impl"], row) for row in rows if LOST_DEVICE in row.get("skipped", ""))
            if self.timed_out and cut_by_phase and running is not None:  # stopped by the phase's end: no blame
                kept.append(self.unmeasured_row(shape, running["measuring"], running["dtype"], pass_,
                                                skipped="not measured: the phase's time ran out while it ran"))
            elif status != "ok" and running is not None:
                # It hung, or the process died, while this one ran.
                ending = f"did not finish within the step's {budget} s" if self.timed_out else \
                    "the process ended while it ran (gpu_bench.log)"
                kept.append(self.unmeasured_row(shape, running["measuring"], running["dtype"], pass_,
                                                failed=ending))
            self.report.rows(kept)
            for row in kept:
                name = row["impl"].removesuffix(" (main kernel)")
                got.add(name)
                if "failed" in row and name not in failing:
                    why = f"failed on shape {n}: {row['failed'][:200]}"
                    failing[name] = {"why": why, "dtype": row["dtype"]}
                    self.report.notes.append(f"speed: {name}'s {pass_} {why}; left out of the later {pass_} shapes")
            done = {row["impl"].removesuffix(" (main kernel)") for row in kept}
            rest = [name for name in pending if name not in done and name not in failing]
            failed = [row["impl"] for row in kept if "failed" in row]
            if not rest or not failed or (self.timed_out and cut_by_phase):
                break  # all run, or none lost to a failure, or no time left to run them again
            pending, culprit = rest, f"{failed[-1]} failed"  # each pass leaves one more out: it ends
        # What has no row yet: the lost GPU's refusal where it had one, else that the step stopped first.
        dtypes = {e["name"]: e["dtypes"][0] for e in self.gpu_implementations()}
        self.report.rows([waiting.get(name) or self.unmeasured_row(
            shape, name, "bf16" if backward else dtypes.get(name, "f32"), pass_,
            skipped="not measured: the shape's step stopped before it (gpu_bench.log)")
            for name in names if name not in got])

    def failed_before(self, impl, pass_):
        """Why `impl`'s `pass_` is not run again in this call: it failed or hung in the speed phase (None if it
        did not)."""
        failing = self.failing.get(pass_, {})
        return f"its {pass_} {failing[impl]['why']}" if impl in failing else None

    def unmeasured_row(self, shape, impl, dtype, pass_, **why):
        """A row without figures for one of gpu-bench's shapes; `why` is skipped=... or failed=..."""
        fields = {key: shape[key] for key in ("batch", "heads", "kv_heads", "seqlen_q", "seqlen_k", "head_dim",
                                              "causal", "page_size") if key in shape}
        row = dict(fields, impl=impl, dtype=dtype, time_ms=None, tflops=None, gbps=None, max_err_o=None, **why,
                   **{"pass": pass_})
        if self.rehearse:
            row["emulated"] = True
        return row


# The reason gpu-bench gives a row that a fault which left the GPU unusable kept from running.
LOST_DEVICE = "was left unusable by"


def streamed_rows(output):
    """gpu-bench --json-lines' rows in `output`, and the measurement that was running when it ended (its
    {"measuring": IMPL, "dtype": ...} line with no row after it), or None."""
    rows, running = [], None
    for line in output.splitlines():
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "measuring" in record:
            running = record
        elif "impl" in record:
            rows.append(record)
            if running is not None and record["impl"] == running["measuring"]:
                running = None
    return rows, running


def json_line(output):
    """The last line of a command's output that is a JSON object (the tool prints its --json on one line; a
    driver or library may have written warnings before it)."""
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON line in the output")


def shape_flags(shape):
    flags = ["--batch", str(shape["batch"]), "--heads", str(shape["heads"]), "--kv-heads", str(shape["kv_heads"]),
             "--seqlen-q", str(shape["seqlen_q"]), "--seqlen-k", str(shape["seqlen_k"]), "--head-dim",
             str(shape["head_dim"])]
    if shape["causal"]:
        flags.append("--causal")
    if shape.get("page_size"):
        flags += ["--page-size", str(shape["page_size"])]
    return flags


class Peers:
    """PyTorch SDPA in one long-lived process (bench/peers_torch.py --serve): PyTorch loads once, each shape's
    rows come back right after ours. A peer that is missing or hangs is reported and costs no other row."""

    def __init__(self, visit):
        self.visit = visit
        self.process = None
        self.log = os.path.join(visit.report.logs, "peers.log")
        self.start()

    def start(self):
        visit = self.visit
        script = os.path.join(ROOT, "bench", "peers_torch.py")
        if "no-peers" in visit.inject:  # the rehearsal's drill: PyTorch is not there
            script = os.path.join(ROOT, "bench", "no_such_peer_script.py")
        argv = [sys.executable, script, "--serve"] + (["--dry-run"] if visit.rehearse else [])
        start = now()
        with open(self.log, "a") as log:
            log.write("$ " + " ".join(argv) + "\n")
        self.pending = b""
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                            cwd=ROOT, env=visit.env, start_new_session=True)
        first = self.read_line(60)
        if first and "ready" in first:
            info = first["ready"]
            if info.get("torch"):
                visit.report.result["peers"] = {"torch": info["torch"], "cudnn": info["cudnn"]}
            visit.report.check("peers: PyTorch SDPA " + ("(dry run)" if visit.rehearse else "started"), "ok",
                               now() - start, 60, "peers.log", visit.phase)
            return
        reason = first.get("unavailable") if first else "it did not start"
        with open(self.log, "a") as log:
            log.write(f"peers unavailable: {reason}\n")
        self.close()
        visit.report.check("peers: PyTorch SDPA", "unavailable", now() - start, 60, "peers.log", visit.phase)

    def read_line(self, seconds):
        """The next JSON line from the peers, or None when none comes within `seconds` or the process ended.
        Reads the pipe's file descriptor directly: a buffered reader would hide lines it has already read
        from the next wait."""
        if self.process is None:
            return None
        deadline = now() + seconds
        while True:
            if b"\n" in self.pending:
                line, self.pending = self.pending.split(b"\n", 1)
                try:
                    return json.loads(line)
                except ValueError:
                    with open(self.log, "a") as log:
                        log.write("(not a protocol line) " + line.decode(errors="replace") + "\n")
                    continue
            ready, _, _ = select.select([self.process.stdout], [], [], max(0.0, deadline - now()))
            if not ready:
                return None
            chunk = os.read(self.process.stdout.fileno(), 65536)
            if not chunk:
                return None
            self.pending += chunk

    def time(self, n, shape, backward):
        visit = self.visit
        if self.process is None or shape.get("page_size"):
            return  # no peers here; or a paged cache, which SDPA cannot read (the contiguous shape has them)
        budget = 60
        limit = min(budget, visit.remaining())
        step = f"peers: {'backward ' if backward else ''}shape {n}"
        start = now()
        backends = PEERS[:3] if backward else PEERS  # the math backend's backward at 8k takes too long
        request = {"shape": shape, "pass": "backward" if backward else "forward", "dtype": "bf16",
                   "backends": backends, "seconds": 0.25}
        rows = []
        try:
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            self.process.stdin.flush()
            while True:
                message = self.read_line(max(0.0, limit - (now() - start)))
                if message is None:
                    raise TimeoutError
                if "done" in message:
                    break
                rows.append(message["row"])
        except (TimeoutError, BrokenPipeError, OSError):
            with open(self.log, "a") as log:
                log.write(f"{step}: no answer within {limit:.0f} s; the peers process is restarted\n")
            visit.report.rows(rows)
            visit.report.check(step, "failed", now() - start, budget, "peers.log", visit.phase)
            self.close()
            self.start()
            return
        visit.report.rows(rows)
        visit.report.check(step, "ok", now() - start, budget, "peers.log", visit.phase)

    def close(self):
        if self.process is not None:
            try:
                self.process.stdin.close()
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process = None


# ---- extra phase
# The kernels Nsight Compute profiles, at one shape each: (implementation, the kernel's name as a regular
# expression, the shape's gpu-bench flags[, launches]); one launch unless the entry gives more.
PROFILED = [
    ("cuda_v2/split_q", "split_q_kernel", ["--batch", "2", "--heads", "16", "--seqlen-q", "8192", "--head-dim", "128"]),
    ("cuda_v3_hopper/ws", "ws_attention_kernel",
     ["--batch", "2", "--heads", "16", "--seqlen-q", "8192", "--head-dim", "128"]),
    ("cuda_v3_hopper/fp8", "fp8_attention_kernel",
     ["--batch", "2", "--heads", "8", "--seqlen-q", "8192", "--head-dim", "256"]),
    ("decoding/cuda_split_kv", "split_kv_kernel",
     ["--batch", "1", "--heads", "32", "--kv-heads", "8", "--seqlen-q", "1", "--seqlen-k", "65536", "--head-dim",
      "128"]),
    # The backward (cuda_v2's, dQ, dK and dV in one kernel after the dot pass), at the backward goal's shape.
    ("cuda_v2/split_q", "backward_kernel",
     ["--batch", "2", "--heads", "16", "--seqlen-q", "8192", "--head-dim", "128", "--pass", "backward", "--dtype",
      "bf16"]),
    # The FP8 pre-pass's five launches (K's mean, the LSE shift, Q, K, V), at the FP8 kernel's shape: each one's
    # time, where the H200 record had only their sum.
    ("cuda_v3_hopper/fp8", "(k_mean|lse_shift|qk_quantize|v_quantize)_kernel",
     ["--batch", "2", "--heads", "8", "--seqlen-q", "8192", "--head-dim", "256"], 5),
    # Then the candidate rungs beside them, while time is left: first the backward in FlashAttention-2's warp
    # layout (64 query rows a step over 128 keys) and the decode with its query rows on the tensor cores, then
    # the backward on 128-key tiles, beside the backward_kernel above.
    # Its stalls by instruction too (SourceCounters): the third H200 run put its time on the L2's input, busy with
    # dQ's atomics, by inference from the stall reasons alone; the samples say which instructions wait.
    ("cuda_v2/split_q_bwd64x128", "backward_64x128_kernel",
     ["--batch", "2", "--heads", "16", "--seqlen-q", "8192", "--head-dim", "128", "--pass", "backward", "--dtype",
      "bf16"], 1, ["SourceCounters"]),
    # The same kernel with dQ's accumulator in the fragments' order: whether the L2's requests for dQ's adds
    # (the memory tables' reduction rows, where the third run read 10 requests a RED) fall with the 512
    # contiguous bytes an add covers.
    ("cuda_v2/split_q_bwd64x128_tiled_dq", "backward_64x128_kernel",
     ["--batch", "2", "--heads", "16", "--seqlen-q", "8192", "--head-dim", "128", "--pass", "backward", "--dtype",
      "bf16"]),
    ("decoding/cuda_split_kv_mma", "split_kv_mma_kernel",
     ["--batch", "1", "--heads", "32", "--kv-heads", "8", "--seqlen-q", "1", "--seqlen-k", "65536", "--head-dim",
      "128"]),
    ("cuda_v2/split_q_bwd128", "backward_kernel",
     ["--batch", "2", "--heads", "16", "--seqlen-q", "8192", "--head-dim", "128", "--pass", "backward", "--dtype",
      "bf16"]),
    ("cuda_v2/split_q", "split_q_kernel",  # FA2's 128 x 128 tile at d 64
     ["--batch", "2", "--heads", "32", "--seqlen-q", "8192", "--head-dim", "64"]),
    ("cuda_v3_hopper/ws_persistent", "ws_attention_kernel",
     ["--batch", "2", "--heads", "16", "--seqlen-q", "8192", "--head-dim", "128"]),
    ("cuda_v3_hopper/ws_m192", "ws_attention_kernel",  # its tiles are 64 wide
     ["--batch", "2", "--heads", "32", "--seqlen-q", "8192", "--head-dim", "64"]),
    # The decode's combine after the tensor-core split kernel, 49 partials a row at 64k keys: the third H200 run
    # profiled it after cuda_split_kv's (82 partials, 40.8 us), and put it and the launch gap at about 18 us of
    # cuda_split_kv_mma's median 86.5 by difference. Its caches left as the split kernel left them
    # (--cache-control none): a profile that flushes them reads the partials from DRAM, where the timed runs
    # find them in the L2.
    ("decoding/cuda_split_kv_mma", "combine_kernel",
     ["--batch", "1", "--heads", "32", "--kv-heads", "8", "--seqlen-q", "1", "--seqlen-k", "65536", "--head-dim",
      "128"], 1, [], ["--cache-control", "none"]),
    # Beside it, the combine in two passes (decoding/cuda_split_kv_mma_two_pass), the same way.
    ("decoding/cuda_split_kv_mma_two_pass", "combine_two_pass_kernel",
     ["--batch", "1", "--heads", "32", "--kv-heads", "8", "--seqlen-q", "1", "--seqlen-k", "65536", "--head-dim",
      "128"], 1, [], ["--cache-control", "none"]),
]
# What each profile reads: achieved occupancy, the pipes' utilization (the tensor pipe among them), shared-memory
# bank conflicts, DRAM throughput, and what the warps wait on (WarpStateStats: the stall reasons, which the
# second H200 run lacked for the backward, whose issue slots were 26% busy).
NCU_SECTIONS = ["SpeedOfLight", "Occupancy", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis_Tables",
                "WarpStateStats"]


def extra_phase(visit):
    """Nsight Compute first (only the GPU can give it, and a second call may have little time), then the FP8
    kernel's LSE against the emulation's and its accuracy, then the Hopper kernels' SASS."""
    if not visit.ensure_build(200):
        return
    # A kernel that failed or hung in the speed phase is not run again here: it would cost its steps' budgets.
    names = [e["name"] for e in visit.gpu_implementations()]
    profile_kernels(visit, names)
    if "cuda_v3_hopper/fp8" not in names:
        visit.note("fp8-accuracy on the GPU", "unavailable", "fp8_accuracy.log",
                   "cuda_v3_hopper/fp8 does not run on this GPU (Hopper, sm_90a)")
    elif visit.failed_before("cuda_v3_hopper/fp8", "forward"):
        visit.report.notes.append("extra: the FP8 LSE seeds and fp8-accuracy not run: cuda_v3_hopper/fp8 "
                                  + visit.failed_before("cuda_v3_hopper/fp8", "forward"))
    else:
        # Whether the kernel's scores are the emulation's tensor-core sums (bench/fp8_lse_seeds.py).
        visit.run("fp8 LSE on large inputs, four seeds, against the emulation", 60,
                  [sys.executable, os.path.join(ROOT, "bench", "fp8_lse_seeds.py"), visit.flashlab]
                  + (["--emulate", "--seeds", "46"] if visit.rehearse else []), "fp8_lse.log")
        argv = [visit.flashlab, "fp8-accuracy"]
        argv += ["--device", "cuda"] + (["--emulate", "--heads", "1", "--seqlen", "128"] if visit.rehearse else [])
        visit.run("fp8-accuracy (the FP8 kernel against FA3's Table 3)", 60, argv, "fp8_accuracy.log")
    if visit.rehearse:  # the dry form: the script parses (it compiles with nvcc, which CI need not spend)
        visit.run("SASS of the Hopper kernels, dry: the script parses", 10,
                  ["bash", "-n", os.path.join(ROOT, "cuda_v3_hopper", "check_ptx.sh")], "sass.log")
    else:  # wgmma as HGMMA/QGMMA, no local memory (cuobjdump reads the cubin)
        visit.run("SASS of the Hopper kernels (cuda_v3_hopper/check_ptx.sh)", 90,
                  ["bash", os.path.join(ROOT, "cuda_v3_hopper", "check_ptx.sh"),
                   os.path.join(visit.report.work, "hopper_evidence")], "sass.log")


def profiled_step(impl, kernel, flags):
    """A profile's step and log names: the implementation, the kernel and the head dim, since one entry's kernel
    may be profiled at two (cuda_v2/split_q's at d 128 and at d 64, where it takes another tile)."""
    d = flags[flags.index("--head-dim") + 1] if "--head-dim" in flags else None
    step = f"ncu {impl} ({kernel}{f', d {d}' if d else ''})"
    log = f"ncu_{impl.replace('/', '_')}_{re.sub(r'[^A-Za-z0-9]+', '_', kernel).strip('_')}{f'_d{d}' if d else ''}.log"
    return step, log


def profile_kernels(visit, names):
    """Nsight Compute on one launch of each top kernel, the clocks left as they are (--clock-control none)."""
    ncu = shutil.which("ncu") or next(iter(sorted(glob.glob("/usr/local/cuda*/bin/ncu")
                                                  + glob.glob("/opt/nvidia/nsight-compute/*/ncu"))), None)
    for impl, kernel, flags, *more in PROFILED:  # more: launches, sections beside NCU_SECTIONS, ncu's options
        launches = more[0] if more else 1
        sections = NCU_SECTIONS + (more[1] if len(more) > 1 else [])
        options = more[2] if len(more) > 2 else []
        step, log = profiled_step(impl, kernel, flags)
        if impl not in names:
            visit.note(step, "unavailable", log, f"{impl} does not run here")
            continue
        why = visit.failed_before(impl, "backward" if "backward" in flags else "forward")
        if why:
            visit.report.notes.append(f"extra: {step} not profiled: {impl} {why}")
            continue
        if visit.rehearse:  # the dry form: the kernel's name must be in the program, or -k would match nothing
            visit.run(step + ", dry: the kernel's name", 20,
                      ["sh", "-c", f"nm -C {shlex.quote(visit.flashlab)} | grep -cE {shlex.quote(kernel)}"], log)
            continue
        if not ncu:
            visit.note(step, "unavailable", log, "ncu: not found")
            continue
        # --print-details all: the memory tables' shared-memory rows (bank conflicts) print only with it.
        argv = [ncu, "--clock-control", "none", "-k", f"regex:{kernel}", "--launch-count", str(launches),
                "--print-details", "all"] + options
        for section in sections:
            argv += ["--section", section]
        argv += [visit.flashlab, "gpu-bench", impl] + flags + ["--seconds", "0.01", "--repeat", "3"]

        def verdict(returncode, output):
            if "==PROF== Disconnected" in output and returncode == 0 and "==WARNING== No kernels were profiled" not in output:
                return "ok"
            # The profiler could not reach the device's counters in this runtime (LibraryNotLoaded, ERR_NVGPU...).
            return "unavailable" if "==ERROR==" in output or "==PROF==" not in output else "failed"
        visit.run(step, 40, argv, log, classify=verdict)


def run_visit(args, out):
    work = tempfile.mkdtemp(prefix="flashlab-gpu-report-")
    command = "bash bench/gpu_report.sh " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    report = Report(out, work, command, commit_of(args), args.rehearse)
    report.write()
    visit = Visit(args, report)
    phases = ["check", "speed", "extra"] if args.phase == "all" else [args.phase]
    overall = now() + call_budget(args)
    try:
        visit.phase, visit.deadline = "preflight", now() + 30
        visit.preflight()
        for phase in phases:
            budget = PHASE_BUDGETS[phase] if args.phase == "all" else call_budget(args)
            if args.phase == "all":
                if phase == "extra" and overall - now() < 30:
                    report.notes.append("extra: not run, too little of the 9 minutes was left")
                    break
                budget = min(budget, max(0, overall - now()))
            visit.phase, visit.deadline = phase, now() + budget
            print(f"==== phase {phase} ({budget:.0f} s)", flush=True)
            {"check": visit.check_phase, "speed": visit.speed_phase, "extra": lambda: extra_phase(visit)}[phase]()
    finally:
        report.write()
        shutil.rmtree(work, ignore_errors=True)
    print(open(os.path.join(out, "summary.txt")).read(), end="")
    return report


def call_budget(args):
    """The seconds a call may spend: --seconds, else the 9 minutes of --phase all or the one phase's budget. A
    second call of one phase (the speed sweep's later shapes, say) can take what the visit has left, rather than
    its phase's share of a first call."""
    if args.seconds is not None:
        return args.seconds
    return ALL_BUDGET if args.phase == "all" else PHASE_BUDGETS[args.phase]


def commit_of(args):
    if args.commit:
        return args.commit
    if os.environ.get("FLASHLAB_COMMIT"):
        return os.environ["FLASHLAB_COMMIT"]
    result = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if result.returncode != 0:
        return "unknown (no .git here: pass --commit SHA)"
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain"], capture_output=True, text=True).stdout
    return result.stdout.strip() + (" (with uncommitted changes)" if dirty.strip() else "")


def baselines_left_out(names, forward_index, baseline_shapes):
    """The names to time on the forward list's shape `forward_index`, and the BASELINES left out of it: they are
    timed on the first `baseline_shapes`."""
    if forward_index < baseline_shapes:
        return names, []
    return [n for n in names if n not in BASELINES], [n for n in names if n in BASELINES]


def files_in(folder):
    return [os.path.join(d, f) for d, _, names in os.walk(folder) for f in names]


# ---- the rehearsal's own checks
def rehearse(args, out):
    problems = []
    report = run_visit(args, out)
    result = load_result(out)
    problems += [f"result: {p}" for p in results_schema.problems_of(result)]
    if len(files_in(out)) > MAX_FILES:
        problems.append(f"{out} holds {len(files_in(out))} files, more than {MAX_FILES}")
    problems += [f"check failed in the rehearsal: {c['step']} (see {c['log']})" for c in report.failed()]
    measured = {row["impl"] for row in result["rows"] if row.get("time_ms") is not None}
    listing = json.loads(subprocess.run([os.path.join(Visit(args, report).build, "bin", "flashlab"), "list",
                                         "--json"], capture_output=True, text=True).stdout)
    for entry in listing:
        if entry["device"] == "cuda" and entry["name"] not in measured and (
                not args.impls or re.search(args.impls, entry["name"])):
            problems.append(f"no row measured for {entry['name']}")
    if not any(row["impl"].startswith("torch/") and row.get("time_ms") is not None for row in result["rows"]):
        problems.append("no peer row (the dry form's)")
    if not any(row.get("pass") == "backward" and row.get("time_ms") is not None for row in result["rows"]):
        problems.append("no backward row")
    # The checks above must be able to fail: a broken result and too many files are caught.
    broken = dict(result, checks=result["checks"] + [{"step": "x", "status": "weird", "seconds": 1, "budget_s": 1,
                                                       "log": ""}])
    del broken["rows"]
    if len(results_schema.problems_of(broken)) < 2:
        problems.append("the schema check does not catch a missing 'rows' and a bad status")
    with tempfile.TemporaryDirectory() as crowded:
        for n in range(MAX_FILES + 1):
            open(os.path.join(crowded, f"f{n}"), "w").close()
        if len(files_in(crowded)) <= MAX_FILES:
            problems.append("the file count does not see 9 files")
    # A shape's step passes gpu-bench --max-seconds: what it leaves out must come back as rows that say so.
    flashlab = os.path.join(Visit(args, report).build, "bin", "flashlab")
    spent = subprocess.run([flashlab, "gpu-bench", "cuda_v3_hopper/ws", "--shapes", "rehearse", "--emulate",
                            "--max-seconds", "0.001", "--json"], capture_output=True, text=True, timeout=120)
    left_out = [row for row in json_line(spent.stdout)["rows"] if "--max-seconds" in row.get("skipped", "")] \
        if spent.returncode == 0 else []
    if not left_out or any(row.get("time_ms") is not None for row in left_out):
        problems.append(f"gpu-bench --max-seconds (exit {spent.returncode}): the shapes left out have no rows "
                        "that say so")
    # --merge keeps a timed row against a later call's row without a time for the same implementation and shape.
    timed = next(row for row in result["rows"] if row.get("time_ms") is not None)
    later = dict(timed, time_ms=None, tflops=None, gbps=None, max_err_o=None, skipped="not measured")
    if merge_rows([result, dict(result, rows=[later])]).count(timed) != 1:
        problems.append("--merge: a later row without a time replaced a timed one")
    failed = {k: v for k, v in later.items() if k != "skipped"} | {"failed": "a fault"}
    if merge_rows([dict(result, rows=[failed]), dict(result, rows=[later])]) != [failed]:
        problems.append("--merge: a later skipped row replaced a failed one")
    # Each profile has a log of its own: two under one name would append to one file under one step.
    steps = [profiled_step(impl, kernel, flags) for impl, kernel, flags, *_ in PROFILED]
    if len({log for _, log in steps}) != len(steps):
        problems.append("PROFILED: two profiles share a step and a log")
    # bench/predictions.json names what this build has, in sections of chapters that exist; its table gives
    # each figure its verdict, and never counts an emulated row.
    names = {entry["name"] for entry in listing}
    for p in load_predictions():
        if p["impl"].removesuffix(" (main kernel)") not in names or not p["low"] < p["high"] or (
                not source_exists(p["source"])) or (
                p["metric"] not in ("tflops", "time_ms", "copy_share", "speedup")) or (
                p["metric"] == "speedup" and p.get("over") not in names):
            problems.append(f"bench/predictions.json: {p['impl']}: unknown entry, range, metric or source")
    # One prediction a figure: two for the same implementation, pass, shape and metric would give the run's
    # table two verdicts on one measurement.
    figures = [json.dumps([p["impl"], p.get("pass", "forward"), p["shape"], p["metric"], p.get("over")],
                          sort_keys=True) for p in load_predictions()]
    if len(set(figures)) != len(figures):
        problems.append("bench/predictions.json: two predictions of one figure (impl, pass, shape, metric)")
    first = load_predictions()[0]
    row = dict(first["shape"], impl=first["impl"], dtype="bf16", time_ms=1.0, tflops=first["low"] * 0.9)
    for want, fake in (("within", dict(row, tflops=(first["low"] + first["high"]) / 2)), ("below (-10%)", row),
                       ("not measured", dict(row, emulated=True))):
        got = prediction_lines(dict(result, rows=[fake]), [first])[-2].split(" | ")[5]
        if got != want:
            problems.append(f"the predictions' table says '{got}' where it should say '{want}'")
    # --seconds gives a call of one phase the time the visit has left, not the phase's share of a first call.
    for phase, seconds, want in (("speed", None, PHASE_BUDGETS["speed"]), ("speed", 420, 420),
                                 ("all", None, ALL_BUDGET), ("all", 300, 300)):
        if call_budget(argparse.Namespace(phase=phase, seconds=seconds)) != want:
            problems.append(f"--phase {phase} --seconds {seconds}: the call's budget is not {want} s")
    # A result an earlier call left in OUTDIR is replaced, whatever its date (run again after midnight, the
    # rehearsal found the day before's beside its own).
    with tempfile.TemporaryDirectory() as earlier, tempfile.TemporaryDirectory() as work:
        for name in ("results-x-2000-01-01.json", "results-x-2000-01-01.md"):
            open(os.path.join(earlier, name), "w").close()
        Report(earlier, work, "the rehearsal", "x", True).write()
        left = sorted(n for n in os.listdir(earlier) if n.startswith("results-"))
        if len(left) != 2 or any("2000-01-01" in n for n in left):
            problems.append(f"an earlier call's result is not replaced: {left}")
    # The cores and baselines: timed on the first forward shapes, left out after them.
    names = ["cuda_v2/split_q", "cuda_v1/split_k", "decoding/cuda_core"]
    for index, first, want in ((3, 4, []), (4, 5, []), (4, 4, names[1:])):
        timed, left = baselines_left_out(names, index, first)
        if left != want or sorted(timed + left) != sorted(names):
            problems.append(f"forward shape {index} (--baseline-shapes {first}): {left} left out, not {want}")
    problems += baseline_drill(args)
    problems += drill(args, result)
    print("\n== rehearsal: " + ("every check passed" if not problems else "FAILED"))
    for problem in problems:
        print("   " + problem)
    return 1 if problems else 0


def baseline_drill(args):
    """The speed phase with the baselines timed on the first forward shape only: split_q_simt measured there and
    left out of the later ones with rows that say so, split_q measured wherever it runs."""
    problems = []
    with tempfile.TemporaryDirectory() as out:
        os.environ["FLASHLAB_REPORT_INJECT"] = "no-backward"
        drill_args = argparse.Namespace(**{**vars(args), "phase": "speed", "impls": "split_q$|split_q_simt",
                                           "baseline_shapes": 1})
        print("\n==== drill: the baselines on the first forward shape only")
        try:
            run_visit(drill_args, out)
        finally:
            del os.environ["FLASHLAB_REPORT_INJECT"]
        rows = load_result(out)["rows"]
    first = shape_key(next(row for row in rows if not row["impl"].startswith("torch/")))
    simt = [row for row in rows if row["impl"] == "cuda_v2/split_q_simt"]
    if not any(row.get("time_ms") is not None and shape_key(row) == first for row in simt):
        problems.append("baselines drill: split_q_simt not measured on the first shape")
    later = [row for row in simt if shape_key(row) != first]
    if not later or any(not row.get("skipped", "").startswith("left out: a core or baseline") for row in later):
        problems.append("baselines drill: split_q_simt's later shapes have no rows that say it was left out")
    if any(row["impl"] == "cuda_v2/split_q" and "left out" in row.get("skipped", "") for row in rows):
        problems.append("baselines drill: split_q was left out")
    return problems


def drill(args, clean):
    """The failures a visit can meet, injected one run at a time: the rows that finished must survive each."""
    problems = []
    drills = {"timeout:ours: shape 1": "a step that times out", "no-cublas": "no cuBLAS", "no-peers": "no peers",
              "fault:cuda_v2/split_q": "a kernel that faults", "hang:cuda_v2/split_q": "a kernel that hangs"}
    for inject, what in drills.items():
        kernel = inject.startswith(("fault:", "hang:"))
        with tempfile.TemporaryDirectory() as out:
            os.environ["FLASHLAB_REPORT_INJECT"] = inject + ",no-backward"
            if kernel:  # the tool's own drill (tools/command.hpp): that kernel fails or hangs in every gpu-bench call
                os.environ["FLASHLAB_INJECT"] = inject
            # A kernel's failure: the faulty one first, and one after it that the failure must not cost.
            impls = "split_q$|split_q_simt" if kernel else "split_q$|cuda_split_kv"
            drill_args = argparse.Namespace(**{**vars(args), "phase": "speed", "impls": impls})
            print(f"\n==== drill: {what}")
            try:
                run_visit(drill_args, out)
            finally:
                del os.environ["FLASHLAB_REPORT_INJECT"]
                os.environ.pop("FLASHLAB_INJECT", None)
            result = load_result(out)
            problems += [f"drill '{what}': {p}" for p in results_schema.problems_of(result)]
            if len(files_in(out)) > MAX_FILES:
                problems.append(f"drill '{what}': more than {MAX_FILES} files")
            checks = {c["step"]: c for c in result["checks"]}
            ours = {(row["impl"], shape_key(row)) for row in result["rows"] if not row["impl"].startswith("torch/")}
            expected = {(row["impl"], shape_key(row)) for row in clean["rows"]
                        if re.search(drill_args.impls, row["impl"]) and row.get("pass", "forward") == "forward"}
            if inject.startswith("timeout:"):
                step = checks.get("ours: shape 1")
                if not step or step["status"] != "failed":
                    problems.append(f"drill '{what}': the step that timed out is not reported failed")
                lost = {key for key in expected if key[1] != shape_key_of(clean, 1)} - ours
                if {key for key in expected if key[1] == shape_key_of(clean, 1)} - ours:
                    problems.append(f"drill '{what}': the shape whose step timed out has no row saying why")
            elif kernel:
                problems += [f"drill '{what}': {p}" for p in kernel_drill(result, clean, inject.split(":", 1)[1])]
                lost = expected - ours
            else:
                lost = expected - ours
                name = "cuBLAS" if inject == "no-cublas" else "peers: PyTorch SDPA"
                if checks.get(name, {}).get("status") != "unavailable":
                    problems.append(f"drill '{what}': '{name}' is not reported unavailable")
                if inject == "no-peers" and any(row["impl"].startswith("torch/") for row in result["rows"]):
                    problems.append(f"drill '{what}': peer rows without peers")
            if lost:
                problems.append(f"drill '{what}': rows lost: {sorted(lost)[:3]}")
            if not kernel and [c for c in result["checks"] if c["status"] == "failed" and
                               not inject.startswith("timeout:")]:
                problems.append(f"drill '{what}': a missing tool was reported as a failure")
    return problems


def kernel_drill(result, clean, faulty):
    """What a kernel that faults or hangs on the first shape must leave: its failure in a row and a failed step,
    the implementation after it measured wherever the clean run measured it, and the faulty one left out of
    the later shapes with the reason."""
    problems = []
    first = shape_key_of(clean, 0)
    rows = [row for row in result["rows"] if row["impl"] == faulty]
    if not any("failed" in row and shape_key(row) == first for row in rows):
        problems.append(f"no failed row for {faulty} on the first shape")
    if any(shape_key(row) != first and "left out" not in row.get("skipped", "") for row in rows) or len(rows) < 2:
        problems.append(f"{faulty} is not left out of the later shapes, with the reason")
    if not any(c["step"] == "ours: shape 0" and c["status"] == "failed" for c in result["checks"]):
        problems.append("the first shape's step is not reported failed")
    measured = {(row["impl"], shape_key(row)) for row in result["rows"] if row.get("time_ms") is not None}
    after = {(row["impl"], shape_key(row)) for row in clean["rows"] if row["impl"] == "cuda_v2/split_q_simt"
             and row.get("time_ms") is not None and row.get("pass", "forward") == "forward"}
    if not after or after - measured:
        problems.append(f"the failure cost the implementation after it: {sorted(after - measured)[:3]}")
    return problems


def shape_key_of(result, n):
    """The shape key of the n-th forward shape the speed phase timed (its rehearse set's order)."""
    keys = []
    for row in result["rows"]:
        key = shape_key(row)
        if key[0] == "forward" and key not in keys:
            keys.append(key)
    return keys[n] if n < len(keys) else None


def load_result(out):
    paths = [p for p in glob.glob(os.path.join(out, "results-*.json"))]
    if len(paths) != 1:
        raise SystemExit(f"gpu_report: expected one results-*.json in {out}, found {len(paths)}")
    return json.load(open(paths[0]))


# ---- merging the results of several calls
def merge_rows(results):
    """The calls' rows in one list: a later call's row replaces an earlier one of the same implementation and
    shape unless it says less: a row with a time outranks a failed one, which outranks one skipped (refused,
    or left out by --max-seconds or after a failure)."""
    def rank(row):
        return 2 if row.get("time_ms") is not None else 1 if "failed" in row else 0
    rows = {}
    for r in results:
        for row in r["rows"]:
            key = (row["impl"], row["dtype"]) + shape_key(row)
            if key not in rows or rank(row) >= rank(rows[key]):
                rows[key] = row
    return list(rows.values())


def merge(out, paths):
    results = [json.load(open(p)) for p in paths]
    for path, result in zip(paths, results):
        problems = results_schema.problems_of(result)
        if problems:
            print(f"gpu_report: {path} does not follow the results schema: {problems[0]}", file=sys.stderr)
            return 2
    devices = {r["device"] for r in results}
    if len(devices) != 1:
        print(f"gpu_report: the results come from different devices ({', '.join(sorted(devices))})", file=sys.stderr)
        return 2
    merged = dict(results[0])
    merged["commands"] = [r["command"] for r in results]
    merged["command"] = "bash bench/gpu_report.sh --merge " + shlex.join([out] + list(paths))
    merged["date"] = max(r["date"] for r in results)
    commits = list(dict.fromkeys(r["commit"] for r in results))
    merged["commit"] = ", ".join(commits)
    for key in ("copy_gbps", "bf16_gemm_tflops", "gpu", "peers"):
        values = [r.get(key) for r in results if r.get(key) is not None]
        if values:
            merged[key] = values[-1]
    merged["rows"] = merge_rows(results)
    merged["checks"] = [c for r in results for c in r["checks"]]
    os.makedirs(out, exist_ok=True)
    report = Report(out, tempfile.mkdtemp(prefix="flashlab-gpu-merge-"), merged["command"], merged["commit"],
                    bool(merged.get("rehearsal")))
    report.result = merged
    report.write()
    os.remove(os.path.join(out, "logs.tar.gz"))  # the calls' own tarballs hold the logs
    os.remove(os.path.join(out, "summary.txt"))
    shutil.rmtree(report.work, ignore_errors=True)
    print(f"merged {len(paths)} results into {out}/{report.stem()}.json and .md")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], usage=__doc__.split("\n\n")[1])
    parser.add_argument("outdir")
    parser.add_argument("inputs", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument("--phase", default="all", choices=("all", "check", "speed", "extra"))
    parser.add_argument("--rehearse", action="store_true")
    parser.add_argument("--merge", action="store_true")
    parser.add_argument("--commit", help="the commit (the checkout on the GPU machine may have no .git)")
    parser.add_argument("--kit", help="the offline kit (./flashlab kit DIR); default: $FLASHLAB_KIT")
    parser.add_argument("--build-dir", help="default: $FLASHLAB_BUILD_DIR, else build/")
    parser.add_argument("--impls", help="only the GPU implementations whose name this regular expression finds")
    parser.add_argument("--first-shape", type=int, default=0,
                        help="speed: start at this shape of the plan (a second call goes on where the first stopped)")
    parser.add_argument("--seconds", type=int,
                        help="this call's budget: instead of the 9 minutes of --phase all, or of the one phase's own")
    parser.add_argument("--baseline-shapes", type=int, default=FORWARD_BASELINE_SHAPES,
                        help="speed: time the cores and baselines (BASELINES) on the first N forward shapes of the "
                             f"plan (default {FORWARD_BASELINE_SHAPES}; more than the plan has: every shape)")
    parser.add_argument("--last-shape", type=int,
                        help="speed: stop after this shape of the plan (the rest of the budget goes to the extra phase)")
    args = parser.parse_args()
    if args.merge:
        return merge(args.outdir, args.inputs)
    if args.inputs:
        parser.error("one OUTDIR (RESULTS files go with --merge)")
    out = os.path.abspath(args.outdir)
    os.makedirs(out, exist_ok=True)
    if args.rehearse:
        return rehearse(args, out)
    report = run_visit(args, out)
    return 1 if report.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
