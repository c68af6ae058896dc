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
rounded product is (mul.rn.f32, which ptxas never fuses). The check: no ex2.approx takes an add or sub one of
whose operands is a plain mul.f32, in any function of the PTX. Exit 1 names each function that does.
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


def check_ptx(text):
    """(exponents seen, [(function, exponents, of them from a fusable product)]) for one PTX text."""
    heads = list(FUNCTION.finditer(text))
    seen, offenders = 0, []
    for i, head in enumerate(heads):
        body = text[head.start():heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        made_by = {m.group(2): (m.group(1), [a.strip() for a in m.group(3).split(",")])
                   for m in DEFINITION.finditer(body)}  # PTX registers are assigned once a function, mostly
        exponents = fused = 0
        for m in EX2.finditer(body):
            exponents += 1
            op, operands = made_by.get(m.group(1), ("", []))
            if op.split(".")[0] in ("add", "sub") and any(made_by.get(a, ("",))[0] in FUSABLE for a in operands):
                fused += 1
        seen += exponents
        if fused:
            offenders.append((head.group(1), exponents, fused))
    # Every ex2.approx of the text must have been read inside some function, or the check proves nothing.
    if seen != len(re.findall(r"\bex2\.approx", text)):
        raise SystemExit(f"ptx_exponents: read {seen} of the {len(re.findall(r'ex2[.]approx', text))} "
                         "ex2.approx instructions; the PTX is not in the form this tool reads")
    return seen, offenders


def ptx_commands(build_dir, out_dir):
    """(source, command) making compute_90a PTX of each stage kernel source, from the build's own nvcc command."""
    database = json.loads((pathlib.Path(build_dir) / "compile_commands.json").read_text())
    commands = {}
    for entry in database:
        args = shlex.split(entry["command"])
        source = pathlib.Path(entry["file"]).resolve()
        if not args[0].endswith("nvcc") or "-c" not in args or source.suffix != ".cu":
            continue
        relative = source.relative_to(ROOT) if source.is_relative_to(ROOT) else None
        if relative is None or relative.parts[0] not in STAGES or str(relative) in commands:
            continue
        out = pathlib.Path(out_dir) / (str(relative).replace("/", "_") + ".ptx")
        kept, skip = [], False
        for arg in args:
            if skip:
                skip = False
            elif arg == "-o":
                skip = True
            elif arg != "-c" and not arg.startswith(("-gencode", "-Xptxas")):
                kept.append(arg)
        commands[str(relative)] = (entry["directory"], kept + ["-gencode=arch=compute_90a,code=compute_90a",
                                                              "-ptx", "-o", str(out)], out)
    return commands


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", help="a configured build with CUDA (its compile_commands.json)")
    parser.add_argument("--keep", help="write the PTX here instead of a temporary folder")
    parser.add_argument("--ptx", nargs="+", default=[], help="check these PTX files instead")
    options = parser.parse_args()
    if bool(options.build_dir) == bool(options.ptx):
        parser.error("give --build-dir or --ptx")

    texts = {path: pathlib.Path(path).read_text() for path in options.ptx}
    if options.build_dir:
        with tempfile.TemporaryDirectory() as temporary:
            out_dir = options.keep or temporary
            os.makedirs(out_dir, exist_ok=True)
            commands = ptx_commands(options.build_dir, out_dir)
            if not commands:
                raise SystemExit(f"ptx_exponents: no nvcc compile of a stage source in {options.build_dir}")

            def compile_one(item):
                source, (directory, command, out) = item
                done = subprocess.run(command, cwd=directory, capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(f"ptx_exponents: nvcc failed on {source}:\n{done.stderr}")
                return source, out.read_text()

            with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
                texts.update(dict(pool.map(compile_one, sorted(commands.items()))))

    failed = False
    for name, text in sorted(texts.items()):
        seen, offenders = check_ptx(text)
        print(f"{name}: {seen} exponents, {sum(f for _, _, f in offenders)} from a product ptxas may fuse")
        for function, exponents, fused in offenders:
            print(f"  {function}: {fused} of its {exponents}")
            failed = True
    if failed:
        print("ptx_exponents: write fmaf() where the fused form is meant, __fmul_rn() where the rounded product is")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
