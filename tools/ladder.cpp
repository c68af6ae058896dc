#include "tools/ladder.hpp"

#include <optional>
#include <string>

#include "common/cuda/device.hpp"
#include "common/error.hpp"
#include "tools/args.hpp"
#include "tools/command.hpp"

namespace flashlab::cli {

namespace {

struct LadderProblem {
  const char* title;
  const char* tag;
  std::vector<std::string> flags;           // the problem the stages are made for
  std::vector<std::string> emulated_flags;  // its smaller twin for the CPU emulator (about 0.03-0.07 GFLOP)
  std::vector<const char*> contrast;        // shown beside the stages placed here, when they run natively
};

// Sizes: each native problem takes seconds with its fp64 reference and same-precision baseline on a laptop's
// CPU; the CPU stages' ones are the sizes their chapters discuss at a smaller scale.
const std::vector<LadderProblem>& ladder_problems() {
  static const std::vector<LadderProblem> problems{
      {"prefill, fp32: the CPU stages and FlashAttention-1/-2 on CUDA cores",
       "prefill f32",
       {"--heads", "8", "--seqlen-q", "1024", "--head-dim", "64"},
       {"--heads", "2", "--seqlen-q", "256", "--head-dim", "64"},
       {}},
      {"prefill, bf16: FlashAttention-2 and -3 on tensor cores",
       "prefill bf16",
       {"--heads", "8", "--seqlen-q", "1024", "--head-dim", "128", "--dtype", "bf16"},
       {"--heads", "2", "--seqlen-q", "256", "--head-dim", "128", "--dtype", "bf16"},
       {}},
      // The stages made for the 64 tile width alone (FA3's 192 x 128 tile), with ws beside them on a GPU.
      {"prefill, bf16 at d 64: FlashAttention-3's tile for d 64",
       "prefill bf16 d64",
       {"--heads", "8", "--seqlen-q", "1024", "--head-dim", "64", "--dtype", "bf16"},
       {"--heads", "2", "--seqlen-q", "256", "--head-dim", "64", "--dtype", "bf16"},
       {"cuda_v3_hopper/ws"}},
      {"prefill, f16: the cores and rungs of FlashAttention-2 on tensor cores",
       "prefill f16",
       {"--heads", "8", "--seqlen-q", "1024", "--head-dim", "128", "--dtype", "f16"},
       {"--heads", "2", "--seqlen-q", "256", "--head-dim", "128", "--dtype", "f16"},
       {}},
      {"decode, fp32: one query row per head over a long KV cache (GQA 32/8)",
       "decode f32",
       {"--heads", "32", "--kv-heads", "8", "--seqlen-q", "1", "--seqlen-k", "16384", "--head-dim", "128"},
       {"--heads", "32", "--kv-heads", "8", "--seqlen-q", "1", "--seqlen-k", "2048", "--head-dim", "128"},
       {"cpu_tiled/forward"}},
      {"decode, bf16: one query row per head over a long KV cache (GQA 32/8)",
       "decode bf16",
       {"--heads", "32", "--kv-heads", "8", "--seqlen-q", "1", "--seqlen-k", "16384", "--head-dim", "128",
        "--dtype", "bf16"},
       {"--heads", "32", "--kv-heads", "8", "--seqlen-q", "1", "--seqlen-k", "2048", "--head-dim", "128",
        "--dtype", "bf16"},
       {"cuda_v2/split_q"}},
      {"decode, f16: Flash-Decoding's core on CUDA (GQA 32/8)",
       "decode f16",
       {"--heads", "32", "--kv-heads", "8", "--seqlen-q", "1", "--seqlen-k", "16384", "--head-dim", "128",
        "--dtype", "f16"},
       {"--heads", "32", "--kv-heads", "8", "--seqlen-q", "1", "--seqlen-k", "2048", "--head-dim", "128",
        "--dtype", "f16"},
       {"decoding/cuda_split_kv"}},
      {"prefill, FP8 (e4m3): FlashAttention-3's FP8 pass",
       "fp8",
       {"--heads", "8", "--seqlen-q", "1024", "--head-dim", "128", "--dtype", "e4m3"},
       {"--heads", "2", "--seqlen-q", "256", "--head-dim", "128", "--dtype", "e4m3"},
       {}},
  };
  return problems;
}

// The problem the flags describe; on a machine too small for it (problem_from_args refuses), none, with why.
struct MaybeProblem {
  std::optional<Problem> problem;
  std::string refusal;
};
MaybeProblem problem_of(const std::vector<std::string>& flags) {
  try {
    return {problem_from_args(Args(flags, problem_flags(), problem_switches()), false).problem, ""};
  } catch (const Error& error) {
    return {std::nullopt, error.what()};
  }
}

}  // namespace

bool wants_ladder(const Args& args) {
  if (!args.positional().empty()) return false;
  for (const std::string& flag : problem_flags())
    if (args.has(flag)) return false;
  for (const std::string& flag : problem_switches())
    if (flag != "--emulate" && args.has(flag)) return false;
  return true;
}

Ladder place_on_ladder(bool emulate) {
  if (emulate) cuda::force_emulation(true);
  Ladder ladder;
  std::vector<LadderSection> native, emulated;
  std::vector<MaybeProblem> native_problems, emulated_problems;
  for (const LadderProblem& problem : ladder_problems()) {
    auto section = [&](bool in_emulator) {
      LadderSection s{problem.title,
                      problem.tag,
                      in_emulator,
                      in_emulator ? problem.emulated_flags : problem.flags,
                      {},
                      {}};
      if (in_emulator) s.title += ", in the CPU emulator on a smaller problem";
      if (emulate) s.flags.push_back("--emulate");
      return s;
    };
    native.push_back(section(false));
    emulated.push_back(section(true));
    native_problems.push_back(problem_of(problem.flags));
    emulated_problems.push_back(problem_of(problem.emulated_flags));
  }
  for (const Implementation& impl : implementations()) {
    if (const std::string reason = unavailable_reason(impl); !reason.empty()) {
      ladder.unplaced.emplace_back(&impl, "unavailable: " + reason);
      continue;
    }
    const bool in_emulator = !emulation_reason(impl).empty();
    const std::vector<MaybeProblem>& problems = in_emulator ? emulated_problems : native_problems;
    std::string first_refusal;
    size_t placed = problems.size();
    for (size_t n = 0; n < problems.size() && placed == problems.size(); ++n) {
      const std::string reason =
          problems[n].problem ? why_cannot_run(impl, *problems[n].problem) : problems[n].refusal;
      if (reason.empty())
        placed = n;
      else if (first_refusal.empty())
        first_refusal = reason;
    }
    if (placed == problems.size())
      ladder.unplaced.emplace_back(&impl, first_refusal);
    else
      (in_emulator ? emulated : native)[placed].stages.push_back(&impl);
  }
  for (size_t n = 0; n < native.size(); ++n) {
    if (!native[n].stages.empty())
      for (const char* name : ladder_problems()[n].contrast) {
        const Implementation* impl = find_implementation(name);
        if (impl != nullptr && emulation_reason(*impl).empty() && native_problems[n].problem &&
            why_cannot_run(*impl, *native_problems[n].problem).empty())
          native[n].contrast.push_back(impl);
      }
    if (!native[n].stages.empty()) ladder.sections.push_back(std::move(native[n]));
    if (!emulated[n].stages.empty()) ladder.sections.push_back(std::move(emulated[n]));
  }
  return ladder;
}

}  // namespace flashlab::cli
