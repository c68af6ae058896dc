// A small JSON writer for the tool's --json output (no dependency needed).
#pragma once

#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <string_view>

namespace flashlab::cli {

class Json {
 public:
  Json& begin_object() { return open('{'); }
  Json& end_object() { return close('}'); }
  Json& begin_array() { return open('['); }
  Json& end_array() { return close(']'); }
  Json& key(std::string_view name) {
    comma();
    string(name);
    out_ << ": ";
    after_key_ = true;
    return *this;
  }
  Json& value(std::string_view text) {
    comma();
    string(text);
    return *this;
  }
  Json& value(const char* text) { return value(std::string_view(text)); }
  Json& value(bool flag) {
    comma();
    out_ << (flag ? "true" : "false");
    return *this;
  }
  Json& value(double number) {
    comma();
    if (std::isfinite(number)) {
      char buffer[32];
      std::snprintf(buffer, sizeof buffer, "%.9g", number);
      out_ << buffer;
    } else {
      out_ << "null";  // JSON has no inf or NaN
    }
    return *this;
  }
  Json& value(int64_t number) {
    comma();
    out_ << number;
    return *this;
  }
  Json& value(int number) { return value(static_cast<int64_t>(number)); }
  Json& null() {
    comma();
    out_ << "null";
    return *this;
  }
  template <typename T>
  Json& field(std::string_view name, T&& v) {
    key(name);
    return value(std::forward<T>(v));
  }
  std::string str() const { return out_.str() + "\n"; }

 private:
  Json& open(char bracket) {
    comma();
    out_ << bracket;
    first_ = true;
    return *this;
  }
  Json& close(char bracket) {
    out_ << bracket;
    first_ = false;
    return *this;
  }
  void comma() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_) out_ << ", ";
    first_ = false;
  }
  void string(std::string_view text) {
    out_ << '"';
    for (char c : text) {
      if (c == '"' || c == '\\')
        out_ << '\\' << c;
      else if (c == '\n')
        out_ << "\\n";
      else if (static_cast<unsigned char>(c) < 0x20)
        out_ << ' ';
      else
        out_ << c;
    }
    out_ << '"';
  }
  std::ostringstream out_;
  bool first_ = true;
  bool after_key_ = false;
};

}  // namespace flashlab::cli
