#!/usr/bin/python3
"""Metering overhead: `slim bench` with --energy against without, side by side.

With --energy every run is metered inside its timed span as a served request would be (a
meter reading and a CpuTimeScope around it), so the latency percentiles carry the cost.
For each model the two are alternated ROUNDS times (fresh processes, same seed, threads
and iterations); the table gives the medians of the p50 latency and of the mean, the
throughput ratio (1/p50, on/off) and the overhead in percent and in microseconds per run.

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
    lines = []
    kernels = source = ""
    for name, file, iters in MODELS:
        p50 = {False: [], True: []}
        mean = {False: [], True: []}
        for r in range(args.rounds):
            for energy in ((False, True) if r % 2 == 0 else (True, False)):
                j = bench(slim, os.path.join(WORK, file), iters, args.threads, energy)
                p50[energy].append(j["p50_ms"])
                mean[energy].append(j["mean_ms"])
                kernels = j["kernels"]
                if energy:
                    source = j["energy"]["basis"] + ": " + j["energy"]["source"]
            print("%s: round %d of %d" % (name, r + 1, args.rounds), file=sys.stderr, flush=True)
        off, on = statistics.median(p50[False]), statistics.median(p50[True])
        ratio = off / on  # throughput on / off
        lines.append("| %s | %d | %.4f | %.4f | %.4f | %.4f | %.4f | %+.2f %% | %+.2f |" % (
            name, iters, off, on, statistics.median(mean[False]), statistics.median(mean[True]), ratio,
            100 * (1 - ratio), 1000 * (on - off)))
    head = ["Metering overhead of `slim bench --energy` (every run metered inside its timed span), %d rounds "
            "alternating on/off, medians; %d threads, kernels %s; meter: %s" % (args.rounds, args.threads, kernels, source),
            "",
            "| model | runs | p50 off (ms) | p50 on (ms) | mean off (ms) | mean on (ms) | throughput on/off | overhead "
            "| us per run |",
            "|---|---|---|---|---|---|---|---|---|"]
    text = "\n".join(head + lines) + "\n"
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "overhead.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
