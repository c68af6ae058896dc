// GPU stages below the registry, checked on any machine: cuda_v2's tile decisions against the mask rules,
// its launchers' refusals, decoding/cuda_split_kv at split counts the heuristic would not pick,
// cuda_v3_hopper/ws's refusal of tiles it is not built for, ws_persistent's tile order and its kernel on a
// few CTAs, and the launchers on tensors that already live on the device (the Python module's CUDA tensors),
// run in the emulator (and on the GPU where there is one).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/cuda/device.hpp"
#include "common/cuda/gpu_stage.hpp"
#include "common/error.hpp"
#include "common/inputs.hpp"
#include "common/mask.hpp"
#include "common/reference.hpp"
#include "common/registry.hpp"
#include "common/tolerance.hpp"
#include "cuda_v2/backward.hpp"
#include "cuda_v2/block_mask.cuh"
#include "cuda_v2/split_q.hpp"
#include "cuda_v3_hopper/ws.hpp"
#include "cuda_v3_hopper/ws_stage.hpp"
#include "decoding/cuda_split_kv.hpp"
#include "emulator/launch.hpp"
#include "tests/harness.hpp"

namespace flashlab::testing {

namespace {

// Every tile decision BlockMask makes for (Br, Bc) against common/mask.hpp's Visibility: a tile with a
// visible key is visited and (without an explicit mask) no other, a tile treated as full has no hidden key,
// and the element mask of a visited tile is Visibility's. "" when all agree, else the first disagreement.
template <int kBlockN>
std::string block_mask_disagreement(const Problem& p, int block_m) {
  const Visibility visibility(p);
  std::vector<int> seqlens_q(p.seqlens_q.begin(), p.seqlens_q.end());
  std::vector<int> seqlens_k(p.seqlens_k.begin(), p.seqlens_k.end());
  cuda_v2::SplitQParams params = cuda_v2::split_q_params(p);  // host pointers: BlockMask only reads them
  params.seqlens_q = seqlens_q.empty() ? nullptr : seqlens_q.data();
  params.seqlens_k = seqlens_k.empty() ? nullptr : seqlens_k.data();
  params.mask = p.mask ? p.mask->data() : nullptr;
  const int tiles = static_cast<int>((p.seqlen_k + kBlockN - 1) / kBlockN);
  for (int b = 0; b < p.batch; ++b)
    for (int row_begin = 0; row_begin < p.seqlen_q; row_begin += block_m) {
      const cuda_v2::BlockMask block =
          cuda_v2::BlockMask::make<kBlockN>(params, b, row_begin, row_begin + block_m);
      const int64_t valid_end = std::min<int64_t>(row_begin + block_m, p.rows_q(b));
      for (int tile = 0; tile < tiles; ++tile) {
        const int64_t key0 = int64_t{tile} * kBlockN, key1 = std::min<int64_t>(key0 + kBlockN, p.seqlen_k);
        const TileCover cover =
            row_begin < valid_end ? visibility.tile(b, row_begin, valid_end, key0, key1) : TileCover::hidden;
        const bool visited = tile >= block.tile_begin && tile < block.tile_end;
        const std::string where = "b " + std::to_string(b) + ", rows from " + std::to_string(row_begin) +
                                  ", tile " + std::to_string(tile) + ": ";
        if (!visited && cover != TileCover::hidden) return where + "a tile with visible keys is skipped";
        // Without an explicit mask (which can hide any element) the visited tiles are exactly those with a
        // visible key: none is loaded for nothing.
        if (visited && cover == TileCover::hidden && p.mask == nullptr)
          return where + "a tile no row sees is visited";
        if (visited && block.tile_is_full<kBlockN>(static_cast<int>(key0)) && cover != TileCover::full)
          return where + "a tile that needs a mask is treated as full";
        for (int row = row_begin; visited && row < row_begin + block_m && row < p.seqlen_q; ++row) {
          const KeyRange keys = cuda_v2::BlockMask::band(params, block, row);
          for (int64_t key = key0; key < key1; ++key)
            if (cuda_v2::element_visible(params, keys, row, static_cast<int>(key)) !=
                visibility.visible(b, row, key))
              return where + "the element mask differs from Visibility at row " + std::to_string(row) +
                     ", key " + std::to_string(key);
        }
      }
    }
  return "";
}

// The backward's view of the same decisions (block_mask.cuh, query_tiles_of): for every key tile of kBlockN
// keys, the runs of kBlockM-row Q tiles found by binary search are exactly the Q tiles that BlockMask::make,
// asked tile by tile, visits and treats as full. Membership is compared tile by tile, so a run that is not
// contiguous would show. "" when all agree, else the first disagreement.
template <int kBlockM, int kBlockN>
std::string query_run_disagreement(const Problem& p) {
  std::vector<int> seqlens_q(p.seqlens_q.begin(), p.seqlens_q.end());
  std::vector<int> seqlens_k(p.seqlens_k.begin(), p.seqlens_k.end());
  cuda_v2::SplitQParams params = cuda_v2::split_q_params(p);  // host pointers, as above
  params.seqlens_q = seqlens_q.empty() ? nullptr : seqlens_q.data();
  params.seqlens_k = seqlens_k.empty() ? nullptr : seqlens_k.data();
  params.mask = p.mask ? p.mask->data() : nullptr;
  const int key_tiles = static_cast<int>((p.seqlen_k + kBlockN - 1) / kBlockN);
  const int query_tiles = static_cast<int>((p.seqlen_q + kBlockM - 1) / kBlockM);
  for (int b = 0; b < p.batch; ++b)
    for (int tile = 0; tile < key_tiles; ++tile) {
      const cuda_v2::QueryTileRun run = cuda_v2::query_tiles_of<kBlockM, kBlockN>(params, b, tile);
      for (int t = 0; t < query_tiles; ++t) {
        const cuda_v2::BlockMask block =
            cuda_v2::BlockMask::make<kBlockN>(params, b, t * kBlockM, (t + 1) * kBlockM);
        const bool visits = tile >= block.tile_begin && tile < block.tile_end;
        const bool full = visits && block.tile_is_full<kBlockN>(tile * kBlockN);
        const std::string where = "b " + std::to_string(b) + ", key tile " + std::to_string(tile) +
                                  ", Q tile " + std::to_string(t) + " (" + std::to_string(kBlockM) + " x " +
                                  std::to_string(kBlockN) + "): ";
        if (visits != (t >= run.begin && t < run.end))
          return where + (visits ? "visits, outside the run" : "does not visit, inside the run");
        if (full != (t >= run.full_begin && t < run.full_end))
          return where + (full ? "full, outside the full run" : "not full, inside the full run");
      }
    }
  return "";
}

}  // namespace

TEST_CASE("cuda_v2's tile decisions (skip, full, element mask) agree with the mask rules") {
  Random random(2024);
  const auto pick = [&random](int64_t lo, int64_t hi) {  // uniform in [lo, hi]
    return lo + static_cast<int64_t>(random.uniform() * static_cast<double>(hi - lo + 1));
  };
  std::vector<Problem> problems;
  for (int n = 0; n < 400; ++n) {
    Problem p = problem_shape(pick(1, 3), 1, 1, pick(1, 300), pick(0, 300), 64);
    p.causal = pick(0, 1) == 1;
    if (pick(0, 2) == 0) p.window_left = pick(0, 80);
    if (pick(0, 2) == 0) p.window_right = pick(0, 80);
    if (pick(0, 1) == 1)
      for (int64_t b = 0; b < p.batch; ++b) {
        p.seqlens_q.push_back(pick(0, p.seqlen_q));
        p.seqlens_k.push_back(pick(0, p.seqlen_k));
      }
    if (n % 10 == 0) {  // an explicit mask: every visited tile is partial
      auto mask = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(p.seqlen_q * p.seqlen_k));
      for (auto& bit : *mask) bit = random.uniform() < 0.5;
      p.mask = std::move(mask);
    }
    problems.push_back(p);
  }
  for (const Problem& p : problems)
    for (int block_m : {32, 64, 128}) {
      INFO(p.describe(), ", Br ", block_m);
      CHECK(block_mask_disagreement<32>(p, block_m) == "");
      CHECK(block_mask_disagreement<64>(p, block_m) == "");
      CHECK(block_mask_disagreement<128>(p, block_m) == "");  // split_q's at d 64, the backward's wide ones
    }
  // The backward's tiles (cuda_v2/backward.hpp: 32 x 64, 32 x 128, 64 x 128), and two more shapes.
  for (const Problem& p : problems) {
    INFO(p.describe());
    CHECK(query_run_disagreement<32, 64>(p) == "");
    CHECK(query_run_disagreement<32, 128>(p) == "");
    CHECK(query_run_disagreement<64, 128>(p) == "");
    CHECK(query_run_disagreement<16, 32>(p) == "");
    CHECK(query_run_disagreement<128, 64>(p) == "");
  }
}

