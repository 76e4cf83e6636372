#!/usr/bin/python3
"""Greedy decoding of slim and llama.cpp, token for token, on small random-weight
Mixture-of-Experts models in every weight type slim computes with: Mixtral's layout
(llama with experts) and qwen2moe (shared expert with its sigmoid gate, no
renormalization of the top-k weights). llama.cpp is node-llama-cpp's prebuilt CPU library
(bench/vs_llamacpp/llamacpp_side.mjs, flash attention off as in bench/vs_llamacpp's greedy
check), installed into bench/vs_llamacpp/node_modules if missing; the test exits 77
(skipped) only when it cannot be installed. Run by ctest with SLIM_BINARY_DIR set.

Random logits have near ties, where the two engines' rounding (f16 attention, activation
formats, summation order) may pick different tokens. So each model's seed is the first,
from a fixed start, whose greedy path has none: tests/fixtures/make_gguf.py's NumPy
forward pass along llama.cpp's tokens must pick each of them by at least MARGIN of the
logits' standard deviation, and route every token with a gap of at least ROUTE_GAP between
the k-th expert's probability and the next. The reference must agree with llama.cpp where
it is not near a tie; slim must agree with llama.cpp everywhere. The token embeddings are
F32 (they are looked up, not multiplied); every matrix product runs in the weight type."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import llamacpp  # noqa: E402
import make_gguf as mg  # noqa: E402

# (name, arch, weight type, moe, first seed: the one the search found when the test was written)
MODELS = [("mixtral_%s" % t.lower(), "llama", t, dict(n_expert=8, k=2), s) for t, s in
          (("F32", 113), ("F16", 113), ("BF16", 103), ("Q8_0", 101), ("Q4_0", 102), ("Q4_K", 101), ("Q6_K", 102))]
MODELS += [("qwen2moe_%s" % t.lower(), "qwen2moe", t, dict(n_expert=8, k=4, n_ff_sh=256), s) for t, s in
           (("F32", 106), ("F16", 110), ("BF16", 103), ("Q8_0", 104), ("Q4_0", 104), ("Q4_K", 105), ("Q6_K", 100))]
PROMPT = [1, 300, 301, 302, 400, 5, 77, 260]
N = 24
MARGIN, ROUTE_GAP, SEEDS = 0.02, 5e-3, 16
# Token embeddings (F32) 5x the other weights dominate the residual stream, so the two
# engines' rounding moves the hidden states less relative to their size.
EMBD_STD = 0.4


def llama_greedy(node_dir, path):
    out = subprocess.run(["node", os.path.join(node_dir, "llamacpp_side.mjs"), "greedy-ids", path,
                          ",".join(map(str, PROMPT)), str(N), "off"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["tokens"]


def slim_greedy(slim, path):
    out = subprocess.run([slim, "generate", path, "--tokens", ",".join(map(str, PROMPT)), "-n", str(N), "--temp", "0",
                          "--ids", "--ignore-eos", "--threads", "1"], check=True, capture_output=True, text=True)
    return [int(t) for t in out.stdout.split()]


def margins(cfg, W, tokens):
    """The reference's choice at each generated position, its margin over the runner-up in
    standard deviations of the logits, and the smallest routing gap (as a fraction of the
    k-th probability)."""
    cfg["route_gaps"] = []
    logits = mg.forward(cfg, W, np.array(PROMPT + tokens[:-1]), True)[len(PROMPT) - 1:]
    top2 = np.sort(logits, 1)[:, -2:]
    return logits.argmax(1), (top2[:, 1] - top2[:, 0]) / logits.std(1), min(cfg["route_gaps"], default=1.0)


def main():
    node_dir = os.path.join(ROOT, "bench", "vs_llamacpp")
    try:
        llamacpp.ensure_node_llama_cpp(node_dir)
    except (OSError, subprocess.CalledProcessError) as e:
        print("node-llama-cpp cannot be installed (%s): skipped" % e)
        return 77
    slim = os.path.join(os.environ["SLIM_BINARY_DIR"], "tools", "slim")
    tmp = tempfile.mkdtemp(prefix="slim_moe_llamacpp_")
    failures = []
    for name, arch, typ, moe, seed0 in MODELS:
        for seed in range(seed0, seed0 + SEEDS):
            cfg, W = mg.make_model(tmp, name, arch, {"default": typ, "token_embd": "F32"}, 2, False, seed, n_ff=256,
                                   vocab=512, n_ctx=256, moe=moe, embd_std=EMBD_STD,
                                   tokenizer=mg.spm_tokenizer(512), reference=False)
            path = os.path.join(tmp, name + ".gguf")
            want = llama_greedy(node_dir, path)
            ref, margin, route_gap = margins(cfg, W, want)
            if route_gap < ROUTE_GAP:
                continue  # a near tie in routing may change any later token
            wrong = [i for i in range(N) if ref[i] != want[i] and margin[i] >= MARGIN]
            if wrong:
                failures.append(name)
                print("%-15s seed %d: llama.cpp's token %d is %d, the reference's %d by a margin of %.3f" % (
                    name, seed, wrong[0], want[wrong[0]], ref[wrong[0]], margin[wrong[0]]))
                break
            if margin.min() < MARGIN:
                continue  # a near tie: the next seed
            got = slim_greedy(slim, path)
            first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
            print("%-15s seed %d (smallest margin %.3f, routing gap %.4f): %s" % (
                name, seed, margin.min(), route_gap, "identical" if got == want else
                "DIFFERENT from token %s: slim %s, llama.cpp %s" % (first, got, want)), flush=True)
            if got != want:
                failures.append(name)
            break
        else:
            failures.append(name)
            print("%-15s no seed of %d..%d without a near tie" % (name, seed0, seed0 + SEEDS - 1))
    if failures:
        print("failed:", " ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
