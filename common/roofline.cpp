#include "common/roofline.hpp"

#include <algorithm>

#include "common/error.hpp"
#include "common/flops.hpp"

namespace flashlab {

double element_bytes(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::e4m3:
      return 1;
  }
  return 4;
}

Traffic forward_traffic(const Implementation& impl, const Problem& problem) {
  if (impl.bytes_moved) return {impl.bytes_moved(problem), true};
  return {forward_min_bytes(problem, element_bytes(problem.dtype)), false};
}

double arithmetic_intensity(double flops, double bytes) {
  if (!(bytes > 0)) fail("arithmetic intensity needs bytes > 0 (got ", bytes, ")");
  return flops / bytes;
}

double attainable_rate(double flop_per_byte, double peak, double bandwidth) {
  return std::min(peak, flop_per_byte * bandwidth);
}

double ridge_point(double peak, double bandwidth) {
  if (!(bandwidth > 0)) fail("ridge point needs bandwidth > 0 (got ", bandwidth, ")");
  return peak / bandwidth;
}

std::string bound_side(double flop_per_byte, double peak, double bandwidth) {
  return flop_per_byte < ridge_point(peak, bandwidth) ? "memory-bound" : "compute-bound";
}

}  // namespace flashlab
