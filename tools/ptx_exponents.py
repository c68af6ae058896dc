#!/usr/bin/env python3
"""Checks that the exponents the GPU kernels hand to ex2.approx are rounded as their source writes them.

    python3 tools/ptx_exponents.py --build-dir build [--keep DIR]   # the stages' kernel sources, as the build
                                                                    # compiles them, to compute_90a PTX
    python3 tools/ptx_exponents.py --ptx FILE.ptx ...               # PTX made some other way

An online softmax takes exp2 of a difference, x - m. Where either side is a plain product in CUDA C++ (`a * b`:
mul.f32 in the PTX), ptxas may fuse the product into the subtraction as one FFMA, and the result then carries
the product's exact value where the rest of the kernel sees its rounded one. In split_q that turned the rescale
of a row whose max held, exp2(m * c - m * c), into 2^(the rounding error of m * c) at every key tile: l and O
took it, O / l hid it, the LSE kept it, and the backward's P was 3% off on an H200 (docs/04-cuda-v2.md, "The
rescale of a max that held"). The emulator never fuses (emulator/CMakeLists.txt), so its tests cannot see it.

So a kernel says which it means: fmaf() where the fused form is meant (fma.rn.f32), __fmul_rn() where the
rounded product is (mul.rn.f32, which ptxas never fuses). The check, in every function of the PTX:
- no ex2.approx takes an add or sub one of whose operands is a plain mul.f32 (any assignment of the register);
- nvcc's front end may fuse before ptxas sees the PTX, writing fma.rn.f32 itself: so each source is compiled
  again with -fmad=false, where an fmaf() of the source stays an fma and a fused plain product does not, and a
  function whose exponents take more fmas than there is one nvcc fused.
Exit 1 names each function that fails. Not checked: exponents taken through expf() (cuda_v1/split_k,
cuda_v2/mma), whose argument reaches ex2.approx through expf's own range reduction, and products anywhere else.
"""
import argparse
import concurrent.futures
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
STAGES = ("cuda_v1", "cuda_v2", "cuda_v3_hopper", "decoding")  # the stage directories whose kernels are checked

FUNCTION = re.compile(r"^(?:\.visible\s+|\.weak\s+|\.extern\s+)*\.(?:entry|func)\s+(?:\([^)]*\)\s*)?([\w$]+)", re.M)
DEFINITION = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][a-z0-9_.]*)\s+(%f\d+),\s*([^;]*);", re.M)
EX2 = re.compile(r"^\s*(?:@!?%p\d+\s+)?ex2\.approx[a-z0-9.]*\s+%f\d+,\s*(%f\d+);", re.M)
FUSABLE = {"mul.f32", "mul.ftz.f32"}  # no rounding modifier: ptxas may contract it with an add or sub


