#!/usr/bin/python3
"""The pruning curve of a GGUF model: `slim prune` at each share of parameters removed, with
the perplexity, KL and top-1 agreement against the unpruned model on held-out text, and the
prefill and decode speed-ups (slim prune's report: the two models alternated, medians).
Parameters are all the model's weights, embeddings and output head included.

Default model and text: slimlm from the `shared` folder next to the repository; calibration
is the first 200 kB of its heldout-long.txt, evaluation the last 150 kB (they do not
overlap). With --llamacpp each pruned file (deci when its widths differ between layers) is
also run by llama.cpp (bench/.work's llama-perplexity and llama-server, built by
bench/llamacpp.py): its perplexity on the evaluation text beside slim's, and whether both
pick the same greedy tokens for a prompt.

Usage: bench/llm_prune/curve.py [--model M] [--removed 0.1,0.2,...] [--threads 2] [--llamacpp]
                                 [--extra "--no-refit"] [--json out.json]"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import llamacpp  # noqa: E402

SHARED = os.path.join(os.path.dirname(ROOT), "shared", "models")


def texts(tmp, heldout):
    with open(heldout, "rb") as f:
        data = f.read()
    calib, evalt = os.path.join(tmp, "calib.txt"), os.path.join(tmp, "eval.txt")
    with open(calib, "wb") as f:
        f.write(data[:200000])
    with open(evalt, "wb") as f:
        f.write(data[-150000:])
    return calib, evalt


def slim_bin():
    return os.path.join(os.environ.get("SLIM_BINARY_DIR", os.path.join(ROOT, "build")), "tools", "slim")


def prune(slim, model, out, calib, evalt, target, threads, extra, tmp):
    rep = os.path.join(tmp, "report.json")
    cmd = [slim, "prune", model, "-o", out, "--calib", calib, "--eval", evalt, "--target-params", str(target),
           "--chunks", "8", "--threads", str(threads), "--json", rep] + extra
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(rep) as f:
        return json.load(f)


def llama_ppl(exe, model, text, threads, tries=3):
    """llama-perplexity's final estimate. Its logger is a thread that may lose the last
    lines at exit (the run ends with status 0 after its 7th of 8 chunks' line): the log
    file is read too, and the run repeated when neither has the estimate."""
    p = float("nan")
    for _ in range(tries):
        p = llama_ppl_once(exe, model, text, threads)
        if p == p:
            break
    return p


def llama_ppl_once(exe, model, text, threads):
    log = os.path.join(tempfile.gettempdir(), "slim_curve_llama_perplexity.log")
    r = subprocess.run([exe, "-m", model, "-f", text, "-c", "256", "--chunks", "8", "-t", str(threads), "-b", "256",
                        "--log-file", log], capture_output=True, text=True)
    out = r.stdout + r.stderr
    if os.path.exists(log):
        with open(log, errors="replace") as f:
            out += f.read()
        os.remove(log)
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", out)
    if not m:
        print("llama-perplexity on %s: exit %d, no estimate" % (model, r.returncode), file=sys.stderr)
    return float(m.group(1)) if m else float("nan")


def slim_ppl(slim, model, text, threads):
    r = subprocess.run([slim, "perplexity", model, "-f", text, "--ctx", "256", "--chunks", "8", "--threads",
                        str(threads)], capture_output=True, text=True, check=True)
    for line in (r.stdout + r.stderr).splitlines():
        if line.startswith("perplexity:"):
            return float(line.split()[1])
    return float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(SHARED, "slimlm-f16.gguf"))
    ap.add_argument("--heldout", default=os.path.join(SHARED, "heldout-long.txt"))
    ap.add_argument("--removed", default="0.1,0.2,0.25,0.3,0.4,0.5")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--extra", default="", help="more slim prune options, e.g. --no-refit")
    ap.add_argument("--llamacpp", action="store_true")
    ap.add_argument("--keep", help="keep the pruned files in this folder")
    ap.add_argument("--json")
    a = ap.parse_args()
    for p in (a.model, a.heldout):
        if not os.path.exists(p):
            sys.exit("%s is missing" % p)
    slim = slim_bin()
    tmp = tempfile.mkdtemp(prefix="slim_prune_curve_")
    calib, evalt = texts(tmp, a.heldout)
    rows = []
    print("| removed | kept params | PPL | ΔPPL | mean KL | same top-1 | prefill | decode | layers (KV heads/FFN) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rm in [float(x) for x in a.removed.split(",")]:
        out = os.path.join(a.keep or tmp, "pruned-%02d.gguf" % round(rm * 100))
        j = prune(slim, a.model, out, calib, evalt, 1 - rm, a.threads, shlex.split(a.extra), tmp)
        b, c, e = j["before"], j["after"], j["eval"]
        row = dict(removed=rm, kept=c["params"] / b["params"], base_ppl=b["ppl"], ppl=c["ppl"], kl=e["mean_kl"],
                   top1=e["top1_agreement"], prefill=c["prefill_tok_s"] / max(b["prefill_tok_s"], 1e-9),
                   decode=c["decode_tok_s"] / max(b["decode_tok_s"], 1e-9), arch=j.get("arch"),
                   layers=" ".join("%d/%d" % (l["kv_heads"], l["n_ff"]) for l in j["layers"]))
        if a.llamacpp:
            exe = os.path.join(llamacpp.WORK, "llama.cpp-native", "bin", "llama-perplexity")
            row["llamacpp_ppl"] = llama_ppl(exe, out, evalt, a.threads) if os.path.exists(exe) else float("nan")
            row["slim_ppl_same_protocol"] = slim_ppl(slim, out, evalt, a.threads)
        rows.append(row)
        print("| %d %% | %.1f %% | %.2f | %+.1f %% | %.3f | %.1f %% | %.2fx | %.2fx | %s |" % (
            round(rm * 100), 100 * row["kept"], row["ppl"], 100 * (row["ppl"] / row["base_ppl"] - 1), row["kl"],
            100 * row["top1"], row["prefill"], row["decode"], row["layers"]), flush=True)
        if a.llamacpp:
            print("|   | %s file: llama.cpp PPL %.2f, slim %.2f (llama-perplexity's protocol) | | | | | | | |" % (
                row["arch"], row["llamacpp_ppl"], row["slim_ppl_same_protocol"]), flush=True)
    if rows:
        print("base PPL %.2f; %s" % (rows[0]["base_ppl"], os.uname().sysname), file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
