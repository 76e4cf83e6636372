#!/usr/bin/python3
"""bench/serve: `slim serve` under load from serve_loadgen, against slim's in-process
numbers (`slim bench`) and the targets of issue 28. Scenarios:

  footprint  start-up to ready and idle RSS, with an empty repository and with digits
  overhead   digits MLP, batch 1, one client: p50 over REST JSON, REST binary and gRPC
             minus the in-process p50 of the same input
  batching   32 closed-loop gRPC clients on a CNN and a BERT-style encoder, dynamic
             batching on vs off, vs in-process throughput at the batch size the server formed
  priority   CNN: a priority-1 Poisson stream at 10% of capacity, alone (idle) and beside a
             priority-3 Poisson stream offering 3x capacity into a bounded queue
  swaps      a repository in poll mode (the CNN by default) under 32 closed-loop gRPC clients:
             steady state, then the same load while 20 new versions are dropped in one by one

Each server's CPU time per answered request (/proc/PID/stat) and peak RSS (VmHWM) is
reported. Writes RESULTS/serve_bench.json, results.md (the tables) and serve_bench.png; a
run of some of the scenarios replaces those in an existing serve_bench.json and keeps the
others. Called by run.sh, which builds the binaries and the models.
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

PORT_LINE = re.compile(r"^slim serve: (HTTP|gRPC|metrics) listening on [0-9.]+:(\d+)$")
TICK = os.sysconf("SC_CLK_TCK")
TARGETS = {"rest_overhead_us": 150, "grpc_overhead_us": 100, "batching_gain": 2.0, "batching_vs_inprocess": 0.85,
           "priority_p99_ratio": 2.0, "idle_rss_mb": 30, "startup_ms": 200, "swap_failed_requests": 0,
           "swap_p99_ratio": 2.0}
SCENARIOS = ("footprint", "overhead", "batching", "priority", "swaps")

DIGITS = """max_batch_size: 32
input [ { name: "pixels", data_type: TYPE_FP32, dims: [ 64 ] } ]
output [ { name: "probabilities", data_type: TYPE_FP32, dims: [ 10 ] } ]
"""
# The batching models: name, file, input, its npy, its config lines.
MODELS = {
    "cnn": ("resnet18_32.onnx", "input", "image",
            'input [ { name: "input", data_type: TYPE_FP32, dims: [ 3, 32, 32 ] } ]\n'
            'output [ { name: "output", data_type: TYPE_FP32, dims: [ 1000 ] } ]\n'),
    "bert": ("bert_mini.onnx", "input_ids", "ids",
             'input [ { name: "input_ids", data_type: TYPE_INT64, dims: [ 64 ] } ]\n'
             'output [ { name: "output", data_type: TYPE_FP32, dims: [ 64, 256 ] } ]\n'),
}
# 32 clients, batches of up to 16: one batch runs while the next one fills.
BATCH = 16
BATCHING_ON = f"""dynamic_batching {{
  preferred_batch_size: [ {BATCH} ]
  max_queue_delay_microseconds: 2000
}}
"""
# Three levels; level 3 (bulk) has a bounded queue, so overload is refused at once.
PRIORITY_BATCH = 8
PRIORITY = """dynamic_batching {
  preferred_batch_size: [ 8 ]
  max_queue_delay_microseconds: 500
  priority_levels: 3
  default_priority_level: 2
  priority_queue_policy { key: 3, value: { max_queue_size: 32 } }
}
"""


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def write_repo(path, models):
    """A Triton-style repository: models is {name: (onnx file, config lines)}; the model
    file is a link to the one in models/."""
    os.makedirs(path, exist_ok=True)
    for name, (onnx, config) in models.items():
        os.makedirs(os.path.join(path, name, "1"), exist_ok=True)
        with open(os.path.join(path, name, "config.pbtxt"), "w") as f:
            f.write(f'name: "{name}"\nplatform: "onnxruntime_onnx"\n' + config)
        link = os.path.join(path, name, "1", "model.onnx")
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(os.path.abspath(onnx), link)
    return path


class Server:
    """`slim serve` on free loopback ports; reads its CPU time and memory from /proc."""

    def __init__(self, slim, repo, threads, extra=()):
        t0 = time.monotonic()
        self.proc = subprocess.Popen([slim, "serve", "--model-repository", repo, "--host", "127.0.0.1", "--http-port", "0",
                                      "--grpc-port", "0", "--metrics-port", "0", "--threads", str(threads), *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.ports, self.stderr = {}, []
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()
        for line in self.proc.stdout:
            m = PORT_LINE.match(line.strip())
            if m:
                self.ports[m.group(1)] = int(m.group(2))
            if line.strip() == "slim serve: ready":
                break
        else:
            self.proc.wait()
            raise RuntimeError("slim serve did not become ready:\n" + "".join(self.stderr))
        self.ready_ms = (time.monotonic() - t0) * 1e3
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()
        time.sleep(0.2)  # let start-up's transient threads and buffers settle
        self.idle_rss_mb = self.status_mb("VmRSS")

    def cpu_s(self):
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)

    def status_mb(self, key):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
        raise RuntimeError(f"no {key} in /proc/{self.proc.pid}/status")

    def counters(self, model):
        """The model's batching counters (each summed over its series)."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.ports['metrics']}/metrics", timeout=10).read().decode()
        names = {"slim_inference_count_total": "rows", "slim_inference_exec_count_total": "batches",
                 "slim_inference_compute_infer_duration_seconds_total": "infer_s",
                 "slim_inference_queue_duration_seconds_total": "queue_s"}
        c = dict.fromkeys(names.values(), 0.0)
        for line in text.splitlines():
            name = line.split("{", 1)[0]
            if name in names and f'model="{model}"' in line:
                c[names[name]] += float(line.rsplit(" ", 1)[1])
        return c

    def wait_stderr(self, text, since, timeout):
        """Waits for a stderr line containing text at index since or later; returns its index."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i in range(since, len(self.stderr)):
                if text in self.stderr[i]:
                    return i
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        raise RuntimeError(f"slim serve printed no '{text}' within {timeout} s:\n" + "".join(self.stderr[-20:]))

    def stop(self):
        peak = self.status_mb("VmHWM")
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(60)
        if rc != 0:
            raise RuntimeError(f"slim serve exited {rc} after SIGTERM:\n" + "".join(self.stderr[-20:]))
        return peak


def batching_stats(before, after):
    """Mean rows per batch and model time per batch between two counters() snapshots."""
    d = {k: after[k] - before[k] for k in after}
    batches = max(1.0, d["batches"])
    return {"mean_batch": d["rows"] / batches, "infer_ms_per_batch": d["infer_s"] / batches * 1e3,
            "queue_ms_per_request": d["queue_s"] / max(1.0, d["rows"]) * 1e3}


class Bench:
    def __init__(self, args):
        self.a = args
        self.work = args.work
        os.makedirs(os.path.join(self.work, "runs"), exist_ok=True)
        self.results = {"machine": machine(), "scenarios": {}}
        self.servers = []  # per server: what it served, requests, CPU seconds, peak RSS
        self.scenario = None  # the one running

    def loadgen(self, server, model, inputs, streams, duration, tag, warmup=None, account=True, during=None):
        """Runs serve_loadgen against the server. With during, the load runs while during(warmup)
        runs here, and ends (SIGINT) when it returns: duration is then an upper bound."""
        out = os.path.join(self.work, "runs", tag + ".json")
        warmup = self.a.warmup if warmup is None else warmup
        cmd = [self.a.loadgen, "--http-port", str(server.ports["HTTP"]), "--grpc-port", str(server.ports["gRPC"]),
               "--model", model, "--duration", str(duration), "--warmup", str(warmup), "--json", out]
        cmd += [x for i in inputs for x in ("--input", i)] + [x for s in streams for x in ("--stream", s)]
        cpu0 = server.cpu_s()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            if during:
                during(warmup)
        finally:
            if during:
                p.send_signal(signal.SIGINT)
            text = p.communicate()[0]
        cpu = server.cpu_s() - cpu0
        if p.returncode != 0:
            raise RuntimeError(f"serve_loadgen failed ({tag}):\n{text}")
        with open(out) as f:
            r = json.load(f)
        if not account:
            return r
        log(f"-- {tag}\n{text.rstrip()}")
        server.requests += r["requests_total"]
        server.cpu += cpu
        r["server_cpu_us_per_request"] = cpu / max(1, r["requests_total"]) * 1e6
        r["client_cpu_us_per_request"] = r["client_cpu_s"] / max(1, r["requests_total"]) * 1e6
        return r

    def warm(self, server, model, in_name, npy, max_batch):
        """Runs every batch size the batcher can form twice, one request of that many rows at
        a time: the runtime compiles a plan for an input shape on its second sighting and
        runs the first on its generic plan, where Conv and MatMul fall back to the reference
        kernels (tens of ms a sample). Returns the seconds it took."""
        t0 = time.monotonic()
        x = np.load(os.path.join(self.work, "models", npy + "1.npy"))
        for b in range(1, max_batch + 1):
            path = os.path.join(self.work, "models", f"{npy}{b}.npy")
            np.save(path, np.repeat(x, b, axis=0))
            self.loadgen(server, model, [f"{in_name}={path}"], ["clients=1,requests=2"], 600, "warm", warmup=0,
                         account=False)
        return time.monotonic() - t0

    def start(self, repo, label, extra=()):
        s = Server(self.a.slim, repo, self.a.threads, extra)
        s.label, s.requests, s.cpu = label, 0, 0.0
        return s

    def stop(self, s):
        peak = s.stop()
        self.servers.append({"server": s.label, "scenario": self.scenario, "requests": s.requests, "cpu_us_per_request":
                             s.cpu / s.requests * 1e6 if s.requests else None, "peak_rss_mb": peak,
                             "idle_rss_mb": s.idle_rss_mb, "ready_ms": s.ready_ms})

    def inprocess(self, model, inputs, iters, warmup=10):
        out = os.path.join(self.work, "runs", "inprocess.json")
        cmd = [self.a.slim, "bench", model, "--threads", str(self.a.threads), "--iters", str(iters), "--warmup",
               str(warmup), "--json", out] + [x for i in inputs for x in ("--input", i)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)

    # ---- scenarios
    def footprint(self):
        res = {}
        empty = os.path.join(self.work, "repo_empty")
        os.makedirs(empty, exist_ok=True)
        for label, repo in (("empty", empty), ("digits", self.digits_repo())):
            ready, rss = [], []
            for _ in range(self.a.repeat):
                s = Server(self.a.slim, repo, self.a.threads)
                ready.append(s.ready_ms)
                rss.append(s.idle_rss_mb)
                s.stop()
            res[label] = {"ready_ms": statistics.median(ready), "idle_rss_mb": statistics.median(rss)}
        ip = self.inprocess(os.path.join(self.work, "models/digits/digits_mlp.onnx"), [], 10)
        res["digits"]["model_load_ms"] = ip["cold_start_ms"]
        self.results["scenarios"]["footprint"] = res

    def digits_repo(self):
        return write_repo(os.path.join(self.work, "repo_digits"),
                          {"digits": (os.path.join(self.work, "models/digits/digits_mlp.onnx"), DIGITS)})

    def overhead(self):
        inp = ["pixels=" + os.path.join(self.work, "models/digit1.npy")]
        s = self.start(self.digits_repo(), "overhead (digits)")
        p50 = {p: [] for p in ("rest-json", "rest-binary", "grpc")}
        cpu = {p: [] for p in p50}
        inproc = []
        for i in range(self.a.repeat):
            for proto in p50:
                r = self.loadgen(s, "digits", inp, [f"clients=1,protocol={proto}"], self.a.overhead_s, f"overhead_{proto}_{i}")
                p50[proto].append(r["total"]["latency_us"]["p50"])
                cpu[proto].append(r["server_cpu_us_per_request"])
            ip = self.inprocess(os.path.join(self.work, "models/digits/digits_mlp.onnx"), inp, 5000, 200)
            inproc.append(ip["p50_ms"] * 1e3)
        self.stop(s)
        base = statistics.median(inproc)
        res = {"inprocess_p50_us": base, "inprocess_runs_us": inproc}
        for proto, v in p50.items():
            res[proto] = {"p50_us": statistics.median(v), "runs_us": v, "overhead_us": statistics.median(v) - base,
                          "server_cpu_us_per_request": statistics.median(cpu[proto])}
        self.results["scenarios"]["overhead"] = res

    def batching(self):
        """Each server run is followed by its in-process counterpart (batch 1 after batching
        off, the server's mean batch after batching on), so both see the same machine load."""
        res = {}
        for name, (onnx, in_name, npy, config) in MODELS.items():
            onnx = os.path.join(self.work, "models", onnx)
            res[name] = {"model": os.path.basename(onnx)}
            for mode, extra in (("off", ""), ("on", BATCHING_ON)):
                repo = write_repo(os.path.join(self.work, f"repo_{name}_{mode}"),
                                  {name: (onnx, f"max_batch_size: {BATCH}\n" + config + extra)})
                s = self.start(repo, f"batching {name} {mode}")
                res[name][mode] = {"warm_s": self.warm(s, name, in_name, npy, BATCH if mode == "on" else 1)}
                runs = {"thr": [], "batch": [], "infer": [], "p50": [], "p99": [], "ip_ms": []}
                for i in range(self.a.repeat):
                    c0 = s.counters(name)
                    inp = [f"{in_name}=" + os.path.join(self.work, "models", npy + "1.npy")]
                    r = self.loadgen(s, name, inp, ["clients=32"], self.a.batching_s, f"batching_{name}_{mode}_{i}")
                    b = batching_stats(c0, s.counters(name))
                    for k, v in (("thr", r["total"]["throughput_rps"]), ("batch", b["mean_batch"]),
                                 ("infer", b["infer_ms_per_batch"]), ("p50", r["total"]["latency_us"]["p50"]),
                                 ("p99", r["total"]["latency_us"]["p99"])):
                        runs[k].append(v)
                    # In-process at the batch size the server formed (the input repeated along dim 0).
                    ip_batch = max(1, round(runs["batch"][0]))
                    path = os.path.join(self.work, "models", f"{npy}{ip_batch}.npy")
                    runs["ip_ms"].append(self.inprocess(onnx, [f"{in_name}={path}"], max(10, 400 // ip_batch), 3)["p50_ms"])
                self.stop(s)
                m = {k: statistics.median(v) for k, v in runs.items()}
                res[name][mode] |= {"throughput_rps": m["thr"], "runs_rps": runs["thr"], "mean_batch": m["batch"],
                                   "infer_ms_per_batch": m["infer"], "p50_us": m["p50"], "p99_us": m["p99"]}
                res[name]["inprocess" if mode == "on" else "inprocess_b1"] = {
                    "batch": ip_batch, "throughput_sps": ip_batch / (m["ip_ms"] / 1e3), "p50_ms": m["ip_ms"],
                    "runs_ms": runs["ip_ms"]}
            res[name]["gain"] = res[name]["on"]["throughput_rps"] / res[name]["off"]["throughput_rps"]
            res[name]["vs_inprocess"] = res[name]["on"]["throughput_rps"] / res[name]["inprocess"]["throughput_sps"]
        self.results["scenarios"]["batching"] = res

    def priority(self):
        onnx, in_name, npy, config = MODELS["cnn"]
        repo = write_repo(os.path.join(self.work, "repo_priority"),
                          {"cnn": (os.path.join(self.work, "models", onnx),
                                   f"max_batch_size: {PRIORITY_BATCH}\n" + config + PRIORITY)})
        inp = [f"{in_name}=" + os.path.join(self.work, "models", npy + "1.npy")]
        s = self.start(repo, "priority (cnn)")
        warm_s = self.warm(s, "cnn", in_name, npy, PRIORITY_BATCH)
        d = self.a.priority_s
        runs = {"capacity": [], "idle_p99": [], "idle_p50": [], "loaded_p99": [], "loaded_p50": [], "high_rejected": [],
                "low_ok_rps": [], "low_rejected": [], "high_rps": [], "idle_infer_ms": [], "loaded_infer_ms": [],
                "loaded_batch": [], "loaded_cpu_us": [], "loaded_client_cpu_us": []}
        for i in range(self.a.repeat):
            cap = self.loadgen(s, "cnn", inp, ["priority=2,clients=16"], d, f"priority_capacity_{i}")["total"]["throughput_rps"]
            # Pools large enough that neither stream waits for a free connection.
            high = f"priority=1,rate={0.1 * cap:.1f},connections=32"
            c0 = s.counters("cnn")
            idle = self.loadgen(s, "cnn", inp, [high], d, f"priority_idle_{i}")["levels"][0]
            c1 = s.counters("cnn")
            low = f"priority=3,rate={3 * cap:.1f},connections=128"
            loaded = self.loadgen(s, "cnn", inp, [high, low], d, f"priority_loaded_{i}")
            c2 = s.counters("cnn")
            runs["idle_infer_ms"].append(batching_stats(c0, c1)["infer_ms_per_batch"])
            runs["loaded_infer_ms"].append(batching_stats(c1, c2)["infer_ms_per_batch"])
            runs["loaded_batch"].append(batching_stats(c1, c2)["mean_batch"])
            runs["loaded_cpu_us"].append(loaded["server_cpu_us_per_request"])
            runs["loaded_client_cpu_us"].append(loaded["client_cpu_us_per_request"])
            lv = {l["priority"]: l for l in loaded["levels"]}
            runs["capacity"].append(cap)
            runs["idle_p50"].append(idle["latency_us"]["p50"])
            runs["idle_p99"].append(idle["latency_us"]["p99"])
            runs["loaded_p50"].append(lv[1]["latency_us"]["p50"])
            runs["loaded_p99"].append(lv[1]["latency_us"]["p99"])
            runs["high_rejected"].append(lv[1]["sent"] - lv[1]["ok"])
            runs["high_rps"].append(lv[1]["throughput_rps"])
            runs["low_ok_rps"].append(lv[3]["throughput_rps"])
            runs["low_rejected"].append(lv[3]["rejected"])
        self.stop(s)
        res = {k: statistics.median(v) for k, v in runs.items()}
        res["high_rejected"] = sum(runs["high_rejected"])
        res["p99_ratio"] = res["loaded_p99"] / res["idle_p99"]
        res["runs"] = runs
        res["max_batch_size"] = PRIORITY_BATCH
        res["warm_s"] = warm_s
        self.results["scenarios"]["priority"] = res

    def swaps(self):
        """A repository in poll mode under 32 closed-loop gRPC clients: a steady-state window,
        then the same load while new version folders are dropped in one after another (each
        copied into a staging folder and renamed in, so the server never sees half a file),
        each awaited in the server's "loaded model" line before the next. The folder of the
        version before the one serving goes in the same moment, so the repository stays at
        two versions without an extra reload."""
        name = self.a.swap_model
        if name == "digits":
            onnx, config = os.path.join(self.work, "models/digits/digits_mlp.onnx"), DIGITS
            inp = ["pixels=" + os.path.join(self.work, "models/digit1.npy")]
        else:
            onnx, in_name, npy, config = MODELS[name]
            onnx, config = os.path.join(self.work, "models", onnx), f"max_batch_size: {BATCH}\n" + config
            inp = [f"{in_name}=" + os.path.join(self.work, "models", npy + "1.npy")]
        repo, staging = os.path.join(self.work, "repo_swaps"), os.path.join(self.work, "swaps_staging")
        for d in (repo, staging):
            shutil.rmtree(d, ignore_errors=True)
        os.makedirs(staging)
        write_repo(repo, {name: (onnx, config)})
        s = self.start(repo, f"swaps ({name})", ["--model-control-mode", "poll", "--repository-poll-secs", "1"])
        version = 1

        def stats(r):  # a loadgen total: every outcome other than ok is a failed request
            return {"requests": r["sent"], "failed": r["sent"] - r["ok"], "throughput_rps": r["throughput_rps"],
                    "outcomes": {k: r[k] for k in ("rejected", "unavailable", "timeout", "error")},
                    **{k: r["latency_us"][k] for k in ("p50", "p99", "max")}}

        runs = {"steady": [], "during": []}
        for i in range(self.a.repeat):
            runs["steady"].append(stats(self.loadgen(s, name, inp, ["clients=32"], self.a.swaps_steady_s,
                                                     f"swaps_steady_{i}")["total"]))
            took, window = [], {}

            def swap_all(warmup):
                nonlocal version
                time.sleep(warmup)
                t_start = time.monotonic()
                for _ in range(self.a.swaps):
                    version += 1
                    tmp = os.path.join(staging, str(version))
                    os.makedirs(tmp)
                    shutil.copyfile(onnx, os.path.join(tmp, "model.onnx"))
                    shutil.rmtree(os.path.join(repo, name, str(version - 2)), ignore_errors=True)
                    since, t0 = len(s.stderr), time.monotonic()
                    os.rename(tmp, os.path.join(repo, name, str(version)))
                    s.wait_stderr(f"loaded model '{name}' version {version} (", since, 30)
                    took.append(time.monotonic() - t0)
                window["s"] = time.monotonic() - t_start

            r = self.loadgen(s, name, inp, ["clients=32"], 3600, f"swaps_during_{i}", during=swap_all)
            runs["during"].append(stats(r["total"]) | {"window_s": window["s"], "swap_s": took,
                                                        "first_error": [x["first_error"] for x in r["streams"]
                                                                        if "first_error" in x]})
        self.stop(s)
        trouble = [line.strip() for line in s.stderr if "failed" in line or "warning" in line]
        res = {"model": name, "clients": 32, "protocol": "grpc", "poll_secs": 1, "swaps": self.a.swaps * self.a.repeat,
               "load_ms": self.inprocess(onnx, inp, 10, 0)["cold_start_ms"], "server_trouble": trouble, "runs": runs}
        for phase, rs in runs.items():
            res[phase] = {k: statistics.median(x[k] for x in rs) for k in ("p50", "p99", "throughput_rps")}
            res[phase] |= {"max": max(x["max"] for x in rs), "requests": sum(x["requests"] for x in rs),
                           "failed": sum(x["failed"] for x in rs)}
        swap_s = [t for x in runs["during"] for t in x["swap_s"]]
        res["swap_s"] = {"median": statistics.median(swap_s), "max": max(swap_s)}
        res["window_s"] = {"steady": self.a.swaps_steady_s, "during": statistics.median(x["window_s"] for x in runs["during"])}
        res["p99_ratio"] = res["during"]["p99"] / res["steady"]["p99"]
        self.results["scenarios"]["swaps"] = res


def machine():
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    flags = open("/proc/cpuinfo").read()
    isa = "avx512" if " avx512f" in flags else "avx2" if " avx2" in flags else "sse"
    return {"cpu": cpu, "cores": os.cpu_count(), "isa": isa, "load_average": os.getloadavg()}


def mark(ok):
    return "met" if ok else "**missed**"


def tables(r):
    """The results as markdown tables (printed and written to results.md)."""
    m, sc = r["machine"], r["scenarios"]
    out = [f"Machine: {m['cpu']}, {m['cores']} cores ({m['isa']}); load average at start "
           f"{m['load_average'][0]:.2f}; server and load generator on the same cores; "
           f"server --threads {r['threads']}, medians of {r['repeat']} runs.", ""]
    if "overhead" in sc:
        o = sc["overhead"]
        out += ["| Server overhead (digits MLP, batch 1, 1 client) | p50 | over in-process | target | | server CPU per request |",
                "|---|---:|---:|---:|---|---:|",
                f"| in-process (`slim bench`) | {o['inprocess_p50_us']:.1f} µs | | | | |"]
        for proto, target in (("rest-json", "rest"), ("rest-binary", "rest"), ("grpc", "grpc")):
            t = TARGETS[target + "_overhead_us"]
            out.append(f"| {proto} | {o[proto]['p50_us']:.1f} µs | {o[proto]['overhead_us']:.1f} µs | ≤ {t} µs | "
                       f"{mark(o[proto]['overhead_us'] <= t)} | {o[proto]['server_cpu_us_per_request']:.0f} µs |")
        out.append("")
    if "batching" in sc:
        out += [f"| Dynamic batching (32 gRPC clients, max batch {BATCH}) | off | on (mean batch) | on/off | in-process at that batch | "
                "on/in-process | in-process batch 1 | in-process gain from batching |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for name, b in sc["batching"].items():
            out.append(f"| {name} ({b['model']}) | {b['off']['throughput_rps']:.1f}/s | {b['on']['throughput_rps']:.1f}/s "
                       f"({b['on']['mean_batch']:.1f}) | {b['gain']:.2f}× (≥ 2×: {mark(b['gain'] >= 2)}) | "
                       f"{b['inprocess']['throughput_sps']:.1f}/s (batch {b['inprocess']['batch']}) | "
                       f"{100 * b['vs_inprocess']:.0f} % (≥ 85 %: {mark(b['vs_inprocess'] >= 0.85)}) | "
                       f"{b['inprocess_b1']['throughput_sps']:.1f}/s | "
                       f"{b['inprocess']['throughput_sps'] / b['inprocess_b1']['throughput_sps']:.2f}× |")
        out.append("")
        out.append("Model time per batch in the server (metrics) vs in-process at that batch: " + "; ".join(
            f"{name} {b['on']['infer_ms_per_batch']:.1f} vs {b['inprocess']['p50_ms']:.1f} ms" for name, b in sc["batching"].items()) +
            ". Warm-up before measuring (every batch size run twice): " + "; ".join(
            f"{name} {b['on']['warm_s']:.1f} s" for name, b in sc["batching"].items()) + ".")
        out.append("")
    if "priority" in sc:
        p = sc["priority"]
        out += [f"| Priority isolation (cnn, max batch {p['max_batch_size']}, gRPC) | value |", "|---|---:|",
                f"| capacity (16 closed-loop clients) | {p['capacity']:.1f}/s |",
                f"| priority 1 alone at 10 % of capacity: p50 / p99 | {p['idle_p50'] / 1e3:.2f} / {p['idle_p99'] / 1e3:.2f} ms |",
                f"| priority 1 beside priority 3 at 3× capacity: p50 / p99 | {p['loaded_p50'] / 1e3:.2f} / "
                f"{p['loaded_p99'] / 1e3:.2f} ms |",
                f"| p99 loaded / idle | {p['p99_ratio']:.2f}× (≤ 2×: {mark(p['p99_ratio'] <= 2)}) |",
                f"| priority 1 rejected or failed (all runs) | {p['high_rejected']} ({mark(p['high_rejected'] == 0)}) |",
                f"| priority 3 answered / rejected | {p['low_ok_rps']:.1f}/s / {p['low_rejected']:.0f} per run |",
                f"| model time per batch: idle / overloaded (mean batch {p['loaded_batch']:.1f}) | {p['idle_infer_ms']:.2f} / "
                f"{p['loaded_infer_ms']:.2f} ms |",
                f"| CPU per request (answered or rejected) under overload: server / load generator | "
                f"{p['loaded_cpu_us']:.0f} / {p['loaded_client_cpu_us']:.0f} µs |", ""]
    if "footprint" in sc:
        f = sc["footprint"]
        d = f["digits"]
        out += ["| Footprint | start-up to ready | idle RSS |", "|---|---:|---:|",
                f"| empty repository | {f['empty']['ready_ms']:.0f} ms (≤ 200 ms: {mark(f['empty']['ready_ms'] <= 200)}) | "
                f"{f['empty']['idle_rss_mb']:.1f} MB (≤ 30 MB: {mark(f['empty']['idle_rss_mb'] <= 30)}) |",
                f"| digits (in-process load + compile + first run {d['model_load_ms']:.1f} ms) | {d['ready_ms']:.0f} ms "
                f"(≤ 200 ms + load: {mark(d['ready_ms'] <= 200 + d['model_load_ms'])}) | {d['idle_rss_mb']:.1f} MB |", ""]
    if "swaps" in sc:
        w = sc["swaps"]
        st, du = w["steady"], w["during"]
        out += [f"| Hot swaps ({w['model']}, {w['clients']} closed-loop {w['protocol']} clients, poll every "
                f"{w['poll_secs']} s) | steady state | during swaps | target |", "|---|---:|---:|---|",
                f"| window per run | {w['window_s']['steady']:.1f} s | {w['window_s']['during']:.1f} s "
                f"({w['swaps'] // w['run']['repeat']} swaps) | |",
                f"| requests / failed (all runs) | {st['requests']} / {st['failed']} | {du['requests']} / {du['failed']} | "
                f"0 failed: {mark(du['failed'] == 0)} |",
                f"| answered per second | {st['throughput_rps']:.0f}/s | {du['throughput_rps']:.0f}/s | |",
                f"| p50 / p99 / max | {st['p50'] / 1e3:.2f} / {st['p99'] / 1e3:.2f} / {st['max'] / 1e3:.1f} ms | "
                f"{du['p50'] / 1e3:.2f} / {du['p99'] / 1e3:.2f} / {du['max'] / 1e3:.1f} ms | |",
                f"| p99 during swaps / steady | | {w['p99_ratio']:.2f}× | ≤ 2×: {mark(w['p99_ratio'] <= 2)} |",
                f"| swaps done; drop to loaded, median / max | | {w['swaps']}; {w['swap_s']['median']:.2f} / "
                f"{w['swap_s']['max']:.2f} s | |",
                f"| the model's load + compile + first run in-process (`slim bench`) | | {w['load_ms']:.0f} ms | |", ""]
    # Scenarios kept from an earlier run (a partial run merges into the results) say when.
    for name, res in sc.items():
        run = res.get("run")
        if run and run["date"] != r.get("date"):
            m = run["machine"]
            out += [f"The {name} scenario ran separately ({run['date']}) on {m['cpu']}, {m['cores']} cores ({m['isa']}): "
                    f"load average {m['load_average'][0]:.2f} at its start, medians of {run['repeat']} runs.", ""]
    if r["servers"]:
        out += ["| Server process | answered requests | CPU per request | peak RSS | idle RSS | ready |",
                "|---|---:|---:|---:|---:|---:|"]
        for s in r["servers"]:
            cpu = f"{s['cpu_us_per_request']:.0f} µs" if s["cpu_us_per_request"] is not None else "-"
            out.append(f"| {s['server']} | {s['requests']} | {cpu} | {s['peak_rss_mb']:.1f} MB | {s['idle_rss_mb']:.1f} MB | "
                       f"{s['ready_ms']:.0f} ms |")
    return "\n".join(out) + "\n"


def plot(r, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sc = r["scenarios"]
    panels = [n for n in ("overhead", "batching", "priority", "swaps") if n in sc]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
    axes = dict(zip(panels, axes[0]))
    if "overhead" in sc:
        o = sc["overhead"]
        names = ["in-process", "rest-json", "rest-binary", "grpc"]
        vals = [o["inprocess_p50_us"]] + [o[n]["p50_us"] for n in names[1:]]
        axes["overhead"].bar(names, vals, color=["gray", "C0", "C1", "C2"])
        axes["overhead"].set_title("digits MLP, batch 1, 1 client: p50")
        axes["overhead"].set_ylabel("µs")
    if "batching" in sc:
        b = sc["batching"]
        x = np.arange(len(b))
        bars = (("off", "server, batching off"), ("on", "server, batching on"), ("inprocess_b1", "in-process, batch 1"),
                ("inprocess", "in-process, the server's batch"))
        for i, (key, label) in enumerate(bars):
            vals = [v[key]["throughput_sps" if key.startswith("inprocess") else "throughput_rps"] for v in b.values()]
            axes["batching"].bar(x + (i - 1.5) * 0.2, vals, 0.2, label=label)
        axes["batching"].set_xticks(x, [f"{k} ({v['model']})" for k, v in b.items()])
        axes["batching"].set_ylabel("samples / s")
        axes["batching"].set_title("32 clients: throughput")
        axes["batching"].legend()
    if "priority" in sc:
        p = sc["priority"]
        x = np.arange(2)
        axes["priority"].bar(x - 0.2, [p["idle_p50"] / 1e3, p["loaded_p50"] / 1e3], 0.4, label="p50")
        axes["priority"].bar(x + 0.2, [p["idle_p99"] / 1e3, p["loaded_p99"] / 1e3], 0.4, label="p99")
        axes["priority"].set_xticks(x, ["idle server", "3× low-priority overload"])
        axes["priority"].set_ylabel("ms")
        axes["priority"].set_title("priority-1 stream at 10 % of capacity")
        axes["priority"].legend()
    if "swaps" in sc:
        w = sc["swaps"]
        x = np.arange(2)
        axes["swaps"].bar(x - 0.2, [w["steady"]["p50"] / 1e3, w["during"]["p50"] / 1e3], 0.4, label="p50")
        axes["swaps"].bar(x + 0.2, [w["steady"]["p99"] / 1e3, w["during"]["p99"] / 1e3], 0.4, label="p99")
        axes["swaps"].set_xticks(x, ["steady state", f"{w['swaps'] // w['run']['repeat']} hot swaps"])
        axes["swaps"].set_ylabel("ms")
        axes["swaps"].set_title(f"{w['model']}, {w['clients']} clients, poll mode")
        axes["swaps"].legend()
    fig.suptitle(f"slim serve on {r['machine']['cpu']}, {r['machine']['cores']} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slim", required=True, help="slim binary")
    ap.add_argument("--loadgen", required=True, help="serve_loadgen binary")
    ap.add_argument("--work", required=True, help="folder with models/ (make_models.py); repositories go here")
    ap.add_argument("--results", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated (default all)")
    ap.add_argument("--threads", type=int, default=1, help="server compute threads and slim bench threads (default 1)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement; tables show medians (default 3)")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds of load before each measurement")
    ap.add_argument("--overhead-s", type=float, default=3.0)
    ap.add_argument("--batching-s", type=float, default=6.0)
    ap.add_argument("--priority-s", type=float, default=5.0)
    ap.add_argument("--swaps", type=int, default=20, help="versions dropped in per run of the swaps scenario (default 20)")
    ap.add_argument("--swaps-steady-s", type=float, default=20.0, help="steady-state window before the swaps (default 20)")
    ap.add_argument("--swap-model", choices=("cnn", "digits"), default="cnn",
                    help="model of the swaps scenario (default cnn: a digits load takes 3 ms and shows nothing)")
    a = ap.parse_args()
    names = a.scenarios.split(",")
    if unknown := [n for n in names if n not in SCENARIOS]:
        ap.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    bench = Bench(a)
    t0, date = time.monotonic(), time.strftime("%Y-%m-%d %H:%M")
    for name in names:
        log(f"== {name}")
        bench.scenario, m = name, machine()
        getattr(bench, name)()
        bench.results["scenarios"][name]["run"] = {"date": date, "machine": m, "repeat": a.repeat}
    r = bench.results
    r.update(date=date, threads=a.threads, repeat=a.repeat, servers=bench.servers, targets=TARGETS,
             load_average_end=os.getloadavg(), seconds=time.monotonic() - t0)
    os.makedirs(a.results, exist_ok=True)
    path = os.path.join(a.results, "serve_bench.json")
    old = {}
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
    if any(k not in names for k in old.get("scenarios", {})):
        # A partial run: the other scenarios (and their servers) stay as an earlier run left them.
        old["scenarios"] |= r["scenarios"]
        old["servers"] = [x for x in old["servers"] if x.get("scenario") not in names] + r["servers"]
        old["targets"] = TARGETS
        r = old
    with open(path, "w") as f:
        json.dump(r, f, indent=2)
    text = tables(r)
    with open(os.path.join(a.results, "results.md"), "w") as f:
        f.write(text)
    print(text)
    plot(r, os.path.join(a.results, "serve_bench.png"))
    log(f"wrote {a.results}/serve_bench.json, results.md and serve_bench.png in {r['seconds']:.0f} s")


if __name__ == "__main__":
    main()
