// The GPU stages' registry entries, checked on any machine: what each declares (dtypes, rounds_p) and what
// its `supports` refuses, with the field named, before any device memory is touched. Their numerics are the
// shared harness's (test_matrix.cpp, run for them by the `harness_cuda` ctest entry on a GPU).
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/registry.hpp"

namespace flashlab::testing {

namespace {

const Implementation& entry(const char* name) {
  const Implementation* impl = find_implementation(name);
  REQUIRE_MESSAGE(impl != nullptr, name, " is not registered");
  return *impl;
}

Problem shape(int64_t heads_q, int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k, int64_t head_dim) {
  Problem p;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.head_dim = head_dim;
  return p;
}

// supports() of `impl` on `p`: "" expected when `field` is empty, else a reason that names `field`.
void check_supports(const Implementation& impl, const Problem& p, const std::string& field) {
  p.validate();
  const std::string reason = impl.supports(p);
  INFO(impl.name, " on ", p.describe(), ": '", reason, "'");
  if (field.empty())
    CHECK(reason.empty());
  else
    CHECK(reason.find(field) != std::string::npos);
}

}  // namespace

TEST_CASE("GPU stages declare their formats, and whether they round P") {
  const std::vector<DType> f32{DType::f32}, half_formats{DType::f16, DType::bf16};
  CHECK(entry("cuda_v2/split_q_simt").dtypes == f32);
  CHECK(!entry("cuda_v2/split_q_simt").rounds_p);
  CHECK(entry("cuda_v2/split_q").dtypes == half_formats);
  CHECK(entry("cuda_v2/split_q").rounds_p);  // P is the A operand of the P V mma
  CHECK(entry("cuda_v3_hopper/ws").dtypes == std::vector<DType>{DType::bf16, DType::f16});
  CHECK(entry("cuda_v3_hopper/ws").rounds_p);  // and of the P V wgmma
  CHECK(entry("decoding/cuda_split_kv").dtypes == half_formats);
  CHECK(!entry("decoding/cuda_split_kv").rounds_p);  // P stays fp32 (CUDA-core products)
  for (const char* name :
       {"cuda_v2/split_q_simt", "cuda_v2/split_q", "cuda_v3_hopper/ws", "decoding/cuda_split_kv"}) {
    INFO(name);
    CHECK(entry(name).device == Device::cuda);
#if FLASHLAB_HAVE_CUDA
    CHECK(entry(name).device_workspace_bytes);  // the int lengths, at least
#else
    CHECK(entry(name).availability() == "built without CUDA");
#endif
  }
}

TEST_CASE("GPU stages refuse what their kernels cannot do, naming the field") {
  auto masked = [](Problem p) {
    p.mask = std::make_shared<const std::vector<uint8_t>>(static_cast<size_t>(p.seqlen_q * p.seqlen_k), 1);
    return p;
  };
  auto scaled = [](Problem p, double scale) {
    p.scale = scale;
    return p;
  };
  for (const char* name : {"cuda_v2/split_q_simt", "cuda_v2/split_q", "cuda_v3_hopper/ws"}) {
    const Implementation& impl = entry(name);
    for (int64_t d : {64, 128, 256}) check_supports(impl, shape(4, 2, 97, 203, d), "");
    for (int64_t d : {1, 32, 80, 96, 512}) check_supports(impl, shape(2, 2, 33, 33, d), "head_dim");
    check_supports(impl, scaled(shape(2, 2, 33, 33, 64), -0.125), "scale");
    check_supports(impl, scaled(shape(2, 2, 33, 33, 64), 0.0), "scale");
    check_supports(impl, shape(70000, 1, 1, 8, 64), "heads_q");
  }
  check_supports(entry("cuda_v2/split_q"), masked(shape(2, 2, 33, 40, 64)), "");
  check_supports(entry("cuda_v3_hopper/ws"), masked(shape(2, 2, 33, 40, 64)), "mask");

  const Implementation& decode = entry("decoding/cuda_split_kv");
  check_supports(decode, shape(32, 8, 1, 65536, 128), "");
  check_supports(decode, masked(shape(8, 2, 16, 300, 64)), "");  // a tree mask over 16 draft rows
  check_supports(decode, shape(8, 2, 17, 300, 64), "seqlen_q");
  check_supports(decode, shape(8, 2, 1, 300, 256), "head_dim");
  Problem padded_rows = shape(8, 2, 4, 300, 64);
  padded_rows.batch = 2;
  padded_rows.seqlens_q = {4, 2};
  check_supports(decode, padded_rows, "seqlens_q");
  padded_rows.seqlens_q = {4, 4};  // every row valid: the same problem as none
  padded_rows.seqlens_k = {300, 0};
  check_supports(decode, padded_rows, "");
  Problem paged = shape(8, 2, 1, 300, 64);
  paged.page_size = 16;
  check_supports(decode, paged, "page_size");
  check_supports(decode, scaled(shape(8, 2, 1, 300, 64), -1.0), "scale");
}

}  // namespace flashlab::testing
