// Measuring: the roofline arithmetic, the traffic models, the SVG charts, reading bench JSON back for
// `flashlab plot`, and how many timed runs a measurement makes (never how fast they are).
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "common/flops.hpp"
#include "common/machine.hpp"
#include "common/registry.hpp"
#include "common/roofline.hpp"
#include "common/timing.hpp"
#include "tools/bench_json.hpp"
#include "tools/svg.hpp"

namespace flashlab {

namespace {

// Checks that every element is closed in order (a stack of tag names), the XML well-formedness a browser
// needs from our SVG; returns the number of elements named `tag`.
int count_balanced(const std::string& svg, const std::string& tag) {
  std::vector<std::string> open;
  int count = 0;
  for (size_t at = svg.find('<'); at != std::string::npos; at = svg.find('<', at + 1)) {
    const size_t end = svg.find('>', at);
    REQUIRE(end != std::string::npos);
    const std::string inner = svg.substr(at + 1, end - at - 1);
    REQUIRE(inner.find('<') == std::string::npos);  // no unescaped '<' inside a tag
    if (inner[0] == '/') {
      REQUIRE(!open.empty());
      CHECK(open.back() == inner.substr(1));
      open.pop_back();
      continue;
    }
    const std::string name = inner.substr(0, inner.find_first_of(" /"));
    count += name == tag;
    if (inner.back() != '/') open.push_back(name);
  }
  CHECK(open.empty());
  return count;
}

}  // namespace

TEST_CASE("timed runs: as many as asked, or fewer once the budget is spent, never none") {
  int calls = 0;
  auto millisecond = [&] {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  auto count = [&](int runs, double budget_seconds) {
    calls = 0;
    const Timing timing = time_after_warm_up(runs, budget_seconds, millisecond);
    CHECK(timing.runs == calls);  // the runs reported are the runs made
    CHECK(timing.median_seconds >= 1e-3);
    return calls;
  };
  CHECK(count(4, 0) == 4);     // no budget: exactly the runs asked
  CHECK(count(3, 3600) == 3);  // a budget never reached
  CHECK(count(5, 1e-6) == 1);  // a budget the first run spends
  CHECK(count(0, 0) == 1);     // at least one run
}

TEST_CASE("roofline arithmetic: intensity, ridge, attainable rate and the side of the ridge") {
  CHECK(arithmetic_intensity(1e9, 4e6) == doctest::Approx(250));
  CHECK(ridge_point(50, 5) == doctest::Approx(10));
  CHECK(attainable_rate(2, 50, 5) == doctest::Approx(10));    // left of the ridge: bandwidth x intensity
  CHECK(attainable_rate(100, 50, 5) == doctest::Approx(50));  // right of it: the compute roof
  CHECK(bound_side(9.9, 50, 5) == "memory-bound");
  CHECK(bound_side(10, 50, 5) == "compute-bound");
  CHECK_THROWS_AS(arithmetic_intensity(1, 0), Error);
  CHECK(element_bytes(DType::f32) == 4);
  CHECK(element_bytes(DType::bf16) == 2);
  CHECK(element_bytes(DType::e4m3) == 1);
}

TEST_CASE("traffic: the declared model when there is one, else the minimum bytes, said so") {
  Problem p;
  p.heads_q = p.heads_kv = 2;
  p.seqlen_q = p.seqlen_k = 128;
  p.head_dim = 64;
  // Inputs and outputs once: Q, O 128 x 2 x 64 each, K, V the same, LSE 2 x 128, all float32.
  const double minimum = 4.0 * 4 * 128 * 2 * 64 + 4.0 * 2 * 128;
  CHECK(forward_min_bytes(p, 4) == doctest::Approx(minimum));

  Implementation unmodeled;
  unmodeled.name = "test/unmodeled";
  const Traffic fallback = forward_traffic(unmodeled, p);
  CHECK_FALSE(fallback.modeled);
  CHECK(fallback.bytes == doctest::Approx(minimum));
  p.dtype = DType::bf16;
  CHECK(forward_traffic(unmodeled, p).bytes == doctest::Approx(forward_min_bytes(p, 2)));
  p.dtype = DType::f32;

  // The materialized stages add full passes over the 128 x 128 float32 S or P of each of the 2 heads.
  const double matrix = 4.0 * 128 * 128 * 2;
  const Implementation* three_pass = find_implementation("naive/three_pass");
  const Implementation* online = find_implementation("naive/online_softmax");
  const Implementation* one_pass = find_implementation("naive/one_pass");
  REQUIRE(three_pass != nullptr);
  REQUIRE(online != nullptr);
  REQUIRE(one_pass != nullptr);
  const Traffic materialized = forward_traffic(*three_pass, p);
  CHECK(materialized.modeled);
  CHECK(materialized.bytes == doctest::Approx(minimum + 6 * matrix));
  CHECK(forward_traffic(*online, p).bytes == doctest::Approx(minimum + 5 * matrix));
  CHECK(forward_traffic(*one_pass, p).bytes == doctest::Approx(minimum));
  // The S and P passes grow as N^2 while the FLOPs grow as N^2 d: the intensity tends to d / (6 bytes) ...
  // here 4 x 128^2 x 64 x 2 FLOPs over the bytes above.
  CHECK(arithmetic_intensity(forward_flops(p), materialized.bytes) ==
        doctest::Approx(4.0 * 128 * 128 * 64 * 2 / (minimum + 6 * matrix)));
}

TEST_CASE("cache sizes come from sysfs with their levels") {
  for (const CacheLevel& cache : cache_levels()) {
    CHECK(cache.level >= 1);
    CHECK(cache.bytes > 0);
    CHECK(cache.type != "Instruction");
    CHECK(cache.shared_by_threads >= 1);
  }
}

TEST_CASE("SVG chart: balanced elements, every point drawn, text escaped") {
  cli::Chart chart("speed <&> test", cli::Axis{"x", true, 0, 0, {}}, cli::Axis{"y", true, 0, 0, {}});
  chart.add(cli::Series{"a<b", {{1, 10}, {10, 100}, {100, 1000}}, true, true, false, ""});
  chart.add(cli::Series{"single", {{50, 5}}, false, true, false, "label & more"});
  chart.note("a note with \"quotes\"");
  const std::string svg = chart.render();
  CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  CHECK(svg.find("</svg>") != std::string::npos);
  CHECK(count_balanced(svg, "circle") == 4 + 2);  // the 4 points, and one legend marker per series
  CHECK(count_balanced(svg, "polyline") == 1);
  CHECK(svg.find("speed &lt;&amp;&gt; test") != std::string::npos);
  CHECK(svg.find("a&lt;b") != std::string::npos);
  CHECK(svg.find("label &amp; more") != std::string::npos);
  CHECK(svg.find("&quot;quotes&quot;") != std::string::npos);
  // The points, in data coordinates, are in the tooltips.
  for (const char* point : {"(1, 10)", "(10, 100)", "(100, 1000)", "(50, 5)"})
    CHECK(svg.find(point) != std::string::npos);
}

TEST_CASE("bench JSON: rows parse back, plot picks its lines, mistakes are named") {
  const std::string text = R"({"device": "test cpu", "date": "2026-01-01T00:00:00Z", "commit": "abc1234",
    "command": "flashlab bench", "copy_gbps": 5.5, "bf16_gemm_tflops": null, "machine": {"caches": []},
    "rows": [
      {"impl": "naive/one_pass", "device": "cpu", "dtype": "f32", "batch": 1, "heads": 8, "kv_heads": 8,
       "seqlen_q": 512, "seqlen_k": 512, "head_dim": 64, "causal": false, "time_ms": 2.5, "tflops": 0.004,
       "gbps": 1.5, "max_err_o": null},
      {"impl": "naive/one_pass", "device": "cpu", "seqlen_q": 1024, "seqlen_k": 1024, "head_dim": 64,
       "causal": false, "time_ms": 10, "tflops": 0.0035, "gbps": 0.7},
      {"impl": "naive/three_pass", "seqlen_q": 512, "seqlen_k": 512, "head_dim": 64, "causal": false,
       "time_ms": 3, "tflops": 0.002},
      {"impl": "naive/three_pass", "seqlen_q": 512, "seqlen_k": 512, "head_dim": 128, "causal": true,
       "time_ms": 3, "tflops": 0.002},
      {"impl": "naive/one_pass", "seqlen_q": 1, "seqlen_k": 4096, "head_dim": 64, "causal": false,
       "time_ms": 0.1, "tflops": 0.001, "gbps": 4.2}
    ], "skipped": []})";
  const cli::BenchFile file = cli::parse_bench_json(text);
  REQUIRE(file.rows.size() == 5);
  CHECK(file.device == "test cpu");
  CHECK(file.commit == "abc1234");
  CHECK(file.rows[0].impl == "naive/one_pass");
  CHECK(file.rows[0].heads == 8);
  CHECK(file.rows[1].seqlen_k == 1024);
  CHECK(file.rows[1].tflops == doctest::Approx(0.0035));
  CHECK(file.rows[3].causal);
  CHECK(file.rows[2].gbps == 0);  // absent: not known

