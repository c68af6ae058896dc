#!/usr/bin/env python3
"""Writes wgmma.cuh: the wgmma.mma_async shapes the Hopper kernel uses, one inline-PTX function each.

Each instruction names every accumulator register, so the functions are long and regular; generating them keeps
them correct. Every function has two bodies (common/cuda/target.hpp): the inline PTX, and the emulator's wgmma
with the same shape and the same immediates (scale-a, scale-b, the transposes), both written from the values
below. Run `python3 gen_wgmma.py > wgmma.cuh` and `python3 gen_wgmma.py fp8 > wgmma_fp8.cuh` (then
clang-format) after changing the shape lists.
"""

import sys

SS_N = [80, 96, 128, 176]  # S = Q K^T: N is the key block Bc
RS_N = [64, 128, 192, 256]  # O += P V: N is the tile width the head dim runs in
TYPES = [("__nv_bfloat16", "bf16"), ("__half", "f16")]


def regs(first, count):
    return ", ".join(f"%{first + i}" for i in range(count))


# The immediates: scale-a and scale-b 1 (no negation); A is K-major (no transpose); B is K-major for
# S = Q K^T and MN-major (transposed) for O += P V with 16-bit inputs. FP8 has no transpose immediates.
SCALE_A, SCALE_B = 1, 1
SS_TRANS_A, SS_TRANS_B = 0, 0
RS_TRANS_B = 1


def emulated(n, input_type, a_registers, trans_a, trans_b):
    """The emulated body: emulator::wgmma with the instruction's shape and immediates."""
    a = "a" if a_registers else "nullptr"
    desc_a = "0" if a_registers else "desc_a"
    shape = (f"{{.n = {n}, .input = emulator::WgmmaInput::{input_type}, .a_from_registers = "
             f"{'true' if a_registers else 'false'}, .transpose_a = {'true' if trans_a else 'false'}, "
             f".transpose_b = {'true' if trans_b else 'false'}, .scale_a = {SCALE_A}, .scale_b = {SCALE_B}}}")
    return ["#if defined(FLASHLAB_EMULATED)",
            f"    emulator::wgmma(d, {shape}, {a}, {desc_a}, desc_b, scale_d != 0);",
            "#else"]


def ss(n, ctype, ptx):
    acc = n // 2
    lines = [
        f"template <>\nstruct Wgmma<{n}, {ctype}> {{",
        "  // D (64 x N, fp32) = A (64 x 16 from shared memory, K-major) * B (N x 16 from shared memory, K-major)",
        "  // + scale_d * D.",
        f"  __device__ static void ss(float (&d)[{acc}], uint64_t desc_a, uint64_t desc_b, int scale_d) {{",
        *emulated(n, ptx, False, SS_TRANS_A, SS_TRANS_B),
        "    asm volatile(",
        '        "{\\n.reg .pred p;\\n"',
        f'        "setp.ne.b32 p, %{acc + 2}, 0;\\n"',
        f'        "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} "',
        f'        "{{{regs(0, acc)}}}, "',
        f'        "%{acc}, %{acc + 1}, p, {SCALE_A}, {SCALE_B}, {SS_TRANS_A}, {SS_TRANS_B};\\n}}\\n"',
        "        : " + ", ".join(f'"+f"(d[{i}])' for i in range(acc)),
        '        : "l"(desc_a), "l"(desc_b), "r"(scale_d));',
        "#endif",
        "  }",
    ]
    return lines


def rs(n, ctype, ptx):
    acc = n // 2
    lines = [
        "  // D (64 x N, fp32) = A (64 x 16 from registers) * B (16 x N from shared memory, MN-major: the",
        "  // transpose-B immediate is 1) + scale_d * D.",
        f"  __device__ static void rs(float (&d)[{acc}], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {{",
        *emulated(n, ptx, True, 0, RS_TRANS_B),
        "    asm volatile(",
        '        "{\\n.reg .pred p;\\n"',
        f'        "setp.ne.b32 p, %{acc + 5}, 0;\\n"',
        f'        "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} "',
        f'        "{{{regs(0, acc)}}}, "',
        f'        "{{%{acc}, %{acc + 1}, %{acc + 2}, %{acc + 3}}}, %{acc + 4}, p, {SCALE_A}, {SCALE_B}, {RS_TRANS_B};\\n}}\\n"',
        "        : " + ", ".join(f'"+f"(d[{i}])' for i in range(acc)),
        '        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));',
        "#endif",
        "  }",
    ]
    return lines


FP8_SS_N = [128, 224]  # S = Q K^T of the FP8 kernel: Bc of head dims 256 and 128
FP8_RS_N = [128, 256]  # O += P V: the head dim


