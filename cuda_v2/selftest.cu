// GPU self-test of the cuda_v2 kernels, straight on their launchers (no registry needed): random inputs,
// awkward shapes, outputs poisoned with NaN before each run, each result judged against the fp64 reference
// with the project's tolerance policy (common/tolerance.hpp). Prints PASS or FAIL per case; exits 1 when any
// case fails, 77 when there is no CUDA device (nothing was checked), 0 only when every case ran and passed.
//
//   build/bin/cuda_v2_selftest [substring]   runs the cases whose name contains `substring`
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/cuda/check.hpp"
#include "common/cuda/device_buffer.hpp"
#include "common/error.hpp"
#include "common/inputs.hpp"
#include "common/mask.hpp"
#include "common/problem.hpp"
#include "common/reference.hpp"
#include "common/tolerance.hpp"
#include "cuda_v2/block_mask.cuh"
#include "cuda_v2/split_q.hpp"
#include "cuda_v2/tensor_core.cuh"

namespace {

using namespace flashlab;
using flashlab::cuda::DeviceBuffer;
using Launcher = void (*)(const cuda_v2::SplitQParams&, cudaStream_t);

struct Case {
  std::string name;
  Problem problem;
  Distribution distribution = Distribution::normal;
};

std::vector<Case> cases() {
  std::vector<Case> all;
  const auto add = [&all](std::string name, Problem p, Distribution d = Distribution::normal) {
    all.push_back({std::move(name), std::move(p), d});
  };
  for (int64_t d : {64, 128, 256}) {
    std::string dim = std::to_string(d);
    dim.insert(dim.begin(), 'd');  // ("d" + ... trips GCC 12's false -Wrestrict, bug 105329)
    dim += ' ';
    add(dim + "seqlen 1", problem_shape(1, 2, 2, 1, 1, d));
    add(dim + "seqlen 97", problem_shape(2, 2, 2, 97, 97, d));
    Problem long_causal = problem_shape(1, 2, 2, 1025, 1025, d);
    long_causal.causal = true;
    add(dim + "seqlen 1025 causal", long_causal);
    Problem wide =
        problem_shape(1, 2, 1, 97, 203, d);  // sq < sk: the diagonal moves right (bottom-right aligned)
    wide.causal = true;
    add(dim + "sq 97 < sk 203 causal MQA", wide);
    Problem tall = problem_shape(1, 2, 2, 203, 97, d);  // sq > sk: the first 106 rows see nothing
    tall.causal = true;
    add(dim + "sq 203 > sk 97 causal", tall);
    add(dim + "GQA 8/2 sq 113 sk 1023", problem_shape(1, 8, 2, 113, 1023, d));
    Problem padded = problem_shape(3, 2, 1, 97, 113, d);
    padded.seqlens_q = {97, 0, 50};
    padded.seqlens_k = {0, 113, 61};
    add(dim + "padding q {97,0,50} k {0,113,61}", padded);
    Problem padded_causal = padded;
    padded_causal.causal = true;
    padded_causal.seqlens_k = {40, 1, 113};
    add(dim + "padding causal", padded_causal);
    Problem window = problem_shape(1, 2, 2, 1025, 1025, d);
    window.window_left = 100;
    window.window_right = 17;
    add(dim + "window (100, 17) seqlen 1025", window);
    Problem window_causal = problem_shape(2, 2, 2, 300, 333, d);
    window_causal.causal = true;
    window_causal.window_left = 64;
    add(dim + "window (64, 0) causal sq 300 sk 333", window_causal);
    add(dim + "no keys (sk 0)", problem_shape(1, 2, 2, 5, 0, d));
    add(dim + "large scores", problem_shape(1, 2, 2, 203, 203, d), Distribution::large);
    add(dim + "outliers", problem_shape(1, 2, 2, 257, 1023, d), Distribution::outliers);
  }
  // An explicit mask: a random tree-like pattern (each key visible with probability 1/2, the diagonal
  // always), plus one row with nothing visible.
  Problem masked = problem_shape(2, 2, 2, 97, 130, 64);
  auto bits = std::make_shared<std::vector<uint8_t>>(97 * 130);
  Random random(7);
  for (int64_t i = 0; i < 97; ++i)
    for (int64_t j = 0; j < 130; ++j) (*bits)[i * 130 + j] = (j == i || random.uniform() < 0.5) && i != 13;
  masked.mask = bits;
  add("d64 explicit mask", masked);
  Problem masked_causal = masked;
  masked_causal.causal = true;
  masked_causal.head_dim = 128;
  add("d128 explicit mask causal", masked_causal);
  return all;
}

template <typename Element>
Element from_float(float x);
template <>
float from_float<float>(float x) {
  return x;
}
template <>
__half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
float to_float(float x) {
  return x;
}
float to_float(__half x) {
  return __half2float(x);
}
float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename Element>
DeviceBuffer<Element> upload(const HostTensor& tensor) {
  std::vector<Element> converted(tensor.data.size());
  for (size_t i = 0; i < converted.size(); ++i) converted[i] = from_float<Element>(tensor.data[i]);
  DeviceBuffer<Element> buffer(converted.size());
  if (!converted.empty()) buffer.copy_from_host(converted.data());
  return buffer;
}

DeviceBuffer<int> upload_lengths(const std::vector<int64_t>& lengths) {
  std::vector<int> narrow(lengths.begin(), lengths.end());
  DeviceBuffer<int> buffer(narrow.size());
  if (!narrow.empty()) buffer.copy_from_host(narrow.data());
  return buffer;
}

// Runs one launcher on `inputs` (already rounded to `Element`) and returns its outputs as float32.
template <typename Element>
AttentionOutputs run_on_device(Launcher launcher, const Problem& p, const AttentionInputs& inputs) {
  DeviceBuffer<Element> q = upload<Element>(inputs.q), k = upload<Element>(inputs.k),
                        v = upload<Element>(inputs.v);
  DeviceBuffer<Element> o(static_cast<size_t>(p.q_elements()));
  DeviceBuffer<float> lse(static_cast<size_t>(p.lse_elements()));
  // Poison: all-ones bytes are NaN in fp32, fp16 and bf16 alike, so an element the kernel never writes fails.
  FLASHLAB_CUDA_CHECK(cudaMemset(o.get(), 0xff, o.bytes()));
  FLASHLAB_CUDA_CHECK(cudaMemset(lse.get(), 0xff, lse.bytes()));
  DeviceBuffer<int> seqlens_q = upload_lengths(p.seqlens_q), seqlens_k = upload_lengths(p.seqlens_k);
  DeviceBuffer<uint8_t> mask(p.mask ? p.mask->size() : 0);
  if (p.mask) mask.copy_from_host(p.mask->data());

  cuda_v2::SplitQParams params = cuda_v2::split_q_params(p);  // the registry launchers' parameters
  params.q = q.get();
  params.k = k.get();
  params.v = v.get();
  params.o = o.get();
  params.lse = lse.get();
  params.seqlens_q = p.seqlens_q.empty() ? nullptr : seqlens_q.get();
  params.seqlens_k = p.seqlens_k.empty() ? nullptr : seqlens_k.get();
  params.mask = p.mask ? mask.get() : nullptr;
  launcher(params, nullptr);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());

