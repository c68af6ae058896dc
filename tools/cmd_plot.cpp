// flashlab plot BENCH.json --svg FILE: speed against sequence length, one line per implementation, from the
// JSON that `flashlab bench --json` writes.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/error.hpp"
#include "tools/args.hpp"
#include "tools/bench_json.hpp"
#include "tools/command.hpp"
#include "tools/svg.hpp"

namespace flashlab::cli {

namespace {

int plot_command(const std::vector<std::string>& argv) {
  const Args args(argv, {"--svg", "--head-dim"}, {"--causal", "--decode", "--bandwidth"});
  if (args.positional().size() != 1) fail("plot needs exactly one bench JSON file (flashlab bench --json F)");
  const auto svg = args.get("--svg");
  if (!svg) fail("plot needs --svg FILE (where to write the chart)");
  const std::string& path = args.positional()[0];
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read '", path, "'");
  std::ostringstream text;
  text << in.rdbuf();
  const BenchFile file = parse_bench_json(text.str());

  PlotSelection selection;
  selection.head_dim = args.get_int("--head-dim", 0);
  if (selection.head_dim < 0) fail("--head-dim (", selection.head_dim, ") must be >= 1");
  selection.causal = args.has("--causal");
  selection.decode = args.has("--decode");
  selection.bandwidth = args.has("--bandwidth");
  const Chart chart = speed_chart(file, selection);
  write_text_file(*svg, chart.render());
  std::printf("wrote %s (%zu rows in %s)\n", svg->c_str(), file.rows.size(), path.c_str());
  return 0;
}

const CommandRegistration plot{
    {"plot",
     "flashlab plot BENCH.json --svg FILE [--head-dim D] [--causal] [--decode] [--bandwidth]\n"
     "      speed against sequence length, one line per implementation (default: smallest head_dim, "
     "non-causal prefill, GFLOP/s)",
     plot_command}};

}  // namespace

}  // namespace flashlab::cli
