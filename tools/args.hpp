// Command-line parsing for the flashlab tool: flags, the shared problem flags, inputs from .npy or random.
// Every mistake throws flashlab::Error with a one-line message naming the flag; main() turns it into exit
// code 2.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/inputs.hpp"
#include "common/npy.hpp"
#include "common/problem.hpp"
#include "common/registry.hpp"
#include "common/tensor.hpp"

namespace flashlab::cli {

class Args {
 public:
  // `valued` flags take a value (--name V or --name=V); `switches` take none. Anything else is an error.
  Args(const std::vector<std::string>& argv, const std::set<std::string>& valued,
       const std::set<std::string>& switches);

  bool has(const std::string& flag) const { return values_.count(flag) > 0; }
  std::optional<std::string> get(const std::string& flag) const;
  int64_t get_int(const std::string& flag, int64_t fallback) const;
  double get_double(const std::string& flag, double fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

// The problem flags of the tool's contract (docs/conventions.md §9) (--batch --heads --kv-heads --seqlen-q
// --seqlen-k --head-dim
// --scale
// --causal --window-left --window-right --seqlens-q --seqlens-k --mask --page-size --dtype --seed) plus
// --distribution, the variants (--softcap --alibi --alibi-slopes --dropout --bias --cu-seqlens-q
// --cu-seqlens-k); and --q/--k/--v for inputs. The switches: --causal, and --emulate (GPU stages run in the
// CPU emulator even where a GPU could run them; problem_from_args() sets that).
std::set<std::string> problem_flags();
std::set<std::string> problem_switches();

struct ProblemSetup {
  Problem problem;
  AttentionInputs inputs;
  std::string input_source;  // "random normal, seed 0" or the .npy paths
};

// Builds and validates the problem; reads --q/--k/--v when given (their shapes then define the problem, and
// any size flag given as well must agree), else draws seeded random inputs. Without `with_inputs`, the
// problem alone (checked the same way; no inputs read or drawn).
ProblemSetup problem_from_args(const Args& args, bool with_inputs = true);

// The explicit mask (nonzero = visible) [seqlen_q, seqlen_k], and the additive bias, whose shape ends in
// [seqlen_q, seqlen_k] with [heads_q or 1] and [batch or 1] before it, from an array given as `what` (a flag
// and its file, or a Python argument's name), into the problem; a wrong shape is an error naming `what`.
void attach_mask(Problem& p, const NpyArray& mask, const std::string& what);
void attach_bias(Problem& p, const NpyArray& bias, const std::string& what);

// The one implementation a command names (`command` is the command's name, for the message).
const Implementation& implementation_from_args(const Args& args, const char* command);

// The implementations the command line names, in that order; with none named, every registered one that
// `keep` accepts (all of them when `keep` is null). An unknown name is an error.
std::vector<const Implementation*> implementations_from_args(const Args& args,
                                                             bool (*keep)(const Implementation&) = nullptr);

// --repeat (timed runs per measurement), `fallback` when absent; fewer than `minimum` is an error.
int64_t repeats_from_args(const Args& args, int64_t fallback, int64_t minimum = 1);

// Copies a float32/float64 .npy array read for `flag` from `path` into `tensor`, whose shape the problem
// fixed
// (`layout` names it in the message, e.g. "[batch, seqlen_q, heads, head_dim]"); refuses any other shape.
void load_tensor(const NpyArray& array, const std::string& flag, const std::string& path, HostTensor& tensor,
                 const char* layout);

}  // namespace flashlab::cli
