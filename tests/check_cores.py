#!/usr/bin/env python3
"""The cores hold to their maps of the papers: every core (one per stage, the paper's algorithm for the plain
case) opens with a table of the algorithm's lines, each with a mark ([L8] for line 8 of Algorithm 1, [S2] for
step 2), and the code carries the same marks where it does what that line says. This checks, for every file
whose header says "tests/check_cores.py holds this table", that each mark of the table is in the code and each
mark in the code is in the table, and that the file stays readable in one sitting (at most 320 lines).

    python3 tests/check_cores.py        exit 1 with the reasons when a core breaks its map
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = re.compile(r"\[([LS]\d+)\]")
MAX_LINES = 320


def cores():
    for folder, _, names in os.walk(ROOT):
        if any(part.startswith(("build", ".")) for part in os.path.relpath(folder, ROOT).split(os.sep)):
            continue
        for name in names:
            if name.endswith((".cpp", ".cu", ".cuh", ".hpp")):
                path = os.path.join(folder, name)
                text = open(path).read()
                prose = " ".join(line.lstrip("/ ").strip() for line in text.split("\n")[:40])
                if "tests/check_cores.py holds this table" in prose:
                    yield path, text


def main():
    problems, found = [], 0
    for path, text in sorted(cores()):
        found += 1
        name = os.path.relpath(path, ROOT)
        lines = text.split("\n")
        header_end = next(n for n, line in enumerate(lines) if not line.startswith("//"))
        table = set(MARK.findall("\n".join(lines[:header_end])))
        code = set(MARK.findall("\n".join(lines[header_end:])))
        if not table:
            problems.append(f"{name}: its header has no marks")
        for mark in sorted(table - code):
            problems.append(f"{name}: [{mark}] is in the header's table but nowhere in the code")
        for mark in sorted(code - table):
            problems.append(f"{name}: [{mark}] is in the code but not in the header's table")
        if len(lines) > MAX_LINES:
            problems.append(f"{name}: {len(lines)} lines, more than the {MAX_LINES} a core may have")
        print(f"{name}: {len(lines)} lines, marks {', '.join(sorted(table, key=lambda m: (m[0], int(m[1:]))))}")
    if found == 0:
        problems.append("no core found")
    for problem in problems:
        print("FAILED: " + problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
