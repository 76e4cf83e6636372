#!/usr/bin/python3
"""Turns a dense Llama GGUF with float weights (e.g. shared/models/slimlm-f16.gguf) into a
Mixture-of-Experts model by splitting each feed-forward network's hidden units into
experts: Mixtral's layout (--arch llama) or qwen2moe (--arch qwen2moe: attention biases of
zero, Q/K rows permuted to its rotary layout, and a shared expert of the --shared hidden
units that matter most, behind a gate whose sigmoid is 1/2, which its down projection
undoes: a random vector of norm about 1e-19, not zero, as llama.cpp computes the sigmoid as
silu(g) / g, NaN at 0).

Each expert's down projection is scaled by the inverse of the mean routing weight an
expert gets, so that routing all experts with equal weight reproduces the dense network.
Without --calibration the routers are zero and every expert is used: a round trip whose
logits equal the dense model's up to summation order. With --calibration (token IDs, as
`slim tokenize --ids` prints them), hidden units that fire together are clustered into
experts of equal size (balanced k-means over their activations on those tokens), and each
router is fitted (ridge regression) to the log of the size of each expert's contribution,
so that top-k routing keeps the experts that matter most for each token; its logits are
scaled to a standard deviation of --router-std.

Usage: make_moe_from_dense.py DENSE.gguf OUT.gguf [--arch llama|qwen2moe] [--experts 8]
       [--used K] [--shared UNITS] [--calibration IDS.txt] [--calibration-tokens 2048]
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures"))
import make_gguf as mg  # noqa: E402

CHUNK = 256  # calibration tokens per forward pass


def load_dense(path):
    kvs, tensors = mg.read_gguf(path)
    arch = mg.meta_value(kvs, "general.architecture")
    if arch != "llama" or mg.meta_value(kvs, "llama.expert_count", 0):
        sys.exit("%s: a dense llama model is needed, not %s" % (path, arch))
    m = lambda k, d=None: mg.meta_value(kvs, "llama." + k, d)  # noqa: E731
    d, heads = m("embedding_length"), m("attention.head_count")
    cfg = dict(arch="llama", n_embd=d, n_head=heads, n_kv=m("attention.head_count_kv", heads), head_dim=d // heads,
               n_layer=m("block_count"), n_ff=m("feed_forward_length"), eps=m("attention.layer_norm_rms_epsilon"),
               base=m("rope.freq_base", 10000.0), n_rot=m("rope.dimension_count", d // heads))
    W, types = {}, {}
    for name, typ, dims, data in tensors:
        if typ not in ("F32", "F16", "BF16"):
            sys.exit("%s: tensor %s is %s; float weights are needed" % (path, name, typ))
        W[name] = mg.dequant(typ, data, int(np.prod(dims))).reshape(dims[::-1])
        types[name] = typ
    return kvs, tensors, cfg, W, types


def ffn_inputs(cfg, W, ids):
    """The normalized feed-forward inputs of every layer for the calibration tokens."""
    per_layer = [[] for _ in range(cfg["n_layer"])]
    for i in range(0, len(ids) - CHUNK + 1, CHUNK):
        mg.forward(cfg, W, np.asarray(ids[i:i + CHUNK]), False, ffn_inputs=per_layer)
    return [np.concatenate(x) for x in per_layer]


def split_layer(gate, up, down, x, n_expert, n_shared, rng):
    """(shared units, expert unit groups, router [n_expert, d] before scaling)."""
    ff = gate.shape[0]
    if x is None:
        units = np.arange(ff)
        shared, rest = units[ff - n_shared:], units[:ff - n_shared]
        return shared, rest.reshape(n_expert, -1), np.zeros((n_expert, gate.shape[1]))
    g = x @ gate.T
    act = g / (1 + np.exp(-g)) * (x @ up.T)  # [T, ff]
    importance = np.abs(act).mean(0) * np.linalg.norm(down, axis=0)
    order = np.argsort(-importance)
    shared, rest = np.sort(order[:n_shared]), order[n_shared:]
    # Balanced k-means on the units' activation profiles (cosine similarity): each round
    # assigns the most similar (unit, centroid) pairs first, up to n / n_expert units each.
    prof = np.abs(act[:, rest]).T
    prof /= np.linalg.norm(prof, axis=1, keepdims=True) + 1e-12
    cap = len(rest) // n_expert
    cent = prof[rng.choice(len(rest), n_expert, replace=False)]
    for _ in range(10):
        sim = prof @ cent.T
        assign = np.full(len(rest), -1)
        count = np.zeros(n_expert, int)
        for flat in np.argsort(-sim, axis=None):
            u, e = divmod(int(flat), n_expert)
            if assign[u] < 0 and count[e] < cap:
                assign[u], count[e] = e, count[e] + 1
        cent = np.stack([prof[assign == e].mean(0) for e in range(n_expert)])
        cent /= np.linalg.norm(cent, axis=1, keepdims=True)
    groups = np.stack([np.sort(rest[assign == e]) for e in range(n_expert)])
    # Router: ridge regression of each expert's log contribution size, centred per token.
    size = np.stack([np.linalg.norm(act[:, gr] @ down[:, gr].T, axis=1) for gr in groups], 1)
    y = np.log(size + 1e-6)
    y -= y.mean(1, keepdims=True)
    lam = 1e-2 * len(x)
    router = np.linalg.solve(x.T @ x + lam * np.eye(x.shape[1]), x.T @ y).T
    return shared, groups, router


def mean_weight(logits, k, renorm):
    """The mean routing weight of a selected expert over the calibration tokens."""
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    top = -np.sort(-p, 1)[:, :k]
    if renorm:
        top /= top.sum(1, keepdims=True)
    return top.mean()


def encode(typ, w):
    if typ == "F32":
        return w.astype("<f4").tobytes()
    if typ == "F16":
        return w.astype("<f2").tobytes()
    u = w.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dense")
    ap.add_argument("out")
    ap.add_argument("--arch", choices=("llama", "qwen2moe"), default="llama")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--used", type=int, help="experts per token (default: all without --calibration, else 2)")
    ap.add_argument("--shared", type=int, help="qwen2moe: hidden units of the shared expert (default n_ff / 4)")
    ap.add_argument("--calibration", help="file of token IDs to cluster the units and fit the routers on")
    ap.add_argument("--calibration-tokens", type=int, default=2048)
    ap.add_argument("--router-std", type=float, default=1.0)
    a = ap.parse_args()
    kvs, tensors, cfg, W, types = load_dense(a.dense)
    E, ff, d = a.experts, cfg["n_ff"], cfg["n_embd"]
    K = a.used or (2 if a.calibration else E)
    qwen = a.arch == "qwen2moe"
    S = (a.shared if a.shared is not None else ff // 4) if qwen else 0
    if not 1 <= K <= E or (ff - S) % E or ((ff - S) // E) % 32 or (qwen and S % 32) or (qwen and S <= 0):
        sys.exit("cannot split %d hidden units into %d experts (%d used) and a shared expert of %d: each part "
                 "must be a positive multiple of 32" % (ff, E, K, S))
    xs = None
    if a.calibration:
        ids = [int(t) for t in open(a.calibration).read().split()][:a.calibration_tokens]
        if len(ids) < CHUNK:
            sys.exit("%s: fewer than %d calibration tokens" % (a.calibration, CHUNK))
        xs = ffn_inputs(cfg, W, ids)
    rng = np.random.default_rng(0)

    prefix = a.arch + "."
    out_kvs = []
    for key, val in kvs:
        if key.startswith("llama."):
            key = prefix + key[len("llama."):]
        if key == "general.architecture":
            val = ("str", a.arch)
        elif key == prefix + "feed_forward_length" and not qwen:
            val = ("u32", (ff - S) // E)  # Mixtral's experts are n_ff wide
        out_kvs.append((key, val))
    out_kvs += [(prefix + "expert_count", ("u32", E)), (prefix + "expert_used_count", ("u32", K))]
    if qwen:
        out_kvs += [(prefix + "expert_feed_forward_length", ("u32", (ff - S) // E)),
                    (prefix + "expert_shared_feed_forward_length", ("u32", S))]

    # qwen2moe rotates (i, i + n_rot/2) where llama rotates (2i, 2i + 1): the same rows, reordered.
    hd, half = cfg["head_dim"], cfg["n_rot"] // 2
    perm = np.r_[np.arange(0, 2 * half, 2), np.arange(1, 2 * half, 2), np.arange(2 * half, hd)]
    out = []
    for name, typ, dims, data in tensors:
        parts = name.split(".")
        kind = parts[2] if name.startswith("blk.") else ""
        if kind in ("ffn_gate", "ffn_up", "ffn_down"):
            continue
        if qwen and kind in ("attn_q", "attn_k"):
            w = W[name].reshape(-1, hd, d)[:, perm, :].reshape(-1, d)
            data = encode(typ, w)
        out.append((name, typ, dims, data))
        if qwen and kind in ("attn_q", "attn_k", "attn_v"):
            out.append((name.replace(".weight", ".bias"), "F32", [dims[1]], np.zeros(dims[1], "<f4").tobytes()))
        if kind != "ffn_norm":
            continue
        p = "blk.%s." % parts[1]
        l = int(parts[1])
        gate, up, down = W[p + "ffn_gate.weight"], W[p + "ffn_up.weight"], W[p + "ffn_down.weight"]
        shared, groups, router = split_layer(gate, up, down, None if xs is None else xs[l], E, S, rng)
        if xs is not None:
            router *= a.router_std / max((xs[l] @ router.T).std(), 1e-12)
            scale = 1 / mean_weight(xs[l] @ router.T, K, not qwen)
        else:
            scale = float(E)
        typ = types[p + "ffn_gate.weight"]
        out.append((p + "ffn_gate_inp.weight", "F32", [d, E], router.astype("<f4").tobytes()))
        out.append((p + "ffn_gate_exps.weight", typ, [d, groups.shape[1], E], encode(typ, gate[groups])))
        out.append((p + "ffn_up_exps.weight", typ, [d, groups.shape[1], E], encode(typ, up[groups])))
        down_exps = np.stack([down[:, g] * scale for g in groups])
        out.append((p + "ffn_down_exps.weight", typ, [groups.shape[1], d, E], encode(typ, down_exps)))
        if qwen:
            gate_sh = rng.normal(0, 1e-19 / np.sqrt(d), d)
            out.append((p + "ffn_gate_inp_shexp.weight", "F32", [d], gate_sh.astype("<f4").tobytes()))
            out.append((p + "ffn_gate_shexp.weight", typ, [d, S], encode(typ, gate[shared])))
            out.append((p + "ffn_up_shexp.weight", typ, [d, S], encode(typ, up[shared])))
            out.append((p + "ffn_down_shexp.weight", typ, [S, d], encode(typ, down[:, shared] * 2)))
    mg.write_gguf(a.out, out_kvs, out, align=mg.meta_value(kvs, "general.alignment", 32))
    print("%s: %s, %d experts of %d hidden units, %d used per token%s" % (
        a.out, a.arch, E, (ff - S) // E, K, ", shared expert of %d" % S if qwen else ""))


if __name__ == "__main__":
    main()