TEST_CASE("cuda_v2's launchers refuse what their kernels cannot do, naming the field") {
  auto refusal = [](cuda_v2::Check check, cuda_v2::SplitQParams params) -> std::string {
    try {
      check(params, cuda_v2::Checks::launch);
    } catch (const Error& error) {
      return error.what();
    }
    return "";
  };
  cuda_v2::SplitQParams params;
  params.head_dim = 84;  // not a multiple of 8: no whole 16-byte chunks
  params.dtype = DType::bf16;
  CHECK(refusal(cuda_v2::check_split_q, params).find("head_dim") != std::string::npos);
  params.head_dim = 264;
  CHECK(refusal(cuda_v2::check_split_q, params).find("head_dim") != std::string::npos);
  params.head_dim = 80;  // in the tile width 96
  CHECK(refusal(cuda_v2::check_split_q, params).find("head_dim") == std::string::npos);
  params.head_dim = 64;
  params.dtype = DType::f32;
  CHECK(refusal(cuda_v2::check_split_q, params).find("dtype") != std::string::npos);
  params.dtype = DType::f16;
  CHECK(refusal(cuda_v2::check_split_q_simt, params).find("dtype") != std::string::npos);
  params.dtype = DType::bf16;
  params.heads_q = 6;
  params.heads_kv = 4;
  CHECK(refusal(cuda_v2::check_split_q, params).find("heads_q (6) must be a multiple of heads_kv (4)") !=
        std::string::npos);

  // The backward's tile: 64 or 128 keys a block, 32 query rows a step or 64 over 128 keys, and the
  // deterministic mode with 64 keys only.
  const auto backward_refusal = [](const cuda_v2::SplitQBackwardParams& backward) -> std::string {
    try {
      cuda_v2::check_split_q_backward(backward);
    } catch (const Error& error) {
      return error.what();
    }
    return "";
  };
  cuda_v2::SplitQBackwardParams backward;
  backward.block_n = 96;
  CHECK(backward_refusal(backward).find("block_n (96) must be 64 or 128") != std::string::npos);
  backward.block_n = cuda_v2::kBackwardWideBlockN;
  backward.deterministic = true;
  CHECK(backward_refusal(backward).find("deterministic (true) takes block_n 64, not 128") !=
        std::string::npos);
  backward.deterministic = false;
  backward.block_n = cuda_v2::kBackwardBlockN;
  backward.block_m = cuda_v2::kBackwardWideBlockM;
  CHECK(backward_refusal(backward).find("block_m (64) must be 32, or 64 with block_n 128") !=
        std::string::npos);
  backward.block_m = 48;
  backward.block_n = cuda_v2::kBackwardWideBlockN;
  CHECK(backward_refusal(backward).find("block_m (48) must be 32") != std::string::npos);
  // With 64 rows over 128 keys: bf16, d 64 or 128, nothing beyond the plain case, each named.
  backward.block_m = cuda_v2::kBackwardWideBlockM;
  backward.forward = params;  // bf16, 6 query heads over 4: refused by the forward's rule
  backward.forward.heads_q = 8;
  backward.forward.head_dim = 96;
  CHECK(backward_refusal(backward).find("head_dim (96) must be 64 or 128 for cuda_v2/split_q_bwd64x128") !=
        std::string::npos);
  backward.forward.head_dim = 128;
  backward.forward.dtype = DType::f16;
  CHECK(backward_refusal(backward).find("dtype (f16) must be bf16 for cuda_v2/split_q_bwd64x128") !=
        std::string::npos);
  backward.deterministic = true;
  CHECK(backward_refusal(backward).find("deterministic (true) takes block_n 64, not 128") !=
        std::string::npos);
}

