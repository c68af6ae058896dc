// Reading benchmark results back: a small JSON parser and the rows of a bench JSON file (the results schema
// of docs/conventions.md §11: {"device", "date", "commit", "command", ..., "rows": [{"impl", "seqlen_q",
// ...}]}), which `flashlab bench --json` writes and `flashlab plot` draws.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace flashlab::cli {

struct JsonValue {
  enum class Kind { null, boolean, number, string, array, object } kind = Kind::null;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<JsonValue> array;
  std::map<std::string, JsonValue> object;

  // The member `key` of an object, or nullptr.
  const JsonValue* find(const std::string& key) const;
};

// Parses a whole JSON document; throws Error with the byte offset of the first mistake.
JsonValue parse_json(const std::string& text);

struct BenchRow {
  std::string impl;
  std::string device;  // "cpu", "cuda", or "" when the file does not say
  std::string dtype;
  int64_t batch = 1, heads = 1, seqlen_q = 0, seqlen_k = 0, head_dim = 0;
  bool causal = false;
  double time_ms = 0;
  double tflops = 0;
  double gbps = 0;  // 0 when the file does not say
};

struct BenchFile {
  std::string device, date, commit, command;
  std::vector<BenchRow> rows;
};

// The rows of a bench JSON document; throws Error naming the missing or mistyped field.
BenchFile parse_bench_json(const std::string& text);

}  // namespace flashlab::cli

#include "tools/svg.hpp"

namespace flashlab::cli {

// Which rows `flashlab plot` draws: one head_dim, causal or not, prefill (seqlen_q == seqlen_k > 1, x =
// seqlen) or decode (seqlen_q == 1, x = seqlen_k); y in GFLOP/s, or GB/s with `bandwidth`.
struct PlotSelection {
  int64_t head_dim = 0;  // 0: the smallest in the file
  bool causal = false;
  bool decode = false;
  bool bandwidth = false;
};

// Speed against sequence length, one line per implementation. Throws Error when no row matches.
Chart speed_chart(const BenchFile& file, PlotSelection selection);

}  // namespace flashlab::cli
