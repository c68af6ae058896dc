// Helpers the harness's test files share: which implementations to test, and cached references per case.
#pragma once

#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/reference.hpp"
#include "common/reference_backward.hpp"
#include "common/registry.hpp"
#include "common/tolerance.hpp"
#include "emulator/counters.hpp"
#include "emulator/launch.hpp"
#include "tests/case_matrix.hpp"

namespace flashlab::testing {

// Whether two tensors hold the same bits (NaN equal to the same NaN, -0 unequal to 0): "bit for bit".
inline bool same_bits(const HostTensor& a, const HostTensor& b) {
  return a.data.size() == b.data.size() &&
         std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(float)) == 0;
}

// The implementations selected by the environment: FLASHLAB_IMPL, a regular expression searched in the name,
// and FLASHLAB_DEVICE, "cpu" or "cuda" (unset = all of them). With `any_device`, FLASHLAB_DEVICE is not
// consulted (checks that run GPU stages in the emulator whatever the device asked for).
std::vector<const Implementation*> selected_implementations(bool any_device = false);
// The dtypes the registry tests run an implementation in: all it offers, or with FLASHLAB_DTYPES=first only
// the first (the exercise self-test's solutions, tools/exercise.py: the stage's own code, which the full
// runs check in every dtype; and the shuffled schedule, tests/CMakeLists.txt: a stage's dtypes share one
// kernel template, whose thread order the schedule varies). FLASHLAB_DTYPES=first:REGEX takes the first only
// for the implementations whose name REGEX finds (the in-order run's rungs beside a full kernel).
std::vector<DType> selected_dtypes(const Implementation& impl);

// A case's inputs (rounded to `dtype`), its fp64 reference and its baseline tolerances, computed once.
struct PreparedCase {
  Problem problem;
  AttentionInputs inputs;
  ReferenceResult reference;
  Tolerance tolerance(bool rounds_p);  // from baseline_attention at problem.dtype, cached

 private:
  std::map<bool, Tolerance> tolerances_;
};
// Every padded case of the matrix holds its padding poisoned: what lies past a batch's real lengths (rows of
// Q past seqlens_q, keys of K and V past seqlens_k) is memory the caller may leave holding anything, so it
// holds NaN and Inf here, and no visible row may change (docs/conventions.md §3: padding is never read).
PreparedCase prepare(const Case& test_case, DType dtype);

// A case's upstream gradient (seeded), reference gradients and gradient tolerance (from the baseline backward
// at the case's dtype, rounding P when the implementation does: Implementation::rounds_p).
struct PreparedBackward {
  HostTensor d_out;
  ReferenceGradients reference;
  GradientTolerance tolerance;
};
PreparedBackward prepare_backward(const PreparedCase& prepared, uint64_t seed, bool rounds_p);

// The message of the flashlab::Error that `run` throws (what the emulator found wrong in a kernel), or ""
// when it runs through; and whether `text` contains `part`.
std::string error_of(const std::function<void()>& run);
bool contains(const std::string& text, const std::string& part);

// Fills the padding of `inputs` (unpaged; attach the paged copy after) with NaN and +-Inf.
void poison_padding(const Problem& p, AttentionInputs& inputs);

// Shapes for the counted GPU passes (tests/test_traffic.cpp, tests/test_counters.cpp): batch x heads/kv_heads
// x sq x sk x d in `dtype`, causal or not; and the same with a sliding window.
Problem shaped(int64_t heads, int64_t kv_heads, int64_t sq, int64_t sk, int64_t d, DType dtype, bool causal,
               int64_t batch = 1);
Problem windowed(Problem p, int64_t left, int64_t right);

// What one forward pass of a GPU implementation counted in the emulator (emulator/counters.hpp), on random
// inputs; and the global bytes it moved (read and written).
emulator::Counters counted_forward(const Implementation& impl, const Problem& p);
double counted_forward_bytes(const Implementation& impl, const Problem& p);

// With FLASHLAB_VERBOSE set, prints one line per checked case, "  PASS|FAIL <impl> [<dtype>] <pass> on
// '<case>'
// (<problem>)", and for a failure the verdict's explanation indented below it (course exercises show these to
// the student; tools/exercise.py reads this format). `pass` is "" for the forward and "backward " for the
// backward.
void report_case(bool passed, const std::string& impl, DType dtype, const char* pass, const Case& test_case,
                 const Problem& problem, const std::string& explanation);

// A matrix test's count per implementation, printed at its end: "  <impl> <pass>N passed, M failed, K
// skipped", then each reason for a skip with its count (`pass`: "" or "backward: ").
struct Tally {
  int passed = 0, failed = 0;
  std::map<std::string, int> skipped;  // reason -> count
};
void print_tally(const std::map<std::string, Tally>& tally, const char* pass = "");
// Runs `impl` forward on a prepared case and checks it against the reference within the same-dtype tolerance,
// counting the outcome in `tally` (a run the emulator stops counts as failed, with its message).
void check_case(const Implementation& impl, DType dtype, const Case& test_case, PreparedCase& prepared,
                Tally& tally);
// The same for the backward: `impl`'s forward, then its backward on the prepared upstream gradient, checked
// against the reference gradients within the gradient tolerance.
void check_backward_case(const Implementation& impl, DType dtype, const Case& test_case,
                         const PreparedCase& prepared, const PreparedBackward& backward, Tally& tally);

// Three sequences packed (cu_seqlens), causal, bf16, of ragged lengths: 200 rows over 231 keys, 1 over 9, 129
// over 150. The packed problem of the tests that renumber a kernel's tiles (test_gpu_launchers.cpp,
// test_gpu_backward.cpp), at head dim `head_dim`.
inline Problem packed_causal_problem(int64_t head_dim) {
  Problem p = problem_shape(3, 2, 1, 1, 1, head_dim);
  p.dtype = DType::bf16;
  p.causal = true;
  p.cu_seqlens_q = {0, 200, 201, 330};
  p.cu_seqlens_k = {0, 231, 240, 390};
  p.seqlen_q = 200, p.seqlen_k = 231;
  return p;
}

// The emulator's schedule for one scope, set back however the scope ends (a failed check or a run the
// emulator stops leaves no other test on another schedule).
class ScheduleFor {
 public:
  explicit ScheduleFor(const emulator::ScheduleSetting& setting) : before_(emulator::schedule()) {
    emulator::set_schedule(setting);
  }
  ~ScheduleFor() { emulator::set_schedule(before_); }
  ScheduleFor(const ScheduleFor&) = delete;
  ScheduleFor& operator=(const ScheduleFor&) = delete;

 private:
  emulator::ScheduleSetting before_;
};

}  // namespace flashlab::testing
