#include "tools/bench_json.hpp"

#include <cctype>
#include <cstdlib>

#include "common/error.hpp"

namespace flashlab::cli {

namespace {

class Parser {
 public:
  explicit Parser(const std::string& text) : text_(text) {}

  JsonValue document() {
    JsonValue value = parse_value();
    skip_space();
    if (at_ < text_.size()) error("unexpected text after the document");
    return value;
  }

 private:
  [[noreturn]] void error(const char* what) const { fail("bench JSON: ", what, " at byte ", at_); }

  void skip_space() {
    while (at_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[at_]))) ++at_;
  }

  bool take(char c) {
    skip_space();
    if (at_ < text_.size() && text_[at_] == c) return ++at_, true;
    return false;
  }

  void expect(char c) {
    if (!take(c)) error(c == ':' ? "expected ':'" : c == ']' ? "expected ']' or ','" : "expected '}' or ','");
  }

  bool take_word(const char* word) {
    const std::string w(word);
    if (text_.compare(at_, w.size(), w) != 0) return false;
    at_ += w.size();
    return true;
  }

  JsonValue parse_value() {
    skip_space();
    if (at_ >= text_.size()) error("unexpected end of text");
    JsonValue value;
    const char c = text_[at_];
    if (c == '{') {
      ++at_;
      value.kind = JsonValue::Kind::object;
      if (take('}')) return value;
      do {
        skip_space();
        if (at_ >= text_.size() || text_[at_] != '"') error("expected a string key");
        const std::string key = parse_string();
        expect(':');
        value.object[key] = parse_value();
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      ++at_;
      value.kind = JsonValue::Kind::array;
      if (take(']')) return value;
      do value.array.push_back(parse_value());
      while (take(','));
      expect(']');
    } else if (c == '"') {
      value.kind = JsonValue::Kind::string;
      value.string = parse_string();
    } else if (take_word("true") || take_word("false")) {
      value.kind = JsonValue::Kind::boolean;
      value.boolean = c == 't';
    } else if (take_word("null")) {
      value.kind = JsonValue::Kind::null;
    } else {
      const char* begin = text_.c_str() + at_;
      char* end = nullptr;
      value.number = std::strtod(begin, &end);
      if (end == begin) error("expected a value");
      value.kind = JsonValue::Kind::number;
      at_ += static_cast<size_t>(end - begin);
    }
    return value;
  }

  std::string parse_string() {
    ++at_;  // the opening quote
    std::string out;
    while (at_ < text_.size() && text_[at_] != '"') {
      char c = text_[at_++];
      if (c == '\\') {
        if (at_ >= text_.size()) break;
        c = text_[at_++];
        switch (c) {
          case 'n':
            out += '\n';
            break;
          case 't':
            out += '\t';
            break;
          case 'r':
            out += '\r';
            break;
          case 'b':
            out += '\b';
            break;
          case 'f':
            out += '\f';
            break;
          case 'u':  // names and numbers here are ASCII: keep a \uXXXX escape as '?'
            at_ = std::min(at_ + 4, text_.size());
            out += '?';
            break;
          default:
            out += c;  // \" \\ \/
        }
      } else {
        out += c;
      }
    }
    if (at_ >= text_.size()) error("unterminated string");
    ++at_;  // the closing quote
    return out;
  }

  const std::string& text_;
  size_t at_ = 0;
};

const JsonValue& member(const JsonValue& object, const std::string& key, JsonValue::Kind kind, size_t row) {
  const JsonValue* value = object.find(key);
  if (value == nullptr) fail("bench JSON: rows[", row, "] has no \"", key, "\"");
  if (value->kind != kind) fail("bench JSON: rows[", row, "].", key, " has the wrong type");
  return *value;
}

std::string optional_string(const JsonValue& object, const std::string& key) {
  const JsonValue* value = object.find(key);
  return value != nullptr && value->kind == JsonValue::Kind::string ? value->string : "";
}

double optional_number(const JsonValue& object, const std::string& key) {
  const JsonValue* value = object.find(key);
  return value != nullptr && value->kind == JsonValue::Kind::number ? value->number : 0;
}

}  // namespace

const JsonValue* JsonValue::find(const std::string& key) const {
  const auto found = object.find(key);
  return found == object.end() ? nullptr : &found->second;
}

JsonValue parse_json(const std::string& text) {
  return Parser(text).document();
}

