#!/usr/bin/env python3
"""Checks, as a step of the build, the register count the warp-specialized Hopper kernels rely on.

The kernels hand registers from the producer warpgroup to the consumers with setmaxnreg: the producer drops to
24 a thread, each of the two consumers rises to 240. setmaxnreg.inc waits until the block's register pool can
supply the increase, and the pool holds what the launch gave: ptxas's register count for the kernel, for each of
its 384 threads. 24 x 128 + 2 x 240 x 128 = 64,512 registers fits only if ptxas gives every thread 168 (the
65,536 of an SM over 384 threads, rounded down to 8): with fewer the consumers wait forever on a GPU. The kernel
with three consumers (FA3's 192 x 128 tile, 512 threads) needs 128 a thread for its 32 + 3 x 160. The kernels
state that count (launch_registers() in ws_kernel.cuh, kLaunchRegisters), the emulator starts its pool from it,
and this script reads ptxas's report of the GPU build's own objects (OBJECT.ptxas, kept by ptxas_log.py) and
fails when any kernel that uses setmaxnreg (ws_attention_kernel with warp specialization, ws_core_kernel,
fp8_attention_kernel) gets another count, when ptxas spills in one (the split is sized so that none does), or
when ptxas ignores setmaxnreg (warning C7508). Objects of other sources than .cu files have no report.

usage: check_registers.py --output REPORT OBJECT...
"""

import argparse
import os
import re
import subprocess
import sys


def threads(kernel):
    """A producer and two consumer warpgroups, or the consumers WsConfig's last argument names."""
    match = re.search(r"WsConfig<[^<>]*, (\d+)>", kernel)
    consumers = int(match.group(1)) if match else 2
    return 128 * (consumers + 1)


def expected(kernel):
    return 65536 // threads(kernel) // 8 * 8


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def uses_setmaxnreg(kernel):
    if "fp8_attention_kernel<" in kernel or "ws_core_kernel<" in kernel:
        return True
    match = re.search(r"ws_attention_kernel<[^<]*WsConfig<[^,]+, \d+, \d+, (true|false),", kernel)
    return bool(match) and match.group(1) == "true"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    parser.add_argument("objects", nargs="+")
    args = parser.parse_args()

    report = []
    failures = []
    for obj in (o for o in args.objects if o.endswith(".cu.o")):
        path = obj + ".ptxas"
        if not os.path.exists(path):
            sys.exit(f"check_registers: no ptxas report {path}: the object was not compiled through "
                     "ptxas_log.py with -Xptxas -v (hopper.cmake)")
        with open(path) as text:
            lines = text.read().splitlines()
        # ptxas ignores setmaxnreg in a kernel without __launch_bounds__(threads, 1) (C7508): the split would
        # silently not happen.
        ignored = [line for line in lines if "C7508" in line]
        if ignored:
            sys.exit("check_registers: ptxas ignored setmaxnreg:\n" + "\n".join(ignored))
        # Per kernel: "Compiling entry function 'NAME'", then its "N bytes spill stores, M bytes spill loads"
        # and "Used R registers".
        kernels, counts, spills = [], [], []
        for line in lines:
            entry = re.search(r"Compiling entry function '([^']+)'", line)
            if entry:
                kernels.append(entry.group(1))
            spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if spill and len(spills) < len(kernels):
                spills.append(int(spill.group(1)) + int(spill.group(2)))
            used = re.search(r"Used (\d+) registers", line)
            if used and len(counts) < len(kernels):
                counts.append(int(used.group(1)))
        for kernel, count, spilled in zip(demangle(kernels), counts, spills):
            if not uses_setmaxnreg(kernel):
                continue
            report.append(f"{count} registers, {spilled} bytes spilled  {kernel}")
            if count != expected(kernel):
                failures.append(f"{kernel}: {threads(kernel)} threads with {count} registers each, not "
                                f"{expected(kernel)}")
            if spilled:
                failures.append(f"{kernel}: ptxas spills {spilled} bytes (stores and loads)")
    if not report:
        sys.exit("check_registers: no kernel that uses setmaxnreg was found in ptxas's reports")
    if failures:
        sys.exit("check_registers: the warp-specialized kernels need ptxas to give each of their threads "
                 "65,536 / threads registers (the pool setmaxnreg shares out, e.g. 24 + 2 x 240 per thread "
                 "of a warpgroup), or setmaxnreg.inc waits forever on a GPU; and the split is sized so that "
                 "none of them spills:\n  " + "\n  ".join(failures))
    with open(args.output, "w") as out:
        out.write("ptxas register counts of the kernels that use setmaxnreg (expected: 65,536 / threads, "
                  "168 for 384, 128 for 512) and their spills (expected: none):\n")
        out.write("\n".join(report) + "\n")


if __name__ == "__main__":
    main()
