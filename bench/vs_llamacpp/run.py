#!/usr/bin/python3
"""slim vs llama.cpp on the same GGUF files, in the same run.

Rows: prefill of 512 tokens and decode of 128 tokens, 1 and 2 threads, for
  - the shared model shared/models/slimlm-f16.gguf (shared/ next to the repository, or
    --shared-model; F16, 15.7 M parameters: too small
    for a like-for-like comparison, node-llama-cpp's per-token JavaScript loop weighs on it),
  - a generated ~1.1 B-parameter random-weight Llama at Q8_0 and at Q4_0.
Prints medians of --repeats runs and the slim/llama.cpp ratios, then compares greedy
decoding of 64 tokens on the shared model at F16 and at Q8_0 (quantized by slim) for ten
prompts, against llama.cpp with flash attention off and with its default; the exit status
says whether the model card's prompt gives identical tokens at F16 and Q8_0 (--moe: on both
splits) with flash attention off.

--moe: Mixture-of-Experts rows instead: the shared model split into experts
(make_moe_from_dense.py, routers fitted on the first 4,096 tokens of
shared/models/heldout-long.txt): Mixtral's layout with 4 experts, 2 per token, and qwen2moe
with 4 experts, 2 per token, and a shared expert; and random-weight Mixtral-layout and
qwen2moe models of 1.9 B and 2.3 B parameters (0.66 B and 1.1 B active per token;
make_random_llama.py --moe, 12 layers) at Q8_0, Q4_0 and Q4_K_M (--moe-types; Q4_K_M
quantized from the Q8_0 file by slim quantize). The greedy comparison runs on the
two split models.

Usage: bench/vs_llamacpp/run.py [--slim BUILD/tools/slim] [--isa native|avx2|avx512] [--repeats 3]
                                [--layers 22] [--skip-1b] [--moe] [--moe-types q8_0,q4_0,q4_k_m]
                                [--model FILE.gguf ...]
Installs node-llama-cpp@3.21.1 (npm --ignore-scripts) into bench/vs_llamacpp/node_modules.

--isa avx2 holds both engines to AVX2: slim through SLIM_ISA=avx2, and llama.cpp through a
llama-bench built from the llama.cpp sources that node-llama-cpp ships (its git bundle),
configured without native tuning and without AVX-512 (the prebuilt binaries pick a zen4,
AVX-512 variant on AVX-512 CPUs); the build goes to bench/.work/llama.cpp-avx2 once (bench/llamacpp.py). Its
rows are llama-bench's pp512 and tg128 at a depth of 512 tokens (decode after the prompt,
as slim's rows are). native and avx512 time the prebuilt node-llama-cpp library.
"""
import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import llamacpp  # noqa: E402  (bench/llamacpp.py: the llama.cpp build shared with bench/serve_llm)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
WORK = os.path.join(ROOT, "bench", ".work")
GREEDY_PROMPTS = ["The PostgreSQL server", "Once upon a time", "In 1969, the", "To create a table, use", "git commit -m",
                  "The Python interpreter", "And God said", "SELECT * FROM", "The Debian package manager",
                  "A function that returns"]


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def llama_bench_speed(exe, model, threads, decode_n):
    """One pp512 and one tg<decode_n> (at depth 512) run of llama-bench: tokens/s."""
    out = []
    for args in (["-p", "512", "-n", "0"], ["-p", "0", "-n", str(decode_n), "-d", "512"]):
        try:
            r = sh([exe, "-m", model, "-t", str(threads), "-r", "1", "-o", "json", *args], timeout=1200)
            out.append(json.loads(r.stdout)[0]["avg_ts"])
        except subprocess.TimeoutExpired:
            print("llama-bench timed out (20 min): %s, %d threads" % (model, threads), file=sys.stderr)
            out.append(float("nan"))
    return [out[0]], [out[1]]


def slim_speed(slim, model, threads, tokens_file, decode_n, repeats, isa="native"):
    pre, dec = [], []
    for _ in range(repeats):
        r = sh([slim, "generate", model, "--tokens-file", tokens_file, "-n", str(decode_n), "--temp", "0",
                "--ignore-eos", "--ids", "--threads", str(threads), "--ctx", "1024"], env=llamacpp.slim_env(isa))
        pre.append(float(re.search(r"prefill: .*\(([\d.]+) tok/s\)", r.stderr).group(1)))
        dec.append(float(re.search(r"decode: .*\(([\d.]+) tok/s\)", r.stderr).group(1)))
    return pre, dec


def llama_speed(model, threads, tokens_json, decode_n, repeats):
    try:
        # llama.cpp's worker threads spin; with more threads than idle cores a run can crawl.
        r = sh(["node", os.path.join(HERE, "llamacpp_side.mjs"), "speed", model, str(threads), tokens_json,
                str(decode_n), str(repeats)], timeout=1200)
    except subprocess.TimeoutExpired:
        print("llama.cpp run timed out (20 min): %s, %d threads" % (model, threads), file=sys.stderr)
        return [float("nan")] * repeats, [float("nan")] * repeats
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return out["prefill_tps"], out["decode_tps"]


