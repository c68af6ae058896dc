// The sm_80 PTX instructions the CUDA stages use, one wrapper each, and the only place their inline PTX
// lives. Every wrapper has two bodies (common/cuda/target.hpp): the `asm` statement nvcc compiles for the
// GPU, and the emulator's execution of the same instruction (emulator/device.hpp) when the host compiler
// builds the kernel for the CPU. What each instruction does is the PTX ISA's; the emulator's account of it is
// checked against NVIDIA's CuTe and the ISA's formulas (tests/test_fragments.cpp), never against these
// kernels.
//   cp.async   global -> shared copy that bypasses registers, completing at a later cp.async.wait_group
//   ldmatrix   a warp loads 8x8 matrices of 16-bit elements from shared memory into mma fragments
//   mma.sync   m16n8k16 with fp16/bf16 inputs and fp32 accumulators: one warp-wide tensor-core product
//   bar.sync, bar.arrive   named barriers over a subset of the block's warps
//   ex2.approx 2^x in one special-function-unit instruction
//   red.global.add.v2.f32, .v4.f32   two or four fp32 adds into global memory in one instruction (sm_90;
//              an atomicAdd each before)
//   cvt.rn.satfinite.e4m3x2.f32   two floats to FP8 (sm_89+; the Hopper FP8 kernels)
// The sm_90a instructions (wgmma, TMA, mbarrier, setmaxnreg) are wrapped the same way in cuda_v3_hopper/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#if defined(FLASHLAB_EMULATED)
#include "common/number_format.hpp"
#include "emulator/device.hpp"
#endif

namespace flashlab::ptx {

// The shared-window address (32 bits) of a pointer into shared memory: what the shared-memory operands of
// PTX instructions take. A kernel may convert a tile's base once and add byte offsets to it.
__device__ inline uint32_t shared_address(const void* smem) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(smem));  // the emulator's: emulator/cuda.hpp
}

// ---- cp.async ----

// Copies 16 bytes global -> shared, asynchronously. When `in_range` is false nothing is read (src-size 0) and
// the 16 bytes are zero-filled: how ragged tails stay in bounds without a branch around the copy.
__device__ inline void cp_async_16(void* smem, const void* gmem, bool in_range) {
#if defined(FLASHLAB_EMULATED)
  emulator::cp_async(smem, gmem, 16, in_range ? 16 : 0);
#else
  const uint32_t dst = shared_address(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(in_range ? 16 : 0));
#endif
}

// Copies 4 bytes global -> shared (cp.async.ca: the only form below 16 bytes), asynchronously; zero-filled
// when `in_range` is false (src-size 0). For per-row scalars that ride along with a tile's copies.
__device__ inline void cp_async_4(void* smem, const void* gmem, bool in_range) {
#if defined(FLASHLAB_EMULATED)
  emulator::cp_async(smem, gmem, 4, in_range ? 4 : 0);
#else
  const uint32_t dst = shared_address(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(in_range ? 4 : 0));
#endif
}

// Closes this thread's copies issued since the last commit into one group.
__device__ inline void cp_async_commit() {
#if defined(FLASHLAB_EMULATED)
  emulator::cp_async_commit_group();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ inline void cp_async_wait() {
#if defined(FLASHLAB_EMULATED)
  emulator::cp_async_wait_group(kPending);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}

// ---- ldmatrix ----

// kMatrices (1, 2 or 4) 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8, in the
// shared window (shared_address). Register r[m] of lane l then holds row l / 4, columns 2 (l % 4) and 2 (l %
// 4) + 1 of matrix m; with kTranspose, each matrix transposed: rows 2 (l % 4), 2 (l % 4) + 1 of column l / 4.
template <int kMatrices, bool kTranspose>
__device__ inline void ldmatrix(uint32_t (&r)[kMatrices], uint32_t addr) {
  static_assert(kMatrices == 1 || kMatrices == 2 || kMatrices == 4);
#if defined(FLASHLAB_EMULATED)
  emulator::ldmatrix(r, kMatrices, kTranspose, addr);
#else
  if constexpr (kMatrices == 1 && !kTranspose)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(addr));
  else if constexpr (kMatrices == 1)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(addr));
  else if constexpr (kMatrices == 2 && !kTranspose)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr));
  else if constexpr (kMatrices == 2)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr));
  else if constexpr (!kTranspose)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}
// The same from a generic pointer into shared memory.
template <int kMatrices, bool kTranspose>
__device__ inline void ldmatrix(uint32_t (&r)[kMatrices], const void* smem_row) {
#if defined(FLASHLAB_EMULATED)
  emulator::ldmatrix(r, kMatrices, kTranspose, smem_row);
#else
  ldmatrix<kMatrices, kTranspose>(r, shared_address(smem_row));
#endif
}

