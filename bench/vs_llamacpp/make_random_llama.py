#!/usr/bin/python3
"""Writes a random-weight Llama GGUF at Q8_0 or Q4_0 for speed comparisons: by default about
1.1 B parameters (TinyLlama's shape: 22 layers, 2048 wide, 32 heads / 4 KV heads, FFN 5632,
vocabulary 32000); with --moe a Mixture-of-Experts model with TinyLlama's attention and
vocabulary (12 layers by default):
  mixtral:  Mixtral's layout, 8 experts of 2816 hidden units, 2 per token
            (1.9 B parameters, 0.66 B active per token);
  qwen2moe: Qwen1.5-MoE's kind, 16 experts of 1408 hidden units, 4 per token, and a shared
            expert of 5632 behind its sigmoid gate (2.3 B parameters, 1.1 B active).
Weights are random valid blocks (routers and gates F32, as llama.cpp's quantizer leaves
them): only speed is measured on it. The vocabulary is a SentencePiece-style one (<unk>,
<s>, </s>, 256 byte tokens, filler pieces) so llama.cpp loads it.
Usage: make_random_llama.py OUT.gguf q8_0|q4_0 [n_layer] [--moe mixtral|qwen2moe]
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures"))
import make_gguf as mg  # noqa: E402

MOE = {"mixtral": dict(arch="llama", n_expert=8, k=2, n_ff_exp=2816, n_ff_sh=0),
       "qwen2moe": dict(arch="qwen2moe", n_expert=16, k=4, n_ff_exp=1408, n_ff_sh=5632)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("qtype", choices=("q8_0", "q4_0"))
    ap.add_argument("n_layer", type=int, nargs="?")
    ap.add_argument("--moe", choices=sorted(MOE))
    args = ap.parse_args()
    qtype = args.qtype.upper()
    moe = MOE.get(args.moe)
    n_layer = args.n_layer or (12 if moe else 22)
    arch = moe["arch"] if moe else "llama"
    d, ff, heads, kv, vocab = 2048, 5632, 32, 4, 32000
    hd = d // heads
    rng = np.random.default_rng(1234)

    def blocks(rows, cols, n=1):
        nb = n * rows * cols // 32
        if qtype == "Q8_0":
            dd = mg.f16(rng.uniform(2e-4, 4e-4, nb)).view(np.uint8).reshape(nb, 2)
            q = rng.integers(-127, 128, (nb, 32), dtype=np.int8).view(np.uint8)
        else:
            dd = mg.f16(rng.uniform(-6e-3, 6e-3, nb)).view(np.uint8).reshape(nb, 2)
            q = rng.integers(0, 256, (nb, 16), dtype=np.uint8)
        return np.concatenate([dd, q], 1).tobytes()

    def f32(*shape, std=0.02):
        return rng.normal(0, std, shape).astype("<f4").tobytes()

    tensors = [("token_embd.weight", qtype, [d, vocab], blocks(vocab, d))]
    for l in range(n_layer):
        p = "blk.%d." % l
        ones = np.ones(d, "<f4").tobytes()
        tensors += [(p + "attn_norm.weight", "F32", [d], ones),
                    (p + "attn_q.weight", qtype, [d, d], blocks(d, d)),
                    (p + "attn_k.weight", qtype, [d, kv * hd], blocks(kv * hd, d)),
                    (p + "attn_v.weight", qtype, [d, kv * hd], blocks(kv * hd, d)),
                    (p + "attn_output.weight", qtype, [d, d], blocks(d, d)),
                    (p + "ffn_norm.weight", "F32", [d], ones)]
        if arch == "qwen2moe":
            tensors += [(p + "attn_q.bias", "F32", [d], f32(d)), (p + "attn_k.bias", "F32", [kv * hd], f32(kv * hd)),
                        (p + "attn_v.bias", "F32", [kv * hd], f32(kv * hd))]
        if not moe:
            tensors += [(p + "ffn_gate.weight", qtype, [d, ff], blocks(ff, d)),
                        (p + "ffn_up.weight", qtype, [d, ff], blocks(ff, d)),
                        (p + "ffn_down.weight", qtype, [ff, d], blocks(d, ff))]
            continue
        E, fe, sh = moe["n_expert"], moe["n_ff_exp"], moe["n_ff_sh"]
        tensors += [(p + "ffn_gate_inp.weight", "F32", [d, E], f32(E, d)),
                    (p + "ffn_gate_exps.weight", qtype, [d, fe, E], blocks(fe, d, E)),
                    (p + "ffn_up_exps.weight", qtype, [d, fe, E], blocks(fe, d, E)),
                    (p + "ffn_down_exps.weight", qtype, [fe, d, E], blocks(d, fe, E))]
        if sh:
            tensors += [(p + "ffn_gate_inp_shexp.weight", "F32", [d], f32(d)),
                        (p + "ffn_gate_shexp.weight", qtype, [d, sh], blocks(sh, d)),
                        (p + "ffn_up_shexp.weight", qtype, [d, sh], blocks(sh, d)),
                        (p + "ffn_down_shexp.weight", qtype, [sh, d], blocks(d, sh))]
    tensors += [("output_norm.weight", "F32", [d], np.ones(d, "<f4").tobytes()),
                ("output.weight", qtype, [d, vocab], blocks(vocab, d))]
    a = arch + "."
    kvs = [("general.architecture", ("str", arch)), ("general.name", ("str", "random-" + (args.moe or "1b"))),
           ("general.file_type", ("u32", 7 if qtype == "Q8_0" else 2)),
           (a + "block_count", ("u32", n_layer)), (a + "context_length", ("u32", 2048)),
           (a + "embedding_length", ("u32", d)), (a + "feed_forward_length", ("u32", moe["n_ff_exp"] if moe else ff)),
           (a + "attention.head_count", ("u32", heads)), (a + "attention.head_count_kv", ("u32", kv)),
           (a + "attention.layer_norm_rms_epsilon", ("f32", 1e-5)), (a + "rope.freq_base", ("f32", 10000.0)),
           (a + "rope.dimension_count", ("u32", hd))]
    if moe:
        kvs += [(a + "expert_count", ("u32", moe["n_expert"])), (a + "expert_used_count", ("u32", moe["k"]))]
        if arch == "qwen2moe":
            kvs += [(a + "expert_feed_forward_length", ("u32", moe["n_ff_exp"])),
                    (a + "expert_shared_feed_forward_length", ("u32", moe["n_ff_sh"]))]
    mg.write_gguf(args.out, kvs + mg.spm_tokenizer(vocab), tensors)


if __name__ == "__main__":
    main()
