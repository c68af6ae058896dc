#!/usr/bin/env python3
"""Runs a compile of the Hopper kernels' GPU build and keeps ptxas's report of it (CMake's compiler launcher).

The GPU build compiles these kernels with `-Xptxas -v` (hopper.cmake). This launcher runs the compile command
it is given, writes what the compiler printed on stderr to OBJECT.ptxas beside the object file, and passes on
everything but ptxas's per-kernel lines ("ptxas info ...", "N bytes stack frame ..."), so that the build log
keeps only warnings and errors. check_registers.py then reads the reports: the register counts it checks are
those of the objects the build links, with the build's own flags, and no second compile is needed.

usage: ptxas_log.py COMPILER ARGUMENT...
"""

import re
import subprocess
import sys

PER_KERNEL = re.compile(r"^(ptxas info\s*:|\s+\d+ bytes stack frame)")


def main():
    command = sys.argv[1:]
    if "-o" not in command[:-1]:  # not a compile to an object: nothing to keep
        sys.exit(subprocess.call(command))
    output = command[command.index("-o") + 1]
    result = subprocess.run(command, stderr=subprocess.PIPE, text=True, errors="replace")
    with open(output + ".ptxas", "w") as report:
        report.write(result.stderr)
    sys.stderr.write("".join(line for line in result.stderr.splitlines(keepends=True)
                             if not PER_KERNEL.match(line)))
    sys.exit(result.returncode)


if __name__ == "__main__":
    main()
