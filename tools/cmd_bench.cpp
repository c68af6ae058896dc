// flashlab bench [--filter REGEX] [--json FILE] [--max-seconds S] [--heads N] [--benchmark_...]: runs the
// Google Benchmark suite over the registry (bench/), the flashlab_bench program next to this one, with the
// flags passed on and the command recorded in the JSON.
#include <unistd.h>

#include <filesystem>

#include "common/error.hpp"
#include "tools/command.hpp"

namespace flashlab::cli {

namespace {

int bench_command(const std::vector<std::string>& argv) {
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  const std::filesystem::path suite = self.parent_path() / "flashlab_bench";
  if (!std::filesystem::exists(suite))
    fail("the benchmark suite is not built: ", suite.string(),
         " is missing (build the flashlab_bench target)");
  std::string command = "flashlab bench";
  for (const std::string& word : argv) command += " " + word;
  std::vector<std::string> words{suite.string(), "--command=" + command};
  for (size_t a = 0; a < argv.size(); ++a) {
    const std::string& word = argv[a];
    // Flags of the suite that take a value may come as "--flag V" or "--flag=V"; the suite reads the latter.
    if ((word == "--filter" || word == "--json" || word == "--max-seconds" || word == "--heads")) {
      if (a + 1 >= argv.size()) fail(word, " needs a value");
      words.push_back(word + "=" + argv[++a]);
    } else {
      words.push_back(word);
    }
  }
  std::vector<char*> pointers;
  for (std::string& word : words) pointers.push_back(word.data());
  pointers.push_back(nullptr);
  execv(suite.c_str(), pointers.data());
  fail("cannot start ", suite.string());
}

const CommandRegistration bench{
    {"bench",
     "flashlab bench [--filter REGEX] [--json FILE] [--max-seconds S] [--heads N] [--benchmark_... flags]\n"
     "      every available implementation over seqlen 512..16k, head_dim 64/128, causal on/off and decode "
     "shapes",
     bench_command}};

}  // namespace

}  // namespace flashlab::cli
