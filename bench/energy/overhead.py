#!/usr/bin/python3
"""Metering overhead: `slim bench` with --energy against without, side by side.

With --energy the timed runs are metered as slim serve meters batches (a CpuTimeScope over
them and a meter reading every 10 ms or more), so the latency percentiles carry the cost.
For each model the two are alternated ROUNDS times (fresh processes, same seed, threads
and iterations); the table gives the medians and the best of the p50 latencies, the
throughput ratio (1/p50, on/off) of each, and the overhead in microseconds per run. On a
shared machine a millisecond run varies by more than metering costs; the smallest model's
difference is the cost per run, given last as a share of each model's p50.

Models (bench/serve/make_models.py writes them into the work folder): the digits MLP (a
~10 us run: the worst case, where a fixed cost per run shows most), ResNet-18 at 32x32
and the BERT-mini encoder at sequence 64 (runs of milliseconds, like served requests).

Usage: bench/energy/overhead.py [--rounds 7] [--threads 2] [--out bench/energy/results];
SLIM overrides the binary."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORK = os.path.join(ROOT, "bench", ".work", "energy_overhead")
# (name, file in the work folder, iterations per process)
MODELS = [("digits MLP", "digits/digits_mlp.onnx", 5000), ("ResNet-18 32x32", "resnet18_32.onnx", 300),
          ("BERT-mini seq 64", "bert_mini.onnx", 200)]


def bench(slim, model, iters, threads, energy):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [slim, "bench", model, "--iters", str(iters), "--warmup", "20", "--threads", str(threads),
               "--json", f.name] + (["--energy"] if energy else [])
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return json.load(open(f.name))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    slim = os.environ.get("SLIM") or os.path.join(ROOT, "build", "tools", "slim")
    subprocess.run([sys.executable, os.path.join(ROOT, "bench", "serve", "make_models.py"), WORK], check=True,
                   stdout=subprocess.DEVNULL)
    rows = []
    kernels = source = ""
    for name, file, iters in MODELS:
        p50 = {False: [], True: []}
        for r in range(args.rounds):
            for energy in ((False, True) if r % 2 == 0 else (True, False)):
                j = bench(slim, os.path.join(WORK, file), iters, args.threads, energy)
                p50[energy].append(j["p50_ms"])
                kernels = j["kernels"]
                if energy:
                    source = j["energy"]["source"]
            print("%s: round %d of %d" % (name, r + 1, args.rounds), file=sys.stderr, flush=True)
        rows.append((name, iters, statistics.median(p50[False]), statistics.median(p50[True]), min(p50[False]),
                     min(p50[True])))
    cost_ms = rows[0][3] - rows[0][2]  # the smallest model's median difference
    lines = ["| %s | %d | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f | %+.2f | %.3f %% |" % (
        name, iters, off, on, off / on, best_off, best_on, best_off / best_on, 1000 * (on - off), 100 * cost_ms / off)
        for name, iters, off, on, best_off, best_on in rows]
    head = ["Metering overhead of `slim bench --energy` (runs metered as slim serve meters batches), %d rounds "
            "alternating on/off; %d threads, kernels %s; meter: %s" % (args.rounds, args.threads, kernels, source),
            "",
            "| model | runs | p50 off (ms, median) | p50 on | throughput on/off | p50 off (best) | p50 on (best) | "
            "throughput on/off (best) | us per run (medians) | cost per run / p50 off |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    text = "\n".join(head + lines) + "\n"
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "overhead.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
