#include "common/score_mod.hpp"

#include <cmath>
#include <sstream>

#include "common/dropout.hpp"

namespace flashlab {

ScoreModParams score_mod_params(const Problem& p) {
  ScoreModParams m;
  m.softcap = p.softcap;
  m.slopes = p.alibi_slopes.empty() ? nullptr : p.alibi_slopes.data();
  m.bias = p.bias ? p.bias->data() : nullptr;
  m.bias_batch = p.bias_batch;
  m.bias_heads = p.bias_heads;
  m.seqlen_q = p.seqlen_q;
  m.seqlen_k = p.seqlen_k;
  return m;
}

DropoutParams dropout_params(const Problem& p) {
  DropoutParams d;
  if (p.dropout_p <= 0.0) return d;
  d.p = p.dropout_p;
  d.scale = 1.0 / (1.0 - p.dropout_p);
  d.seed = p.dropout_seed;
  d.threshold = static_cast<uint64_t>(std::ceil(p.dropout_p * 0x1p32));  // exact: a power-of-two scaling
  return d;
}

std::vector<float> alibi_slopes(int64_t heads) {
  const auto power_of_two = [](int64_t n) {
    std::vector<float> slopes;
    const double start = std::exp2(-8.0 / static_cast<double>(n));
    for (int64_t k = 1; k <= n; ++k)
      slopes.push_back(static_cast<float>(std::pow(start, static_cast<double>(k))));
    return slopes;
  };
  if (heads < 1) return {};
  int64_t closest = 1;
  while (closest * 2 <= heads) closest *= 2;
  std::vector<float> slopes = power_of_two(closest);
  if (closest == heads) return slopes;
  const std::vector<float> doubled = power_of_two(2 * closest);
  for (int64_t k = 0; static_cast<int64_t>(slopes.size()) < heads; k += 2)
    slopes.push_back(doubled[static_cast<size_t>(k)]);
  return slopes;
}

std::string score_mod_refusal(const Problem& p, bool supported, const std::string& name) {
  if (supported) return "";
  if (p.softcap > 0.0) {
    std::ostringstream out;
    out << "softcap (" << p.softcap << ") is not supported by " << name;
    return out.str();
  }
  if (!p.alibi_slopes.empty()) return "alibi_slopes (ALiBi) are not supported by " + name;
  if (p.bias) return "bias (an additive score bias) is not supported by " + name;
  return "";
}

std::string dropout_refusal(const Problem& p, bool supported, const std::string& name) {
  if (supported || p.dropout_p <= 0.0) return "";
  std::ostringstream out;
  out << "dropout_p (" << p.dropout_p << ") is not supported by " << name;
  return out.str();
}

}  // namespace flashlab