  AttentionOutputs out = AttentionOutputs::poisoned(p);
  std::vector<Element> o_host(o.size());
  o.copy_to_host(o_host.data());
  for (size_t i = 0; i < o_host.size(); ++i) out.o.data[i] = to_float(o_host[i]);
  lse.copy_to_host(out.lse.data.data());
  return out;
}

struct Kernel {
  const char* name;
  DType dtype;
  std::function<AttentionOutputs(const Problem&, const AttentionInputs&)> run;
};

// One case on one kernel: the verdict line, and whether it passed.
bool check_case(const Kernel& kernel, const Case& c, uint64_t seed) {
  Problem p = c.problem;
  p.dtype = kernel.dtype;
  std::string line = std::string(kernel.name) + " " + std::string(to_string(kernel.dtype)) + " | " + c.name +
                     " | " + p.describe() + " " + std::string(to_string(c.distribution));
  try {
    p.validate();
    const AttentionInputs inputs = random_inputs(p, c.distribution, seed);
    const ReferenceResult reference = reference_attention(p, inputs);
    // The yardstick: naive attention at the kernel's precision; tensor-core kernels round P to fp16/bf16.
    const AttentionOutputs baseline = baseline_attention(p, inputs, p.dtype, p.dtype != DType::f32);
    const Tolerance tolerance = tolerance_from_baseline(p.dtype, deviation(p, baseline, reference));
    const Verdict verdict = judge(p, kernel.run(p, inputs), reference, tolerance);
    std::printf("%s %s\n  %s\n", verdict.passed() ? "PASS" : "FAIL", line.c_str(), verdict.explain().c_str());
    return verdict.passed();
  } catch (const std::exception& error) {
    std::printf("FAIL %s\n  error: %s\n", line.c_str(), error.what());
    return false;
  }
}

