// The lane-to-element maps of the warp-level matrix instructions, each defined once: the emulated mma.sync
// and ldmatrix (sm80.cpp) use them, `flashlab layout` prints them, and tests/test_fragments.cpp checks them
// against CuTe's MMA_Traits / Copy_Traits and against the PTX ISA's formulas ("Matrix fragments for
// mma.m16n8k16", "Warp-level matrix load instruction: ldmatrix"). A kernel's own fragment comments
// (cuda_v2/tensor_core.cuh) are not the reference: a kernel and an emulator written from the same
// misunderstanding would both pass.
//
// Registers hold 16-bit elements in pairs: `half` 0 is a register's low 16 bits, 1 its high 16 bits.
//
// Host and device functions: a kernel that loads a fragment element by element (cuda_v2/mma, the tensor-core
// ladder's first rung, before ldmatrix) takes its positions from these same maps.
#pragma once

#include "common/host_device.hpp"

namespace flashlab::emulator::fragments {

struct Element {
  int row = 0, col = 0;
  constexpr bool operator==(const Element&) const = default;
};

// mma.sync.aligned.m16n8k16.row.col: D (16 x 8) = A (16 x 16) * B (16 x 8) + C (16 x 8). With group = lane /
// 4 and pair = lane % 4, each lane holds 4 registers of A, 2 of B and 4 accumulators of C and D.
namespace m16n8k16 {
constexpr int M = 16, N = 8, K = 16;
constexpr int a_registers = 4, b_registers = 2, c_registers = 4;

// A[row][k]: registers 0 and 1 are columns 0-7 of rows group and group + 8; registers 2 and 3 columns 8-15.
FLASHLAB_HOST_DEVICE constexpr Element a(int lane, int reg, int half) {
  return {lane / 4 + 8 * (reg % 2), 2 * (lane % 4) + half + 8 * (reg / 2)};
}
// B[k][col]: register 0 holds rows 0-7 of column group, register 1 rows 8-15 ({row = k, col = n}).
FLASHLAB_HOST_DEVICE constexpr Element b(int lane, int reg, int half) {
  return {2 * (lane % 4) + half + 8 * reg, lane / 4};
}
// C[row][col] and D: registers 0 and 1 are row group, registers 2 and 3 row group + 8; two columns each.
FLASHLAB_HOST_DEVICE constexpr Element c(int lane, int reg) {
  return {lane / 4 + 8 * (reg / 2), 2 * (lane % 4) + reg % 2};
}
}  // namespace m16n8k16

// ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16: up to four 8 x 8 matrices of 16-bit elements, each
// row 16 contiguous bytes whose address one lane supplies.
namespace ldmatrix {
constexpr int rows = 8, cols = 8;

// The lane whose address is row `row` of matrix `matrix`: lanes 0-7 give matrix 0's rows, 8-15 matrix 1's ...
FLASHLAB_HOST_DEVICE constexpr int address_lane(int matrix, int row) {
  return matrix * 8 + row;
}
// The element of every matrix that lands in `lane`'s register for that matrix: without .trans, row lane / 4
// and columns 2 (lane % 4), 2 (lane % 4) + 1; with .trans, the same positions of the transposed matrix.
FLASHLAB_HOST_DEVICE constexpr Element element(int lane, int half, bool transpose) {
  const Element plain{lane / 4, 2 * (lane % 4) + half};
  return transpose ? Element{plain.col, plain.row} : plain;
}
}  // namespace ldmatrix

}  // namespace flashlab::emulator::fragments
