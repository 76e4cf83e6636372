#!/usr/bin/python3
"""MoE expert pruning: dropping each layer's least-routed quarter of the experts against
dropping a random quarter (`slim prune --random-experts SEED`, 5 seeds), as perplexity on
held-out text, for the MoE models made from slimlm (bench/.work/slimlm-moe-llama.gguf: the
Mixtral layout, and slimlm-moe-qwen2moe.gguf: with a shared expert; 4 experts, 2 per token,
made by bench/vs_llamacpp/run.py --moe with make_moe_from_dense.py, whose routers were
fitted on the first 4,096 tokens of heldout-long.txt). Calibration (routing counts): the
first 200 kB of heldout-long.txt; evaluation: its last 150 kB. No fine-tuning; the router
keeps its rows for the kept experts, and the softmax over them renormalizes.

Usage: bench/llm_prune/moe_seeds.py [--seeds 5] [--threads 2] [--models a.gguf,b.gguf]"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import curve  # noqa: E402


def prune(slim, model, tmp, calib, evalt, threads, seed):
    """The slim prune command line (without its target) and its report's path; seed: drop
    random experts with it instead of the least routed."""
    rep = os.path.join(tmp, "moe.json")
    cmd = [slim, "prune", model, "-o", os.path.join(tmp, "moe-pruned.gguf"), "--calib", calib, "--eval", evalt,
           "--chunks", "8", "--threads", str(threads), "--no-speed", "--json", rep]
    if seed is not None:
        cmd += ["--random-experts", str(seed)]
    return cmd, rep


def run(cmd, rep):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(rep) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    work = os.path.join(ROOT, "bench", ".work")
    ap.add_argument("--models", default=",".join(os.path.join(work, "slimlm-moe-%s.gguf" % a)
                                                  for a in ("llama", "qwen2moe")))
    ap.add_argument("--heldout", default=os.path.join(curve.SHARED, "heldout-long.txt"))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    slim = curve.slim_bin()
    tmp = tempfile.mkdtemp(prefix="slim_prune_moe_")
    calib, evalt = curve.texts(tmp, a.heldout)
    print("| model | experts kept | unpruned PPL | least routed dropped | random, seeds 0..%d | random mean |"
          % (a.seeds - 1))
    print("|---|---|---|---|---|---|")
    for model in a.models.split(","):
        if not os.path.exists(model):
            print("%s is missing (bench/vs_llamacpp/run.py --moe makes it): skipped" % model, file=sys.stderr)
            continue
        # One expert per layer first (slim prune drops the fewest experts per layer that
        # reach the target): its parameter count sets the target for a quarter.
        cmd, rep = prune(slim, model, tmp, calib, evalt, a.threads, None)
        one = run(cmd + ["--target-params", "0.9999"], rep)
        n_expert = len(one["layers"][0]["experts"]) + 1
        per = one["before"]["params"] - one["after"]["params"]
        n_drop = max(1, n_expert // 4)
        target = (one["before"]["params"] - n_drop * per + 1) / one["before"]["params"]
        least = run(cmd + ["--target-params", "%.9f" % target], rep) if n_drop > 1 else one
        rand = []
        for seed in range(a.seeds):
            c, r = prune(slim, model, tmp, calib, evalt, a.threads, seed)
            rand.append(run(c + ["--target-params", "%.9f" % target], r)["after"]["ppl"])
        print("| %s | %d of %d | %.2f | %.2f | %s | %.2f |" % (
            os.path.basename(model), n_expert - n_drop, n_expert, least["before"]["ppl"], least["after"]["ppl"],
            " ".join("%.2f" % p for p in rand), statistics.mean(rand)), flush=True)


if __name__ == "__main__":
    main()
