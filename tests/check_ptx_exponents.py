#!/usr/bin/env python3
"""tools/ptx_exponents.py on hand-written PTX: an exponent formed from a plain product (mul.f32) is found, one
from fma.rn.f32 or from rounded products (mul.rn.f32) is not; every assignment of a register counts;
predicated instructions and .func bodies count; an fma that the -fmad=false compile of the same source does
not have is one nvcc fused, and is found; PTX whose exponents it cannot place in a function is refused."""
import pathlib
import subprocess
import sys
import tempfile

TOOL = pathlib.Path(__file__).resolve().parent.parent / "tools" / "ptx_exponents.py"

LISTING = """
.version 9.0
.target sm_90a
.visible .entry _Z6fusingv(
\t.param .u64 _Z6fusingv_param_0
)
{
\t.reg .f32 \t%f<9>;
\tmul.f32 \t%f3, %f1, %f2;
\tmul.rn.f32 \t%f4, %f1, %f2;
\tsub.f32 \t%f5, %f3, %f4;
\tex2.approx.ftz.f32 \t%f6, %f5;
\t{
\tex2.approx.ftz.f32 %f7, %f6;
\t}
}
.func _Z7roundedv()
{
\t.reg .f32 \t%f<9>;
\tmul.rn.f32 \t%f3, %f1, %f2;
\tsub.f32 \t%f4, %f1, %f3;
\t@%p1 ex2.approx.ftz.f32 \t%f5, %f4;
\tfma.rn.f32 \t%f6, %f1, %f2, %f3;
\tex2.approx.f32 \t%f7, %f6;
\tmul.ftz.f32 \t%f8, %f1, %f2;
\t@!%p2 add.f32 \t%f9, %f8, %f1;
}
.visible .entry _Z9predicatev()
{
\tmul.f32 \t%f3, %f1, %f2;
\t@!%p2 add.f32 \t%f4, %f3, %f1;
\t@%p1 ex2.approx.ftz.f32 \t%f5, %f4;
}
.visible .entry _Z8reassignv()
{
\tmul.f32 \t%f3, %f1, %f2;
\tsub.f32 \t%f4, %f3, %f1;
\tex2.approx.f32 \t%f5, %f4;
\tadd.f32 \t%f3, %f1, %f1;
}
"""

# The same function compiled twice: as the build does (the front end fused s * c - m into an fma, beside an
# fmaf() of the source), and with -fmad=false (the product rounded, the fmaf() kept).
FUSED = """
.visible .entry _Z5frontv()
{
\tfma.rn.f32 \t%f3, %f1, %f2, %f9;
\tex2.approx.f32 \t%f4, %f3;
\tfma.rn.f32 \t%f5, %f1, %f2, %f8;
\tex2.approx.f32 \t%f6, %f5;
}
"""
UNFUSED = """
.visible .entry _Z5frontv()
{
\tmul.rn.f32 \t%f3, %f1, %f2;
\tadd.rn.f32 \t%f7, %f3, %f9;
\tex2.approx.f32 \t%f4, %f7;
\tfma.rn.f32 \t%f5, %f1, %f2, %f8;
\tex2.approx.f32 \t%f6, %f5;
}
"""


def run(*texts, unfused=None):
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for n, text in enumerate(texts + ((unfused,) if unfused else ())):
            path = pathlib.Path(folder) / f"listing{n}.ptx"
            path.write_text(text)
            paths.append(str(path))
        argv = [sys.executable, str(TOOL), "--ptx", paths[0]] + (["--unfused", paths[1]] if unfused else [])
        return subprocess.run(argv, capture_output=True, text=True)


def main():
    found = run(LISTING)
    assert found.returncode == 1, found
    # 6 exponents: 2 in _Z6fusingv (the first from a plain product), 2 in _Z7roundedv (none), 1 predicated in
    # _Z9predicatev (a plain product through a predicated add), 1 in _Z8reassignv (a plain product in a
    # register assigned again after the exponent's use).
    assert "6 exponents, 3 functions" in found.stdout, found.stdout
    assert "_Z6fusingv: of its 2, 1 from a product ptxas may fuse" in found.stdout, found.stdout
    assert "_Z9predicatev: of its 1, 1 from" in found.stdout, found.stdout
    assert "_Z8reassignv: of its 1, 1 from" in found.stdout, found.stdout
    assert "_Z7roundedv" not in found.stdout, found.stdout
    clean = run(LISTING.split(".visible .entry _Z9predicatev")[0].replace("mul.f32 \t%f3", "mul.rn.f32 \t%f3"))
    assert clean.returncode == 0 and "4 exponents, 0 functions" in clean.stdout, clean
    front = run(FUSED, unfused=UNFUSED)
    assert front.returncode == 1 and "_Z5frontv: of its 2, 1 from a product nvcc fused" in front.stdout, front
    both = run(FUSED, unfused=FUSED)  # every fma of the build also under -fmad=false: the source's fmaf()s
    assert both.returncode == 0, both
    outside = run("ex2.approx.f32 %f1, %f2;\n" + LISTING)
    assert outside.returncode != 0 and "read 6 of the 7" in outside.stderr, outside
    print("ptx_exponents: fusable and front-end-fused products found, fmaf() and rounded ones passed, stray "
          "exponents refused")


if __name__ == "__main__":
    main()
