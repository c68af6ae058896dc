// The shared vocabulary: problem validation, masks, the softmax state, number formats, .npy I/O, FLOP counts.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/error.hpp"
#include "common/flops.hpp"
#include "common/inputs.hpp"
#include "common/mask.hpp"
#include "common/npy.hpp"
#include "common/number_format.hpp"
#include "common/reference.hpp"
#include "common/softmax_state.hpp"

namespace flashlab {

TEST_CASE("Problem::validate names the field and the rule") {
  const Problem good;
  CHECK_NOTHROW(good.validate());
  auto expect = [](auto mutate, const char* message) {
    Problem p;
    mutate(p);
    CHECK_THROWS_WITH_AS(p.validate(), message, Error);
  };
  expect([](Problem& p) { p.heads_q = 12, p.heads_kv = 5; },
         "heads_q (12) must be a multiple of heads_kv (5)");
  expect([](Problem& p) { p.batch = 0; }, "batch (0) must be >= 1");
  expect([](Problem& p) { p.seqlen_q = -3; }, "seqlen_q (-3) must be >= 1");
  expect([](Problem& p) { p.seqlen_k = -1; }, "seqlen_k (-1) must be >= 0");
  expect([](Problem& p) { p.head_dim = 0; }, "head_dim (0) must be >= 1");
  expect([](Problem& p) { p.heads_kv = 0; }, "heads_kv (0) must be >= 1");
  expect([](Problem& p) { p.window_left = -2; }, "window_left (-2) must be >= 0, or -1 for unbounded");
  expect([](Problem& p) { p.scale = NAN; }, "scale (nan) must be finite");
  expect([](Problem& p) { p.batch = 2, p.seqlens_k = {1}; }, "seqlens_k has 1 entries but batch is 2");
  expect([](Problem& p) { p.seqlens_q = {2}; }, "seqlens_q[0] (2) must be in [0, seqlen_q = 1]");
  expect([](Problem& p) { p.mask = std::make_shared<std::vector<uint8_t>>(3, 1); },
         "mask has 3 entries but must be [seqlen_q, seqlen_k] = [1, 1]");
  expect([](Problem& p) { p.page_size = -4; }, "page_size (-4) must be >= 1, or 0 for contiguous K/V");
  // Packed variable-length batches: cumulative lengths, batch + 1 of them, from 0, never decreasing.
  auto packed = [](Problem& p, std::vector<int64_t> cu_q, std::vector<int64_t> cu_k) {
    p.seqlen_q = p.seqlen_k = 8;
    p.batch = 2;
    p.cu_seqlens_q = std::move(cu_q);
    p.cu_seqlens_k = std::move(cu_k);
  };
  expect(
      [&](Problem& p) {
        packed(p, {0, 3, 5}, {});
      },
      "cu_seqlens_k is missing: packed batches need both cu_seqlens_q and cu_seqlens_k");
  expect(
      [&](Problem& p) {
        packed(p, {0, 3}, {0, 1, 2});
      },
      "cu_seqlens_q has 2 entries but must have batch + 1 = 3");
  expect([&](Problem& p) { packed(p, {1, 3, 5}, {0, 1, 2}); }, "cu_seqlens_q[0] (1) must be 0");
  expect(
      [&](Problem& p) {
        packed(p, {0, 3, 5}, {0, 4, 2});
      },
      "cu_seqlens_k must not decrease: cu_seqlens_k[2] (2) < cu_seqlens_k[1] (4)");
  expect(
      [&](Problem& p) {
        packed(p, {0, 9, 12}, {0, 1, 2});
      },
      "cu_seqlens_q: sequence 0 has 9 tokens, more than seqlen_q (8)");
  expect(
      [&](Problem& p) {
        packed(p, {0, 3, 5}, {0, 1, 2}), p.seqlens_q = {3, 2};
      },
      "cu_seqlens_q and seqlens_q exclude each other: packed sequences have no padding");
  expect(
      [&](Problem& p) {
        packed(p, {0, 3, 5}, {0, 1, 2}), p.page_size = 16;
      },
      "page_size (16) does not combine with packed batches (cu_seqlens_q/k)");
  CHECK_THROWS_WITH_AS(parse_dtype("f64"), "dtype 'f64' is not one of f32, f16, bf16, e4m3", Error);
  CHECK_THROWS_WITH_AS(parse_lengths("3,x", "--seqlens-k"), "--seqlens-k entry 'x' is not an integer", Error);
  CHECK(parse_lengths("3,0,12", "--seqlens-k") == std::vector<int64_t>{3, 0, 12});
}

TEST_CASE("packed batches: shapes, offsets and lengths from the cumulative lengths") {
  Problem p = problem_shape(3, 4, 2, 6, 9, 8);
  p.cu_seqlens_q = {0, 6, 6, 10};   // lengths 6, 0, 4
  p.cu_seqlens_k = {0, 2, 11, 12};  // lengths 2, 9, 1
  REQUIRE_NOTHROW(p.validate());
  CHECK(p.q_shape() == std::vector<int64_t>{10, 4, 8});
  CHECK(p.kv_shape() == std::vector<int64_t>{12, 2, 8});
  CHECK(p.lse_shape() == std::vector<int64_t>{4, 10});  // [heads_q, total_q], as FlashAttention's varlen
  CHECK(p.rows_q(1) == 0);
  CHECK(p.rows_k(1) == 9);
  CHECK(p.stored_rows_q(2) == 4);
  CHECK(p.q_offset(2, 1, 3) == ((6 + 1) * 4 + 3) * 8);  // row 1 of sequence 2 is token 7
  CHECK(p.kv_offset(1, 5, 1) == ((2 + 5) * 2 + 1) * 8);
  CHECK(p.lse_offset(2, 3, 1) == 3 * 10 + 7);
  CHECK(p.q_elements() == 10 * 4 * 8);
  // The masks see each sequence's own lengths: causal aligns each to its own bottom-right corner.
  p.causal = true;
  const Visibility visibility(p);
  CHECK(visibility.key_range(2, 0).empty());  // 4 rows against 1 key: rows 0 to 2 see nothing
  CHECK(visibility.key_range(2, 3).end == 1);
  CHECK(visibility.key_range(1, 0).empty());  // an empty sequence
  // The padded layout through the same accessors.
  Problem padded = problem_shape(3, 4, 2, 6, 9, 8);
  CHECK(padded.q_offset(2, 1, 3) == ((2 * 6 + 1) * 4 + 3) * 8);
  CHECK(padded.lse_offset(2, 3, 1) == (2 * 4 + 3) * 6 + 1);
  CHECK(padded.stored_rows_q(1) == 6);
}

TEST_CASE("masks: causal is bottom-right aligned, windows and padding combine") {
  Problem p;
  p.seqlen_q = 3;
  p.seqlen_k = 5;
  p.causal = true;
  const Visibility causal(p);
  CHECK(causal.key_range(0, 0).begin == 0);
  CHECK(causal.key_range(0, 0).end == 3);  // row 0 sees keys 0..2 (diagonal offset sk - sq = 2)
  CHECK(causal.key_range(0, 2).end == 5);
  p.seqlen_q = 5;
  p.seqlen_k = 3;
  const Visibility tall(p);
  CHECK(tall.key_range(0, 1).empty());  // sq > sk: the first sq - sk rows see nothing
  CHECK(tall.key_range(0, 2).size() == 1);
  p = Problem{};
  p.seqlen_q = p.seqlen_k = 10;
  p.window_left = 2;
  p.window_right = 1;
  const Visibility window(p);
  CHECK(window.key_range(0, 5).begin == 3);
  CHECK(window.key_range(0, 5).end == 7);
  CHECK(window.tile(0, 0, 2, 6, 10) == TileCover::hidden);
  CHECK(window.tile(0, 4, 6, 4, 6) == TileCover::full);
  CHECK(window.tile(0, 0, 4, 0, 4) == TileCover::partial);
  p.batch = 2;
  p.seqlens_q = {10, 4};
  p.seqlens_k = {10, 0};
  const Visibility padded(p);
  CHECK(padded.key_range(1, 2).empty());   // no keys at all in batch 1
  CHECK(padded.visible_count(0, 9) == 3);  // keys 7, 8, 9: the window's right edge is clipped at sk
}

TEST_CASE("softmax state: merging the partials of any split equals the unsplit result") {
  Random random(3);
  const int64_t n = 50, d = 4;
  std::vector<double> scores(n), values(n * d);
  for (auto& s : scores) s = 20.0 * random.normal();
  for (auto& v : values) v = random.normal();
  scores[7] = -INFINITY;  // a masked key inside a chunk
  auto partial = [&](int64_t begin, int64_t end, std::vector<double>& acc) {
    SoftmaxState<double> state;
    acc.assign(d, 0.0);
    for (int64_t j = begin; j < end; ++j) state.push(scores[j], &values[j * d], acc.data(), d);
    return state;
  };
  std::vector<double> whole_acc, whole_out(d);
  const SoftmaxState<double> whole = partial(0, n, whole_acc);
  whole.finalize(whole_acc.data(), whole_out.data(), d);
  for (const std::vector<int64_t>& cuts :
       {std::vector<int64_t>{0, 50}, {0, 7, 8, 8, 30, 50}, {0, 0, 0, 50}, {0, 1, 2, 3, 49, 50}}) {
    // Each chunk finishes as (normalized O_j, LSE_j), as a split-KV worker would; the combine merges them.
    SoftmaxState<double> merged;
    std::vector<double> merged_acc(d, 0.0);
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      std::vector<double> acc, chunk_out(d);
      const SoftmaxState<double> chunk = partial(cuts[c], cuts[c + 1], acc);
      chunk.finalize(acc.data(), chunk_out.data(), d);
      merged.merge(SoftmaxState<double>::from_lse(chunk.lse()), chunk_out.data(), merged_acc.data(), d);
    }
    std::vector<double> out(d);
    merged.finalize(merged_acc.data(), out.data(), d);
    CHECK(merged.lse() == doctest::Approx(whole.lse()).epsilon(1e-13));
    for (int64_t c = 0; c < d; ++c) CHECK(out[c] == doctest::Approx(whole_out[c]).epsilon(1e-12));
  }
  SUBCASE("all-empty splits merge to an empty row: O = 0, LSE = -inf, no NaN") {
    SoftmaxState<float> merged;
    float acc[2] = {0, 0}, empty_out[2] = {0, 0}, out[2];
    for (int c = 0; c < 3; ++c) merged.merge(SoftmaxState<float>::from_lse(-INFINITY), empty_out, acc, 2);
    merged.finalize(acc, out, 2);
    CHECK(merged.lse() == -INFINITY);
    CHECK(out[0] == 0.0f);
    CHECK(out[1] == 0.0f);
  }
}

