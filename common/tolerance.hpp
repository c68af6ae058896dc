// The tolerance policy, in one place (SPEC "Tolerance policy").
//
// An implementation passes when   max_err(out) <= 2 * max_err(baseline) + floor(dtype)   for O and for LSE,
// where
//  - max_err(x) = max over elements of |x - ref64| / max(1, |ref64|), ref64 the fp64 reference;
//  - baseline is naive standard attention computed at the implementation's precision (inputs rounded to its
//  dtype,
//    fp32 arithmetic, P rounded to the dtype when the kernel rounds it for a tensor-core product, O rounded);
//  - -inf in the reference LSE must be -inf exactly, and NaN in the reference must be NaN in the output (and
//  only
//    there): either mismatch counts as an infinite error.
// Tolerances are never loosened to make a test pass.
#pragma once

#include <string>

#include "common/problem.hpp"
#include "common/reference.hpp"
#include "common/tensor.hpp"

namespace flashlab {

// The floor added to twice the baseline's error; fp32's is 2e-5 (SPEC).
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

}  // namespace flashlab
