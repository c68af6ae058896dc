#include "common/npy.hpp"

#include <cstring>
#include <fstream>
#include <regex>

#include "common/error.hpp"

namespace flashlab {

namespace {

std::string header_value(const std::string& header, const std::string& key, const std::string& where) {
  const std::regex pattern("'" + key + "'\\s*:\\s*('[^']*'|True|False|\\([^)]*\\))");
  std::smatch match;
  if (!std::regex_search(header, match, pattern)) fail(where, ": header has no '", key, "'");
  return match[1].str();
}

}  // namespace

NpyArray read_npy(const std::string& path, const std::string& field) {
  const std::string where = field + ": " + path;
  std::ifstream file(path, std::ios::binary);
  if (!file) fail(where, ": cannot open file");
  char magic[8] = {};
  file.read(magic, 8);
  if (!file || std::memcmp(magic, "\x93NUMPY", 6) != 0) fail(where, ": not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(magic[6]);
  uint32_t header_length = 0;
  if (major == 1) {
    unsigned char bytes[2];
    file.read(reinterpret_cast<char*>(bytes), 2);
    header_length = bytes[0] | (bytes[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char bytes[4];
    file.read(reinterpret_cast<char*>(bytes), 4);
    header_length = bytes[0] | (bytes[1] << 8) | (bytes[2] << 16) | (static_cast<uint32_t>(bytes[3]) << 24);
  } else {
    fail(where, ": unsupported .npy version ", major);
  }
  if (!file || header_length > (1u << 20)) fail(where, ": truncated or corrupt header");
  std::string header(header_length, '\0');
  file.read(header.data(), header_length);
  if (!file) fail(where, ": truncated header");

  NpyArray array;
  array.dtype = header_value(header, "descr", where);
  array.dtype = array.dtype.substr(1, array.dtype.size() - 2);
  if (array.dtype != "<f4" && array.dtype != "<f8" && array.dtype != "|b1")
    fail(where, ": dtype ", array.dtype, " is not supported (float32 '<f4', float64 '<f8' or bool '|b1')");
  if (header_value(header, "fortran_order", where) != "False")
    fail(where, ": Fortran-order arrays are not supported (save with C order)");
  const std::string shape_text = header_value(header, "shape", where);
  const std::regex number("\\d+");
  int64_t count = 1;
  for (auto it = std::sregex_iterator(shape_text.begin(), shape_text.end(), number);
       it != std::sregex_iterator(); ++it) {
    array.shape.push_back(std::stoll(it->str()));
    count *= array.shape.back();
  }
  const size_t element_size = array.dtype == "<f4" ? 4 : array.dtype == "<f8" ? 8 : 1;
  std::vector<char> raw(static_cast<size_t>(count) * element_size);
  file.read(raw.data(), static_cast<std::streamsize>(raw.size()));
  if (file.gcount() != static_cast<std::streamsize>(raw.size()))
    fail(where, ": truncated data (", file.gcount(), " of ", raw.size(), " bytes)");
  array.values.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    if (element_size == 4) {
      float x;
      std::memcpy(&x, raw.data() + 4 * i, 4);
      array.values[i] = x;
    } else if (element_size == 8) {
      std::memcpy(&array.values[i], raw.data() + 8 * i, 8);
    } else {
      array.values[i] = raw[i] != 0 ? 1.0 : 0.0;
    }
  }
  return array;
}

void write_npy(const std::string& path, const std::vector<int64_t>& shape, const std::vector<float>& values) {
  std::string shape_text = "(";
  for (int64_t extent : shape) shape_text += std::to_string(extent) + ", ";
  if (shape.size() > 1)
    shape_text.resize(shape_text.size() - 2);
  else if (shape.size() == 1)
    shape_text.resize(shape_text.size() - 1);
  shape_text += ")";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_text + ", }";
  const size_t unpadded = 10 + header.size() + 1;  // magic + version + length + header + '\n'
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::ofstream file(path, std::ios::binary);
  if (!file) fail(path, ": cannot open for writing");
  const uint16_t length = static_cast<uint16_t>(header.size());
  file.write("\x93NUMPY\x01\x00", 8);
  const char length_bytes[2] = {static_cast<char>(length & 0xff), static_cast<char>(length >> 8)};
  file.write(length_bytes, 2);
  file.write(header.data(), static_cast<std::streamsize>(header.size()));
  file.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * 4));
  if (!file) fail(path, ": write failed");
}

}  // namespace flashlab
