#include "common/tolerance.hpp"

#include <cmath>
#include <limits>
#include <optional>
#include <sstream>

#include "common/dropout.hpp"
#include "common/error.hpp"
#include "common/mask.hpp"
#include "common/number_format.hpp"
#include "common/score_mod.hpp"

namespace flashlab {

double tolerance_floor(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 2e-5;
    case DType::f16:
      return 1e-4;
    case DType::bf16:
      return 1e-3;
    case DType::e4m3:
      // A quarter of the format's unit roundoff, the rule the other floors follow (bf16: 2^-8 / 4 ~ 1e-3,
      // fp16: 2^-11 / 4 ~ 1e-4): e4m3's is 2^-4 / 4 = 2^-6. One fp8 score on unit inputs is already off by
      // about that much, so a case whose error rests on a single score (a row that sees one key) needs it.
      return 0x1p-6;
  }
  return 0.0;
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// |x - ref| / max(1, |ref|), with the special values handled exactly: NaN must match NaN, -inf must match
// -inf.
double element_error(double x, double ref) {
  if (std::isnan(ref) || std::isnan(x)) return std::isnan(ref) && std::isnan(x) ? 0.0 : kInf;
  if (std::isinf(ref) || std::isinf(x)) return x == ref ? 0.0 : kInf;
  return std::fabs(x - ref) / std::max(1.0, std::fabs(ref));
}

std::string describe_element(const char* tensor, const std::string& where, double x, double ref) {
  std::ostringstream out;
  out.precision(7);
  out << tensor << "[" << where << "] = " << x << " but the reference is " << ref;
  return out.str();
}

}  // namespace

Deviation deviation(const Problem& p, const AttentionOutputs& out, const ReferenceResult& ref,
                    const Tolerance* tolerance) {
  Deviation result;
  // Tracks the largest error and, when a tolerance is given, the first element (in memory order) beyond it.
  auto visit = [](double err, double limit, double& max_err, std::string& worst, std::string& first,
                  auto describe) {
    if (err > max_err || (std::isinf(err) && worst.empty())) {
      max_err = err;
      worst = describe();
    }
    if (err > limit && first.empty()) first = describe();
  };
  const double limit_o = tolerance ? tolerance->o : kInf, limit_lse = tolerance ? tolerance->lse : kInf;
  const int64_t d = p.head_dim;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t i = 0; i < p.stored_rows_q(b); ++i)
      for (int64_t h = 0; h < p.heads_q; ++h) {
        const int64_t base = p.q_offset(b, i, h);
        for (int64_t c = 0; c < d; ++c) {
          const double x = out.o.data[base + c], r = ref.o[base + c];
          visit(element_error(x, r), limit_o, result.max_err_o, result.worst_o, result.first_o, [&] {
            return describe_element("O",
                                    "b=" + std::to_string(b) + ", i=" + std::to_string(i) +
                                        ", h=" + std::to_string(h) + ", c=" + std::to_string(c),
                                    x, r);
          });
        }
      }
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.stored_rows_q(b); ++i) {
        const int64_t index = p.lse_offset(b, h, i);
        const double x = out.lse.data[index], r = ref.lse[index];
        visit(element_error(x, r), limit_lse, result.max_err_lse, result.worst_lse, result.first_lse, [&] {
          return describe_element(
              "LSE", "b=" + std::to_string(b) + ", h=" + std::to_string(h) + ", i=" + std::to_string(i), x,
              r);
        });
      }
  return result;
}

namespace {

// FlashAttention-3's scale for P before its e4m3 cast: P = exp(s - m) lies in [0, 1], and 2^8 moves it up to
// [0, 256] so that small probabilities stay above e4m3's subnormal range (its largest finite value is 448). A
// power of two, so the scaling itself is exact. cuda_v3_hopper/fp8_emulated uses the same default.
constexpr float kFp8PScale = 256.0f;

// The per-tensor fp8 inputs of the e4m3 baseline (FA3 Table 3's "baseline FP8"): one scale for the whole
// tensor, the dequantized values e4m3(x / descale) * descale kept as float. Non-finite entries take no part
// in amax so that one of them does not zero every other entry; NaN stays NaN through the cast.
HostTensor quantize_per_tensor_e4m3(const HostTensor& tensor) {
  float amax = 0.0f;
  for (float x : tensor.data)
    if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
  const float descale = e4m3_descale(amax);
  HostTensor quantized = tensor;
  for (float& x : quantized.data) x = round_to_e4m3(x / descale) * descale;
  return quantized;
}

}  // namespace