  // Default selection: the smallest head_dim, non-causal prefill: two lines, one_pass with two points.
  const std::string svg = cli::speed_chart(file, {}).render();
  CHECK(count_balanced(svg, "polyline") == 1);       // three_pass has a single point: no line to join
  CHECK(svg.find("(512, 4)") != std::string::npos);  // GFLOP/s = 1000 x TFLOP/s
  CHECK(svg.find("(1024, 3.5)") != std::string::npos);
  CHECK(svg.find("(512, 2)") != std::string::npos);
  CHECK(svg.find("(4096") == std::string::npos);  // the decode row is another plot
  const std::string decode = cli::speed_chart(file, {64, false, true, true}).render();
  CHECK(decode.find("(4096, 4.2)") != std::string::npos);
  CHECK_THROWS_WITH_AS(cli::speed_chart(file, {256, false, false, false}),
                       doctest::Contains("no prefill rows with head_dim 256"), Error);

  CHECK_THROWS_WITH_AS(cli::parse_bench_json(R"({"rows": [{"impl": "x"}]})"),
                       "bench JSON: rows[0] has no \"seqlen_q\"", Error);
  CHECK_THROWS_WITH_AS(cli::parse_bench_json(R"({"rows": [{"impl": 3}]})"),
                       "bench JSON: rows[0].impl has the wrong type", Error);
  CHECK_THROWS_WITH_AS(cli::parse_bench_json(R"({"device": "x"})"), doctest::Contains("no \"rows\" array"),
                       Error);
  CHECK_THROWS_WITH_AS(cli::parse_json(R"({"a": [1, 2)"), doctest::Contains("at byte"), Error);
  CHECK_THROWS_AS(cli::parse_json("{\"a\": tru}"), Error);
}

}  // namespace flashlab