def slimlm_moe(slim, shared, arch):
    """bench/.work/slimlm-moe-ARCH.gguf: the shared model split into 4 experts, 2 per token
    (qwen2moe: and a shared expert), made if missing."""
    path = os.path.join(WORK, "slimlm-moe-%s.gguf" % arch)
    if not os.path.exists(path):
        heldout = os.path.join(os.path.dirname(shared), "heldout-long.txt")
        ids = os.path.join(WORK, "heldout-ids.txt")
        with open(ids, "w") as f:
            f.write(sh([slim, "tokenize", shared, "-f", heldout, "--ids", "--no-special"]).stdout)
        print("splitting %s into experts (a few minutes) ..." % shared, file=sys.stderr)
        sh(["/usr/bin/python3", os.path.join(HERE, "make_moe_from_dense.py"), shared, path + ".tmp", "--arch", arch,
            "--experts", "4", "--used", "2", "--calibration", ids, "--calibration-tokens", "4096"])
        os.rename(path + ".tmp", path)
    return path


def random_moe(slim, qtype, layers, kind):
    """The random MoE model of make_random_llama.py at qtype; q4_k_m is `slim quantize`d from
    its Q8_0 file (llama-quantize's mix: Q4_K, Q6_K for the output, attn_v and ffn_down_exps of
    some layers), made if missing."""
    if qtype != "q4_k_m":
        return llamacpp.random_llama(qtype, layers, kind)
    path = os.path.join(WORK, "random-moe-%s-q4_k_m-L%d.gguf" % (kind, layers))
    if not os.path.exists(path):
        sh([slim, "quantize", llamacpp.random_llama("q8_0", layers, kind), path + ".tmp", "--type", "q4_k_m"])
        os.rename(path + ".tmp", path)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--slim", default=os.path.join(ROOT, "build", "tools", "slim"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--skip-1b", action="store_true")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--decode", type=int, default=128, help="decode tokens per run")
    ap.add_argument("--only", default="", help="run only models whose label contains this text")
    ap.add_argument("--greedy-only", action="store_true", help="skip the speed rows")
    ap.add_argument("--isa", choices=("native", "avx2", "avx512"), default="native",
                    help="instruction set both engines are held to (see the module docstring)")
    ap.add_argument("--shared-model", default=None, help="the shared F16 model (default: shared/models next to the repo)")
    ap.add_argument("--model", action="append", default=[],
                    help="time this GGUF file instead of the default models (repeatable)")
    ap.add_argument("--skip-greedy", action="store_true", help="skip the greedy-decoding comparison")
    ap.add_argument("--moe", action="store_true", help="Mixture-of-Experts models instead (see the docstring)")
    ap.add_argument("--moe-layers", type=int, default=12)
    ap.add_argument("--moe-types", default="q8_0,q4_0,q4_k_m", help="weight types of the random MoE rows")
    a = ap.parse_args()
    llamacpp.ensure_node_llama_cpp(HERE)
    os.makedirs(WORK, exist_ok=True)
    shared = a.shared_model or llamacpp.find_shared("slimlm-f16.gguf")
    llama_bench = llamacpp.build("llama-bench", a.isa, HERE) if a.isa == "avx2" and not a.greedy_only else None
    slim_isa = a.isa
    llama_isa = ("llama-bench built for AVX2 (no AVX-512)" if llama_bench else
                 "%s prebuilt" % llamacpp.NODE_LLAMA_CPP)
    print("ISA: slim %s, llama.cpp %s" % ({"native": "native (best the CPU has)"}.get(slim_isa, slim_isa), llama_isa))

    rng = random.Random(7)
    prompt = [rng.randrange(300, 8000) for _ in range(512)]
    tokens_file = os.path.join(WORK, "prompt512.txt")
    tokens_json = os.path.join(WORK, "prompt512.json")
    with open(tokens_file, "w") as f:
        f.write(" ".join(map(str, prompt)))
    with open(tokens_json, "w") as f:
        json.dump(prompt, f)

    models = []
    if not shared:
        print("shared/models/slimlm-f16.gguf not found next to the repository (--shared-model): its rows are skipped",
              file=sys.stderr)
    elif a.moe:
        models += [("slimlm-MoE mixtral 4x2", slimlm_moe(a.slim, shared, "llama")),
                   ("slimlm-MoE qwen2moe 4x2", slimlm_moe(a.slim, shared, "qwen2moe"))]
    else:
        models.append(("slimlm F16 (15.7M)", shared))
    if a.model:
        models = [(os.path.basename(m), m) for m in a.model]
    elif a.moe:
        for kind, size in (("mixtral", "1.9B"), ("qwen2moe", "2.3B")):
            for q in a.moe_types.split(","):
                models.append(("%s-%s %s" % (kind, size, q.upper()), random_moe(a.slim, q, a.moe_layers, kind)))
    elif not a.skip_1b:
        for q in ("q8_0", "q4_0"):
            path = llamacpp.random_llama(q, a.layers)
            models.append(("random-1.1B %s" % q.upper(), path))

    rows = []
    print("%-24s %3s | %10s %10s %6s | %10s %10s %6s | %5s" % ("model", "thr", "slim pp", "llama pp", "ratio",
                                                                 "slim tg", "llama tg", "ratio", "load"))
    for name, path in models:
        if a.greedy_only or (a.only and a.only not in name):
            continue
        for t in map(int, a.threads.split(",")):
            # Alternate the engines round by round: on a shared machine the load drifts, and
            # interleaving exposes both engines to the same drift.
            sp, sd, lp, ld = [], [], [], []
            for _ in range(a.repeats):
                p, d = slim_speed(a.slim, path, t, tokens_file, a.decode, 1, slim_isa)
                sp += p
                sd += d
                if llama_bench:
                    p, d = llama_bench_speed(llama_bench, path, t, a.decode)
                else:
                    p, d = llama_speed(path, t, tokens_json, a.decode, 1)
                lp += p
                ld += d
            load = os.getloadavg()[0]
            row = dict(model=name, threads=t, slim_isa=slim_isa, llama_isa=llama_isa, slim_prefill=statistics.median(sp), llama_prefill=statistics.median(lp),
                       slim_decode=statistics.median(sd), llama_decode=statistics.median(ld), load=load)
            rows.append(row)
            print("%-24s %3d | %10.1f %10.1f %6.2f | %10.2f %10.2f %6.2f | %5.1f" % (
                name, t, row["slim_prefill"], row["llama_prefill"], row["slim_prefill"] / row["llama_prefill"],
                row["slim_decode"], row["llama_decode"], row["slim_decode"] / row["llama_decode"], load), flush=True)
    print("(tokens/s, medians of %d alternating runs; pp = prefill of 512 tokens, tg = decode of %d tokens; "
          "load = 1-minute load average of the machine after the row)" % (a.repeats, a.decode))
    if a.skip_greedy or not shared or a.model:
        with open(os.path.join(WORK, "vs_llamacpp.json"), "w") as f:
            json.dump(dict(rows=rows), f, indent=1)
        return 0

    # Greedy agreement on the shared model, at F16 and at Q8_0 (--moe: its two MoE splits),
    # against llama.cpp with flash attention off (the attention slim computes: scores,
    # softmax, then the weighted sum in f32) and with its default ("auto", on here: it
    # accumulates the weighted values in f16, which moves near-tied logits).
    if a.moe:
        variants = [(name[len("slimlm-MoE "):], path) for name, path in models[:2]]
    else:
        q8 = os.path.join(WORK, "slimlm-q8_0.gguf")
        sh([a.slim, "quantize", shared, q8, "--type", "q8_0"], env=llamacpp.slim_env(slim_isa))
        variants = [("F16", shared), ("Q8_0", q8)]
    greedy = {}
    for flash in ("off", "auto"):
        for label, path in variants:
            results = []
            for prompt in GREEDY_PROMPTS:
                g = json.loads(sh(["node", os.path.join(HERE, "llamacpp_side.mjs"), "greedy", path, prompt, "64",
                                   flash]).stdout.strip().splitlines()[-1])
                r = sh([a.slim, "generate", path, "--tokens", ",".join(map(str, g["prompt"])), "-n", "64", "--temp",
                        "0", "--ids", "--threads", "1", "--ignore-eos"], env=llamacpp.slim_env(slim_isa))
                slim_tokens = [int(x) for x in r.stdout.split()]
                first_diff = next((i for i, (x, y) in enumerate(zip(slim_tokens, g["tokens"])) if x != y), None)
                results.append(dict(prompt=prompt, identical=slim_tokens == g["tokens"], first_difference=first_diff))
            greedy["%s, flash attention %s" % (label, flash)] = results
            n_same = sum(r["identical"] for r in results)
            diffs = ", ".join("%r at token %s" % (r["prompt"], r["first_difference"]) for r in results
                              if not r["identical"])
            print("greedy 64 tokens on the shared model, %s, llama.cpp flash attention %s: %d/%d prompts identical%s" % (
                label, flash, n_same, len(results), "" if not diffs else " (first differences: %s)" % diffs))
    same = all(greedy["%s, flash attention off" % label][0]["identical"] for label, _ in variants)
    with open(os.path.join(WORK, "vs_llamacpp.json"), "w") as f:
        json.dump(dict(rows=rows, greedy=greedy), f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