// The baselines' score row, in float from inputs rounded by `rounded`: s[j] = scale q_i . k_j over the keys
// row i sees (with the problem's score modifications, common/score_mod.hpp), -inf for the others. Returns the
// row max: NaN when a score is NaN (it poisons its row), -inf for a fully masked row.
template <class Round>
float baseline_score_row(const Problem& p, const AttentionInputs& in, const Visibility& visibility, int64_t b,
                         int64_t i, int64_t h, Round rounded, float* s) {
  const int64_t d = p.head_dim, hk = p.kv_head(h);
  const float scale = static_cast<float>(p.softmax_scale());
  const ScoreMod mod(p);
  const float* q = in.q_row(p, b, i, h);
  float row_max = -INFINITY;
  for (int64_t j = 0; j < p.seqlen_k; ++j) {
    if (!visibility.visible(b, i, j)) {
      s[j] = -INFINITY;
      continue;
    }
    const float* k = in.k_row(p, b, j, hk);
    float dot = 0.0f;
    for (int64_t c = 0; c < d; ++c) dot += rounded(q[c]) * rounded(k[c]);
    s[j] = mod.apply(dot * scale, b, h, i, j);
    row_max = std::isnan(s[j]) ? s[j] : std::max(row_max, s[j]);
  }
  return row_max;
}

// f32/f16/bf16: inputs, P (when the kernel rounds it) and O rounded to the dtype.
// e4m3: inputs quantized to fp8 with one scale per tensor, P scaled by 2^8 and rounded to e4m3 (when the
// kernel rounds it, as every fp8 tensor-core kernel must), O rounded to bf16, the output format of fp8
// kernels.
AttentionOutputs baseline_attention(const Problem& p, const AttentionInputs& given, DType dtype,
                                    bool rounds_p) {
  const bool fp8 = dtype == DType::e4m3;
  AttentionInputs quantized;
  if (fp8)
    quantized = {quantize_per_tensor_e4m3(given.q), quantize_per_tensor_e4m3(given.k),
                 quantize_per_tensor_e4m3(given.v)};
  const AttentionInputs& in = fp8 ? quantized : given;
  const Visibility visibility(p);
  const Dropout dropout(p);
  const int64_t d = p.head_dim;
  AttentionOutputs out = AttentionOutputs::poisoned(p);
  auto rounded = [dtype, fp8](float x) { return fp8 ? x : round_to(dtype, x); };  // inputs already quantized
  auto rounded_p = [dtype, fp8](float x) {
    return fp8 ? round_to_e4m3(x * kFp8PScale) / kFp8PScale : round_to(dtype, x);
  };
  auto rounded_o = [dtype](float x) { return round_to(dtype, x); };  // bf16 for e4m3

#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = p.kv_head(h);
      std::vector<float> s(static_cast<size_t>(p.seqlen_k));
      std::vector<float> acc(static_cast<size_t>(d));
      for (int64_t i = 0; i < p.stored_rows_q(b); ++i) {
        const float row_max = baseline_score_row(p, in, visibility, b, i, h, rounded, s.data());
        float* o = out.o_row(p, b, i, h);
        if (row_max == -INFINITY) {  // fully masked row
          for (int64_t c = 0; c < d; ++c) o[c] = 0.0f;
          out.lse_at(p, b, h, i) = -INFINITY;
          continue;
        }
        float row_sum = 0.0f;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j < p.seqlen_k; ++j) {
          if (s[j] == -INFINITY) continue;
          const float weight = std::exp(s[j] - row_max);
          row_sum += weight;
          const float p_used = (rounds_p ? rounded_p(weight) : weight) * dropout.factor<float>(b, h, i, j);
          const float* v = in.v_row(p, b, j, hk);
          for (int64_t c = 0; c < d; ++c) acc[c] += p_used * rounded(v[c]);
        }
        for (int64_t c = 0; c < d; ++c) o[c] = rounded_o(acc[c] / row_sum);
        out.lse_at(p, b, h, i) = row_max + std::log(row_sum);
      }
    }
  return out;
}

Tolerance tolerance_from_baseline(DType dtype, const Deviation& baseline) {
  const double floor = tolerance_floor(dtype);
  return {2.0 * baseline.max_err_o + floor, 2.0 * baseline.max_err_lse + floor};
}

Verdict judge(const Problem& p, const AttentionOutputs& out, const ReferenceResult& ref,
              const Tolerance& tol) {
  return {deviation(p, out, ref, &tol), tol};
}

