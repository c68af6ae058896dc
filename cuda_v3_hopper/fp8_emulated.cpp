// cuda_v3_hopper/fp8_emulated: FlashAttention-3's FP8 forward pass, emulated exactly on the CPU (see the
// header for the steps). Quantized tensors are kept as the float values of their e4m3 codes. Every product of
// two e4m3 values is exact, and the products' sums are those of Hopper's tensor cores: a block of 32 (one
// wgmma's K) at a time, onto the accumulator, with 13 bits kept (common/e4m3_block_sum.hpp).
#include "cuda_v3_hopper/fp8_emulated.hpp"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "common/e4m3_block_sum.hpp"
#include "common/error.hpp"
#include "common/hadamard.hpp"
#include "common/mask.hpp"
#include "common/number_format.hpp"
#include "common/registry.hpp"
#include "common/softmax_state.hpp"
#include "cuda_v3_hopper/fp8_prepass.hpp"

namespace flashlab::hopper {

namespace {

constexpr int64_t kWgmmaK = 32;  // the K of one e4m3 wgmma: the products a tensor-core block sums

// An entry taken out of the fp8 tensor by the outlier decomposition (Fp8Config::qk_outlier_threshold).
struct Outlier {
  int32_t channel;
  float value;  // in input units (bf16, exact)
};

// One quantized operand (Q, K or V): e4m3 values in the BSHD layout of the input, and the descale of each
// tile of `block` tokens of each (batch, head): descale[(b * heads + h) * tiles + t]; value * descale ~
// input.
struct Fp8Tensor {
  std::vector<float> values;
  std::vector<float> descale;
  // Entries taken out of the fp8 tensor (their place there holds 0), per token row (b, s, h).
  std::vector<std::vector<Outlier>> outliers;
  int64_t seqlen = 0, heads = 0, head_dim = 0, block = 0, tiles = 0;
  bool keep_fp32 = false;  // study knob: skip the e4m3 cast (Fp8Config::quantize_qk / quantize_v)
  float outlier_threshold = 0.0f;

  const std::vector<Outlier>& row_outliers(int64_t b, int64_t s, int64_t h) const {
    return outliers[(b * seqlen + s) * heads + h];
  }

