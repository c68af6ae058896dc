#!/usr/bin/env python3
"""tools/sass_loop.py on a hand-written listing: the loop is the widest backward branch, the skip the widest
forward branch inside it (or one named by address), guards are stripped, and a function without a loop or a
named address that is no forward branch inside it is refused."""
import pathlib
import subprocess
import sys

TOOL = pathlib.Path(__file__).resolve().parent.parent / "tools" / "sass_loop.py"

LISTING = """
\t\tFunction : _Z5otheri
        /*0000*/                   EXIT ;
\t\tFunction : _Z6kernelv
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
        /*0020*/               @P0 BRA 0x60 ;
        /*0030*/                   LDG.E.U8 R2, desc[UR4][R6.64] ;
        /*0040*/                   LDG.E.U8 R3, desc[UR4][R6.64+0x1] ;
        /*0050*/                   FSEL R4, R4, -INF , P1 ;
        /*0060*/                   MUFU.EX2 R5, R5 ;
        /*0070*/              @!P2 FMUL R5, R5, R5 ;
        /*0080*/               @P3 BRA 0x10 ;
        /*0090*/                   BRA 0x30 ;
        /*00a0*/                   EXIT ;
"""


def run(*args):
    return subprocess.run([sys.executable, str(TOOL), *args], input=LISTING, capture_output=True, text=True)


def main():
    whole = run("kernel")
    assert whole.returncode == 0, whole.stderr
    # Two backward branches: @P3 BRA 0x10 at 0x80 spans 7 instructions, BRA 0x30 at 0x90 only 6. The loop is
    # the wider, instructions 1-8; inside it @P0 BRA 0x60 jumps over 3-5.
    assert "loop: 1-8; counted: 8" in whole.stdout, whole.stdout
    assert "HMMA 1" in whole.stdout and "LDG 2" in whole.stdout and "FMUL 1" in whole.stdout, whole.stdout
    full = run("kernel", "--skip-largest-branch")
    assert "less 3-5; counted: 5" in full.stdout, full.stdout
    assert "LDG" not in full.stdout.splitlines()[-1] and "FSEL" not in full.stdout, full.stdout
    assert "MUFU 1" in full.stdout and "BRA 2" in full.stdout, full.stdout
    # --skip-branch names a forward branch by its address: the one at 0x20 jumps over 3-5, as above.
    named = run("kernel", "--skip-branch", "0x20")
    assert "less 3-5; counted: 5" in named.stdout, named.stdout
    # A backward branch, or an address outside the loop, is refused.
    wrong = run("kernel", "--skip-branch", "0x80")
    assert wrong.returncode != 0 and "no forward branch inside the loop at 0x80" in wrong.stderr, wrong
    refused = run("other")
    assert refused.returncode != 0 and "no backward branch" in refused.stderr, refused
    absent = run("nothing_like_it")
    assert absent.returncode != 0 and "no function matches" in absent.stderr, absent
    print("sass_loop: loop, skip, guards and refusals as expected")


if __name__ == "__main__":
    main()
