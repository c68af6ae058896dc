#include "tests/case_matrix.hpp"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/score_mod.hpp"
#include "tests/harness.hpp"

namespace flashlab::testing {

std::vector<uint8_t> tree_mask(int64_t seqlen_q, int64_t prefix, uint64_t seed) {
  Random random(seed);
  const int64_t seqlen_k = prefix + seqlen_q;
  std::vector<int64_t> parent(static_cast<size_t>(seqlen_q), -1);
  for (int64_t t = 1; t < seqlen_q; ++t)
    parent[t] = static_cast<int64_t>(random.next() % t);  // a random tree
  std::vector<uint8_t> mask(static_cast<size_t>(seqlen_q * seqlen_k), 0);
  for (int64_t i = 0; i < seqlen_q; ++i) {
    for (int64_t j = 0; j < prefix; ++j) mask[i * seqlen_k + j] = 1;
    for (int64_t node = i; node >= 0; node = parent[node]) mask[i * seqlen_k + prefix + node] = 1;
  }
  return mask;
}

namespace {

// The matrix's long lengths in the emulator. They cost most of its time (every thread of every block runs on
// the CPU) without adding a kind of case, so with FLASHLAB_CASE_SIZES=emulator (the emulated test entries and
// the sanitizer build's CPU entry, tests/CMakeLists.txt, and the course exercises' checks) a length above 512
// becomes 256 + (length mod 256): the same remainder modulo every tile size up to 256, so the same ragged
// last tile, and still several tiles. Shorter lengths stay as they are. (Problem::validate() rejects a case
// whose reduced lengths no longer fit each other, so a reduction can never pass unnoticed.)
// docs/conventions.md §8.
int64_t sized(int64_t length) {
  static const bool reduced = [] {
    const char* sizes = std::getenv("FLASHLAB_CASE_SIZES");
    return sizes != nullptr && std::string(sizes) == "emulator";
  }();
  return reduced && length > 512 ? 256 + length % 256 : length;
}

Problem causal(Problem p) {
  p.causal = true;
  return p;
}

Problem padded(Problem p, std::vector<int64_t> seqlens_q, std::vector<int64_t> seqlens_k) {
  p.seqlens_q = std::move(seqlens_q);
  p.seqlens_k = std::move(seqlens_k);
  return p;
}

// Packed variable-length batches (common/problem.hpp): the sequences of these lengths one after another,
// seqlen_q and seqlen_k the longest.
Problem packed(Problem p, const std::vector<int64_t>& lengths_q, const std::vector<int64_t>& lengths_k) {
  p.batch = static_cast<int64_t>(lengths_q.size());
  p.cu_seqlens_q = {0};
  p.cu_seqlens_k = {0};
  p.seqlen_q = 1;
  p.seqlen_k = 0;
  for (size_t b = 0; b < lengths_q.size(); ++b) {
    p.cu_seqlens_q.push_back(p.cu_seqlens_q.back() + lengths_q[b]);
    p.cu_seqlens_k.push_back(p.cu_seqlens_k.back() + lengths_k[b]);
    p.seqlen_q = std::max(p.seqlen_q, lengths_q[b]);
    p.seqlen_k = std::max(p.seqlen_k, lengths_k[b]);
  }
  return p;
}

Problem paged(Problem p, int64_t page_size) {
  p.page_size = page_size;
  return p;
}

Problem softcapped(Problem p, double cap) {
  p.softcap = cap;
  return p;
}

Problem with_alibi(Problem p) {
  p.alibi_slopes = alibi_slopes(p.heads_q);
  return p;
}

Problem dropped(Problem p, double probability, uint64_t seed) {
  p.dropout_p = probability;
  p.dropout_seed = seed;
  return p;
}

// A random bias [1, heads, seqlen_q, seqlen_k] (heads 1: shared) in [-2, 2], a tenth of it -inf, and row 3
// -inf everywhere (hidden entirely by the bias).
Problem biased(Problem p, int64_t heads, uint64_t seed) {
  Random random(seed);
  auto bias = std::make_shared<std::vector<float>>(static_cast<size_t>(heads * p.seqlen_q * p.seqlen_k));
  for (float& x : *bias)
    x = random.uniform() < 0.1 ? -INFINITY : static_cast<float>(4.0 * random.uniform() - 2.0);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < p.seqlen_k; ++j) (*bias)[(h * p.seqlen_q + 3) * p.seqlen_k + j] = -INFINITY;
  p.bias = std::move(bias);
  p.bias_heads = heads;
  return p;
}

Problem with_tree_mask(Problem p, uint64_t seed) {
  p.mask = std::make_shared<const std::vector<uint8_t>>(tree_mask(p.seqlen_q, p.seqlen_k - p.seqlen_q, seed));
  return p;
}

// Decoding shapes (docs/07-decoding.md): one query row or a few (speculative decoding) against a long KV
// cache, ragged per-batch KV lengths, GQA, paged K/V (page sizes 1, 16, 256 and one that divides no length),
// tree masks.
template <typename Add>
void add_decode_cases(Add&& add) {
  add("decode: seqlen_q 1, long KV 4099, GQA 8/2", problem_shape(1, 8, 2, 1, sized(4099), 128));
  add("decode: seqlen_q 1, MQA 4/1, batch 3", problem_shape(3, 4, 1, 1, sized(777), 64));
  add("decode: ragged KV lengths 2500, 0, 1, 1337",
      padded(problem_shape(4, 4, 2, 1, sized(2500), 64), {}, {sized(2500), 0, 1, sized(1337)}));
  add("decode: seqlen_q 2, causal, KV shorter than seqlen_q in one batch",
      causal(padded(problem_shape(2, 4, 2, 2, sized(600), 64), {}, {sized(600), 1})));
  add("speculative: seqlen_q 5, causal, GQA 6/2", causal(problem_shape(2, 6, 2, 5, sized(1500), 64)));
  add("speculative: seqlen_q 16, causal, ragged",
      causal(padded(problem_shape(2, 4, 4, 16, sized(700), 32), {16, 3}, {sized(700), 9})));
  add("speculative: seqlen_q 8, window (256, 0)",
      windowed(problem_shape(1, 4, 2, 8, sized(1200), 64), 256, 0));
  add("speculative: tree mask, 2000 prefix + 16 draft, GQA 8/2",
      with_tree_mask(problem_shape(1, 8, 2, 16, sized(2016), 64), 13));
  add("paged 1: one token per page", paged(problem_shape(2, 4, 2, 1, 300, 64), 1));
  add("paged 16: ragged lengths including 0",
      paged(padded(problem_shape(3, 8, 2, 1, sized(1000), 128), {}, {sized(1000), 0, sized(517)}), 16));
  add("paged 256: seqlen_q 3, causal, MQA", paged(causal(problem_shape(1, 4, 1, 3, sized(3001), 64)), 256));
  add("paged 100: page size dividing no length",
      paged(padded(problem_shape(2, 4, 2, 1, sized(2049), 64), {}, {sized(2049), 250}), 100));
  add("paged 16: tree mask, 1000 prefix + 8 draft",
      paged(with_tree_mask(problem_shape(2, 8, 2, 8, sized(1008), 64), 17), 16));
  // Head dims off the 16-float vector (a scalar tail) and below one vector, and two that models use (32 and
  // 96 run in decoding/cuda_split_kv's tile widths 64 and 128 with zero lanes); a GQA group of 5 (a 4-row
  // tile and a 1-row tile per kv head).
  for (int64_t d : {1, 32, 59, 96, 111})
    add("decode: head_dim " + std::to_string(d) + ", seqlen_q 3, causal, GQA 10/2",
        causal(problem_shape(1, 10, 2, 3, 301, d)));
  add("decode: large magnitude, scores ~ 1e4", problem_shape(1, 4, 2, 1, sized(2000), 64),
      Distribution::large);
  add("decode: 0.1% outliers, paged 64", paged(problem_shape(1, 8, 2, 1, sized(3000), 128), 64),
      Distribution::outliers);
}

std::vector<Case> build_matrix() {
  std::vector<Case> cases;
  auto add = [&](std::string name, Problem p, Distribution distribution = Distribution::normal) {
    cases.push_back({std::move(name), std::move(p), distribution, 1000 + cases.size()});
  };
  // Sizes
  add("seqlen 1", problem_shape(1, 1, 1, 1, 1, 64));
  add("seqlen_k 0: every row fully masked", problem_shape(1, 2, 2, 5, 0, 64));
  add("awkward lengths 97 x 113", problem_shape(2, 3, 3, 97, 113, 64));
  add("awkward lengths 203 x 203", problem_shape(1, 2, 2, 203, 203, 128));
  add("awkward lengths 1023 x 1025", problem_shape(1, 1, 1, sized(1023), sized(1025), 64));
  add("awkward lengths 1025 x 1023, causal", causal(problem_shape(1, 1, 1, sized(1025), sized(1023), 64)));
  add("single query row, long keys", problem_shape(2, 4, 4, 1, sized(1025), 128));
  add("decode rows 4 x 333, causal", causal(problem_shape(2, 4, 4, 4, 333, 64)));
  // Head dims: off every vector width (1, 59, 111), and those real models use; on the full GPU kernels 32,
  // 80, 96, 160 and 40 run in the tile widths 32, 96, 96, 192 and 64, with zero lanes past the head dim
  // (common/cuda/tile_width.hpp).
  for (int64_t d : {1, 32, 59, 80, 96, 111, 160, 256})
    add("head_dim " + std::to_string(d), problem_shape(1, 2, 2, 67, 75, d));
  add("head_dim 40 causal, GQA 4/2", causal(problem_shape(1, 4, 2, 70, 90, 40)));
  add("head_dim 128 causal", causal(problem_shape(1, 2, 2, 130, 130, 128)));
  add("head_dim 256 causal", causal(problem_shape(1, 2, 2, 96, 160, 256)));
  // Causal with unequal lengths (bottom-right alignment)
  add("causal, seqlen_q < seqlen_k", causal(problem_shape(2, 2, 2, 97, 203, 64)));
  add("causal, seqlen_q > seqlen_k: first rows fully masked", causal(problem_shape(2, 2, 2, 203, 97, 64)));
  add("causal, square", causal(problem_shape(1, 2, 2, 113, 113, 32)));
  // GQA / MQA
  add("GQA 6 query heads / 2 kv heads", problem_shape(2, 6, 2, 77, 91, 64));
  add("MQA 4 query heads / 1 kv head, causal", causal(problem_shape(1, 4, 1, 129, 129, 128)));
  add("GQA 8/2 decode, causal", causal(problem_shape(1, 8, 2, 3, sized(517), 128)));
  // Sliding windows
  add("window (16, 0)", windowed(problem_shape(1, 2, 2, 150, 150, 64), 16, 0));
  add("window (32, 8), seqlen_q < seqlen_k", windowed(problem_shape(1, 2, 2, 100, 170, 64), 32, 8));
  add("window (-1, 5)", windowed(problem_shape(1, 2, 2, 90, 90, 32), -1, 5));
  add("window (0, 0): diagonal only", windowed(problem_shape(1, 1, 1, 40, 40, 64), 0, 0));
  add("window (10, 10) + causal", causal(windowed(problem_shape(1, 2, 2, 120, 120, 64), 10, 10)));
  add("window (3, 2), seqlen_q > seqlen_k: rows outside the band",
      windowed(problem_shape(1, 2, 2, 80, 20, 64), 3, 2));
  // Padding (per-batch lengths), including 0
  add("padding: ragged lengths including 0",
      padded(problem_shape(3, 2, 2, 97, 113, 64), {97, 0, 50}, {60, 113, 0}));
  add("padding + causal", causal(padded(problem_shape(3, 2, 1, 64, 96, 64), {64, 31, 5}, {96, 17, 40})));
  add("padding + window + GQA",
      windowed(padded(problem_shape(2, 4, 2, 70, 70, 32), {70, 41}, {33, 70}), 8, 4));
  // Explicit masks
  {
    Problem p = problem_shape(2, 2, 2, 16, 48, 64);
    p.mask = std::make_shared<const std::vector<uint8_t>>(tree_mask(16, 32, 7));
    add("tree mask (speculative decoding): 32 prefix + 16 draft tokens", p);
  }
  {
    Problem p = causal(problem_shape(1, 2, 2, 37, 53, 64));
    Random random(11);
    auto mask = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(37 * 53));
    for (auto& entry : *mask) entry = random.uniform() < 0.6;
    for (int64_t j = 0; j < 53; ++j) (*mask)[5 * 53 + j] = 0;  // row 5: fully masked by the mask alone
    p.mask = std::move(mask);
    add("random mask + causal, one row fully masked", p);
  }
  // Value distributions
  add("large magnitude: scores ~ 1e4", problem_shape(1, 2, 2, 97, 97, 64), Distribution::large);
  add("large magnitude, causal", causal(problem_shape(1, 2, 2, 64, 128, 128)), Distribution::large);
  add("0.1% outliers", problem_shape(1, 2, 2, 256, 256, 128), Distribution::outliers);
  {
    Problem p = problem_shape(1, 2, 2, 32, 40, 64);
    p.scale = 0.5;
    add("explicit scale 0.5", p);
  }
  add_decode_cases(add);
  // Score modifications (common/score_mod.hpp), last so that the cases above keep their seeds: soft-capping
  // where tanh bends the scores and where it saturates them, ALiBi causal and not, and both with a window,
  // padding and GQA. Stages without them refuse.
  add("softcap 2, causal, GQA 6/2", softcapped(causal(problem_shape(1, 6, 2, 120, 150, 64)), 2.0));
  add("softcap 5, large magnitude: scores ~ 1e4 saturated",
      softcapped(problem_shape(1, 2, 2, 97, 97, 64), 5.0), Distribution::large);
  add("ALiBi, causal, GQA 8/2", with_alibi(causal(problem_shape(1, 8, 2, 100, 100, 64))));
  add("ALiBi, seqlen_q < seqlen_k", with_alibi(problem_shape(2, 2, 2, 60, 130, 128)));
  add("ALiBi + softcap 3 + window (32, 8) + padding + GQA",
      softcapped(
          with_alibi(windowed(padded(problem_shape(2, 4, 2, 90, 110, 64), {90, 37}, {110, 64}), 32, 8)),
          3.0));
  add("decode: ALiBi + softcap 10, GQA 8/2",
      softcapped(with_alibi(problem_shape(1, 8, 2, 1, sized(1500), 128)), 10.0));
  // Dropout (common/dropout.hpp): its mask is a function of the seed, so every stage that supports it drops
  // the same weights and matches the reference.
  add("dropout 0.1, causal, GQA 6/2", dropped(causal(problem_shape(1, 6, 2, 110, 130, 64)), 0.1, 7));
  add("dropout 0.5 + softcap 3 + ALiBi + window + padding",
      dropped(softcapped(with_alibi(windowed(padded(problem_shape(2, 2, 2, 80, 96, 128), {80, 33}, {96, 50}),
                                             20, 4)),
                         3.0),
              0.5, 8));
  add("decode: dropout 0.2, GQA 8/2", dropped(problem_shape(1, 8, 2, 1, sized(1200), 64), 0.2, 9));
  // An additive bias: per head, with -inf entries (one row hidden entirely), under causal and GQA; shared by
  // every head and batch element, with soft-capping and padding.
  add("bias per head with -inf entries, causal, GQA 4/2",
      biased(causal(problem_shape(1, 4, 2, 70, 90, 64)), 4, 21));
  add("bias shared + softcap 4 + padding",
      softcapped(biased(padded(problem_shape(2, 2, 2, 60, 75, 128), {60, 20}, {75, 31}), 1, 22), 4.0));
  // Packed variable-length batches (FlashAttention's varlen form): no padding, each sequence starts where the
  // last one ends, so a stage that read a row or key past its sequence would read the next one's (or past the
  // tensor). Ragged lengths including 0, causal with seqlen_q != seqlen_k both ways, and the variants.
  add("packed varlen: lengths 97, 0, 50 against 60, 113, 0, GQA 4/2",
      packed(problem_shape(1, 4, 2, 1, 1, 64), {97, 0, 50}, {60, 113, 0}));
  add("packed varlen + causal: 64, 31, 5 against 96, 17, 40",
      causal(packed(problem_shape(1, 2, 1, 1, 1, 64), {64, 31, 5}, {96, 17, 40})));
  // Tensors that hold no token: every query sequence empty (Q, O and LSE are empty), and every key sequence
  // empty while seqlen_k says 16 (K and V are empty; every row is fully masked).
  add("packed varlen: no query token (lengths 0, 0 against 5, 3)",
      packed(problem_shape(1, 2, 1, 1, 1, 64), {0, 0}, {5, 3}));
  Problem no_key = packed(problem_shape(1, 2, 1, 1, 1, 64), {3, 4}, {0, 0});
  no_key.seqlen_k = 16;
  add("packed varlen: no key (lengths 3, 4 against 0, 0), seqlen_k 16", no_key);
  add("packed varlen + window + softcap 3 + ALiBi + dropout 0.2 + bias",
      dropped(softcapped(
                  with_alibi(biased(
                      windowed(packed(problem_shape(1, 2, 2, 1, 1, 128), {70, 41}, {33, 70}), 8, 4), 2, 23)),
                  3.0),
              0.2, 10));
  return cases;
}

}  // namespace

const std::vector<Case>& case_matrix() {
  static const std::vector<Case> cases = build_matrix();
  return cases;
}

}  // namespace flashlab::testing