  const float* row(int64_t b, int64_t s, int64_t h) const {
    return values.data() + bshd_offset(b, s, h, seqlen, heads, head_dim);
  }
  float tile_descale(int64_t b, int64_t h, int64_t s) const {
    return descale[(b * heads + h) * tiles + s / block];
  }
};

struct Fp8Operands {
  Fp8Tensor q, k, v;
  std::vector<float> q_bf16, k_bf16;  // outlier decomposition: the bf16 Q and K its sparse terms read
  // [batch, heads_q, seqlen_q]: scale * q_i . mean(K) from K smoothing (else 0), added to the LSE.
  std::vector<float> lse_shift;
};

Fp8Operands quantization_prepass(const Problem& p, const AttentionInputs& in, const Fp8Config& config);

// The score terms of the outlier decomposition: sum over the channels c extracted from q_i or from k_j of
// q_bf16[c] * k_bf16[c] (the fp8 product holds 0 on those channels). Exact bf16 products, summed in fp32.
float sparse_score(const std::vector<Outlier>& q_outliers, const std::vector<Outlier>& k_outliers,
                   const float* q_bf16, const float* k_bf16) {
  float sum = 0.0f;
  for (const Outlier& qo : q_outliers) sum += qo.value * k_bf16[qo.channel];
  for (const Outlier& ko : k_outliers) {
    bool counted = false;
    for (const Outlier& qo : q_outliers) counted = counted || qo.channel == ko.channel;
    if (!counted) sum += q_bf16[ko.channel] * ko.value;
  }
  return sum;
}

// FA3 Algorithm 1 for the rows [i0, i1) of one (batch, query head), one row at a time: each row's arithmetic
// is that of a Br-row tile over the key tiles the row sees. (A kernel's tile of rows also visits the tiles
// its later rows see; for an earlier row they hold no visible key, and with the tensor cores' sums they still
// cut its O to 14 bits, which this leaves out: docs/06-fp8.md, "The bound the kernel is tested against".)
void attend_rows(const Problem& p, const Fp8Operands& ops, const Fp8Config& config, int64_t b, int64_t h,
                 int64_t i0, int64_t i1, AttentionOutputs& out) {
  const Visibility visibility(p);
  const int64_t d = p.head_dim, hk = p.kv_head(h), bc = config.block_k;
  const float softmax_scale = static_cast<float>(p.softmax_scale());
  // Where both operands of a product are e4m3, its sums are the tensor cores' (common/e4m3_block_sum.hpp).
  const bool tensor_core_qk = config.tensor_core_sums && config.quantize_qk;
  const bool tensor_core_pv = config.tensor_core_sums && config.quantize_v && config.round_p;
  std::vector<float> acc(static_cast<size_t>(d)), s(static_cast<size_t>(bc)), o(static_cast<size_t>(d));
  for (int64_t i = i0; i < i1; ++i) {
    const float* q = ops.q.row(b, i, h);
    const float q_descale = ops.q.tile_descale(b, h, i);
    const std::vector<Outlier>& q_outliers = ops.q.row_outliers(b, i, h);
    SoftmaxState<float> state;
    std::fill(acc.begin(), acc.end(), 0.0f);
    float acc_v_descale = 1.0f;  // the V descale that acc is currently expressed in
    const KeyRange keys = visibility.key_range(b, i);
    for (int64_t j0 = keys.begin / bc * bc; j0 < keys.end; j0 += bc) {  // kv tiles overlapping the row's keys
      const int64_t j1 = std::min(j0 + bc, p.seqlen_k);
      // S = Q8 K8^T, with the two tiles' descales folded into the softmax scale (FA3 Sec. 3.3).
      const float score_scale = q_descale * ops.k.tile_descale(b, hk, j0) * softmax_scale;
      float block_max = -INFINITY;
      for (int64_t j = j0; j < j1; ++j) {
        if (j < keys.begin || j >= keys.end || !visibility.mask_allows(i, j)) {
          s[j - j0] = -INFINITY;
          continue;
        }
        const float* k = ops.k.row(b, j, hk);
        float dot = 0.0f;
        if (tensor_core_qk) {  // the kernel's head_dim / 32 chained wgmma k-steps, the first onto 0
          for (int64_t c0 = 0; c0 < d; c0 += kWgmmaK)
            dot = e4m3_block_sum(q + c0, k + c0, static_cast<int>(std::min(kWgmmaK, d - c0)), dot);
        } else {
#pragma omp simd reduction(+ : dot)
          for (int64_t c = 0; c < d; ++c) dot += q[c] * k[c];
        }
        s[j - j0] = dot * score_scale;
        if (config.qk_outlier_threshold > 0.0f)
          s[j - j0] += softmax_scale * sparse_score(q_outliers, ops.k.row_outliers(b, j, hk),
                                                    ops.q_bf16.data() + p.q_offset(b, i, h),
                                                    ops.k_bf16.data() + p.kv_offset(b, j, hk));
        // A NaN score must not pass for "nothing visible": keep it as the max so the row turns NaN.
        block_max = std::isnan(s[j - j0]) ? s[j - j0] : std::max(block_max, s[j - j0]);
      }
      if (block_max == -INFINITY) continue;  // no visible key in this tile: nothing to add, no rescale
      // FA2 Alg. 1 line 9: O *= exp(m_old - m_new); the same multiply moves acc to this tile's V descale.
      const float v_descale = ops.v.tile_descale(b, hk, j0);
      const float rescale = state.raise_max(block_max) * (acc_v_descale / v_descale);
      acc_v_descale = v_descale;
      for (int64_t c = 0; c < d; ++c) acc[c] *= rescale;
      // O += P8 V8 a group of kWgmmaK keys at a time: one P V wgmma k-step of the kernel (fp8_v_key reorders
      // keys only within a group, which a block's sum does not see).
      for (int64_t g0 = j0; g0 < j1; g0 += kWgmmaK) {
        float weight[kWgmmaK], p8[kWgmmaK];
        int64_t key[kWgmmaK];
        int visible = 0;
        for (int64_t j = g0; j < std::min(g0 + kWgmmaK, j1); ++j) {
          if (s[j - j0] == -INFINITY) continue;  // masked: weight 0 (and a NaN in its V must not leak in)
          weight[visible] = state.weight(s[j - j0]);
          state.add(weight[visible]);  // l sums the fp32 P, as FA3 does
          // P in [0, 1] scaled by 2^8 and cast to e4m3 for the P V tensor-core product.
          const float scaled = weight[visible] * config.p_scale;
          p8[visible] = config.round_p ? round_to_e4m3(scaled) : scaled;
          key[visible++] = j;
        }
        for (int64_t c = 0; c < d; ++c) {
          float v[kWgmmaK];
          for (int t = 0; t < visible; ++t) v[t] = ops.v.row(b, key[t], hk)[c];
          if (tensor_core_pv) {
            acc[c] = e4m3_block_sum(p8, v, visible, acc[c]);
          } else {
            for (int t = 0; t < visible; ++t) acc[c] += p8[t] * v[t];
          }
        }
        // Extracted V entries: O += P v in fp32, in acc's units (V descale and 2^8 of P).
        for (int t = 0; t < visible; ++t)
          for (const Outlier& outlier : ops.v.row_outliers(b, key[t], hk))
            acc[outlier.channel] += weight[t] * outlier.value * (config.p_scale / v_descale);
      }
    }
    // Epilogue: undo the V descale and the 2^8 of P, divide by l (FA2 Alg. 1 line 12), round to bf16.
    const float undo = acc_v_descale / config.p_scale;
    for (int64_t c = 0; c < d; ++c) acc[c] *= undo;
    state.finalize(acc.data(), o.data(), d);
    float* out_row = out.o_row(p, b, i, h);
    for (int64_t c = 0; c < d; ++c) out_row[c] = round_to_bf16(o[c]);
    const float lse = state.lse();
    out.lse_at(p, b, h, i) =
        lse == -INFINITY ? lse : lse + ops.lse_shift[(b * p.heads_q + h) * p.seqlen_q + i];
  }
}

// Allocates an operand with its inputs rounded to bf16 (the format the kernel's entry point takes).
Fp8Tensor bf16_copy(const HostTensor& input, int64_t seqlen, int64_t heads, int64_t head_dim, int64_t block,
                    int64_t batch) {
  Fp8Tensor t{.values = input.data, .seqlen = seqlen, .heads = heads, .head_dim = head_dim, .block = block};
  for (float& x : t.values) x = round_to_bf16(x);
  t.tiles = (seqlen + block - 1) / block;
  t.outliers.resize(static_cast<size_t>(batch * seqlen * heads));
  t.descale.assign(static_cast<size_t>(std::max<int64_t>(1, batch * heads * t.tiles)), 1.0f);
  return t;
}

// Quantizes the valid rows (those below `valid(b)`) of every (batch, head) in place: finds each tile's amax
// (or one amax over the whole tensor), sets its descale and casts value / descale to e4m3. Padded rows are
// never read and take no part in the scales. Non-finite entries are left out of amax so that one of them
// cannot zero a whole tile; NaN stays NaN through the cast.
template <typename ValidRows>
void quantize(Fp8Tensor& t, int64_t batch, ValidRows valid, Fp8Scaling scaling) {
  const int64_t d = t.head_dim;
  auto tile_amax = [&](int64_t b, int64_t h, int64_t tile) {
    float amax = 0.0f;
    for (int64_t s = tile * t.block; s < std::min((tile + 1) * t.block, valid(b)); ++s)
      for (int64_t c = 0; c < d; ++c) {
        const float x = t.row(b, s, h)[c];
        if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
      }
    return amax;
  };
  if (t.outlier_threshold > 0.0f) {
    // Outlier extraction: entries beyond `threshold` times their tile's RMS leave the fp8 tensor for a sparse
    // list kept in bf16, so the fp8 grid only has to cover the bulk of the tile (LLM.int8's decomposition).
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < t.heads; ++h)
        for (int64_t tile = 0; tile < t.tiles; ++tile) {
          const int64_t s0 = tile * t.block, s1 = std::min((tile + 1) * t.block, valid(b));
          double square_sum = 0.0;
          int64_t count = 0;
          for (int64_t s = s0; s < s1; ++s)
            for (int64_t c = 0; c < d; ++c) {
              const float x = t.row(b, s, h)[c];
              if (std::isfinite(x)) square_sum += double(x) * x, ++count;
            }
          const float limit =
              t.outlier_threshold * static_cast<float>(std::sqrt(square_sum / std::max<int64_t>(count, 1)));
          for (int64_t s = s0; s < s1; ++s) {
            float* x = t.values.data() + bshd_offset(b, s, h, t.seqlen, t.heads, d);
            for (int64_t c = 0; c < d; ++c)
              if (std::isfinite(x[c]) && std::fabs(x[c]) > limit) {
                t.outliers[(b * t.seqlen + s) * t.heads + h].push_back({static_cast<int32_t>(c), x[c]});
                x[c] = 0.0f;
              }
          }
        }
  }
  float tensor_amax = 0.0f;
  if (scaling == Fp8Scaling::per_tensor)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < t.heads; ++h)
        for (int64_t tile = 0; tile < t.tiles; ++tile)
          tensor_amax = std::max(tensor_amax, tile_amax(b, h, tile));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < t.heads; ++h)
      for (int64_t tile = 0; tile < t.tiles; ++tile) {
        const float amax = scaling == Fp8Scaling::per_tensor ? tensor_amax : tile_amax(b, h, tile);
        const float descale = e4m3_descale(amax);
        t.descale[(b * t.heads + h) * t.tiles + tile] = descale;
        for (int64_t s = tile * t.block; s < std::min((tile + 1) * t.block, t.seqlen); ++s) {
          float* x = t.values.data() + bshd_offset(b, s, h, t.seqlen, t.heads, d);
          for (int64_t c = 0; c < d; ++c)
            x[c] = s < valid(b) ? (t.keep_fp32 ? x[c] / descale : round_to_e4m3(x[c] / descale)) : 0.0f;
        }
      }
}