TEST_CASE("bf16 and fp16 rounding: nearest, ties to even, overflow, subnormals") {
  CHECK(round_to_bf16(1.0f) == 1.0f);
  CHECK(round_to_bf16(1.0f + 0x1p-8f) == 1.0f);                // tie: to even (down)
  CHECK(round_to_bf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);  // tie: to even (up)
  CHECK(round_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);
  CHECK(std::isinf(round_to_bf16(3.4e38f)));
  CHECK(round_to_fp16(65504.0f) == 65504.0f);
  CHECK(round_to_fp16(65519.0f) == 65504.0f);
  CHECK(std::isinf(round_to_fp16(65520.0f)));
  CHECK(round_to_fp16(1.0f + 0x1p-11f) == 1.0f);  // tie to even
  CHECK(round_to_fp16(1.0f + 3 * 0x1p-11f) == 1.0f + 0x1p-9f);
  CHECK(round_to_fp16(0x1p-25f) == 0.0f);  // half the smallest subnormal: ties to even (0)
  CHECK(round_to_fp16(0x1.8p-25f) == 0x1p-24f);
  CHECK(round_to_fp16(-0.1f) == -0.0999755859375f);
}

TEST_CASE(".npy: float32 round trip, float64 and bool read, clear errors for bad files") {
  const auto dir = std::filesystem::temp_directory_path() / "flashlab_npy_test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "a.npy").string();
  write_npy(path, {2, 3}, {1, 2, 3, 4, 5, 6.5f});
  const NpyArray a = read_npy(path, "--q");
  CHECK(a.shape == std::vector<int64_t>{2, 3});
  CHECK(a.values[5] == 6.5);
  auto write_raw = [&](const std::string& name, const std::string& header, const std::string& data) {
    std::string padded = header;
    while ((10 + padded.size() + 1) % 64 != 0) padded += ' ';
    padded += '\n';
    std::ofstream file(dir / name, std::ios::binary);
    file.write("\x93NUMPY\x01\x00", 8);
    const char length[2] = {static_cast<char>(padded.size() & 0xff), static_cast<char>(padded.size() >> 8)};
    file.write(length, 2);
    file << padded << data;
    return (dir / name).string();
  };
  const double twelve = 12.0;
  const std::string f8 = write_raw("f8.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }",
                                   std::string(reinterpret_cast<const char*>(&twelve), 8));
  CHECK(read_npy(f8, "--k").values[0] == 12.0);
  const std::string mask = write_raw("b1.npy", "{'descr': '|b1', 'fortran_order': False, 'shape': (2, 2), }",
                                     std::string("\1\0\0\1", 4));
  CHECK(read_npy(mask, "--mask").values == std::vector<double>{1, 0, 0, 1});
  const std::string i4 =
      write_raw("i4.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (1,), }", "abcd");
  CHECK_THROWS_WITH_AS(
      read_npy(i4, "--q"),
      ("--q: " + i4 + ": dtype <i4 is not supported (float32 '<f4', float64 '<f8' or bool '|b1')").c_str(),
      Error);
  const std::string fortran =
      write_raw("f.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }", "abcd");
  CHECK_THROWS_WITH_AS(
      read_npy(fortran, "--v"),
      ("--v: " + fortran + ": Fortran-order arrays are not supported (save with C order)").c_str(), Error);
  const std::string truncated =
      write_raw("t.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", "abcd");
  CHECK_THROWS_WITH_AS(read_npy(truncated, "--q"),
                       ("--q: " + truncated + ": truncated data (4 of 16 bytes)").c_str(), Error);
  CHECK_THROWS_WITH_AS(read_npy((dir / "missing.npy").string(), "--q"),
                       ("--q: " + (dir / "missing.npy").string() + ": cannot open file").c_str(), Error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("FLOP counts follow the masks: causal is about half") {
  Problem p;
  p.heads_q = 2;
  p.seqlen_q = p.seqlen_k = 1000;
  p.head_dim = 64;
  CHECK(forward_flops(p) == 4.0 * 2 * 1000 * 1000 * 64);
  p.causal = true;
  CHECK(forward_flops(p) == 4.0 * 2 * (1000.0 * 1001 / 2) * 64);
  CHECK(backward_flops(p) == 2.5 * forward_flops(p));
}

TEST_CASE("the fp64 reference: known values, fully masked rows, NaN propagation") {
  Problem p;
  p.seqlen_q = 2;
  p.seqlen_k = 2;
  p.head_dim = 1;
  p.scale = 1.0;
  p.causal = true;
  AttentionInputs in = empty_inputs(p);
  in.q.data = {1, 2};
  in.k.data = {1, 3};
  in.v.data = {10, 20};
  const ReferenceResult ref = reference_attention(p, in);
  CHECK(ref.o[0] == 10.0);  // row 0 sees key 0 only
  const double w0 = std::exp(2.0 * 1), w1 = std::exp(2.0 * 3);
  CHECK(ref.o[1] == doctest::Approx((10 * w0 + 20 * w1) / (w0 + w1)));
  CHECK(ref.lse[1] == doctest::Approx(std::log(w0 + w1)));
  p.seqlens_k = {0};
  const ReferenceResult empty = reference_attention(p, in);
  CHECK(empty.o[0] == 0.0);
  CHECK(empty.lse[0] == -INFINITY);
  p.seqlens_k.clear();
  in.q.data[1] = NAN;
  const ReferenceResult nan = reference_attention(p, in);
  CHECK(std::isnan(nan.o[1]));
  CHECK(nan.o[0] == 10.0);  // other rows are untouched
}

TEST_CASE("random inputs are reproducible and follow their distribution") {
  Problem p;
  p.seqlen_q = p.seqlen_k = 100;
  const AttentionInputs a = random_inputs(p, Distribution::normal, 42),
                        b = random_inputs(p, Distribution::normal, 42);
  CHECK(a.q.data == b.q.data);
  double sum_sq = 0;
  for (float x : a.k.data) sum_sq += x * x;
  CHECK(sum_sq / a.k.size() == doctest::Approx(1.0).epsilon(0.05));
  const AttentionInputs large = random_inputs(p, Distribution::large, 42);
  double max_abs = 0;
  for (float x : large.q.data) max_abs = std::max<double>(max_abs, std::fabs(x));
  CHECK(max_abs > 200.0);
}

}  // namespace flashlab
