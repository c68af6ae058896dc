// The fp64 reference backward against central finite differences of the fp64 forward: with the loss
// L = sum(dO * O), dL/dx ~ (L(x + h) - L(x - h)) / (2h) for every element x of Q, K and V.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>

#include "common/inputs.hpp"
#include "common/reference.hpp"
#include "common/reference_backward.hpp"
#include "common/score_mod.hpp"

namespace flashlab {

namespace {

double loss(const Problem& p, const AttentionInputs& in, const HostTensor& d_out) {
  const ReferenceResult ref = reference_attention(p, in);
  double sum = 0.0;
  for (size_t e = 0; e < ref.o.size(); ++e) sum += static_cast<double>(d_out.data[e]) * ref.o[e];
  return sum;
}

// Checks every element of one input's gradient; returns the largest |gradient| seen, so the caller can
// make sure the check was not vacuous.
double check_against_finite_differences(const Problem& p, AttentionInputs in, const HostTensor& d_out,
                                        HostTensor AttentionInputs::*tensor, const std::vector<double>& grad,
                                        const char* name) {
  // The step is a power of two, and the difference quotient divides by the step actually taken in float, so
  // the only error left is the O(h^2) truncation of the central difference (about 1e-6 here).
  const float h = 1.0f / 1024.0f;
  double largest = 0.0;
  HostTensor& x = in.*tensor;
  for (size_t e = 0; e < x.data.size(); ++e) {
    const float original = x.data[e];
    const float up = original + h, down = original - h;
    x.data[e] = up;
    const double loss_up = loss(p, in, d_out);
    x.data[e] = down;
    const double loss_down = loss(p, in, d_out);
    x.data[e] = original;
    const double numeric = (loss_up - loss_down) / (static_cast<double>(up) - static_cast<double>(down));
    INFO(name, "[", e, "]: reference ", grad[e], ", finite difference ", numeric, " (", p.describe(), ")");
    CHECK(std::fabs(grad[e] - numeric) <= 1e-4 * std::max(1.0, std::fabs(numeric)));
    largest = std::max(largest, std::fabs(grad[e]));
  }
  return largest;
}

void check_problem(const Problem& p, uint64_t seed) {
  const AttentionInputs in = random_inputs(p, Distribution::normal, seed);
  const HostTensor d_out = random_d_out(p, seed + 1);
  const ReferenceGradients grad = reference_backward(p, in, d_out);
  double largest = 0.0;
  largest =
      std::max(largest, check_against_finite_differences(p, in, d_out, &AttentionInputs::q, grad.dq, "dQ"));
  largest =
      std::max(largest, check_against_finite_differences(p, in, d_out, &AttentionInputs::k, grad.dk, "dK"));
  largest =
      std::max(largest, check_against_finite_differences(p, in, d_out, &AttentionInputs::v, grad.dv, "dV"));
  CHECK(largest > 0.1);  // the gradients are not trivially zero
}

}  // namespace

TEST_CASE("reference backward matches finite differences: GQA, causal with fully masked rows, padding") {
  Problem p;
  p.batch = 2;
  p.heads_q = 4;
  p.heads_kv = 2;
  p.seqlen_q = 6;
  p.seqlen_k = 5;
  p.head_dim = 3;
  p.causal = true;  // seqlen_q > seqlen_k: row 0 of batch 0 sees nothing
  p.seqlens_q = {6, 4};
  p.seqlens_k = {5, 2};
  check_problem(p, 41);

  // What the finite differences show, stated exactly: a row that sees nothing gets dQ = 0, padded keys get
  // dK = dV = 0.
  const AttentionInputs in = random_inputs(p, Distribution::normal, 41);
  const ReferenceGradients grad = reference_backward(p, in, random_d_out(p, 42));
  for (int64_t h = 0; h < p.heads_q; ++h)
    for (int64_t c = 0; c < p.head_dim; ++c) {
      CHECK(grad.dq[p.q_offset(0, 0, h) + c] == 0.0);  // causal, row 0
      CHECK(grad.dq[p.q_offset(1, 5, h) + c] == 0.0);  // padded row
    }
  for (int64_t hk = 0; hk < p.heads_kv; ++hk)
    for (int64_t c = 0; c < p.head_dim; ++c) {
      CHECK(grad.dk[p.kv_offset(1, 3, hk) + c] == 0.0);  // padded key
      CHECK(grad.dv[p.kv_offset(1, 3, hk) + c] == 0.0);
    }
}

TEST_CASE("reference backward matches finite differences: sliding window, explicit mask, explicit scale") {
  Problem p;
  p.heads_q = 2;
  p.heads_kv = 1;
  p.seqlen_q = 7;
  p.seqlen_k = 9;
  p.head_dim = 4;
  p.window_left = 3;
  p.window_right = 1;
  p.scale = 0.7;
  Random random(5);
  auto mask = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(7 * 9));
  for (auto& entry : *mask) entry = random.uniform() < 0.7;
  p.mask = std::move(mask);
  check_problem(p, 51);
}

TEST_CASE("reference backward matches finite differences: no mask, seqlen_q < seqlen_k") {
  Problem p;
  p.seqlen_q = 4;
  p.seqlen_k = 6;
  p.head_dim = 5;
  check_problem(p, 61);
}

// The score modifications (common/score_mod.hpp): soft-capping's tanh and its derivative, ALiBi's constant
// shift (bottom-right aligned with each batch element's own lengths), and both together under GQA and a
// causal mask. A scale of 2 puts the scores where tanh(s / cap) bends (cap 1.5).
TEST_CASE(
    "reference backward matches finite differences: soft-capping, ALiBi, dropout, a bias, packed batches, "
    "with "
    "GQA and padding") {
  Problem p;
  p.heads_q = 2;
  p.heads_kv = 1;
  p.seqlen_q = 5;
  p.seqlen_k = 7;
  p.head_dim = 4;
  p.scale = 2.0;
  p.softcap = 1.5;
  check_problem(p, 71);

  p.softcap = 0.0;
  p.alibi_slopes = {0.5f, 0.125f};
  p.window_left = 4;
  check_problem(p, 72);

  Problem both = p;
  both.batch = 2;
  both.heads_q = 4;
  both.heads_kv = 2;
  both.alibi_slopes = alibi_slopes(4);
  both.softcap = 1.5;
  both.causal = true;
  both.window_left = -1;
  both.seqlens_q = {5, 3};
  both.seqlens_k = {7, 4};
  check_problem(both, 73);

  // Dropout (common/dropout.hpp): the reference backward recomputes the same mask; with soft-capping too.
  Problem dropped = both;
  dropped.dropout_p = 0.3;
  dropped.dropout_seed = 11;
  check_problem(dropped, 74);

  // An additive bias per (head, row, key), finite: a constant of the scores, with soft-capping around it.
  Problem biased = both;
  Random random(75);
  auto bias = std::make_shared<std::vector<float>>(static_cast<size_t>(4 * 5 * 7));
  for (float& x : *bias) x = static_cast<float>(2.0 * random.uniform() - 1.0);
  biased.bias = std::move(bias);
  biased.bias_heads = 4;
  check_problem(biased, 75);

  // Packed variable-length batches: the same sequences as `both` without padding (every element of the packed
  // tensors is a real one, so each is perturbed), with dropout and the bias.
  Problem packed = biased;
  packed.seqlens_q.clear();
  packed.seqlens_k.clear();
  packed.cu_seqlens_q = {0, 5, 8};
  packed.cu_seqlens_k = {0, 7, 11};
  packed.dropout_p = 0.3;
  packed.dropout_seed = 12;
  check_problem(packed, 76);
}

}  // namespace flashlab