TEST_CASE("decoding/cuda_split_kv merges 1, 7, 82 and 128 splits (some empty) exactly like one") {
  // 2049 keys: 65 tiles of 32 (33 of 64 for the tensor-core kernel). 82 splits of one tile leave splits 65-81
  // without a key (33-81), 128 leave 63 (95); their partials (LSE -inf) must weigh nothing in the combine.
  // Splits past the first start their contiguous K/V offsets at tile_begin > 0. Both split kernels:
  // decoding/cuda_split_kv's, and cuda_split_kv_mma's (tensor_cores), which rounds P for its mma; and both
  // combines: each split merged in turn, and in two passes (cuda_split_kv_mma_two_pass), at d 128 and at d
  // 64, where its 64 threads take 82 and 128 splits more than one each.
  struct Run {
    bool tensor_cores, two_pass;
    int64_t head_dim;
  };
  for (const Run run :
       {Run{false, false, 128}, Run{true, false, 128}, Run{true, true, 128}, Run{true, true, 64}})
    for (int splits : {1, 7, 82, 128}) {
      const bool tensor_cores = run.tensor_cores;
      INFO(splits, " splits", tensor_cores ? ", tensor cores" : "", run.two_pass ? ", two passes" : "",
           ", d ", run.head_dim);
      Problem p = problem_shape(2, 8, 2, 3, 2049, run.head_dim);
      p.causal = true;
      p.dtype = DType::bf16;
      p.seqlens_k = {2049, 700};
      const AttentionInputs inputs = random_inputs(p, Distribution::normal, 31);
      const ReferenceResult reference = reference_attention(p, inputs);
      const Tolerance tolerance = tolerance_from_baseline(
          p.dtype, deviation(p, baseline_attention(p, inputs, p.dtype, tensor_cores), reference));
      decoding::SplitKvParams params = decoding::split_kv_params(p, tensor_cores);
      params.num_splits = splits;
      params.two_pass_combine = run.two_pass;
      const size_t partial_bytes = splits == 1 ? 0
                                               : sizeof(float) *
                                                     static_cast<size_t>(p.batch * p.heads_q * p.seqlen_q) *
                                                     splits * (p.head_dim + 1);
      const size_t workspace = partial_bytes + 16;  // then the int lengths (2 of them)
      const auto launch = [&](auto forward, auto narrow) {
        return [&, forward, narrow](const DeviceTensors& tensors) {
          decoding::SplitKvParams device = params;
          device.q = tensors.q;
          device.k = tensors.k;
          device.v = tensors.v;
          device.o = tensors.o;
          device.lse = tensors.lse;
          device.workspace = tensors.workspace;
          device.workspace_bytes = partial_bytes;
          device.seqlens_k =
              narrow(p, tensors, static_cast<char*>(tensors.workspace) + partial_bytes).seqlens_k;
          forward(device, nullptr);
        };
      };
      AttentionOutputs out = AttentionOutputs::poisoned(p);
      cuda::emulated::run_on_device(
          p, inputs, out, workspace,
          launch(decoding::emulated::cuda_split_kv_forward, cuda::emulated::narrow_lengths));
      const Verdict emulated = judge(p, out, reference, tolerance);
      INFO("emulated: ", emulated.explain());
      CHECK(emulated.passed());
      if (run.two_pass) {
        // The same merge as the one split at a time, rounded in another order: LSE within a few fp32 ulp, O
        // within one bf16 ulp (both round the same fp32 sums), an empty row's -inf the same.
        params.two_pass_combine = false;
        AttentionOutputs merged = AttentionOutputs::poisoned(p);
        cuda::emulated::run_on_device(
            p, inputs, merged, workspace,
            launch(decoding::emulated::cuda_split_kv_forward, cuda::emulated::narrow_lengths));
        params.two_pass_combine = true;
        int lse_apart = 0, o_apart = 0;
        for (int64_t i = 0; i < merged.lse.size(); ++i) {
          const float a = out.lse.data[i], b = merged.lse.data[i];
          lse_apart += !(a == b || std::fabs(a - b) <= 1e-5f * std::max(1.0f, std::fabs(b)));
        }
        for (int64_t i = 0; i < merged.o.size(); ++i) {
          const float a = out.o.data[i], b = merged.o.data[i];
          o_apart += !(std::fabs(a - b) <= std::ldexp(std::max(std::fabs(a), std::fabs(b)), -7));
        }
        CHECK(lse_apart == 0);
        CHECK(o_apart == 0);
      }
#if FLASHLAB_HAVE_CUDA
      if (cuda::unavailable_reason().empty()) {
        AttentionOutputs on_gpu = AttentionOutputs::poisoned(p);
        cuda::gpu::run_on_device(p, inputs, on_gpu, workspace,
                                 launch(decoding::gpu::cuda_split_kv_forward, cuda::gpu::narrow_lengths));
        const Verdict gpu = judge(p, on_gpu, reference, tolerance);
        INFO("gpu: ", gpu.explain());
        CHECK(gpu.passed());
      }
#endif
    }
}