Fp8Operands quantization_prepass(const Problem& p, const AttentionInputs& in, const Fp8Config& config) {
  const int64_t d = p.head_dim;
  Fp8Operands ops{
      .q = bf16_copy(in.q, p.seqlen_q, p.heads_q, d, config.block_q, p.batch),
      .k = bf16_copy(in.k, p.seqlen_k, p.heads_kv, d, config.block_k, p.batch),
      .v = bf16_copy(in.v, p.seqlen_k, p.heads_kv, d, config.block_k, p.batch),
      .lse_shift = std::vector<float>(static_cast<size_t>(p.lse_elements()), 0.0f),
  };
  if (config.smooth_k) {
    // K <- K - mean_j K_j per (batch, kv head) over its valid keys; each score of row i drops by
    // scale * q_i . mean, the same for every key of the row, which the LSE gets back.
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
        const int64_t keys = p.rows_k(b);
        if (keys == 0) continue;
        // Over finite entries only: a NaN key must reach the rows that see it (as in the reference), not
        // every row through the mean.
        // The sums run in chunks of kFp8MeanChunk keys, each chunk's in key order, then the chunks' in chunk
        // order: the GPU pre-pass sums many chunks at once, in this order (fp8_prepass.hpp).
        std::vector<double> sum(static_cast<size_t>(d), 0.0), count(static_cast<size_t>(d), 0.0);
        for (int64_t j0 = 0; j0 < keys; j0 += kFp8MeanChunk) {
          std::vector<double> chunk(static_cast<size_t>(d), 0.0);
          for (int64_t j = j0; j < std::min(j0 + kFp8MeanChunk, keys); ++j)
            for (int64_t c = 0; c < d; ++c)
              if (const float x = ops.k.row(b, j, hk)[c]; std::isfinite(x)) chunk[c] += x, count[c] += 1.0;
          for (int64_t c = 0; c < d; ++c) sum[c] += chunk[c];
        }
        std::vector<float> mean(static_cast<size_t>(d), 0.0f);
        for (int64_t c = 0; c < d; ++c)
          if (count[c] > 0.0) mean[c] = static_cast<float>(sum[c] / count[c]);
        for (int64_t j = 0; j < keys; ++j) {
          float* k = ops.k.values.data() + p.kv_offset(b, j, hk);
          for (int64_t c = 0; c < d; ++c) k[c] -= mean[c];
        }
        for (int64_t h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h)
          for (int64_t i = 0; i < p.rows_q(b); ++i) {
            double shift = 0.0;
            for (int64_t c = 0; c < d; ++c) shift += static_cast<double>(ops.q.row(b, i, h)[c]) * mean[c];
            ops.lse_shift[(b * p.heads_q + h) * p.seqlen_q + i] =
                static_cast<float>(shift * p.softmax_scale());
          }
      }
  }
  if (config.hadamard && RandomHadamard::why_unsupported(d).empty()) {
    // Incoherent processing: Q M and K M leave every score unchanged (M orthogonal) and spread outliers.
    const RandomHadamard transform(d, config.hadamard_seed);
    for (std::vector<float>* values : {&ops.q.values, &ops.k.values}) {
      const int64_t rows = static_cast<int64_t>(values->size()) / d;
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) transform.apply(values->data() + r * d);
    }
  }
  if (config.qk_outlier_threshold > 0.0f) ops.q_bf16 = ops.q.values, ops.k_bf16 = ops.k.values;
  ops.q.keep_fp32 = ops.k.keep_fp32 = !config.quantize_qk;
  ops.v.keep_fp32 = !config.quantize_v;
  ops.q.outlier_threshold = ops.k.outlier_threshold = config.qk_outlier_threshold;
  ops.v.outlier_threshold = config.v_outlier_threshold;
  quantize(
      ops.q, p.batch, [&](int64_t b) { return p.rows_q(b); }, config.scaling);
  quantize(
      ops.k, p.batch, [&](int64_t b) { return p.rows_k(b); }, config.scaling);
  quantize(
      ops.v, p.batch, [&](int64_t b) { return p.rows_k(b); }, config.scaling);
  return ops;
}

}  // namespace