BenchFile parse_bench_json(const std::string& text) {
  const JsonValue document = parse_json(text);
  if (document.kind != JsonValue::Kind::object) fail("bench JSON: the document must be an object");
  const JsonValue* rows = document.find("rows");
  if (rows == nullptr || rows->kind != JsonValue::Kind::array)
    fail("bench JSON: no \"rows\" array (is this a file written by flashlab bench --json?)");
  BenchFile file{optional_string(document, "device"),
                 optional_string(document, "date"),
                 optional_string(document, "commit"),
                 optional_string(document, "command"),
                 {}};
  using Kind = JsonValue::Kind;
  for (size_t n = 0; n < rows->array.size(); ++n) {
    const JsonValue& row = rows->array[n];
    if (row.kind != Kind::object) fail("bench JSON: rows[", n, "] is not an object");
    BenchRow r;
    r.impl = member(row, "impl", Kind::string, n).string;
    r.device = optional_string(row, "device");
    r.dtype = optional_string(row, "dtype");
    r.batch = static_cast<int64_t>(optional_number(row, "batch"));
    r.heads = static_cast<int64_t>(optional_number(row, "heads"));
    r.seqlen_q = static_cast<int64_t>(member(row, "seqlen_q", Kind::number, n).number);
    r.seqlen_k = static_cast<int64_t>(member(row, "seqlen_k", Kind::number, n).number);
    r.head_dim = static_cast<int64_t>(member(row, "head_dim", Kind::number, n).number);
    r.causal = member(row, "causal", Kind::boolean, n).boolean;
    r.time_ms = member(row, "time_ms", Kind::number, n).number;
    r.tflops = member(row, "tflops", Kind::number, n).number;
    r.gbps = optional_number(row, "gbps");
    file.rows.push_back(r);
  }
  return file;
}

}  // namespace flashlab::cli

namespace flashlab::cli {

Chart speed_chart(const BenchFile& file, PlotSelection selection) {
  if (selection.head_dim == 0) {
    for (const BenchRow& row : file.rows)
      if (selection.head_dim == 0 || row.head_dim < selection.head_dim) selection.head_dim = row.head_dim;
  }
  std::map<std::string, std::map<int64_t, double>> lines;  // impl -> sequence length -> speed
  std::map<int64_t, bool> lengths;
  for (const BenchRow& row : file.rows) {
    const bool decode = row.seqlen_q == 1 && row.seqlen_k > 1;
    const bool prefill = row.seqlen_q > 1 && row.seqlen_q == row.seqlen_k;
    if (row.head_dim != selection.head_dim || row.causal != selection.causal) continue;
    if (selection.decode ? !decode : !prefill) continue;
    const double speed = selection.bandwidth ? row.gbps : 1e3 * row.tflops;
    if (!(speed > 0)) continue;
    lines[row.impl][row.seqlen_k] = speed;
    lengths[row.seqlen_k] = true;
  }
  if (lines.empty())
    fail("bench JSON has no ", selection.decode ? "decode" : "prefill", " rows with head_dim ",
         selection.head_dim, selection.causal ? ", causal" : ", non-causal",
         selection.bandwidth ? " and a bandwidth" : "", " (try --head-dim, --causal, --decode)");

  std::string title = std::string(selection.decode ? "Decode (seqlen_q 1)" : "Forward") + ", head_dim " +
                      std::to_string(selection.head_dim) + (selection.causal ? ", causal" : ", non-causal");
  Axis x{selection.decode ? "KV length (seqlen_k)" : "sequence length (seqlen_q = seqlen_k)", true, 0, 0, {}};
  for (const auto& [length, present] : lengths) x.ticks.push_back(static_cast<double>(length));
  x.min = x.ticks.front() / 1.5;
  x.max = x.ticks.back() * 1.5;
  Chart chart(title, x, Axis{selection.bandwidth ? "GB/s (model bytes)" : "GFLOP/s", true, 0, 0, {}});
  for (const auto& [impl, points] : lines) {
    Series series{impl, {}, true, true, false, ""};
    for (const auto& [length, speed] : points) series.points.push_back({static_cast<double>(length), speed});
    chart.add(series);
  }
  chart.note(file.device + (file.date.empty() ? "" : ", " + file.date) +
             (file.commit.empty() ? "" : ", commit " + file.commit));
  if (!file.command.empty()) chart.note("command: " + file.command);
  return chart;
}

}  // namespace flashlab::cli