TEST_CASE("decoding/cuda_split_kv's split count fills one wave, rounded down, never a tail wave") {
  // The emulated device: 132 SMs, and at d 128 shared memory (45,312 B a block with a 2-tile ring) lets 5
  // blocks share an SM: a wave of 660 blocks. A 32/8 GQA decode has one block per kv head and split.
  // The count, from the partials' size: batch x 32 rows x splits x (128 channels + LSE), none unsplit.
  const auto splits_for = [](int batch, int seqlen_k) {
    const Problem p = problem_shape(batch, 32, 8, 1, seqlen_k, 128);
    const int64_t elements = decoding::emulated::cuda_split_kv_partial_elements(p);
    return elements == 0 ? 1 : static_cast<int>(elements / (int64_t{batch} * 32 * 129));
  };
  CHECK(splits_for(1, 65536) == 82);  // floor(660 / 8); 656 blocks, not 2 waves with a tail of 4
  CHECK(splits_for(1, 8192) == 32);   // kMinKeysPerSplit: 8192 / 256
  CHECK(splits_for(8, 65536) == 10);  // floor(660 / 64)
  CHECK(splits_for(64, 65536) == 1);  // 512 blocks already fill most of the wave
  CHECK(splits_for(1, 100) == 1);
  // decoding/cuda_split_kv_mma's kernel takes 73,728 B a block at d 128 (64-key tiles, 2 stages, Q and the
  // exact path's P): 3 blocks an SM, a wave of 396 (on a GPU its 166-167 registers allow 3 as well).
  const auto mma_splits_for = [](int batch, int seqlen_k) {
    const Problem p = problem_shape(batch, 32, 8, 1, seqlen_k, 128);
    const int64_t elements = decoding::emulated::cuda_split_kv_mma_partial_elements(p);
    return elements == 0 ? 1 : static_cast<int>(elements / (int64_t{batch} * 32 * 129));
  };
  CHECK(mma_splits_for(1, 65536) == 49);  // floor(396 / 8)
  CHECK(mma_splits_for(1, 8192) == 32);   // kMinKeysPerSplit
  CHECK(mma_splits_for(8, 65536) == 6);   // floor(396 / 64)
  CHECK(mma_splits_for(64, 65536) == 1);
  for (const int batch : {1, 2, 3, 5, 8, 13, 64, 100})
    for (const int seqlen_k : {1, 257, 4096, 65536, 1 << 20}) {
      INFO("batch ", batch, ", seqlen_k ", seqlen_k);
      const int splits = splits_for(batch, seqlen_k);
      CHECK(splits >= 1);
      CHECK(splits <= decoding::kSplitKvMaxSplits);
      if (splits > 1) CHECK(int64_t{splits} * batch * 8 <= 660);  // one wave, no tail
    }
}