Fp8Config fa3_fp8_config(int64_t head_dim) {
  Fp8Config config;
  if (head_dim <= 64) {
    config.block_q = 192, config.block_k = 160;
  } else if (head_dim <= 128) {
    config.block_q = 128, config.block_k = 224;
  } else {
    config.block_q = 128, config.block_k = 128;
  }
  return config;
}

Fp8Config registered_fp8_config(int64_t head_dim) {
  Fp8Config config = fa3_fp8_config(head_dim);
  config.smooth_k = true;
  return config;
}

std::string why_invalid(const Fp8Config& config) {
  if (config.block_q < 1) return "block_q (" + std::to_string(config.block_q) + ") must be >= 1";
  if (config.block_k < 1) return "block_k (" + std::to_string(config.block_k) + ") must be >= 1";
  if (config.qk_outlier_threshold < 0.0f || config.v_outlier_threshold < 0.0f)
    return "qk_outlier_threshold and v_outlier_threshold must be >= 0 (0 = off)";
  if (config.qk_outlier_threshold > 0.0f && config.hadamard)
    return "qk_outlier_threshold needs hadamard off: the sparse score terms are in the original basis";
  // P * p_scale must stay within e4m3's 448 (P <= 1) and be a power of two so that undoing it is exact.
  int exponent = 0;
  const bool power_of_two = std::frexp(config.p_scale, &exponent) == 0.5f;
  if (!(config.p_scale > 0.0f) || !power_of_two || config.p_scale > 256.0f)
    return "p_scale (" + std::to_string(config.p_scale) + ") must be a power of two in (0, 256]";
  return "";
}

