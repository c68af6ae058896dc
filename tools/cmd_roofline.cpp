// flashlab roofline [IMPL...] [problem flags] [--repeat N] [--svg FILE]: the machine's roofline (compute roof
// and bandwidth slope, measured by `machine`) with every available implementation placed at its arithmetic
// intensity (FLOPs / its traffic model's bytes) and its achieved rate, as a text table and an SVG. With no
// implementation and no problem flag, every stage at the problem it is made for (tools/ladder.hpp): decode
// then sits under the bandwidth slope and prefill under the compute roof.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/error.hpp"
#include "common/flops.hpp"
#include "common/machine.hpp"
#include "common/roofline.hpp"
#include "tools/args.hpp"
#include "tools/command.hpp"
#include "tools/ladder.hpp"
#include "tools/svg.hpp"

namespace flashlab::cli {

namespace {

// A roofline: the ceilings of one device, in GFLOP/s and GB/s.
struct Roof {
  std::string name;
  double peak = 0;       // GFLOP/s
  double bandwidth = 0;  // GB/s
};

struct Placed {
  const Implementation* impl;
  std::string problem;  // the ladder's tag of its problem ("decode f32"); "" for one problem
  Traffic traffic;
  double intensity = 0;  // FLOP/byte
  double rate = 0;       // GFLOP/s achieved
  double roof = 0;       // GFLOP/s attainable at that intensity
  const Roof* device_roof = nullptr;
};

// The roof line from x = lo to hi: the bandwidth slope up to the ridge, then flat at the peak.
Series roof_series(const Roof& roof, double lo, double hi, bool dashed) {
  const double ridge = ridge_point(roof.peak, roof.bandwidth);
  Series s{roof.name, {{lo, lo * roof.bandwidth}}, true, false, dashed, ""};
  if (ridge > lo && ridge < hi) s.points.push_back({ridge, roof.peak});
  s.points.push_back({hi, attainable_rate(hi, roof.peak, roof.bandwidth)});
  return s;
}

int roofline_command(const std::vector<std::string>& argv) {
  auto valued = problem_flags();
  valued.insert({"--repeat", "--svg"});
  const Args args(argv, valued, problem_switches());
  const int64_t repeats = repeats_from_args(args, 3);

  progress("measuring the machine's ceilings ...");
  const MachineCeilings& m = machine_ceilings();
  const GpuReport& gpus = gpu_ceilings();
  std::vector<Roof> roofs{{"CPU: " + std::to_string(m.threads) + " threads", m.fma_gflops_all, m.copy_gbps}};
  const Roof one_core{"CPU: one core's FMA peak", m.fma_gflops_1core, m.copy_gbps};
  for (const GpuCeilings& gpu : gpus.devices)
    if (gpu.gemm_unavailable.empty())  // without the GEMM's rate there is no compute roof to draw
      roofs.push_back({"GPU: " + gpu.name + " (bf16 GEMM)", 1e3 * gpu.bf16_gemm_tflops, gpu.copy_gbps});

  std::vector<Placed> placed;
  std::vector<std::pair<std::string, std::string>> skipped;
  // Measures `chosen` on one problem and places each point; `tag` names the problem in the labels.
  auto place = [&](const std::vector<const Implementation*>& chosen, const ProblemSetup& setup,
                   const std::string& tag) {
    const Problem& p = setup.problem;
    const double flops = forward_flops(p);
    for (size_t n = 0; n < chosen.size(); ++n) {
      const Implementation& impl = *chosen[n];
      std::string reason = why_cannot_run(impl, p);
      if (reason.empty() && !emulation_reason(impl).empty())
        reason = "runs in the CPU emulator here (" + emulation_reason(impl) +
                 "): an emulated time is not a measurement";
      if (reason.empty() && impl.device == Device::cuda && roofs.size() < 2)
        reason = "no GPU ceilings measured";
      if (!reason.empty()) {
        skipped.emplace_back(impl.name, reason);
        continue;
      }
      progress("[" + std::to_string(n + 1) + "/" + std::to_string(chosen.size()) + "] " + impl.name + " ...");
      const Measurement measured = measure(impl, p, setup.inputs, static_cast<int>(repeats));
      Placed row{&impl,
                 tag,
                 forward_traffic(impl, p),
                 0,
                 flops / (measured.median_ms * 1e-3) / 1e9,
                 0,
                 &roofs[impl.device == Device::cuda ? 1 : 0]};
      row.intensity = arithmetic_intensity(flops, row.traffic.bytes);
      row.roof = attainable_rate(row.intensity, row.device_roof->peak, row.device_roof->bandwidth);
      placed.push_back(row);
    }
  };
  std::string title;
  if (wants_ladder(args)) {
    title = "every stage at the problem it is made for";
    const Ladder ladder = place_on_ladder(args.has("--emulate"));
    for (const LadderSection& section : ladder.sections) {
      if (section.emulated) {  // an emulated time is not a measurement: no point, the reason once each
        for (const Implementation* impl : section.stages)
          skipped.emplace_back(impl->name, "runs in the CPU emulator here (" + emulation_reason(*impl) +
                                               "): an emulated time is not a measurement");
        continue;
      }
      const ProblemSetup setup = problem_from_args(Args(section.flags, problem_flags(), problem_switches()));
      std::printf("%-13s %s, %.3f GFLOP\n", (section.tag + ":").c_str(), setup.problem.describe().c_str(),
                  forward_flops(setup.problem) / 1e9);
      place(section.stages, setup, section.tag);
      place(section.contrast, setup, section.tag);
    }
    for (const auto& [impl, reason] : ladder.unplaced) skipped.emplace_back(impl->name, reason);
  } else {
    const ProblemSetup setup = problem_from_args(args);
    title = setup.problem.describe();
    std::printf("%s, %.3f GFLOP\n", title.c_str(), forward_flops(setup.problem) / 1e9);
    place(implementations_from_args(args), setup, "");
  }
  progress("");

  for (const Roof& roof : roofs)
    std::printf("%s: peak %.1f GFLOP/s, bandwidth %.1f GB/s, ridge %.2f FLOP/byte\n", roof.name.c_str(),
                roof.peak, roof.bandwidth, ridge_point(roof.peak, roof.bandwidth));
  std::printf("\n%-29s %-12s %12s %11s %10s %10s %8s  %s\n", "implementation", "problem", "MB moved",
              "FLOP/byte", "GFLOP/s", "roof", "% roof", "side of the ridge");
  bool any_minimum = false;
  for (const Placed& row : placed) {
    any_minimum |= !row.traffic.modeled;
    std::printf("%-29s %-12s %11.1f%s %11.2f %10.1f %10.1f %7.1f%%  %s\n", row.impl->name.c_str(),
                row.problem.c_str(), row.traffic.bytes / 1e6, row.traffic.modeled ? " " : "*", row.intensity,
                row.rate, row.roof, 100 * row.rate / row.roof,
                bound_side(row.intensity, row.device_roof->peak, row.device_roof->bandwidth).c_str());
  }
  // Not placed, by reason (in the ladder's view most share one: they run in the emulator here).
  std::vector<std::pair<std::string, std::string>> by_reason;  // reason, names
  for (const auto& [name, reason] : skipped) {
    auto same =
        std::find_if(by_reason.begin(), by_reason.end(), [&](const auto& r) { return r.first == reason; });
    if (same == by_reason.end())
      by_reason.emplace_back(reason, name);
    else
      same->second += ", " + name;
  }
  for (const auto& [reason, names] : by_reason)
    std::printf("not placed: %s\n  (%s)\n", names.c_str(), reason.c_str());
  std::printf("\nMB moved: the implementation's memory-traffic model (Implementation::bytes_moved).\n");
  if (any_minimum)
    std::printf(
        "* no traffic model declared: the minimum (inputs read once, outputs written once) is used, so "
        "its intensity is an upper bound.\n");
  std::printf("time: median of %lld runs after a warm-up (results checked by flashlab compare, not here).\n",
              static_cast<long long>(repeats));

  if (const auto svg = args.get("--svg")) {
    double lo = INFINITY, hi = 0, low_rate = INFINITY, top = 0;
    for (const Roof& roof : roofs) {
      lo = std::min(lo, ridge_point(roof.peak, roof.bandwidth)),
      hi = std::max(hi, ridge_point(roof.peak, roof.bandwidth));
      top = std::max(top, roof.peak);
    }
    for (const Placed& row : placed) {
      lo = std::min(lo, row.intensity), hi = std::max(hi, row.intensity);
      low_rate = std::min(low_rate, row.rate);
    }
    lo = std::pow(10.0, std::floor(std::log10(lo / 2)));
    hi = std::pow(10.0, std::ceil(std::log10(hi * 2)));
    double bottom = lo * roofs[0].bandwidth;
    for (const Roof& roof : roofs) bottom = std::min(bottom, lo * roof.bandwidth);
    bottom = std::pow(10.0, std::floor(std::log10(std::min(bottom, low_rate))));
    top = std::pow(10.0, std::ceil(std::log10(top * 1.5)));
    Chart chart("Roofline: " + title, Axis{"arithmetic intensity (FLOP/byte)", true, lo, hi, {}},
                Axis{"GFLOP/s", true, bottom, top, {}});
    for (Roof roof : roofs) {
      char ridge[48];
      std::snprintf(ridge, sizeof ridge, " (ridge %.1f FLOP/B)", ridge_point(roof.peak, roof.bandwidth));
      roof.name += ridge;
      chart.add(roof_series(roof, lo, hi, false));
    }
    chart.add(roof_series(one_core, lo, hi, true));
    for (const Placed& row : placed) {
      const std::string label = row.impl->name + (row.problem.empty() ? "" : " (" + row.problem + ")") +
                                (row.traffic.modeled ? "" : " *");
      chart.add(Series{label, {{row.intensity, row.rate}}, false, true, false, label});
    }
    chart.note("Roofs measured by flashlab machine on " + m.cpu + ": FMA peak " +
               std::to_string(static_cast<int>(m.fma_gflops_all)) + " GFLOP/s, copy " +
               std::to_string(static_cast<int>(m.copy_gbps)) + " GB/s.");
    chart.note("Intensity = forward FLOPs / bytes of each implementation's traffic model" +
               std::string(any_minimum ? "; * = no model, minimum bytes." : "."));
    write_text_file(*svg, chart.render());
    std::printf("wrote %s\n", svg->c_str());
  }
  return 0;
}

const CommandRegistration roofline{
    {"roofline", "flashlab roofline [IMPL...] [problem flags] [--repeat N] [--svg FILE]", roofline_command}};

}  // namespace

}  // namespace flashlab::cli