// The launchers must refuse what they cannot run, naming the field.
bool check_refusals() {
  bool ok = true;
  const auto expect_error = [&ok](const char* what, Launcher launcher, cuda_v2::SplitQParams params,
                                  const char* field) {
    try {
      launcher(params, nullptr);
      std::printf("FAIL refusal: %s was accepted\n", what);
      ok = false;
    } catch (const Error& error) {
      const bool named = std::string(error.what()).find(field) != std::string::npos;
      std::printf("%s refusal: %s -> %s\n", named ? "PASS" : "FAIL", what, error.what());
      ok = ok && named;
    }
  };
  cuda_v2::SplitQParams params;
  params.head_dim = 80;
  params.dtype = DType::bf16;
  expect_error("split_q head_dim 80", cuda_v2::split_q_forward, params, "head_dim");
  params.head_dim = 64;
  params.dtype = DType::f32;
  expect_error("split_q fp32", cuda_v2::split_q_forward, params, "dtype");
  params.dtype = DType::f16;
  expect_error("split_q_simt fp16", cuda_v2::split_q_simt_forward, params, "dtype");
  return ok;
}

// The tile decisions of BlockMask for one problem and one (Br, Bc), against Visibility; prints what breaks.
template <int kBlockN>
bool check_block_mask(const Problem& p, int block_m, const std::string& name) {
  const Visibility visibility(p);
  std::vector<int> seqlens_q(p.seqlens_q.begin(), p.seqlens_q.end());
  std::vector<int> seqlens_k(p.seqlens_k.begin(), p.seqlens_k.end());
  cuda_v2::SplitQParams params;  // host pointers: BlockMask only reads lengths and the mask
  params.seqlen_q = static_cast<int>(p.seqlen_q);
  params.seqlen_k = static_cast<int>(p.seqlen_k);
  params.causal = p.causal;
  params.window_left = static_cast<int>(p.window_left);
  params.window_right = static_cast<int>(p.window_right);
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
        std::string wrong;
        if (!visited && cover != TileCover::hidden) wrong = "a tile with visible keys is skipped";
        if (visited && block.tile_is_full<kBlockN>(static_cast<int>(key0)) && cover != TileCover::full)
          wrong = "a tile that needs a mask is treated as full";
        for (int row = row_begin; wrong.empty() && visited && row < row_begin + block_m && row < p.seqlen_q;
             ++row) {
          const KeyRange keys = cuda_v2::BlockMask::band(params, block, row);
          for (int64_t key = key0; key < key1; ++key)
            if (cuda_v2::element_visible(params, keys, row, static_cast<int>(key)) !=
                visibility.visible(b, row, key))
              wrong = "the element mask differs from Visibility at row " + std::to_string(row) + ", key " +
                      std::to_string(key);
        }
        if (!wrong.empty()) {
          std::printf("FAIL host block mask | %s | Br %d Bc %d b %d rows %d.. tile %d: %s\n", name.c_str(),
                      block_m, kBlockN, b, row_begin, tile, wrong.c_str());
          return false;
        }
      }
    }
  return true;
}

