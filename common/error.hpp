// flashlab::Error: the one exception type for invalid or unsupported input. Its message names the offending
// field and the rule it breaks, e.g. "heads_q (12) must be a multiple of heads_kv (5)".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace flashlab {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// An implementation that failed while it ran, through no fault of its input: what the CPU emulator found
// wrong inside a kernel (a race, an out-of-bounds access, a deadlock), or a fault a GPU reported. The tool
// reports it like a wrong result (exit code 1), not as a user mistake.
class ExecutionError : public Error {
 public:
  using Error::Error;
};

// A problem too large for the device's memory: a device allocation failed (common/cuda/check.hpp). The
// problem's size, as a problem too large for the host's memory is: the tool's exit code 2 where one stage
// runs, a row that says so where compare (forward and --backward) and gpu-bench run several; Python's
// MemoryError.
class DeviceMemoryError : public Error {
 public:
  using Error::Error;
};

// Builds a message from streamable parts: fail("heads_q (", h, ") must be ...").
template <typename... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  std::ostringstream message;
  (message << ... << std::forward<Parts>(parts));
  throw Error(message.str());
}

}  // namespace flashlab