std::string Verdict::explain() const {
  std::ostringstream text;
  text.precision(3);
  text << "max error O " << deviation.max_err_o << " (tolerance " << tolerance.o << "), LSE "
       << deviation.max_err_lse << " (tolerance " << tolerance.lse << ")";
  if (deviation.max_err_o > tolerance.o)
    text << "\n  first wrong: " << deviation.first_o << "\n  worst:       " << deviation.worst_o;
  if (deviation.max_err_lse > tolerance.lse)
    text << "\n  first wrong: " << deviation.first_lse << "\n  worst:       " << deviation.worst_lse;
  return text.str();
}

// ---- Gradients

namespace {

// max_err over one gradient: Q's layout, or with `keys` K's and V's; `row` names the sequence index (i or j).
// `first` receives the first element (memory order) whose error exceeds `limit`.
double tensor_deviation(const char* tensor, const char* row, const std::vector<float>& x,
                        const std::vector<double>& ref, const Problem& p, bool keys, double limit,
                        std::string& worst, std::string& first) {
  double max_err = 0.0;
  const int64_t heads = keys ? p.heads_kv : p.heads_q, head_dim = p.head_dim;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s = 0; s < (keys ? p.stored_rows_k(b) : p.stored_rows_q(b)); ++s)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = keys ? p.kv_offset(b, s, h) : p.q_offset(b, s, h);
        for (int64_t c = 0; c < head_dim; ++c) {
          const double err = element_error(x[base + c], ref[base + c]);
          auto describe = [&] {
            return describe_element(tensor,
                                    "b=" + std::to_string(b) + ", " + row + "=" + std::to_string(s) +
                                        ", h=" + std::to_string(h) + ", c=" + std::to_string(c),
                                    x[base + c], ref[base + c]);
          };
          if (err > max_err || (std::isinf(err) && worst.empty())) {
            max_err = err;
            worst = describe();
          }
          if (err > limit && first.empty()) first = describe();
        }
      }
  return max_err;
}

}  // namespace

GradientDeviation gradient_deviation(const Problem& p, const AttentionGradients& grad,
                                     const ReferenceGradients& ref, const GradientTolerance* tolerance) {
  GradientDeviation result;
  result.max_err_dq = tensor_deviation("dQ", "i", grad.dq.data, ref.dq, p, false,
                                       tolerance ? tolerance->dq : kInf, result.worst_dq, result.first_dq);
  result.max_err_dk = tensor_deviation("dK", "j", grad.dk.data, ref.dk, p, true,
                                       tolerance ? tolerance->dk : kInf, result.worst_dk, result.first_dk);
  result.max_err_dv = tensor_deviation("dV", "j", grad.dv.data, ref.dv, p, true,
                                       tolerance ? tolerance->dv : kInf, result.worst_dv, result.first_dv);
  return result;
}

