// The GPU stages' registry entries, checked on any machine: what each declares (dtypes, rounds_p) and what
// its `supports` refuses, with the field named, before any device memory is touched. Their numerics are the
// shared harness's (test_matrix.cpp, run for them by the `harness_cuda` ctest entry on a GPU).
#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/registry.hpp"
#include "cuda_v3_hopper/fp8_emulated.hpp"
#include "cuda_v3_hopper/fp8_stage.hpp"

namespace flashlab::testing {

namespace {

const Implementation& entry(const char* name) {
  const Implementation* impl = find_implementation(name);
  REQUIRE_MESSAGE(impl != nullptr, name, " is not registered");
  return *impl;
}

Problem shape(int64_t heads_q, int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k, int64_t head_dim) {
  return problem_shape(1, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim);
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
  CHECK(entry("decoding/cuda_split_kv_mma").dtypes == half_formats);
  CHECK(entry("decoding/cuda_split_kv_mma").rounds_p);  // P is the A operand of the P V mma
  // The FP8 kernel is offered for e4m3 only (fed bf16, quantized by its own pre-pass), and rounds P as its
  // emulation does (P * 2^8 to e4m3, the A operand of the P V wgmma): the same declarations as the oracle.
  CHECK(entry("cuda_v3_hopper/fp8").dtypes == std::vector<DType>{DType::e4m3});
  CHECK(entry("cuda_v3_hopper/fp8").rounds_p);
  CHECK(entry("cuda_v3_hopper/fp8").dtypes == entry("cuda_v3_hopper/fp8_emulated").dtypes);
  CHECK(entry("cuda_v3_hopper/fp8").rounds_p == entry("cuda_v3_hopper/fp8_emulated").rounds_p);
  for (const char* name : {"cuda_v2/split_q_simt", "cuda_v2/split_q", "cuda_v3_hopper/ws",
                           "cuda_v3_hopper/fp8", "decoding/cuda_split_kv", "decoding/cuda_split_kv_mma"}) {
    INFO(name);
    CHECK(entry(name).device == Device::cuda);
#if FLASHLAB_HAVE_CUDA
    CHECK(entry(name).gpu_build.workspace);  // the int lengths, at least
#endif
    CHECK(entry(name).emulated_build.workspace);
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
  // The head dims each stage takes: split_q and ws every multiple of 8 up to 256 (in their tile widths,
  // common/cuda/tile_width.hpp), split_q_simt the multiples of 32 models use.
  const std::vector<int64_t> multiples_of_8{8, 32, 40, 64, 80, 96, 128, 160, 192, 200, 256};
  const std::vector<int64_t> others{1, 12, 59, 100, 264, 512};
  const std::map<std::string, std::pair<std::vector<int64_t>, std::vector<int64_t>>> head_dims{
      {"cuda_v2/split_q", {multiples_of_8, others}},
      {"cuda_v3_hopper/ws", {multiples_of_8, others}},
      {"cuda_v2/split_q_simt", {{32, 64, 96, 128, 256}, {1, 40, 80, 160, 512}}}};
  for (const auto& [name, dims] : head_dims) {
    const Implementation& impl = entry(name.c_str());
    for (int64_t d : dims.first) check_supports(impl, shape(4, 2, 97, 203, d), "");
    for (int64_t d : dims.second) check_supports(impl, shape(2, 2, 33, 33, d), "head_dim");
    check_supports(impl, scaled(shape(2, 2, 33, 33, 64), -0.125), "scale");
    check_supports(impl, scaled(shape(2, 2, 33, 33, 64), 0.0), "scale");
    check_supports(impl, shape(70000, 1, 1, 8, 64), "heads_q");
  }
  check_supports(entry("cuda_v2/split_q"), masked(shape(2, 2, 33, 40, 64)), "");
  // The backward: the head dims models use up to 128, each compiled as it is.
  for (int64_t d : {32, 64, 96, 128})
    CHECK(entry("cuda_v2/split_q").supports_backward(shape(4, 2, 97, 203, d)) == "");
  for (int64_t d : {40, 80, 160, 256})
    CHECK(entry("cuda_v2/split_q").supports_backward(shape(4, 2, 97, 203, d)).find("head_dim") !=
          std::string::npos);
  // split_q's entries of one tile width are built for bf16 and for the head dims that width holds
  // (check_one_width, split_q_params.cpp).
  const std::map<std::string, std::pair<std::vector<int64_t>, std::vector<int64_t>>> one_width{
      {"cuda_v2/split_q_8warps", {{104, 112, 128}, {64, 96, 136, 256}}},
      {"cuda_v2/split_q_bc64", {{40, 48, 64}, {8, 32, 72, 128}}}};
  for (const auto& [name, dims] : one_width) {
    const Implementation& impl = entry(name.c_str());
    CHECK(impl.dtypes == std::vector<DType>{DType::bf16});
    for (int64_t d : dims.first) check_supports(impl, shape(2, 2, 200, 203, d), "");
    for (int64_t d : dims.second) check_supports(impl, shape(2, 2, 200, 203, d), "head_dim");
  }
  // FA3's 192-row tile is built for bf16 and the 64 tile width alone (ws.hpp).
  const Implementation& tall = entry("cuda_v3_hopper/ws_m192");
  CHECK(tall.dtypes == std::vector<DType>{DType::bf16});
  for (int64_t d : {8, 32, 64}) check_supports(tall, shape(2, 2, 200, 203, d), "");
  for (int64_t d : {72, 128, 256}) check_supports(tall, shape(2, 2, 200, 203, d), "head_dim");
  // No Hopper kernel takes an explicit mask: each entry declares it, and the registry refuses one by name
  // (why_cannot_run, common/registry.cpp). The FP8 emulation on the CPU takes every mask.
  for (const Implementation& impl : implementations())
    if (impl.name.rfind("cuda_v3_hopper/", 0) == 0 && impl.device == Device::cuda)
      CHECK_MESSAGE(!impl.explicit_mask, impl.name);

  const Implementation& fp8 = entry("cuda_v3_hopper/fp8");
  for (int64_t d : {128, 256}) check_supports(fp8, shape(4, 2, 97, 203, d), "");
  for (int64_t d : {32, 64, 80, 96, 512}) check_supports(fp8, shape(2, 2, 33, 33, d), "head_dim");
  check_supports(fp8, scaled(shape(2, 2, 33, 33, 128), -0.125), "scale");
  check_supports(fp8, scaled(shape(2, 2, 33, 33, 128), 0.0), "scale");
  check_supports(fp8, shape(70000, 1, 1, 8, 128), "heads_q");
  Problem fp8_paged = shape(8, 2, 1, 300, 128);
  fp8_paged.page_size = 16;
  check_supports(fp8, fp8_paged, "page_size");
  Problem fp8_masks = shape(4, 1, 257, 700, 128);  // causal, a window, padding and GQA 4: all taken
  fp8_masks.batch = 2;
  fp8_masks.causal = true;
  fp8_masks.window_left = 50;
  fp8_masks.seqlens_q = {100, 0};
  fp8_masks.seqlens_k = {700, 5};
  check_supports(fp8, fp8_masks, "");

  for (const char* name : {"decoding/cuda_split_kv", "decoding/cuda_split_kv_mma"}) {
    INFO(name);
    const Implementation& decode = entry(name);
    check_supports(decode, shape(32, 8, 1, 65536, 128), "");
    check_supports(decode, masked(shape(8, 2, 16, 300, 64)), "");  // a tree mask over 16 draft rows
    check_supports(decode, shape(8, 2, 17, 300, 64), "seqlen_q");
    for (int64_t d : {8, 32, 40, 96, 120}) check_supports(decode, shape(8, 2, 1, 300, d), "");
    for (int64_t d : {1, 60, 136, 256}) check_supports(decode, shape(8, 2, 1, 300, d), "head_dim");
    for (int64_t d : {32, 96})
      check_supports(entry("decoding/cuda_core"), shape(8, 2, 1, 300, d), "head_dim");
    Problem padded_rows = shape(8, 2, 4, 300, 64);
    padded_rows.batch = 2;
    padded_rows.seqlens_q = {4, 2};
    check_supports(decode, padded_rows, "seqlens_q");
    padded_rows.seqlens_q = {4, 4};  // every row valid: the same problem as none
    padded_rows.seqlens_k = {300, 0};
    check_supports(decode, padded_rows, "");
    Problem paged = shape(8, 2, 1, 300, 64);
    paged.page_size = 16;  // the registry's device tensors carry the paged cache (DeviceTensors::block_table)
    check_supports(decode, paged, "");
    for (int64_t page_size : {1, 4, 12, 100}) {  // a page is found with a shift and a mask
      paged.page_size = page_size;
      check_supports(decode, paged, "page_size");
    }
    check_supports(decode, scaled(shape(8, 2, 1, 300, 64), -1.0), "scale");
  }
}

}  // namespace flashlab::testing

namespace flashlab::testing {

// The FP8 launcher carves its scratch (e4m3 operands, tile descales, K mean, LSE shift, Hadamard factors)
// from the registry's workspace: every region 16-byte aligned (TMA reads q8, k8, v8), in order, disjoint,
// large enough, and inside the bytes the registry allocates.
TEST_CASE("cuda_v3_hopper/fp8's workspace holds every scratch region, aligned and disjoint") {
  for (int64_t d : {128, 256}) {
    Problem p = shape(6, 2, 300, 333, d);
    p.batch = 3;
    p.seqlens_q = {300, 0, 17};
    p.seqlens_k = {333, 5, 0};
    p.validate();
    const hopper::Fp8Config config = hopper::registered_fp8_config(d);
    const hopper::Fp8Workspace w = hopper::fp8_workspace(p, config);
    INFO("head_dim ", d);
    const int64_t tiles_q = (p.seqlen_q + config.block_q - 1) / config.block_q;
    const int64_t tiles_k = (p.seqlen_k + config.block_k - 1) / config.block_k;
    struct Region {
      size_t offset;
      int64_t bytes;
    };
    const std::vector<Region> regions = {{w.lengths, 6 * 4},
                                         {w.q8, p.q_elements()},
                                         {w.k8, p.kv_elements()},
                                         {w.v8, p.batch * p.heads_kv * tiles_k * d * config.block_k},
                                         {w.q_descale, p.batch * p.heads_q * tiles_q * 4},
                                         {w.k_descale, p.batch * p.heads_kv * tiles_k * 4},
                                         {w.v_descale, p.batch * p.heads_kv * tiles_k * 4},
                                         {w.lse_shift, p.lse_elements() * 4},
                                         {w.k_mean, p.batch * p.heads_kv * d * 4},
                                         {w.hadamard_factors, d * 4}};
    for (size_t r = 0; r < regions.size(); ++r) {
      INFO("region ", r);
      CHECK(regions[r].offset % 16 == 0);
      const size_t end = regions[r].offset + static_cast<size_t>(regions[r].bytes);
      CHECK(end <= (r + 1 < regions.size() ? regions[r + 1].offset : w.bytes));
    }
    CHECK(entry("cuda_v3_hopper/fp8").emulated_build.workspace(p) == w.bytes);
  }
}

}  // namespace flashlab::testing