Fp8Prepass fp8_prepass(const Problem& p, const AttentionInputs& in, const Fp8Config& config) {
  if (const std::string reason = why_invalid(config); !reason.empty()) fail(reason);
  if (config.qk_outlier_threshold > 0.0f || config.v_outlier_threshold > 0.0f)
    fail(
        "qk_outlier_threshold and v_outlier_threshold must be 0 for fp8_prepass: its operands have no sparse "
        "part");
  Fp8Operands ops = quantization_prepass(p, in, config);
  return Fp8Prepass{.q = std::move(ops.q.values),
                    .k = std::move(ops.k.values),
                    .v = std::move(ops.v.values),
                    .q_descale = std::move(ops.q.descale),
                    .k_descale = std::move(ops.k.descale),
                    .v_descale = std::move(ops.v.descale),
                    .lse_shift = std::move(ops.lse_shift)};
}

void fp8_emulated_attention(const Problem& p, const AttentionInputs& in, AttentionOutputs& out,
                            const Fp8Config& config) {
  if (const std::string reason = why_invalid(config); !reason.empty()) fail(reason);
  const Fp8Operands ops = quantization_prepass(p, in, config);
  const int64_t tiles_q = (p.seqlen_q + config.block_q - 1) / config.block_q;
#pragma omp parallel for collapse(3) schedule(dynamic)
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t t = 0; t < tiles_q; ++t)
        attend_rows(p, ops, config, b, h, t * config.block_q, std::min((t + 1) * config.block_q, p.seqlen_q),
                    out);
}

namespace {

const Registration fp8_emulated{{
    .name = "cuda_v3_hopper/fp8_emulated",
    .summary = "FA3's FP8 pass emulated exactly: Hadamard, per-tile e4m3 scales, P * 2^8 in e4m3, bf16 out",
    .device = Device::cpu,
    .dtypes = {DType::e4m3},
    .constraints = "any shape, every mask; Hadamard only for power-of-two head_dim; FA3 fp8 tile sizes",
    .rounds_p = true,
    .forward =
        [](const Problem& p, const AttentionInputs& in, AttentionOutputs& out) {
          fp8_emulated_attention(p, in, out, registered_fp8_config(p.head_dim));
        },
}};

}  // namespace

}  // namespace flashlab::hopper
