#!/usr/bin/env python3
"""tools/ptx_exponents.py on hand-written PTX: an exponent formed from a plain product (mul.f32) is found, one
from fma.rn.f32 or from rounded products (mul.rn.f32) is not, predicated instructions and .func bodies count,
and PTX whose exponents it cannot place in a function is refused."""
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
"""


def run(text):
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "listing.ptx"
        path.write_text(text)
        return subprocess.run([sys.executable, str(TOOL), "--ptx", str(path)], capture_output=True, text=True)


def main():
    found = run(LISTING)
    assert found.returncode == 1, found
    # 5 exponents: 2 in _Z6fusingv (the first from a plain product), 2 in _Z7roundedv (none), 1 predicated in
    # _Z9predicatev (from a plain product through a predicated add).
    assert "5 exponents, 2 from a product ptxas may fuse" in found.stdout, found.stdout
    assert "_Z6fusingv: 1 of its 2" in found.stdout, found.stdout
    assert "_Z9predicatev: 1 of its 1" in found.stdout, found.stdout
    assert "_Z7roundedv" not in found.stdout, found.stdout
    clean = run(LISTING.split(".visible .entry _Z9predicatev")[0].replace("mul.f32 \t%f3", "mul.rn.f32 \t%f3"))
    assert clean.returncode == 0 and "4 exponents, 0 from" in clean.stdout, clean
    outside = run("ex2.approx.f32 %f1, %f2;\n" + LISTING)
    assert outside.returncode != 0 and "read 5 of the 6" in outside.stderr, outside
    print("ptx_exponents: fusable products found, fused and rounded ones passed, stray exponents refused")


if __name__ == "__main__":
    main()
