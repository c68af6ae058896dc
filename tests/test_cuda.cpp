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

#include "common/cuda/storage.hpp"
#include "common/inputs.hpp"

#if FLASHLAB_HAVE_CUDA
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace flashlab::testing {

TEST_CASE("GPU implementations are listed, and run on a GPU or say why they run in the emulator") {
  const std::string here = cuda::unavailable_reason();
#if FLASHLAB_HAVE_CUDA
  CHECK((here.empty() || here.rfind("no CUDA device: ", 0) == 0));
#else
  CHECK(here == "built without CUDA");
#endif
  if (!here.empty()) MESSAGE("GPU stages run in the emulator on this machine: ", here);
  for (const Implementation& impl : implementations()) {
    if (impl.device != Device::cuda) continue;
    INFO(impl.name);
    REQUIRE(impl.availability);
    REQUIRE(impl.emulation);
    CHECK(impl.forward);  // the adapter exists in every build
#if FLASHLAB_HAVE_CUDA
    CHECK(impl.gpu_build.forward);  // the GPU build's launcher on device pointers, for benchmarks
    CHECK(bool(impl.gpu_build.backward) == bool(impl.backward));
#else
    CHECK(!impl.gpu_build.forward);
    CHECK(!impl.gpu_build.backward);
#endif
    CHECK(impl.emulated_build.forward);  // the same launcher compiled for the emulator
    CHECK(bool(impl.emulated_build.backward) == bool(impl.backward));
    const std::string emulated = impl.emulation();
    if (impl.availability().empty()) {
      // Runnable: on this machine's GPU, or else in the emulator, with the machine's reason first.
      if (!here.empty() && !cuda::emulation_forced()) CHECK(emulated == here);
    } else {
      CHECK(emulated.empty());  // a stage the emulator cannot run says why the GPU cannot either
    }
  }
  CHECK(cuda::device_properties().has_value() == here.empty());
}

TEST_CASE("--emulate sends every emulated GPU stage to the emulator, and back") {
  const bool before = cuda::emulation_forced();
  for (bool forced : {true, false}) {
    cuda::force_emulation(forced);
    for (const Implementation& impl : implementations()) {
      if (impl.device != Device::cuda || !impl.availability().empty()) continue;
      INFO(impl.name, " forced ", forced);
      if (forced) CHECK(impl.emulation().find("--emulate") != std::string::npos);
      if (!forced) CHECK(impl.emulation() == cuda::unavailable_reason());
    }
  }
  cuda::force_emulation(before);
}

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

#if FLASHLAB_HAVE_CUDA
// The 16-bit bit patterns the GPU stages store and the emulator's __half and __nv_bfloat16 compute with
// (common/number_format.hpp) against NVIDIA's own host conversions: every bf16 and fp16 pattern decodes to
// the same float, and floats around every rounding boundary encode to the same pattern.
TEST_CASE("encode and decode of f16 and bf16 match NVIDIA's cuda_fp16.h and cuda_bf16.h") {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto pattern = static_cast<uint16_t>(bits);
    __half_raw raw_h;
    raw_h.x = pattern;
    __nv_bfloat16_raw raw_b;
    raw_b.x = pattern;
    const __half h(raw_h);
    const __nv_bfloat16 b(raw_b);
    const float theirs_h = __half2float(h), theirs_b = __bfloat162float(b);
    const float ours_h = decode_fp16(pattern), ours_b = decode_bf16(pattern);
    INFO("pattern ", bits);
    if (std::isnan(theirs_h))
      CHECK(std::isnan(ours_h));
    else
      CHECK(std::memcmp(&theirs_h, &ours_h, 4) == 0);
    if (std::isnan(theirs_b))
      CHECK(std::isnan(ours_b));
    else
      CHECK(std::memcmp(&theirs_b, &ours_b, 4) == 0);
  }
  // Floats near the midpoints between neighbouring 16-bit values, at every exponent, and random ones.
  std::vector<float> values{0.0f,  -0.0f, INFINITY, -INFINITY, 65504.0f, 65519.99f, 65520.0f,
                            1e-8f, 3e-8f, 5.96e-8f, 2.98e-8f,  3.4e38f,  -1e-40f};
  for (uint32_t bits = 0; bits < 0x10000; bits += 7) {
    const float low = decode_fp16(static_cast<uint16_t>(bits)),
                high = decode_bf16(static_cast<uint16_t>(bits));
    for (float x : {low, high})
      if (std::isfinite(x))
        for (float nudge : {1.0f, 1.0f + 0x1p-12f, 1.0f - 0x1p-12f, 1.0f + 0x1p-9f, 1.0f - 0x1p-9f})
          values.push_back(x * nudge);
  }
  Random random(17);
  for (int n = 0; n < 100000; ++n) values.push_back(static_cast<float>((random.uniform() - 0.5) * 1e5));
  for (float x : values) {
    INFO("value ", x);
    CHECK(encode_fp16(x) == static_cast<__half_raw>(__float2half_rn(x)).x);
    CHECK(encode_bf16(x) == static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(x)).x);
  }
  const float nan = NAN;  // NaN: any NaN pattern will do, as long as it stays NaN
  CHECK(std::isnan(decode_fp16(encode_fp16(nan))));
  CHECK(std::isnan(decode_bf16(encode_bf16(nan))));
}

// The e4m3 encoding that the emulated cvt.rn.satfinite.e4m3x2.f32 (common/cuda/ptx.cuh) and the FP8
// emulation use, against NVIDIA's saturating host conversion (cuda_fp8.h): every bf16 value (the FP8 stages'
// inputs) and floats around every e4m3 rounding boundary encode to the same byte, and every byte decodes to
// the same float.
TEST_CASE("encode and decode of e4m3 match NVIDIA's cuda_fp8.h (saturating, round to nearest even)") {
  std::vector<float> values{0.0f, -0.0f, INFINITY, -INFINITY, 448.0f, 464.0f, 480.0f, 1e-30f, 0x1p-10f};
  for (uint32_t bits = 0; bits < 0x10000; ++bits) values.push_back(decode_bf16(static_cast<uint16_t>(bits)));
  for (uint32_t code = 0; code < 0x100; ++code) {
    const float x = decode_e4m3(static_cast<uint8_t>(code));
    if (std::isfinite(x))
      for (float nudge : {1.0f, 1.0f + 0x1p-5f, 1.0f - 0x1p-5f, 1.0f + 0x1p-4f, 1.0f - 0x1p-4f})
        values.push_back(x * nudge);
    __nv_fp8_e4m3 theirs;
    theirs.__x = static_cast<__nv_fp8_storage_t>(code);
    const float theirs_value = static_cast<float>(theirs);
    INFO("code ", code);
    if (std::isnan(theirs_value))
      CHECK(std::isnan(x));
    else
      CHECK(std::memcmp(&theirs_value, &x, 4) == 0);
  }
  for (float x : values) {
    INFO("value ", x);
    if (std::isnan(x)) continue;
    CHECK(encode_e4m3(x) == __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
  }
  CHECK(std::isnan(decode_e4m3(encode_e4m3(NAN))));
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
