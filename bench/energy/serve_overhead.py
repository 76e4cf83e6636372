#!/usr/bin/python3
"""Metering overhead of `slim serve --energy`: server throughput with every batch metered
against none, side by side.

For each model two `slim serve` processes run side by side (loopback, free ports), one with
--energy and one without; each first runs every batch size it can pad to twice (an ONNX
session compiles a plan per shape on its second sighting), then the same closed-loop load
goes to one and then the other, ROUNDS times, in alternating order (bench/serve's
serve_loadgen: CLIENTS gRPC clients, each sending its next request when the last one is
answered, for SECONDS after a second of warm-up). The table gives the median and best
throughput of each side and their ratio, and the server's CPU time per request (utime +
stime from /proc over the load): on a shared machine other processes move throughput by far
more than metering costs, while CPU time per request moves less, and its difference is the
cost (a CpuTimeScope and the counters' atomic adds per batch, two meter readings every 10 ms).

Models (bench/serve/make_models.py writes them into the work folder): the digits MLP (a
~10 us model behind a ~100 us request: the worst case, where a fixed cost per batch shows
most), ResNet-18 at 32x32 with dynamic batching up to 16 (batches of milliseconds), an
XGBoost forest (tests/serve/make_repository.py's: 20 trees of depth 4 on 8 features, one
row a request) and a language model over the OpenAI API (tests/serve/make_llm.py --moe: a
tiny Mixture-of-Experts model, so the per-expert accounting runs too; CLIENTS threads each
sending completions of 32 tokens; throughput in generated tokens per second).

Usage: bench/energy/serve_overhead.py [--rounds 5] [--seconds 4] [--threads 2] [--models digits,cnn,forest,llm]
[--out bench/energy/results]; SLIM and LOADGEN override the binaries (default build/)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "serve"))
import run as serve_bench  # noqa: E402  (bench/serve/run.py: the repository and the server)
sys.path.insert(0, os.path.join(ROOT, "tests", "serve"))
import make_repository  # noqa: E402  (the forest model and its config)

WORK = os.path.join(ROOT, "bench", ".work", "energy_overhead")
# name, model file, config lines, input name, its .npy (one row), clients, max batch
MODELS = [
    ("digits", "digits/digits_mlp.onnx", serve_bench.DIGITS, "pixels", "digit1.npy", 8, 32),
    ("cnn", "resnet18_32.onnx", "max_batch_size: 16\n" + serve_bench.MODELS["cnn"][3] + serve_bench.BATCHING_ON,
     "input", "image1.npy", 32, 16),
    ("forest", None, make_repository.FOREST_CONFIG, "input", "forest1.npy", 8, 256),
    ("llm", "chat-moe.gguf", None, None, None, 4, None),
]


def load(loadgen, server, model, inp, stream, seconds, warmup=1):
    """(requests per second, server CPU microseconds per request) of one load run."""
    cpu0 = server.cpu_s()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([loadgen, "--http-port", str(server.ports["HTTP"]), "--grpc-port", str(server.ports["gRPC"]),
                        "--model", model, "--input", inp, "--stream", stream, "--protocol", "grpc",
                        "--duration", str(seconds), "--warmup", str(warmup), "--json", f.name],
                       check=True, stdout=subprocess.DEVNULL)
        j = json.load(open(f.name))
    r = j["total"]
    if r["ok"] != r["sent"]:
        raise RuntimeError("%d of %d requests failed" % (r["sent"] - r["ok"], r["sent"]))
    return r["throughput_rps"], (server.cpu_s() - cpu0) / max(1, j["requests_total"]) * 1e6


def llm_load(server, clients, seconds):
    """(generated tokens per second, server CPU microseconds per token) of CLIENTS threads
    sending completions of up to 32 tokens for SECONDS."""
    url = "http://127.0.0.1:%d/v1/completions" % server.ports["HTTP"]
    end = time.monotonic() + seconds
    tokens = [0] * clients

    def client(i):
        n = 0
        while time.monotonic() < end:
            body = {"model": "llm", "prompt": "Once upon a time %d %d" % (i, n), "max_tokens": 32, "temperature": 0}
            req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                tokens[i] += json.load(r)["usage"]["completion_tokens"]
            n += 1

    cpu0, t0 = server.cpu_s(), time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    return sum(tokens) / elapsed, (server.cpu_s() - cpu0) / max(1, sum(tokens)) * 1e6


def warm(loadgen, server, model, in_name, npy, max_batch):
    """Two requests of each batch size the batcher pads to."""
    x = np.load(os.path.join(WORK, npy))
    for b in ladder(max_batch):
        path = os.path.join(WORK, "warm_%d_%s" % (b, npy))
        np.save(path, np.repeat(x, b, axis=0))
        load(loadgen, server, model, "%s=%s" % (in_name, path), "clients=1,requests=2", 600, warmup=0)


def ladder(max_batch):
    """The batch sizes an ONNX model is padded to (serve::batch_ladder without preferred sizes)."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return sizes + [max_batch]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default=",".join(m[0] for m in MODELS),
                    help="comma-separated, of digits,cnn,forest,llm")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    slim = os.environ.get("SLIM") or os.path.join(ROOT, "build", "tools", "slim")
    loadgen = os.environ.get("LOADGEN") or os.path.join(ROOT, "build", "bench", "serve", "serve_loadgen")
    subprocess.run([sys.executable, os.path.join(ROOT, "bench", "serve", "make_models.py"), WORK], check=True,
                   stdout=subprocess.DEVNULL)
    np.save(os.path.join(WORK, "forest1.npy"), np.random.default_rng(1).normal(size=(1, 8)).astype(np.float32))
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "serve", "make_llm.py"), WORK, "--moe"], check=True)
    rows, source = [], ""
    for name, file, config, in_name, npy, clients, max_batch in (m for m in MODELS if m[0] in args.models.split(",")):
        llm = config is None
        if llm:
            repo = os.path.join(WORK, "repo_empty")
            os.makedirs(repo, exist_ok=True)
            extra = ["--model", os.path.join(WORK, file), "--model-name", name]
        elif file is None:  # the forest: its own config and model.json
            repo = os.path.join(WORK, "repo_" + name)
            make_repository.write(os.path.join(repo, name, "config.pbtxt"), config)
            make_repository.forest_model(os.path.join(repo, name, "1", "model.json"))
            extra = []
        else:
            repo = serve_bench.write_repo(os.path.join(WORK, "repo_" + name), {name: (os.path.join(WORK, file), config)})
            extra = []
        servers = {e: serve_bench.Server(slim, repo, args.threads, extra + (["--energy"] if e else []))
                   for e in (False, True)}
        for s in servers.values():
            if llm:
                llm_load(s, clients, 1)
            else:
                warm(loadgen, s, name, in_name, npy, max_batch)
        source = next((line.split("energy: ", 1)[1].strip() for line in servers[True].stderr
                       if line.startswith("slim serve: energy: ")), source)
        inp = "%s=%s" % (in_name, os.path.join(WORK, npy or ""))
        rps, cpu = {False: [], True: []}, {False: [], True: []}
        for r in range(args.rounds):
            for energy in ((False, True) if r % 2 == 0 else (True, False)):
                t, c = (llm_load(servers[energy], clients, args.seconds) if llm else
                        load(loadgen, servers[energy], name, inp, "clients=%d" % clients, args.seconds))
                rps[energy].append(t)
                cpu[energy].append(c)
            print("%s: round %d of %d" % (name, r + 1, args.rounds), file=sys.stderr, flush=True)
        for s in servers.values():
            s.stop()
        off, on = statistics.median(rps[False]), statistics.median(rps[True])
        c_off, c_on = statistics.median(cpu[False]), statistics.median(cpu[True])
        rows.append("| %s%s | %d | %.0f | %.0f | %.4f | %.0f | %.0f | %.4f | %.1f | %.1f | %+.1f (%+.2f %%) |" % (
            name, " (tokens)" if llm else "", clients, off, on, on / off, max(rps[False]), max(rps[True]), max(rps[True]) / max(rps[False]),
            c_off, c_on, c_on - c_off, 100 * (c_on - c_off) / c_off))
    head = ["Metering overhead of `slim serve --energy` (every batch and step; the meter read at most every 10 ms "
            "per model), %d rounds alternating on/off, "
            "%g s of closed-loop load each (gRPC; llm: OpenAI completions, tokens/s and CPU us per token); %d "
            "threads; meter: %s" % (args.rounds, args.seconds, args.threads,
                                                                          source),
            "",
            "| model | clients | req/s off (median) | req/s on | on/off | req/s off (best) | req/s on (best) | "
            "on/off (best) | server CPU us/request off (median) | on | on - off |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    text = "\n".join(head + rows) + "\n"
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "serve_overhead.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
