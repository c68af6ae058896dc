// The CUDA plumbing (common/cuda/): GPU implementations are listed everywhere and say why they cannot run;
// the storage formats the registry adapter converts to round exactly like common/number_format.hpp; the mask
// rules the kernels share. GPU implementations' numerics are checked by the shared harness (test_matrix.cpp),
// run for them by the `harness_cuda` ctest entry.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/cuda/device.hpp"
#include "common/mask.hpp"
#include "common/number_format.hpp"
#include "common/registry.hpp"

#if FLASHLAB_HAVE_CUDA
#include "common/cuda/device_problem.hpp"
#endif

namespace flashlab::testing {

TEST_CASE("GPU implementations are listed, and say why when they cannot run here") {
  const std::string here = cuda::unavailable_reason();
#if FLASHLAB_HAVE_CUDA
  CHECK((here.empty() || here.rfind("no CUDA device: ", 0) == 0));
#else
  CHECK(here == "built without CUDA");
#endif
  if (!here.empty()) MESSAGE("GPU cases are skipped on this machine: ", here);
  for (const Implementation& impl : implementations()) {
    if (impl.device != Device::cuda) continue;
    INFO(impl.name);
    REQUIRE(impl.availability);
    if (!here.empty()) CHECK(impl.availability() == here);  // the machine's reason comes first, everywhere
    CHECK(impl.forward);                                    // the adapter exists in every build
#if FLASHLAB_HAVE_CUDA
    CHECK(impl.forward_device);  // the launcher on device pointers, for benchmarks
#else
    CHECK(!impl.forward_device);
#endif
  }
  CHECK(cuda::device_properties().has_value() == here.empty());
}

#if FLASHLAB_HAVE_CUDA
TEST_CASE("the adapter's storage formats round like common/number_format.hpp") {
  const std::vector<float> values{0.0f,     -0.0f,     1.0f,       1.0f + 1.0f / 2048,  // fp16 tie: to even
                                  3.14159f, -2.71828f, 65504.0f,   65520.0f,  // fp16 largest, overflow
                                  1e-6f,    -3e-8f,    1e-30f,     3.4e38f,
                                  INFINITY, -INFINITY, 1.00390625f /* bf16 tie */};
  for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::e4m3}) {
    const std::vector<std::byte> stored = cuda::to_storage(dtype, values.data(), values.size());
    CHECK(stored.size() == values.size() * cuda::storage_bytes(dtype));
    std::vector<float> back(values.size());
    cuda::from_storage(dtype, stored.data(), values.size(), back.data());
    const DType format = cuda::storage_dtype(dtype);
    for (size_t n = 0; n < values.size(); ++n) {
      INFO(to_string(dtype), " value ", values[n]);
      const float expected = round_to(format, values[n]);
      CHECK(std::memcmp(&back[n], &expected, sizeof(float)) == 0);  // bit for bit, signed zeros included
    }
  }
  const float nan = NAN;
  for (DType dtype : {DType::f16, DType::bf16}) {
    float back = 0;
    cuda::from_storage(dtype, cuda::to_storage(dtype, &nan, 1).data(), 1, &back);
    CHECK(std::isnan(back));
  }
  CHECK(cuda::storage_dtype(DType::e4m3) == DType::bf16);  // FP8 stages quantize from bf16 themselves
}
#endif

TEST_CASE("the mask rules the kernels call are the ones Visibility uses") {
  CHECK(band_key_range(0, 3, 5, true, -1, -1).end == 3);   // bottom-right causal: row 0 sees keys 0..2
  CHECK(band_key_range(0, 5, 3, true, -1, -1).empty());    // sq > sk: the first rows see nothing
  CHECK(band_key_range(4, 5, 5, false, 2, 0).begin == 2);  // window (2, 0)
  CHECK(band_key_range(5, 5, 9, false, -1, -1).empty());   // a padded row sees nothing
  const std::vector<uint8_t> mask{1, 0, 0, 1};             // [2, 2]
  CHECK(explicit_mask_allows(nullptr, 2, 1, 0));
  CHECK(!explicit_mask_allows(mask.data(), 2, 1, 0));
  CHECK(explicit_mask_allows(mask.data(), 2, 1, 1));
}

}  // namespace flashlab::testing