bool check_block_masks_on_host(const std::vector<Case>& all) {
  // The self-test's cases, plus random small problems that hit every alignment of diagonals and window edges
  // against the tile boundaries.
  std::vector<Case> problems;
  for (const Case& c : all)
    if (c.problem.head_dim == 64) problems.push_back(c);  // the mask does not depend on the head dim
  Random random(2024);
  const auto pick = [&random](int64_t lo, int64_t hi) {  // uniform in [lo, hi]
    return lo + static_cast<int64_t>(random.uniform() * static_cast<double>(hi - lo + 1));
  };
  for (int n = 0; n < 400; ++n) {
    Problem p = problem_shape(pick(1, 3), 1, 1, pick(1, 300), pick(0, 300), 64);
    p.causal = pick(0, 1) == 1;
    if (pick(0, 2) == 0) p.window_left = pick(0, 80);
    if (pick(0, 2) == 0) p.window_right = pick(0, 80);
    if (pick(0, 1) == 1) {
      for (int64_t b = 0; b < p.batch; ++b) {
        p.seqlens_q.push_back(pick(0, p.seqlen_q));
        p.seqlens_k.push_back(pick(0, p.seqlen_k));
      }
    }
    problems.push_back({"random " + std::to_string(n) + " " + p.describe(), p});
  }
  bool ok = true;
  int checked = 0;
  for (const Case& c : problems) {
    for (int block_m : {32, 64, 128}) {
      ok = check_block_mask<32>(c.problem, block_m, c.name) && ok;
      ok = check_block_mask<64>(c.problem, block_m, c.name) && ok;
      checked += 2;
    }
  }
  std::printf("%s host block mask: %d (problem, Br, Bc) combinations against Visibility\n",
              ok ? "PASS" : "FAIL", checked);
  return ok;
}

// ---- Host emulation of one warp's tile products: the ldmatrix addresses, the swizzle and the fragment order
// ----
//
// PTX semantics, emulated: ldmatrix.x4 gives lane L, for matrix m, row L / 4 (columns 2 (L % 4), +1) of the
// 8x8 matrix whose rows lanes 8m..8m+7 addressed; .trans gives column L / 4 (rows 2 (L % 4), +1). mma
// m16n8k16 takes and returns the fragments of tensor_core.cuh. The loops below index exactly as split_q.cu
// does.
constexpr int kEmuDim = 64, kEmuKeys = 64;
using Fragments = std::vector<std::array<float, 8>>;  // per lane: four registers of two b16 values

// ldmatrix phases whose 8 rows (one 8x8 matrix, 8 x 16 bytes of b16) do not cover all 32 banks.
int ldmatrix_bank_conflicts = 0;

template <int kCols>
Fragments emulate_ldmatrix_x4(const std::vector<float>& smem, const int (&row_offset)[32], bool trans) {
  for (int m = 0; m < 4; ++m) {
    unsigned bank_groups = 0;  // 16-byte bank group (4 banks) of each row: b16 element offset * 2 / 16, mod 8
    for (int i = 0; i < 8; ++i) bank_groups |= 1u << ((row_offset[8 * m + i] * 2 / 16) % 8);
    ldmatrix_bank_conflicts += bank_groups != 0xffu;
  }
  Fragments out(32);
  for (int lane = 0; lane < 32; ++lane)
    for (int m = 0; m < 4; ++m)
      for (int half = 0; half < 2; ++half) {
        const int source_lane = trans ? 8 * m + 2 * (lane % 4) + half : 8 * m + lane / 4;
        const int element = trans ? lane / 4 : 2 * (lane % 4) + half;
        out[lane][2 * m + half] = smem[row_offset[source_lane] + element];
      }
  return out;
}

