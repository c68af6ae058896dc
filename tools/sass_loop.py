#!/usr/bin/env python3
"""Counts the instructions of a kernel's main loop in SASS, by opcode.

    cuobjdump -sass -arch sm_90a OBJECT.o | python3 tools/sass_loop.py REGEX [--skip-largest-branch]
                                                                     [--skip-branch ADDRESS ...]

REGEX picks the function (the first whose mangled name matches). Its main loop is taken to be the backward
branch with the largest span: in the key-tile kernels, the loop over key tiles. With --skip-largest-branch the
instructions inside the largest forward branch within the loop are left out: in split_q that is the cut tile's
mask, so the count is that of a full tile's path (check the printed ranges against the listing: the rule is a
reading aid, not a control-flow analysis). --skip-branch ADDRESS leaves out the instructions that the
forward branch at that address (hex, as the listing prints it) jumps over, when the path to count takes it:
a branch the largest one does not cover. Predicated instructions count as issued, as they are.
"""
import argparse
import re
import sys
from collections import Counter

INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,6})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA\s+(?:!?U?P\w+,\s*)?(0x[0-9a-f]+)")
GUARD = re.compile(r"^@!?U?P\w+\s+")


def functions(text):
    """(name, [(address, instruction text)]) for each function of a cuobjdump -sass listing."""
    for part in text.split("Function : ")[1:]:
        name = part.split("\n", 1)[0].strip()
        yield name, [(int(a, 16), t) for a, t in INSTRUCTION.findall(part)]


def opcode(instruction):
    return GUARD.sub("", instruction).split()[0].split(".")[0]


def branches(code):
    index = {address: i for i, (address, _) in enumerate(code)}
    for i, (_, text) in enumerate(code):
        m = BRANCH.search(text)
        if m and int(m.group(1), 16) in index:
            yield i, index[int(m.group(1), 16)]


def main_loop(code, skip_largest_branch, skip_at=()):
    """(first, last, skipped ranges [start, end), the indices counted)."""
    backward = [(i - target, target, i) for i, target in branches(code) if target < i]
    if not backward:
        raise SystemExit("no backward branch: the function has no loop")
    _, first, last = max(backward)
    inside = [(i, target) for i, target in branches(code) if first <= i < target <= last]
    skipped = []
    if skip_largest_branch and inside:
        source, target = max(inside, key=lambda branch: branch[1] - branch[0])
        skipped.append((source + 1, target))
    by_address = {code[i][0]: (i, target) for i, target in inside}
    for address in skip_at:
        if address not in by_address:
            raise SystemExit(f"no forward branch inside the loop at {address:#x}")
        source, target = by_address[address]
        skipped.append((source + 1, target))
    counted = [i for i in range(first, last + 1) if not any(a <= i < b for a, b in skipped)]
    return first, last, sorted(skipped), counted


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("function", help="a regular expression matched against the mangled names")
    parser.add_argument("sass", nargs="?", help="cuobjdump -sass output (default: standard input)")
    parser.add_argument("--skip-largest-branch", action="store_true",
                        help="leave out the largest forward branch inside the loop")
    parser.add_argument("--skip-branch", action="append", default=[], metavar="ADDRESS",
                        type=lambda text: int(text, 16),
                        help="leave out what the forward branch at this address jumps over (repeatable)")
    args = parser.parse_args()
    text = open(args.sass).read() if args.sass else sys.stdin.read()
    pattern = re.compile(args.function)
    found = [(name, code) for name, code in functions(text) if pattern.search(name)]
    if not found:
        raise SystemExit(f"no function matches {args.function!r}")
    name, code = found[0]
    first, last, skipped, counted = main_loop(code, args.skip_largest_branch, args.skip_branch)
    ops = Counter(opcode(code[i][1]) for i in counted)
    print(name)
    less = "".join(f", less {start}-{end - 1}" for start, end in skipped)
    print(f"function: {len(code)} instructions; loop: {first}-{last}{less}; counted: {len(counted)}")
    print(" ".join(f"{op} {n}" for op, n in ops.most_common()))


if __name__ == "__main__":
    main()