def fp8_ss(n):
    acc = n // 2
    return [
        f"  // D (64 x {n}, fp32) = A (64 x 32 e4m3, shared memory, K-major) * B ({n} x 32 e4m3, shared memory,",
        "  // K-major) + scale_d * D. FP8 has no transpose immediates: both operands are K-major.",
        f"  __device__ static void ss(float (&d)[{acc}], uint64_t desc_a, uint64_t desc_b, int scale_d) {{",
        *emulated(n, "e4m3", False, 0, 0),
        "    asm volatile(",
        '        "{\\n.reg .pred p;\\n"',
        f'        "setp.ne.b32 p, %{acc + 2}, 0;\\n"',
        f'        "wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3 "',
        f'        "{{{regs(0, acc)}}}, "',
        f'        "%{acc}, %{acc + 1}, p, {SCALE_A}, {SCALE_B};\\n}}\\n"',
        "        : " + ", ".join(f'"+f"(d[{i}])' for i in range(acc)),
        '        : "l"(desc_a), "l"(desc_b), "r"(scale_d));',
        "#endif",
        "  }",
    ]


def fp8_rs(n):
    acc = n // 2
    return [
        f"  // D (64 x {n}, fp32) = A (64 x 32 e4m3 from registers, 4 per register) * B ({n} x 32 e4m3, shared",
        "  // memory, K-major) + scale_d * D.",
        f"  __device__ static void rs(float (&d)[{acc}], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {{",
        *emulated(n, "e4m3", True, 0, 0),
        "    asm volatile(",
        '        "{\\n.reg .pred p;\\n"',
        f'        "setp.ne.b32 p, %{acc + 5}, 0;\\n"',
        f'        "wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3 "',
        f'        "{{{regs(0, acc)}}}, "',
        f'        "{{%{acc}, %{acc + 1}, %{acc + 2}, %{acc + 3}}}, %{acc + 4}, p, {SCALE_A}, {SCALE_B};\\n}}\\n"',
        "        : " + ", ".join(f'"+f"(d[{i}])' for i in range(acc)),
        '        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));',
        "#endif",
        "  }",
    ]


def fp8_main():
    out = [
        "// GENERATED by gen_wgmma.py fp8: do not edit by hand.",
        "//",
        "// wgmma.mma_async with e4m3 operands (k = 32 per instruction) for the FP8 kernel (fp8_kernel.cuh).",
        "// WgmmaE4m3<N>::ss: S = Q K^T, both from shared memory; ::rs: O += P V, P from registers. The fp32",
        "// accumulator layout is the bf16 one (wgmma.cuh); the A-operand fragment is not (fp8_kernel.cuh).",
        "#pragma once",
        "",
        "#include <cstdint>",
        "",
        '#include "common/cuda/target.hpp"',
        "",
        "#if defined(FLASHLAB_EMULATED)",
        '#include "emulator/device.hpp"',
        "#endif",
        "",
        "namespace flashlab::hopper {",
        "namespace FLASHLAB_CUDA_TARGET {",
        "",
        "template <int N>",
        "struct WgmmaE4m3;",
        "",
    ]
    for n in sorted(set(FP8_SS_N) | set(FP8_RS_N)):
        out += [f"template <>\nstruct WgmmaE4m3<{n}> {{"]
        if n in FP8_SS_N:
            out += fp8_ss(n)
        if n in FP8_RS_N:
            out += fp8_rs(n)
        out += ["};", ""]
    out += ["}  // namespace FLASHLAB_CUDA_TARGET", "using namespace FLASHLAB_CUDA_TARGET;",
            "}  // namespace flashlab::hopper", ""]
    print("\n".join(out))


def main():
    out = [
        "// GENERATED by gen_wgmma.py: do not edit by hand.",
        "//",
        "// wgmma.mma_async for the shapes the kernel uses (PTX ISA, \"Asynchronous Warpgroup Level Matrix",
        "// Multiply-Accumulate\"). Wgmma<N, Element>::ss takes both operands from shared memory (S = Q K^T);",
        "// ::rs takes A from registers (O += P V, P never touches shared memory). Accumulator layout per warp w of",
        "// the warpgroup: register 4*i + {0,1} holds row 16w + lane/4, columns 8i + 2*(lane%4) + {0,1}; register",
        "// 4*i + {2,3} the same columns of row 16w + lane/4 + 8.",
        "#pragma once",
        "",
        "#include <cuda_bf16.h>",
        "#include <cuda_fp16.h>",
        "",
        "#include <cstdint>",
        "",
        '#include "common/cuda/target.hpp"',
        "",
        "#if defined(FLASHLAB_EMULATED)",
        '#include "emulator/device.hpp"',
        "#endif",
        "",
        "namespace flashlab::hopper {",
        "namespace FLASHLAB_CUDA_TARGET {",
        "",
        "template <int N, typename Element>",
        "struct Wgmma;",
        "",
    ]
    for ctype, ptx in TYPES:
        for n in sorted(set(SS_N) | set(RS_N)):
            body = []
            if n in SS_N:
                body += ss(n, ctype, ptx)
            else:
                body += [f"template <>\nstruct Wgmma<{n}, {ctype}> {{"]
            if n in RS_N:
                body += rs(n, ctype, ptx)
            body += ["};", ""]
            out += body
    out += ["}  // namespace FLASHLAB_CUDA_TARGET", "using namespace FLASHLAB_CUDA_TARGET;",
            "}  // namespace flashlab::hopper", ""]
    print("\n".join(out))


if __name__ == "__main__":
    fp8_main() if sys.argv[1:] == ["fp8"] else main()