// d[lane][0..3] += A B for the fragments a (registers 0-3) and b (registers b0, b1 given by index).
void emulate_mma(float (*d)[4], const Fragments& a, const Fragments& b, int b0, int b1) {
  float A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int j = 0; j < 2; ++j) {
      A[g][2 * t + j] = a[lane][0 + j];
      A[g + 8][2 * t + j] = a[lane][2 + j];
      A[g][2 * t + 8 + j] = a[lane][4 + j];
      A[g + 8][2 * t + 8 + j] = a[lane][6 + j];
      B[2 * t + j][g] = b[lane][2 * b0 + j];
      B[2 * t + 8 + j][g] = b[lane][2 * b1 + j];
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
      for (int k = 0; k < 16; ++k) d[lane][e] += A[row][k] * B[k][col];
    }
  }
}

// Stores a [rows][kCols] matrix into swizzled shared memory, as cp.async does, chunk by chunk.
template <int kCols>
std::vector<float> swizzled(const std::vector<float>& matrix, int rows) {
  std::vector<float> smem(matrix.size(), NAN);
  for (int r = 0; r < rows; ++r)
    for (int col = 0; col < kCols; col += 8)
      for (int e = 0; e < 8; ++e)
        smem[cuda_v2::SwizzledTile<kCols>::offset(r, col) + e] = matrix[r * kCols + col + e];
  return smem;
}

