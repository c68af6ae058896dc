#include "common/problem.hpp"

#include <cmath>
#include <exception>
#include <limits>
#include <sstream>
#include <string>

#include "common/error.hpp"

namespace flashlab {

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::e4m3:
      return "e4m3";
  }
  return "?";
}

DType parse_dtype(std::string_view text) {
  if (text == "f32" || text == "fp32" || text == "float32") return DType::f32;
  if (text == "f16" || text == "fp16" || text == "float16") return DType::f16;
  if (text == "bf16" || text == "bfloat16") return DType::bf16;
  if (text == "e4m3" || text == "fp8" || text == "fp8_e4m3") return DType::e4m3;
  fail("dtype '", text, "' is not one of f32, f16, bf16, e4m3");
}

void Problem::validate() const {
  auto positive = [](const char* field, int64_t value) {
    if (value < 1) fail(field, " (", value, ") must be >= 1");
  };
  positive("batch", batch);
  positive("heads_q", heads_q);
  positive("heads_kv", heads_kv);
  positive("seqlen_q", seqlen_q);
  positive("head_dim", head_dim);
  if (seqlen_k < 0) fail("seqlen_k (", seqlen_k, ") must be >= 0");
  if (heads_q % heads_kv != 0)
    fail("heads_q (", heads_q, ") must be a multiple of heads_kv (", heads_kv, ")");
  if (scale && !std::isfinite(*scale)) fail("scale (", *scale, ") must be finite");
  if (window_left < -1) fail("window_left (", window_left, ") must be >= 0, or -1 for unbounded");
  if (window_right < -1) fail("window_right (", window_right, ") must be >= 0, or -1 for unbounded");
  auto check_lengths = [&](const char* field, const std::vector<int64_t>& lengths, int64_t max,
                           const char* bound) {
    if (lengths.empty()) return;
    if (static_cast<int64_t>(lengths.size()) != batch)
      fail(field, " has ", lengths.size(), " entries but batch is ", batch);
    for (size_t b = 0; b < lengths.size(); ++b)
      if (lengths[b] < 0 || lengths[b] > max)
        fail(field, "[", b, "] (", lengths[b], ") must be in [0, ", bound, " = ", max, "]");
  };
  check_lengths("seqlens_q", seqlens_q, seqlen_q, "seqlen_q");
  check_lengths("seqlens_k", seqlens_k, seqlen_k, "seqlen_k");
  auto check_cumulative = [&](const char* field, const std::vector<int64_t>& cu, int64_t max,
                              const char* bound, const std::vector<int64_t>& seqlens,
                              const char* seqlens_field) {
    if (cu.empty()) return;
    if (!seqlens.empty())
      fail(field, " and ", seqlens_field, " exclude each other: packed sequences have no padding");
    if (static_cast<int64_t>(cu.size()) != batch + 1)
      fail(field, " has ", cu.size(), " entries but must have batch + 1 = ", batch + 1);
    if (cu[0] != 0) fail(field, "[0] (", cu[0], ") must be 0");
    for (size_t b = 1; b < cu.size(); ++b) {
      if (cu[b] < cu[b - 1])
        fail(field, " must not decrease: ", field, "[", b, "] (", cu[b], ") < ", field, "[", b - 1, "] (",
             cu[b - 1], ")");
      if (cu[b] - cu[b - 1] > max)
        fail(field, ": sequence ", b - 1, " has ", cu[b] - cu[b - 1], " tokens, more than ", bound, " (", max,
             ")");
    }
  };
  if (cu_seqlens_q.empty() != cu_seqlens_k.empty())
    fail(cu_seqlens_q.empty() ? "cu_seqlens_q" : "cu_seqlens_k", " is missing: packed batches need both ",
         "cu_seqlens_q and cu_seqlens_k");
  check_cumulative("cu_seqlens_q", cu_seqlens_q, seqlen_q, "seqlen_q", seqlens_q, "seqlens_q");
  check_cumulative("cu_seqlens_k", cu_seqlens_k, seqlen_k, "seqlen_k", seqlens_k, "seqlens_k");
  if (packed() && page_size > 0)
    fail("page_size (", page_size, ") does not combine with packed batches (cu_seqlens_q/k)");
  if (mask && static_cast<int64_t>(mask->size()) != seqlen_q * seqlen_k)
    fail("mask has ", mask->size(), " entries but must be [seqlen_q, seqlen_k] = [", seqlen_q, ", ", seqlen_k,
         "]");
  if (page_size < 0) fail("page_size (", page_size, ") must be >= 1, or 0 for contiguous K/V");
  if (!(softcap >= 0.0) || !std::isfinite(softcap))
    fail("softcap (", softcap, ") must be a positive number, or 0 for none");
  if (bias) {
    if (bias_batch != 1 && bias_batch != batch)
      fail("bias batch extent (", bias_batch, ") must be 1 or batch (", batch, ")");
    if (bias_heads != 1 && bias_heads != heads_q)
      fail("bias heads extent (", bias_heads, ") must be 1 or heads_q (", heads_q, ")");
    if (static_cast<int64_t>(bias->size()) != bias_batch * bias_heads * seqlen_q * seqlen_k)
      fail("bias has ", bias->size(), " entries but must be [", bias_batch, ", ", bias_heads,
           ", seqlen_q, seqlen_k] = ", bias_batch * bias_heads * seqlen_q * seqlen_k);
    for (const float x : *bias)
      if (std::isnan(x) || x == std::numeric_limits<float>::infinity())
        fail("bias holds ", x, ": its entries must be finite or -inf");
  }
  if (!(dropout_p >= 0.0 && dropout_p < 1.0)) fail("dropout_p (", dropout_p, ") must be in [0, 1)");
  if (!alibi_slopes.empty() && static_cast<int64_t>(alibi_slopes.size()) != heads_q)
    fail("alibi_slopes has ", alibi_slopes.size(), " entries but heads_q is ", heads_q,
         " (one slope per query head)");
  for (size_t h = 0; h < alibi_slopes.size(); ++h)
    if (!std::isfinite(alibi_slopes[h])) fail("alibi_slopes[", h, "] (", alibi_slopes[h], ") must be finite");
}

