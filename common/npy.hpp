// .npy files (NumPy's format, version 1.0 to 3.0): read float32/float64/bool arrays in C order, write
// float32. Anything else (another dtype, Fortran order, a truncated file) is refused with an Error naming the
// file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flashlab {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<double> values;  // float32, float64 and bool data, widened
  std::string dtype;           // "<f4", "<f8" or "|b1"
};

// Reads an array; throws Error("FIELD: path: what is wrong"), with `field` the flag or input it was given
// for.
NpyArray read_npy(const std::string& path, const std::string& field);

// Writes a float32 C-order array; throws Error naming the path when it cannot.
void write_npy(const std::string& path, const std::vector<int64_t>& shape, const std::vector<float>& values);

}  // namespace flashlab