bool check_fragments_on_host() {
  using Tile = cuda_v2::SwizzledTile<kEmuDim>;
  Random random(99);
  std::vector<float> q(16 * kEmuDim), k(kEmuKeys * kEmuDim), v(kEmuKeys * kEmuDim);
  for (float& x : q)
    x = static_cast<float>(static_cast<int>(random.uniform() * 9) - 4);  // small integers: exact
  for (float& x : k) x = static_cast<float>(static_cast<int>(random.uniform() * 9) - 4);
  for (float& x : v) x = static_cast<float>(static_cast<int>(random.uniform() * 9) - 4);
  const std::vector<float> sQ = swizzled<kEmuDim>(q, 16), sK = swizzled<kEmuDim>(k, kEmuKeys),
                           sV = swizzled<kEmuDim>(v, kEmuKeys);

  // S = Q K^T, as the kernel's first loop.
  float s[kEmuKeys / 8][32][4] = {};
  for (int kk = 0; kk < kEmuDim / 16; ++kk) {
    int q_rows[32], k_rows[32];
    for (int lane = 0; lane < 32; ++lane) {
      const auto q_at = cuda_v2::a_operand_row(lane);
      q_rows[lane] = Tile::offset(q_at.row, kk * 16 + q_at.col);
    }
    const Fragments a = emulate_ldmatrix_x4<kEmuDim>(sQ, q_rows, false);
    for (int np = 0; np < kEmuKeys / 16; ++np) {
      for (int lane = 0; lane < 32; ++lane) {
        const auto k_at = cuda_v2::b_operand_row_nk(lane);
        k_rows[lane] = Tile::offset(np * 16 + k_at.row, kk * 16 + k_at.col);
      }
      const Fragments bk = emulate_ldmatrix_x4<kEmuDim>(sK, k_rows, false);
      emulate_mma(s[2 * np], a, bk, 0, 1);
      emulate_mma(s[2 * np + 1], a, bk, 2, 3);
    }
  }
  // O = S V, with S's accumulators reused as the A fragments exactly as the kernel packs them.
  float o[kEmuDim / 8][32][4] = {};
  for (int kk = 0; kk < kEmuKeys / 16; ++kk) {
    Fragments a(32);
    for (int lane = 0; lane < 32; ++lane)
      for (int j = 0; j < 2; ++j) {
        a[lane][0 + j] = s[2 * kk][lane][j];
        a[lane][2 + j] = s[2 * kk][lane][2 + j];
        a[lane][4 + j] = s[2 * kk + 1][lane][j];
        a[lane][6 + j] = s[2 * kk + 1][lane][2 + j];
      }
    for (int np = 0; np < kEmuDim / 16; ++np) {
      int v_rows[32];
      for (int lane = 0; lane < 32; ++lane) {
        const auto v_at = cuda_v2::b_operand_row_kn(lane);
        v_rows[lane] = Tile::offset(kk * 16 + v_at.row, np * 16 + v_at.col);
      }
      const Fragments bv = emulate_ldmatrix_x4<kEmuDim>(sV, v_rows, true);
      emulate_mma(o[2 * np], a, bv, 0, 1);
      emulate_mma(o[2 * np + 1], a, bv, 2, 3);
    }
  }
  // Compare with the plain products (all values are small integers: exact in float).
  double worst = 0.0;
  for (int lane = 0; lane < 32; ++lane)
    for (int e = 0; e < 4; ++e) {
      const int row = lane / 4 + 8 * (e / 2), col = 2 * (lane % 4) + e % 2;
      for (int nt = 0; nt < kEmuKeys / 8; ++nt) {
        double expected = 0.0;
        for (int c = 0; c < kEmuDim; ++c) expected += q[row * kEmuDim + c] * k[(nt * 8 + col) * kEmuDim + c];
        worst = std::max(worst, std::fabs(expected - s[nt][lane][e]));
      }
      for (int nt = 0; nt < kEmuDim / 8; ++nt) {
        double expected = 0.0;
        for (int j = 0; j < kEmuKeys; ++j) {
          double score = 0.0;
          for (int c = 0; c < kEmuDim; ++c) score += q[row * kEmuDim + c] * k[j * kEmuDim + c];
          expected += score * v[j * kEmuDim + nt * 8 + col];
        }
        worst = std::max(worst, std::fabs(expected - o[nt][lane][e]));
      }
    }
  const bool ok = worst == 0.0 && ldmatrix_bank_conflicts == 0;
  std::printf(
      "%s host fragment emulation: S = Q K^T and O = S V through swizzled ldmatrix/mma layouts (max error "
      "%g, "
      "%d ldmatrix phases with bank conflicts)\n",
      ok ? "PASS" : "FAIL", worst, ldmatrix_bank_conflicts);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string filter = argc > 1 ? argv[1] : "";
  if (!check_block_masks_on_host(cases()) || !check_fragments_on_host()) return 1;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP cuda_v2 kernels: no CUDA device here; only the host checks ran\n");
    return 77;
  }
  cudaDeviceProp properties{};
  FLASHLAB_CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
  std::printf("cuda_v2 self-test on %s (sm_%d%d)\n", properties.name, properties.major, properties.minor);

  const std::vector<Kernel> kernels = {
      {"cuda_v2/split_q_simt", DType::f32,
       [](const Problem& p, const AttentionInputs& in) {
         return run_on_device<float>(cuda_v2::split_q_simt_forward, p, in);
       }},
      {"cuda_v2/split_q", DType::f16,
       [](const Problem& p, const AttentionInputs& in) {
         return run_on_device<__half>(cuda_v2::split_q_forward, p, in);
       }},
      {"cuda_v2/split_q", DType::bf16,
       [](const Problem& p, const AttentionInputs& in) {
         return run_on_device<__nv_bfloat16>(cuda_v2::split_q_forward, p, in);
       }},
  };
  int passed = 0, failed = 0;
  uint64_t seed = 1;
  for (const Case& c : cases()) {
    ++seed;
    if (c.name.find(filter) == std::string::npos) continue;
    for (const Kernel& kernel : kernels) (check_case(kernel, c, seed) ? passed : failed) += 1;
  }
  (check_refusals() ? passed : failed) += 1;
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
