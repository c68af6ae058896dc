// The tolerance policy, in one place (docs/conventions.md §7).
//
// An implementation passes when   max_err(out) <= 2 * max_err(baseline) + floor(dtype)   for O and for LSE,
// where
//  - max_err(x) = max over elements of |x - ref64| / max(1, |ref64|), ref64 the fp64 reference;
//  - baseline is naive standard attention computed at the implementation's precision (inputs rounded to its
//  dtype,
//    fp32 arithmetic, P rounded to the dtype when the kernel rounds it for a tensor-core product, O rounded);
//    for e4m3 the inputs are quantized to fp8 with one scale per tensor, P is scaled by 2^8 and rounded to
//    e4m3, and O is rounded to bf16 (FA3 Table 3's per-tensor fp8 baseline);
//  - -inf in the reference LSE must be -inf exactly, and NaN in the reference must be NaN in the output (and
//  only
//    there): either mismatch counts as an infinite error.
// Tolerances are never loosened to make a test pass.
#pragma once

#include <string>

#include "common/problem.hpp"
#include "common/reference.hpp"
#include "common/reference_backward.hpp"
#include "common/tensor.hpp"

namespace flashlab {

// The floor added to twice the baseline's error; fp32's is 2e-5 (docs/conventions.md §7).
double tolerance_floor(DType dtype);

struct Tolerance {
  double o = 0.0;
  double lse = 0.0;
};

// Error of an output against the fp64 reference, with elements described for humans.
struct Deviation {
  double max_err_o = 0.0;
  double max_err_lse = 0.0;
  std::string worst_o;    // the largest error, e.g. "O[b=0, i=97, h=1, c=3] = 0.51 but the reference is 0.49"
  std::string worst_lse;  // likewise for LSE
  std::string first_o;    // the first element (memory order) beyond the tolerance, when one was given
  std::string first_lse;
};
Deviation deviation(const Problem& problem, const AttentionOutputs& out, const ReferenceResult& ref,
                    const Tolerance* tolerance = nullptr);

// Naive standard attention at `dtype` precision (see above), the yardstick for the tolerance.
AttentionOutputs baseline_attention(const Problem& problem, const AttentionInputs& inputs, DType dtype,
                                    bool rounds_p);

Tolerance tolerance_from_baseline(DType dtype, const Deviation& baseline);

struct Verdict {
  Deviation deviation;
  Tolerance tolerance;
  bool passed() const { return deviation.max_err_o <= tolerance.o && deviation.max_err_lse <= tolerance.lse; }
  std::string explain() const;  // errors and tolerances; when failing, the first wrong and the worst element
};
Verdict judge(const Problem& problem, const AttentionOutputs& out, const ReferenceResult& ref,
              const Tolerance& tol);

// ---- Gradients: the same policy for the backward pass, per tensor. An implementation's backward passes
// when, for each of dQ, dK and dV,   max_err(grad) <= 2 * max_err(baseline grad) + floor(dtype),   with
// max_err as above against the fp64 reference backward, and the baseline the naive backward (S and P
// recomputed per row, dP, D = rowsum(dO * O), dS) at the implementation's precision: inputs and dO rounded to
// its dtype, fp32 arithmetic.

struct GradientDeviation {
  double max_err_dq = 0.0;
  double max_err_dk = 0.0;
  double max_err_dv = 0.0;
  // The first worst element of each, e.g. "dK[b=0, j=12, h=1, c=3] = 0.51 but the reference is 0.49".
  std::string worst_dq, worst_dk, worst_dv;
  // The first element (memory order) of each beyond the tolerance, when one was given.
  std::string first_dq, first_dk, first_dv;
};
struct GradientTolerance;
GradientDeviation gradient_deviation(const Problem& problem, const AttentionGradients& grad,
                                     const ReferenceGradients& ref,
                                     const GradientTolerance* tolerance = nullptr);

// The naive backward at `dtype` precision, the yardstick for the gradient tolerance. Its forward (O, LSE) is
// its own, recomputed at the same precision. `rounds_p`: the implementation rounds P and dS to its dtype
// before they enter products (tensor cores take them as inputs: P for dV, dS for dK and dQ), and the baseline
// rounds them the same way (Implementation::rounds_p), and D then reads the O of the forward's baseline
// (baseline_attention, P rounded the same way), rounded to the dtype as a backward receives it.
AttentionGradients baseline_backward(const Problem& problem, const AttentionInputs& inputs,
                                     const HostTensor& d_out, DType dtype, bool rounds_p = false);

struct GradientTolerance {
  double dq = 0.0;
  double dk = 0.0;
  double dv = 0.0;
};
GradientTolerance gradient_tolerance_from_baseline(DType dtype, const GradientDeviation& baseline);

struct GradientVerdict {
  GradientDeviation deviation;
  GradientTolerance tolerance;
  bool passed() const {
    return deviation.max_err_dq <= tolerance.dq && deviation.max_err_dk <= tolerance.dk &&
           deviation.max_err_dv <= tolerance.dv;
  }
  std::string explain()
      const;  // errors and tolerances; per failing tensor, the first wrong and the worst element
};
GradientVerdict judge_gradients(const Problem& problem, const AttentionGradients& grad,
                                const ReferenceGradients& ref, const GradientTolerance& tol);

}  // namespace flashlab
