// flashlab: the command-line tool over the implementation registry (docs/conventions.md §9; its names and
// flags are a contract). Commands register themselves (tools/command.hpp).
//
// Exit codes: 0 success; 1 a result outside tolerance, or an implementation that failed while it ran (what
// the emulator found wrong in a kernel); 2 invalid or unsupported input (one line on stderr naming the
// field). A user mistake never produces a crash or a stack trace.
#include <cstdio>
#include <iostream>
#include <new>
#include <string>

#include "common/error.hpp"
#include "tools/command.hpp"

namespace flashlab::cli {

namespace {

constexpr const char* kProblemFlags = R"(
problem flags (defaults: batch 1, 8 heads, seqlen_q 1024, seqlen_k = seqlen_q, head_dim 64, f32, random normal
inputs, seed 0):
  --batch N --heads N --kv-heads N --seqlen-q N --seqlen-k N --head-dim N --scale X --causal
  --window-left N --window-right N --seqlens-q a,b,.. --seqlens-k a,b,.. --mask F.npy (bool [SQ,SK])
  --page-size P --dtype f32|f16|bf16|e4m3 --seed N --distribution normal|large|outliers
                (without --dtype, in compare, run, grad and profile: a stage that does not offer f32 runs
                in its own dtype, named in its row, on the same inputs and held to that dtype's tolerance)
  --softcap C   logit soft-capping after the scale, s -> C tanh(s / C) (C > 0)
  --alibi       ALiBi with the ALiBi paper's slopes for the query heads; --alibi-slopes a,b,.. gives them
                (one per query head): s -> s - slope_h |i + seqlen_k - seqlen_q - j|
  --dropout P   dropout on the attention weights with probability P in [0, 1), its mask seeded by --seed
  --bias F.npy  an additive score bias, float [SQ,SK], [H or 1,SQ,SK] or [B or 1,H or 1,SQ,SK]; -inf hides a key
  --cu-seqlens-q 0,a,b,..  packed variable-length batches (FlashAttention's varlen form): cumulative lengths,
                batch + 1 entries from 0 to the token count; Q and O are [total_q, H, D] and LSE [H, total_q];
                --cu-seqlens-k gives K/V's (default: the same, self-attention), [total_k, KVH, D]. The batch
                is the number of sequences, --seqlen-q/--seqlen-k default to the longest one
  --emulate   GPU stages run in the CPU emulator even where a GPU could run them (without a GPU they always
              do; emulated times are labelled and never compared with measured speeds)

exit codes: 0 success, 1 result outside tolerance or a stage that failed as it ran, 2 invalid or unsupported
input
)";

// The commands of the driver script, ./flashlab (it builds first where a command needs the build, then runs
// the tool for every other command).
constexpr const char* kDriverCommands = R"(
the driver script's own commands (the script flashlab at the repository's root, e.g. ./flashlab test):
  flashlab test [--sanitize]     build, then run every test (ctest)
  flashlab exercise list|start|hint|check|solution|grade|handout ...   course exercises (docs/exercises.md)
  flashlab kit DIR               gather what an offline GPU machine lacks for the build (bench/README.md)
  flashlab setup                 install the build's dependencies (apt-get; pinned PyPI packages under build/)
)";

bool is_driver_command(const std::string& name) {
  return name == "test" || name == "exercise" || name == "kit" || name == "setup";
}

void usage() {
  std::cout << "flashlab: FlashAttention from safe softmax to Hopper, every stage side by side\n\nusage:\n";
  for (const Command& command : commands()) {
    std::string usage = command.usage;  // continuation lines indented with the first
    for (size_t at = usage.find('\n'); at != std::string::npos; at = usage.find('\n', at + 3))
      usage.insert(at + 1, "  ");
    std::cout << "  " << usage << "\n";
  }
  std::cout << kDriverCommands << kProblemFlags;
}

int dispatch(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0] == "help" || argv[0] == "--help" || argv[0] == "-h") {
    usage();
    return argv.empty() ? 2 : 0;
  }
  for (const Command& command : commands())
    if (command.name == argv[0]) return command.run({argv.begin() + 1, argv.end()});
  if (is_driver_command(argv[0]))
    fail("'", argv[0],
         "' is a command of the driver script, the script flashlab at the repository's root: run "
         "it through that script (see flashlab help)");
  fail("unknown command '", argv[0], "' (see flashlab help)");
}

}  // namespace

}  // namespace flashlab::cli

int main(int argc, char** argv) {
  try {
    return flashlab::cli::dispatch(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const flashlab::ExecutionError& error) {  // the implementation failed, not the user
    std::fprintf(stderr, "flashlab: %s\n", error.what());
    return 1;
  } catch (const flashlab::Error& error) {
    std::fprintf(stderr, "flashlab: %s\n", error.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "flashlab: out of memory: the problem is too large for this machine\n");
    return 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "flashlab: %s\n", error.what());
    return 2;
  }
}