AttentionGradients baseline_backward(const Problem& p, const AttentionInputs& in, const HostTensor& d_out,
                                     DType dtype, bool rounds_p) {
  if (dtype == DType::e4m3) fail("dtype e4m3 has no naive backward baseline");
  const Visibility visibility(p);
  const int64_t d = p.head_dim;
  const float scale = static_cast<float>(p.softmax_scale());
  const ScoreMod mod(p);
  const Dropout dropout(p);
  AttentionGradients grad = AttentionGradients::poisoned(p);
  std::fill(grad.dk.data.begin(), grad.dk.data.end(), 0.0f);
  std::fill(grad.dv.data.begin(), grad.dv.data.end(), 0.0f);
  auto rounded = [dtype](float x) { return round_to(dtype, x); };

  // The O that D reads: for an implementation that rounds P (a tensor-core forward), that forward's O as the
  // forward's baseline models it (P rounded for P V, normalized at the end, O rounded to the dtype), whose
  // rounding D inherits; otherwise the O of the same P as dP below (O = V where a row is one-hot, so that
  // dP - D cancels as it does in exact arithmetic).
  std::optional<AttentionOutputs> forward;
  if (rounds_p) forward = baseline_attention(p, in, dtype, true);

    // One task per (batch, kv head), which owns that head's dK and dV (GQA: the group's query heads add in).

#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      std::vector<float> s(static_cast<size_t>(p.seqlen_k)), own_o(static_cast<size_t>(d));
      for (int64_t h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h)
        for (int64_t i = 0; i < p.stored_rows_q(b); ++i) {
          const float* q = in.q_row(p, b, i, h);
          const float* dout = d_out.ptr() + p.q_offset(b, i, h);
          float* dq = grad.dq.ptr() + p.q_offset(b, i, h);
          std::fill(dq, dq + d, 0.0f);
          const float row_max = baseline_score_row(p, in, visibility, b, i, h, rounded, s.data());
          if (row_max == -INFINITY) continue;  // fully masked row: dQ = 0, nothing added to dK or dV
          float row_sum = 0.0f;
          for (int64_t j = 0; j < p.seqlen_k; ++j)
            if (s[j] != -INFINITY) row_sum += std::exp(s[j] - row_max);
          const float lse = row_max + std::log(row_sum);
          const float* o = own_o.data();
          if (forward) {
            o = forward->o_row(p, b, i, h);
          } else {
            std::fill(own_o.begin(), own_o.end(), 0.0f);
            for (int64_t j = 0; j < p.seqlen_k; ++j) {  // O = P V with P = exp(S - LSE)
              if (s[j] == -INFINITY) continue;
              const float* v = in.v_row(p, b, j, hk);
              const float weight = std::exp(s[j] - lse) * dropout.factor<float>(b, h, i, j);
              for (int64_t c = 0; c < d; ++c) own_o[c] += weight * rounded(v[c]);
            }
          }
          float D = 0.0f;  // D_i = dO_i . O_i
          for (int64_t c = 0; c < d; ++c) D += rounded(dout[c]) * o[c];
          for (int64_t j = 0; j < p.seqlen_k; ++j) {
            if (s[j] == -INFINITY) continue;  // a hidden key takes no part
            const float* k = in.k_row(p, b, j, hk);
            const float* v = in.v_row(p, b, j, hk);
            const float weight = std::exp(s[j] - lse);
            float dP = 0.0f;  // dP_ij = dO_i . v_j
            for (int64_t c = 0; c < d; ++c) dP += rounded(dout[c]) * rounded(v[c]);
            const float z = dropout.factor<float>(b, h, i, j);  // dropout's mask, recomputed
            dP *= z;
            float dS = scale * weight * (dP - D) * mod.derivative(s[j], b, h, i, j);
            float p_used = weight * z;  // P (with dropout's mask) as it enters dV = (P Z)^T dO
            if (rounds_p) {
              dS = rounded(dS);
              p_used = rounded(weight) * z;
            }
            float* dk = grad.dk.ptr() + p.kv_offset(b, j, hk);
            float* dv = grad.dv.ptr() + p.kv_offset(b, j, hk);
            for (int64_t c = 0; c < d; ++c) {
              dv[c] += p_used * rounded(dout[c]);
              dk[c] += dS * rounded(q[c]);
              dq[c] += dS * rounded(k[c]);
            }
          }
        }
    }
  for (auto* tensor : {&grad.dq, &grad.dk, &grad.dv})
    for (float& x : tensor->data) x = rounded(x);
  return grad;
}

GradientTolerance gradient_tolerance_from_baseline(DType dtype, const GradientDeviation& baseline) {
  const double floor = tolerance_floor(dtype);
  return {2.0 * baseline.max_err_dq + floor, 2.0 * baseline.max_err_dk + floor,
          2.0 * baseline.max_err_dv + floor};
}

GradientVerdict judge_gradients(const Problem& p, const AttentionGradients& grad,
                                const ReferenceGradients& ref, const GradientTolerance& tol) {
  return {gradient_deviation(p, grad, ref, &tol), tol};
}

std::string GradientVerdict::explain() const {
  std::ostringstream text;
  text.precision(3);
  text << "max error dQ " << deviation.max_err_dq << " (tolerance " << tolerance.dq << "), dK "
       << deviation.max_err_dk << " (tolerance " << tolerance.dk << "), dV " << deviation.max_err_dv
       << " (tolerance " << tolerance.dv << ")";
  if (deviation.max_err_dq > tolerance.dq)
    text << "\n  first wrong: " << deviation.first_dq << "\n  worst:       " << deviation.worst_dq;
  if (deviation.max_err_dk > tolerance.dk)
    text << "\n  first wrong: " << deviation.first_dk << "\n  worst:       " << deviation.worst_dk;
  if (deviation.max_err_dv > tolerance.dv)
    text << "\n  first wrong: " << deviation.first_dv << "\n  worst:       " << deviation.worst_dv;
  return text.str();
}

}  // namespace flashlab