def functions_of(text):
    """{function: (exponents, from a fusable product, from an fma)} for one PTX text: what each ex2.approx's
    argument is made by. A register may be assigned more than once in a function; every assignment counts."""
    heads = list(FUNCTION.finditer(text))
    found, seen = {}, 0
    for i, head in enumerate(heads):
        body = text[head.start():heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        made_by = {}  # register -> [(op, operands)], every assignment in the function
        for m in DEFINITION.finditer(body):
            made_by.setdefault(m.group(2), []).append((m.group(1), [a.strip() for a in m.group(3).split(",")]))
        ops_of = lambda register: [op for op, _ in made_by.get(register, [])]
        exponents = fusable = fma = 0
        for m in EX2.finditer(body):
            exponents += 1
            makers = made_by.get(m.group(1), [])
            if any(op.split(".")[0] in ("add", "sub") and
                   any(product in FUSABLE for a in operands for product in ops_of(a)) for op, operands in makers):
                fusable += 1
            if any(op.startswith("fma") for op, _ in makers):
                fma += 1
        seen += exponents
        found[head.group(1)] = (exponents, fusable, fma)
    # Every ex2.approx of the text must have been read inside some function, or the check proves nothing.
    if seen != len(re.findall(r"\bex2\.approx", text)):
        raise SystemExit(f"ptx_exponents: read {seen} of the {len(re.findall(r'ex2[.]approx', text))} "
                         "ex2.approx instructions; the PTX is not in the form this tool reads")
    return found


def check_ptx(text, unfused=None):
    """(exponents seen, [(function, exponents, what is wrong)]) for one PTX text. With `unfused`, the same
    source compiled with -fmad=false: an exponent that takes an fma in `text` but not there is one nvcc's own
    front end fused from a plain product (an fmaf() of the source stays an fma under -fmad=false)."""
    found = functions_of(text)
    without = functions_of(unfused) if unfused is not None else {}
    offenders = []
    for function, (exponents, fusable, fma) in found.items():
        problems = []
        if fusable:
            problems.append(f"{fusable} from a product ptxas may fuse")
        if function in without and fma > without[function][2]:
            problems.append(f"{fma - without[function][2]} from a product nvcc fused")
        if problems:
            offenders.append((function, exponents, "; ".join(problems)))
    return sum(e for e, _, _ in found.values()), offenders


def ptx_commands(build_dir, out_dir):
    """{(source, unfused): (directory, command, output)}: compute_90a PTX of each stage kernel source, from the
    build's own nvcc command, as the build compiles it and again with -fmad=false (`unfused`)."""
    database = json.loads((pathlib.Path(build_dir) / "compile_commands.json").read_text())
    commands = {}
    for entry in database:
        args = shlex.split(entry["command"])
        source = pathlib.Path(entry["file"]).resolve()
        if not args[0].endswith("nvcc") or "-c" not in args or source.suffix != ".cu":
            continue
        relative = source.relative_to(ROOT) if source.is_relative_to(ROOT) else None
        if relative is None or relative.parts[0] not in STAGES or (str(relative), False) in commands:
            continue
        kept, skip = [], False
        for arg in args:
            if skip:
                skip = False
            elif arg == "-o":
                skip = True
            elif arg != "-c" and not arg.startswith(("-gencode", "-Xptxas")):
                kept.append(arg)
        for unfused in (False, True):
            out = pathlib.Path(out_dir) / (str(relative).replace("/", "_") + (".unfused" if unfused else "") + ".ptx")
            commands[(str(relative), unfused)] = (
                entry["directory"], kept + ["-gencode=arch=compute_90a,code=compute_90a"] +
                (["-fmad=false"] if unfused else []) + ["-ptx", "-o", str(out)], out)
    return commands


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", help="a configured build with CUDA (its compile_commands.json)")
    parser.add_argument("--keep", help="write the PTX here instead of a temporary folder")
    parser.add_argument("--ptx", nargs="+", default=[], help="check these PTX files instead")
    parser.add_argument("--unfused", nargs="+", default=[],
                        help="with --ptx: the same sources compiled with -fmad=false, one each, in order")
    options = parser.parse_args()
    if bool(options.build_dir) == bool(options.ptx):
        parser.error("give --build-dir or --ptx")
    if options.unfused and len(options.unfused) != len(options.ptx):
        parser.error("--unfused takes one file for each --ptx file")

    pairs = {path: (pathlib.Path(path).read_text(),
                    pathlib.Path(options.unfused[n]).read_text() if options.unfused else None)
             for n, path in enumerate(options.ptx)}
    if options.build_dir:
        with tempfile.TemporaryDirectory() as temporary:
            out_dir = options.keep or temporary
            os.makedirs(out_dir, exist_ok=True)
            commands = ptx_commands(options.build_dir, out_dir)
            if not commands:
                raise SystemExit(f"ptx_exponents: no nvcc compile of a stage source in {options.build_dir}")

            def compile_one(item):
                key, (directory, command, out) = item
                done = subprocess.run(command, cwd=directory, capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(f"ptx_exponents: nvcc failed on {key[0]}:\n{done.stderr}")
                return key, out.read_text()

            with concurrent.futures.ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
                made = dict(pool.map(compile_one, sorted(commands.items())))
            for (source, unfused), text in made.items():
                if not unfused:
                    pairs[source] = (text, made[(source, True)])

    failed = False
    for name, (text, unfused) in sorted(pairs.items()):
        seen, offenders = check_ptx(text, unfused)
        print(f"{name}: {seen} exponents, {len(offenders)} functions with one from a product that may be fused")
        for function, exponents, problem in offenders:
            print(f"  {function}: of its {exponents}, {problem}")
            failed = True
    if failed:
        print("ptx_exponents: write fmaf() where the fused form is meant, __fmul_rn() where the rounded product is")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