std::vector<int64_t> Problem::q_shape() const {
  if (packed()) return {tokens_q(), heads_q, head_dim};
  return {batch, seqlen_q, heads_q, head_dim};
}

std::vector<int64_t> Problem::kv_shape() const {
  if (packed()) return {tokens_k(), heads_kv, head_dim};
  return {batch, seqlen_k, heads_kv, head_dim};
}

std::vector<int64_t> Problem::lse_shape() const {
  if (packed()) return {heads_q, tokens_q()};
  return {batch, heads_q, seqlen_q};
}

double Problem::softmax_scale() const {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

std::string Problem::describe() const {
  std::ostringstream out;
  out << "b=" << batch << " h=" << heads_q << "/" << heads_kv << " sq=" << seqlen_q << " sk=" << seqlen_k
      << " d=" << head_dim;
  if (causal) out << " causal";
  if (window_left >= 0 || window_right >= 0) out << " window=(" << window_left << "," << window_right << ")";
  if (!seqlens_q.empty()) out << " ragged-q";
  if (!seqlens_k.empty()) out << " ragged-k";
  if (packed()) out << " packed=" << tokens_q() << "/" << tokens_k();
  if (mask) out << " mask";
  if (page_size > 0) out << " page=" << page_size;
  if (softcap > 0.0) out << " softcap=" << softcap;
  if (!alibi_slopes.empty()) out << " alibi";
  if (bias) out << " bias";
  if (dropout_p > 0.0) out << " dropout=" << dropout_p << "/" << dropout_seed;
  out << " " << to_string(dtype);
  return out.str();
}

namespace {

// "a,b,c" split at the commas, each item parsed by `parse` (which sets `used` to the characters it read);
// throws Error naming `field` and the item when one is not entirely a `what`.
template <typename T, typename Parse>
std::vector<T> parse_list(std::string_view text, std::string_view field, const char* what, Parse parse) {
  std::vector<T> values;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string item(text.substr(start, comma - start));
    size_t used = 0;
    T value{};
    try {
      value = parse(item, used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size()) fail(field, " entry '", item, "' is not ", what);
    values.push_back(value);
    start = comma + 1;
  }
  return values;
}

}  // namespace

std::vector<int64_t> parse_lengths(std::string_view text, std::string_view field) {
  return parse_list<int64_t>(text, field, "an integer",
                             [](const std::string& item, size_t& used) { return std::stoll(item, &used); });
}

std::vector<double> parse_numbers(std::string_view text, std::string_view field) {
  return parse_list<double>(text, field, "a finite number", [](const std::string& item, size_t& used) {
    const double value = std::stod(item, &used);
    if (!std::isfinite(value)) used = 0;
    return value;
  });
}

}  // namespace flashlab
