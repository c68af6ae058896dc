// The roofline model (docs/00-roofline-and-memory.md), in one place: the bytes an implementation moves, its
// arithmetic intensity, and the rate the machine's ceilings allow at that intensity.
//
//   attainable(I) = min(peak FLOP/s, I x bandwidth)       ridge point I* = peak / bandwidth
//
// An implementation left of the ridge (I < I*) is memory-bound: no faster arithmetic helps it, only moving
// fewer bytes does; right of it, it is compute-bound.
#pragma once

#include <string>

#include "common/problem.hpp"
#include "common/registry.hpp"

namespace flashlab {

// Bytes of one element of `dtype` in main memory (f32 4, f16/bf16 2, e4m3 1).
double element_bytes(DType dtype);

struct Traffic {
  double bytes = 0;
  bool modeled = false;  // false: the implementation declares no traffic model and `bytes` is the minimum
};

// The implementation's own traffic model (Implementation::bytes_moved) when it declares one; otherwise the
// memory-bound minimum (forward_min_bytes: inputs read once, outputs written once) at the problem's dtype.
Traffic forward_traffic(const Implementation& impl, const Problem& problem);

// FLOPs per byte moved.
double arithmetic_intensity(double flops, double bytes);

// The roof at intensity `flop_per_byte`: min(peak, intensity x bandwidth), in the units of `peak` per second
// (GFLOP/s with `peak` in GFLOP/s and `bandwidth` in GB/s).
double attainable_rate(double flop_per_byte, double peak, double bandwidth);

// Where the bandwidth slope meets the compute roof: peak / bandwidth FLOP per byte.
double ridge_point(double peak, double bandwidth);

// "memory-bound" left of the ridge, "compute-bound" at or right of it.
std::string bound_side(double flop_per_byte, double peak, double bandwidth);

}  // namespace flashlab