TEST_CASE("the persistent kernel's tile order hands out every tile once, longest first in L2 sections") {
  // 8k keys at d 128: a pair's K and V take 4 MiB, so 8 pairs share a section; 3 x 7 pairs leave a short last
  // section of 5.
  hopper::HopperParams params;
  params.batch = 3, params.heads_q = 7, params.heads_kv = 1;
  params.seqlen_q = 1000, params.seqlen_k = 8192, params.head_dim = 128;
  const cuda::TileOrder order = hopper::ws_tile_order(params);
  CHECK(order.section == 8);
  CHECK(order.blocks == 8);
  REQUIRE(order.tiles() == 8 * 7 * 3);
  std::vector<int> seen(static_cast<size_t>(order.tiles()), 0);
  int last_section = 0, last_block = order.blocks;
  for (int t = 0; t < order.tiles(); ++t) {
    const cuda::Tile tile = order(t);
    INFO("tile ", t, ": block ", tile.block, ", head ", tile.head, ", batch ", tile.batch);
    REQUIRE((tile.block >= 0 && tile.block < order.blocks && tile.head >= 0 && tile.head < 7 &&
             tile.batch >= 0 && tile.batch < 3));
    ++seen[static_cast<size_t>((tile.batch * 7 + tile.head) * order.blocks + tile.block)];
    const int section = (tile.batch * 7 + tile.head) / order.section;
    CHECK(section >= last_section);  // sections one after another
    if (section != last_section) last_block = order.blocks;
    CHECK(tile.block <= last_block);  // within a section, the last row block first
    last_section = section, last_block = tile.block;
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  // Short K and V: every pair in one section. Long: one pair a section.
  params.seqlen_k = 100;
  CHECK(hopper::ws_tile_order(params).section == 21);
  params.seqlen_k = 1 << 20;
  CHECK(hopper::ws_tile_order(params).section == 1);
}

// The persistent kernel's dynamic tile scheduler draws from a counter in device memory that the launcher
// clears: a launch without one is refused by name, as are the tiles it is not built for.
TEST_CASE("cuda_v3_hopper/ws_persistent refuses a launch without its tile counter, naming the field") {
  hopper::HopperParams params;
  params.seqlen_q = params.seqlen_k = 100, params.head_dim = 64, params.softmax_scale = 0.125f;
  hopper::set_packed_strides(params);
  params.persistent = true;
  CHECK(contains(hopper::hopper_ws_unsupported(params), "tile_counter must be a device pointer"));
  unsigned counter = 0;
  params.tile_counter = &counter;
  CHECK(std::string(hopper::hopper_ws_unsupported(params)).empty());
  params.head_dim = 192;
  hopper::set_packed_strides(params);
  CHECK(contains(hopper::hopper_ws_unsupported(params),
                 "persistent: the full kernel, bf16, head dims up to 128"));
  params.head_dim = 64;
  hopper::set_packed_strides(params);
  params.ctas = -1;
  CHECK(contains(hopper::hopper_ws_unsupported(params), "ctas must be >= 0"));
}

// The launcher's tile choices outside what it is built for are refused, naming the field, before anything
// runs: FA3's 192 x 128 (block_m 192) is built for the full kernel, bf16, the 64 tile width alone.
TEST_CASE("cuda_v3_hopper/ws refuses block_m outside FA3's 192 x 128 tile, naming the field") {
  hopper::HopperParams params;
  params.seqlen_q = params.seqlen_k = 100, params.head_dim = 64, params.softmax_scale = 0.125f;
  hopper::set_packed_strides(params);
  CHECK(std::string(hopper::hopper_ws_unsupported(params)).empty());
  params.block_m = hopper::kWsTallBlockM;
  CHECK(std::string(hopper::hopper_ws_unsupported(params)).empty());
  CHECK(hopper::ws_block_m(params) == 192);
  params.block_n = 128;  // the head dim's own, named
  CHECK(std::string(hopper::hopper_ws_unsupported(params)).empty());
  params.block_n = 0;
  auto refused = [](hopper::HopperParams p) {
    return contains(hopper::hopper_ws_unsupported(p), "block_m must be 0, 128, or 192");
  };
  for (int block_m : {64, 256}) {
    hopper::HopperParams other = params;
    other.block_m = block_m;
    CHECK(refused(other));
  }
  hopper::HopperParams f16 = params, wide = params, persistent = params, no_overlap = params;
  f16.dtype = hopper::HopperDType::f16;
  wide.head_dim = 128;
  hopper::set_packed_strides(wide);
  persistent.persistent = true;
  no_overlap.ablation.intra_warpgroup_overlap = false;
  CHECK(refused(f16));
  CHECK(refused(wide));
  CHECK(refused(persistent));
  CHECK(refused(no_overlap));
}

namespace {

// cuda_v3_hopper/ws_persistent on p, on each (CTAs, schedule) of `runs`: its O and LSE must be ws's bit for
// bit (ws computes each tile in a CTA of its own), and within the same-dtype tolerance.
void check_persistent_as_ws(Problem p, const AttentionInputs& inputs,
                            std::initializer_list<std::pair<int, emulator::ScheduleSetting>> runs) {
  const Implementation& ws = *find_implementation("cuda_v3_hopper/ws");
  REQUIRE(why_cannot_run(ws, p).empty());
  const size_t bytes = ws.emulated_build.workspace(p);
  AttentionOutputs expected = AttentionOutputs::poisoned(p);
  cuda::emulated::run_on_device(p, inputs, expected, bytes,
                                [&](const DeviceTensors& tensors) { ws.emulated_build.forward(p, tensors); });
  const ReferenceResult reference = reference_attention(p, inputs);
  const Tolerance tolerance =
      tolerance_from_baseline(p.dtype, deviation(p, baseline_attention(p, inputs, p.dtype, true), reference));
  for (const auto& [ctas, schedule] : runs) {
    INFO(ctas, " CTAs, ", schedule.describe());
    AttentionOutputs out = AttentionOutputs::poisoned(p);
    {
      const ScheduleFor scope(schedule);
      cuda::emulated::run_on_device(p, inputs, out, bytes, [&](const DeviceTensors& tensors) {
        hopper::emulated::launch_ws_persistent_ctas(p, tensors, ctas);
      });
    }
    CHECK(same_bits(out.o, expected.o));
    CHECK(same_bits(out.lse, expected.lse));
    const Verdict verdict = judge(p, out, reference, tolerance);
    INFO(verdict.explain());
    CHECK(verdict.passed());
  }
}

// NaN in every key and value of batch element b from `key` on (its padding).
void poison_padding(const Problem& p, AttentionInputs& inputs, int64_t b, int64_t key) {
  for (; key < p.seqlen_k; ++key)
    for (int64_t n = 0; n < p.heads_kv * p.head_dim; ++n) {
      inputs.k.data[static_cast<size_t>(p.kv_offset(b, key, 0) + n)] = NAN;
      inputs.v.data[static_cast<size_t>(p.kv_offset(b, key, 0) + n)] = NAN;
    }
}

}  // namespace

// The persistent kernel carries its pipeline (the ring's stages, the barriers' phases, the Q tile, the
// consumers' turns) from tile to tile, loads a tile's K_0 and Q while the last tile's P V, epilogue and
// O store run, and hands its tiles out from a counter all CTAs draw from. On 1, 2 and 5 CTAs each computes
// many tiles, among them tiles that see no key (padding rows), tiles whose last V block holds NaN padding
// (the tail), and NaN in a visible key (the exact pass); on 2 CTAs under the shuffled schedule too, where the
// loads land at random points of the other warps' work. (The case matrix is no check of this: with one CTA
// for each of the emulator's 132 SMs, its problems leave a CTA one tile or few, and it passed with most of
// the bugs planted in docs/results/hopper-persistent-2026-12-04.)
TEST_CASE("cuda_v3_hopper/ws_persistent on 1, 2 and 5 CTAs computes every tile as ws does") {
  Problem causal = problem_shape(2, 4, 2, 300, 260, 64);
  causal.causal = true;
  causal.seqlens_q = {300, 100};  // batch 1: two row blocks without a row
  causal.seqlens_k = {260, 130};  // batch 1: V's block 1 ends in padding
  Problem wide = problem_shape(1, 3, 3, 257, 200, 128);
  wide.window_left = 90;
  for (Problem p : {causal, wide}) {
    p.dtype = DType::bf16;
    p.validate();
    INFO(p.describe());
    AttentionInputs inputs = random_inputs(p, Distribution::normal, 11);
    if (p.causal) {
      poison_padding(p, inputs, 1, 130);  // batch 1's padding keys, past its 130
      inputs.v.data[static_cast<size_t>(p.kv_offset(0, 250, 1) + 3)] = NAN;  // a key some rows see
    }
    const emulator::ScheduleSetting in_order{false, 0}, shuffled{true, 3};
    check_persistent_as_ws(p, inputs, {{1, in_order}, {2, in_order}, {5, in_order}, {2, shuffled}});
  }
}

// Tails back to back: batch element 0's tiles end in a V block that holds padding (300 keys: blocks of 128,
// the third part padding), and every tile of batch element 1 sees one block, itself a tail (100 keys). A CTA
// then loads a tail right after the last, both through the one v_tail barrier; with the TMA loads slowed
// (each lands at a scheduling point with probability 1/2000), the producer runs far ahead of them. Before it
// waited for the last tail to be zeroed, the emulator stopped this test with one arrival too many on v_tail.
TEST_CASE("cuda_v3_hopper/ws_persistent loads V tails back to back, its TMA loads slowed") {
  Problem p = problem_shape(2, 2, 2, 256, 400, 64);
  p.seqlens_k = {300, 100};
  p.dtype = DType::bf16;
  p.validate();
  AttentionInputs inputs = random_inputs(p, Distribution::normal, 5);
  poison_padding(p, inputs, 0, 300);
  poison_padding(p, inputs, 1, 100);
  // Seeds under which the emulator caught it (each also passes now, as do seeds 1 to 16 on 1 and 2 CTAs).
  const auto slow = [](uint64_t seed) { return emulator::ScheduleSetting{true, seed, 2000}; };
  check_persistent_as_ws(p, inputs, {{1, slow(1)}, {1, slow(5)}, {2, slow(12)}});
}

// split_q_longest_first's order is split_q's tiles renumbered: sections sized by L2 unless given, and a grid
// too large to number in an int refused by name.
TEST_CASE("cuda_v2/split_q_longest_first's order: split_q's tiles in L2 sections, longest first") {
  Problem p = problem_shape(3, 7, 7, 1000, 8192, 128);
  p.dtype = DType::bf16;
  cuda_v2::SplitQParams params = cuda_v2::split_q_params(p);
  const cuda::TileOrder order = cuda_v2::split_q_longest_first_order(params);
  CHECK(order.blocks == 8);  // split_q_tile(128): 128 rows a block
  CHECK(order.heads == 7);
  CHECK(order.batches == 3);
  CHECK(order.section == 8);  // 4 MiB of K and V a pair in 32 MiB
  CHECK(cuda_v2::split_q_longest_first_order(params, 3).section == 3);
  CHECK(cuda_v2::split_q_longest_first_order(params, 100).section == 21);  // at most every pair
  CHECK(order(0).block == 7);  // the last row block of the first pair first
  CHECK(order(0).head == 0);
  CHECK(order(order.tiles() - 1).block == 0);
  CHECK(cuda_v2::split_q_longest_first_order(cuda_v2::split_q_params(problem_shape(1, 1, 1, 100, 100, 256)))
            .blocks == 2);  // split_q_tile(256): 64 rows
  CHECK(refusal(cuda_v2::check_split_q_longest_first, p).empty());
  p.batch = 65535, p.heads_q = p.heads_kv = 65535, p.seqlen_q = 128;
  CHECK(contains(refusal(cuda_v2::check_split_q_longest_first, p),
                 "batch x heads_q x query blocks (4294836225) must be at most 2147483647"));
  CHECK(refusal(cuda_v2::check_split_q, p).empty());  // split_q's three-dimensional grid takes it
  CHECK(cuda::numbered_in_an_int(INT32_MAX, 1, 1));
  CHECK(cuda::numbered_in_an_int(1073741823, 2, 1));  // 2^31 - 2
  CHECK(!cuda::numbered_in_an_int(1073741824, 2, 1));
  CHECK(!cuda::numbered_in_an_int(65536, 65535, 65535));
}

// Each block of cuda_v2/split_q_longest_first computes the tile its number names in the order, with
// split_q's code: in sections of 1, 3 (the last one short) and every pair, over padding rows and keys with
// NaN in the padding, GQA, a window and packed batches, at both of FA2's tiles (128 x 64 in 4 warps of two
// row tiles at the 128 width, 128 x 128 at the 64 width) and at 96 and 48, its O and LSE must be split_q's
// bit for bit, on poisoned outputs (a tile computed twice or never shows).
TEST_CASE("split_q_longest_first in sections of 1, 3 and every pair computes split_q's tiles") {
  std::vector<Problem> problems;
  for (int64_t d : {128, 64}) {
    Problem causal = problem_shape(2, 4, 2, 300, 260, d);
    causal.dtype = DType::bf16;
    causal.causal = true;
    causal.seqlens_q = {300, 100};  // batch 1: row blocks without a row
    causal.seqlens_k = {260, 130};
    problems.push_back(causal);
  }
  Problem window = problem_shape(1, 3, 3, 257, 200, 48);
  window.dtype = DType::f16;
  window.window_left = 90;
  problems.push_back(window);
  problems.push_back(packed_causal_problem(96));
  const Implementation& grid_order = *find_implementation("cuda_v2/split_q");
  const Implementation& longest_first = *find_implementation("cuda_v2/split_q_longest_first");
  for (const Problem& p : problems) {
    p.validate();
    INFO(p.describe());
    REQUIRE(why_cannot_run(longest_first, p).empty());
    AttentionInputs inputs = random_inputs(p, Distribution::normal, 12);
    if (!p.seqlens_k.empty())  // NaN in batch 1's padding keys, past its 130
      for (int64_t key = 130; key < p.seqlen_k; ++key)
        for (int64_t n = 0; n < p.heads_kv * p.head_dim; ++n) {
          inputs.k.data[static_cast<size_t>(p.kv_offset(1, key, 0) + n)] = NAN;
          inputs.v.data[static_cast<size_t>(p.kv_offset(1, key, 0) + n)] = NAN;
        }
    const size_t bytes = grid_order.emulated_build.workspace(p);
    AttentionOutputs expected = AttentionOutputs::poisoned(p);
    cuda::emulated::run_on_device(p, inputs, expected, bytes, [&](const DeviceTensors& tensors) {
      grid_order.emulated_build.forward(p, tensors);
    });
    for (int section : {1, 3, 0}) {
      INFO("sections of ", section, " pairs (0: every pair, as L2 sizes them here)");
      AttentionOutputs out = AttentionOutputs::poisoned(p);
      cuda::emulated::run_on_device(p, inputs, out, bytes, [&](const DeviceTensors& tensors) {
        cuda_v2::emulated::launch_split_q_longest_first_sections(p, tensors, section);
      });
      CHECK(same_bits(out.o, expected.o));
      CHECK(same_bits(out.lse, expected.lse));
    }
  }
}

namespace {

// What a framework hands over: Q, K, V, O, LSE and the workspace on the device, without the problem's small
// tensors (run_on_stream() uploads those itself).
DeviceTensors framework_tensors(const DeviceTensors& tensors) {
  DeviceTensors bare;
  bare.q = tensors.q, bare.k = tensors.k, bare.v = tensors.v, bare.o = tensors.o, bare.lse = tensors.lse;
  bare.workspace = tensors.workspace;
  return bare;
}

}  // namespace

// run_on_stream() is the path of the Python module's CUDA tensors (python/module.cpp). Run here in the
// emulator, where a stream is only a name, it shows that the lengths, packed offsets, mask, bias and ALiBi
// slopes it uploads reach the kernels as the registry adapter's do: the outputs are the adapter's bit for
// bit. That the work is ordered on the caller's stream is checked on a GPU (bench/gpu_python_smoke.py).
TEST_CASE("launchers on tensors already on the device upload the problem's small tensors like the adapter") {
  Problem padded = problem_shape(2, 4, 2, 45, 70, 64);
  padded.dtype = DType::bf16;
  padded.seqlens_q = {45, 17};
  padded.seqlens_k = {70, 33};
  padded.causal = true;
  padded.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  Problem masked = problem_shape(1, 2, 2, 40, 56, 32);
  masked.dtype = DType::f16;
  std::vector<uint8_t> mask(40 * 56);
  for (size_t n = 0; n < mask.size(); ++n) mask[n] = (n * 7919) % 5 != 0;
  masked.mask = std::make_shared<const std::vector<uint8_t>>(mask);
  std::vector<float> bias(40 * 56);
  for (size_t n = 0; n < bias.size(); ++n) bias[n] = static_cast<float>(n % 11) * 0.1f - 0.5f;
  masked.bias = std::make_shared<const std::vector<float>>(bias);
  Problem packed = problem_shape(3, 2, 1, 1, 1, 96);
  packed.dtype = DType::bf16;
  packed.cu_seqlens_q = {0, 20, 21, 50};
  packed.cu_seqlens_k = {0, 31, 40, 90};
  packed.seqlen_q = 29, packed.seqlen_k = 50;
  Problem decode = problem_shape(2, 8, 2, 1, 300, 128);
  decode.dtype = DType::f16;
  decode.seqlens_k = {300, 129};
  // The same problems without what a stage does not take, in its dtype.
  const auto without_mods = [](Problem p, DType dtype) {
    p.alibi_slopes.clear();
    p.bias = nullptr;
    p.dtype = dtype;
    return p;
  };
  const std::pair<std::string, Problem> cases[] = {{"cuda_v2/split_q", padded},
                                                   {"cuda_v2/split_q", masked},
                                                   {"cuda_v2/split_q", packed},
                                                   {"cuda_v3_hopper/ws", without_mods(padded, DType::bf16)},
                                                   {"decoding/cuda_split_kv", decode},
                                                   {"decoding/cuda_split_kv_mma", decode},
                                                   {"cuda_v2/split_q_simt", without_mods(masked, DType::f32)},
                                                   {"cuda_v1/split_k", without_mods(padded, DType::f32)}};
  for (const auto& [name, p] : cases) {
    p.validate();
    const Implementation& impl = *find_implementation(name);
    INFO(name, " on ", p.describe(), ": ", why_cannot_run(impl, p));
    REQUIRE(why_cannot_run(impl, p).empty());
    const DeviceBuild& build = impl.emulated_build;
    const size_t bytes = build.workspace ? build.workspace(p) : 0;
    const AttentionInputs inputs = random_inputs(p, Distribution::normal, 5);
    const auto forward = [&](const DeviceTensors& tensors) { build.forward(p, tensors); };
    AttentionOutputs adapter = AttentionOutputs::poisoned(p), on_stream = AttentionOutputs::poisoned(p);
    cuda::emulated::run_on_device(p, inputs, adapter, bytes, forward);
    cuda::emulated::run_on_device(p, inputs, on_stream, bytes, [&](const DeviceTensors& tensors) {
      cuda::emulated::run_on_stream(p, 0, framework_tensors(tensors), forward);
    });
    CHECK(same_bits(on_stream.o, adapter.o));
    CHECK(same_bits(on_stream.lse, adapter.lse));

    if (!impl.backward) continue;
    REQUIRE(why_cannot_run_backward(impl, p).empty());
    const HostTensor d_out = random_inputs(p, Distribution::normal, 6).q;
    const size_t backward_bytes = build.backward_workspace ? build.backward_workspace(p) : 0;
    const auto backward = [&](const BackwardTensors& tensors) { build.backward(p, tensors); };
    AttentionGradients by_adapter = AttentionGradients::poisoned(p),
                       by_stream = AttentionGradients::poisoned(p);
    cuda::emulated::run_backward_on_device(p, inputs, adapter, d_out, by_adapter, backward_bytes, backward);
    cuda::emulated::run_backward_on_device(p, inputs, adapter, d_out, by_stream, backward_bytes,
                                           [&](const BackwardTensors& tensors) {
                                             BackwardTensors bare = tensors;
                                             bare.forward = framework_tensors(tensors.forward);
                                             cuda::emulated::run_backward_on_stream(p, 0, bare, backward);
                                           });
    CHECK(same_bits(by_stream.dq, by_adapter.dq));
    CHECK(same_bits(by_stream.dk, by_adapter.dk));
    CHECK(same_bits(by_stream.dv, by_adapter.dv));
  }
  // A paged KV cache is built from host arrays: refused by name.
  Problem paged = decode;
  paged.page_size = 16;
  CHECK_THROWS_WITH(cuda::emulated::run_on_stream(paged, 0, DeviceTensors{}, [](const DeviceTensors&) {}),
                    doctest::Contains("page_size"));
}

}  // namespace flashlab::testing
