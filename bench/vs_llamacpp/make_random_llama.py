#!/usr/bin/python3
"""Writes a random-weight Llama GGUF of about 1.1 B parameters (TinyLlama's shape: 22 layers,
2048 wide, 32 heads / 4 KV heads, FFN 5632, vocabulary 32000) at Q8_0 or Q4_0 for speed
comparisons. Weights are random valid blocks: only speed is measured on it. The vocabulary is
a SentencePiece-style one (<unk>, <s>, </s>, 256 byte tokens, filler pieces) so llama.cpp loads it.
Usage: make_random_llama.py OUT.gguf q8_0|q4_0 [n_layer]
"""
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures"))
import make_gguf as mg  # noqa: E402


def main():
    out, qtype = sys.argv[1], sys.argv[2].upper()
    n_layer = int(sys.argv[3]) if len(sys.argv) > 3 else 22
    assert qtype in ("Q8_0", "Q4_0")
    d, ff, heads, kv, vocab = 2048, 5632, 32, 4, 32000
    hd = d // heads
    rng = np.random.default_rng(1234)

    def blocks(rows, cols):
        nb = rows * cols // 32
        if qtype == "Q8_0":
            dd = mg.f16(rng.uniform(2e-4, 4e-4, nb)).view(np.uint8).reshape(nb, 2)
            q = rng.integers(-127, 128, (nb, 32), dtype=np.int8).view(np.uint8)
        else:
            dd = mg.f16(rng.uniform(-6e-3, 6e-3, nb)).view(np.uint8).reshape(nb, 2)
            q = rng.integers(0, 256, (nb, 16), dtype=np.uint8)
        return np.concatenate([dd, q], 1).tobytes()

    tensors = [("token_embd.weight", qtype, [d, vocab], blocks(vocab, d))]
    for l in range(n_layer):
        p = "blk.%d." % l
        ones = np.ones(d, "<f4").tobytes()
        tensors += [(p + "attn_norm.weight", "F32", [d], ones),
                    (p + "attn_q.weight", qtype, [d, d], blocks(d, d)),
                    (p + "attn_k.weight", qtype, [d, kv * hd], blocks(kv * hd, d)),
                    (p + "attn_v.weight", qtype, [d, kv * hd], blocks(kv * hd, d)),
                    (p + "attn_output.weight", qtype, [d, d], blocks(d, d)),
                    (p + "ffn_norm.weight", "F32", [d], ones),
                    (p + "ffn_gate.weight", qtype, [d, ff], blocks(ff, d)),
                    (p + "ffn_up.weight", qtype, [d, ff], blocks(ff, d)),
                    (p + "ffn_down.weight", qtype, [ff, d], blocks(d, ff))]
    tensors += [("output_norm.weight", "F32", [d], np.ones(d, "<f4").tobytes()),
                ("output.weight", qtype, [d, vocab], blocks(vocab, d))]
    a = "llama."
    kvs = [("general.architecture", ("str", "llama")), ("general.name", ("str", "random-1b")),
           ("general.file_type", ("u32", 7 if qtype == "Q8_0" else 2)),
           (a + "block_count", ("u32", n_layer)), (a + "context_length", ("u32", 2048)),
           (a + "embedding_length", ("u32", d)), (a + "feed_forward_length", ("u32", ff)),
           (a + "attention.head_count", ("u32", heads)), (a + "attention.head_count_kv", ("u32", kv)),
           (a + "attention.layer_norm_rms_epsilon", ("f32", 1e-5)), (a + "rope.freq_base", ("f32", 10000.0)),
           (a + "rope.dimension_count", ("u32", hd))] + mg.spm_tokenizer(vocab)
    mg.write_gguf(out, kvs, tensors)


if __name__ == "__main__":
    main()