__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  ldmatrix<4, false>(r, smem_row);
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  ldmatrix<4, true>(r, smem_row);
}
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  ldmatrix<4, false>(r, addr);
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  ldmatrix<4, true>(r, addr);
}

// ---- mma.sync m16n8k16 ----

// D (16x8, fp32) += A (16x16, row-major) * B (16x8, column-major), Element = __half or __nv_bfloat16. The
// fragment layouts are in cuda_v2/tensor_core.cuh (and, as the emulator's reference, emulator/fragments.hpp).
template <typename Element>
__device__ inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  static_assert(std::is_same_v<Element, __half> || std::is_same_v<Element, __nv_bfloat16>);
#if defined(FLASHLAB_EMULATED)
  const uint32_t b[2] = {b0, b1};
  emulator::mma_m16n8k16(
      d, a, b, d, std::is_same_v<Element, __half> ? emulator::MmaInput::f16 : emulator::MmaInput::bf16);
#else
  if constexpr (std::is_same_v<Element, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#endif
}

// ---- Named barriers (bar.sync / bar.arrive with an id; barrier 0 is __syncthreads) ----

// Waits until `threads` threads (a multiple of 32) have arrived at barrier `id` (1-15; 0 is __syncthreads).
__device__ inline void barrier_sync(uint32_t id, uint32_t threads) {
#if defined(FLASHLAB_EMULATED)
  emulator::barrier_sync(id, threads);
#else
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
#endif
}

// Counts toward barrier `id` without waiting: "you may go" from one group of warps to another.
__device__ inline void barrier_arrive(uint32_t id, uint32_t threads) {
#if defined(FLASHLAB_EMULATED)
  emulator::barrier_arrive(id, threads);
#else
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
#endif
}

// ---- red.global.add.v2.f32, red.global.add.v4.f32 ----

// a[i] += the i-th value in global memory, each add atomic on its own (the PTX ISA: a vector red is a red
// per element), with no result. `a` must be aligned to the vector's bytes (8 or 16). On sm_90 one
// instruction (REDG.E.ADD.F32x2, .F32x4) for the vector, where atomicAdd issues one per element; the PTX
// built for older GPUs (compute_80) takes an atomicAdd per element. Either way each element is rounded as
// atomicAdd rounds it. The emulator refuses an address that is not so aligned global memory, which a GPU
// would fault on.
__device__ inline void red_add_f32x2(float* a, float x, float y) {
#if defined(FLASHLAB_EMULATED)
  const float values[2] = {x, y};
  emulator::red_add_f32_vector(a, values, 2);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  atomicAdd(a, x);
  atomicAdd(a + 1, y);
#else
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(a), "f"(x), "f"(y) : "memory");
#endif
}
__device__ inline void red_add_f32x4(float* a, const float (&v)[4]) {
#if defined(FLASHLAB_EMULATED)
  emulator::red_add_f32_vector(a, v, 4);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  for (int i = 0; i < 4; ++i) atomicAdd(a + i, v[i]);
#else
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(a), "f"(v[0]), "f"(v[1]), "f"(v[2]),
               "f"(v[3])
               : "memory");
#endif
}

// ---- ex2.approx ----

// 2^x in one MUFU.EX2 instruction (relative error ~2^-22, far below fp16/bf16 rounding); 2^-inf = +0.
// `kFlushSubnormals` selects .ftz: subnormal inputs and results are flushed to zero.
template <bool kFlushSubnormals = false>
__device__ inline float ex2_approx(float x) {
#if defined(FLASHLAB_EMULATED)
  return emulator::ex2_approx(x, kFlushSubnormals);
#else
  float y;
  if constexpr (kFlushSubnormals)
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  else
    asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}

// ---- cvt.rn.satfinite.e4m3x2.f32 ----

// Two floats to e4m3 (PTX ISA, cvt): `high` to the upper byte, `low` to the lower one; rounded to nearest
// even, saturated to +-448 (infinities too), NaN to NaN. The emulated body is common/number_format.hpp's
// encode_e4m3, which tests/test_cuda.cpp checks against NVIDIA's cuda_fp8.h conversion.
__device__ inline uint16_t cvt_e4m3x2(float high, float low) {
#if defined(FLASHLAB_EMULATED)
  return static_cast<uint16_t>(encode_e4m3(high) << 8 | encode_e4m3(low));
#else
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(high), "f"(low));
  return pair;
#endif
}

}  // namespace flashlab::ptx
