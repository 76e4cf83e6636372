#!/usr/bin/python3
"""bench/serve_llm: `slim serve` against llama.cpp's `llama-server` on the same GGUF file, the
same threads and the same slots (concurrent sequences) and context per slot, under the chat
load of loadgen.py (multi-turn conversations, a shared system prompt, streaming).

For each model and each level (1, 8, 16, 32 clients; then the mixed run), the two servers run
one after the other (alternating, so both see the same drift in machine load), each freshly
started with slots = clients and a total context of slots x --ctx:
  llama-server -m FILE -t T -tb T -np N -c N*CTX --host 127.0.0.1 --port P   (continuous batching on)
  slim serve --model FILE --host 127.0.0.1 --http-port 0 --allow-grpc false --metrics-port 0
             --threads T --max-sequences N --ctx-size CTX
Level 1 also probes a follow-up chat turn with a ~1,000-token history against a cold request
of the same length. The mixed run: --mixed-clients normal clients (priority 10) fill all
slots, plus priority-0 requests (about 10% of all); those are then replayed on the idle
server, and the table shows their TTFT p99 under load over idle.

Before the load, each server is started once per model (one slot) for `slim check URL`, whose
JSON report goes to RESULTS/check_ENGINE_MODEL.json, with a one-line summary printed
(--check-only: that step alone).

Models: shared/models/slimlm-f16.gguf (next to the repository; --model to name others), and
with --random-1b the random-weight 1.1 B Llama of bench/vs_llamacpp (Q4_0 by default).
llama-server is built once by bench/llamacpp.py (native, or --isa avx2) into bench/.work.
Writes RESULTS/serve_llm.json, results.md and serve_llm.png. run.sh installs what it needs.
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.dirname(HERE))
import llamacpp  # noqa: E402
import loadgen  # noqa: E402

ENGINES = ("llama", "slim")
METRICS = ("output_tps", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "e2e_p50_ms")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server process, its log in a file; port once it answers."""

    def __init__(self, engine, a, model, slots, logpath):
        self.engine, self.port = engine, None
        self.logpath = logpath
        t = str(a.threads)
        if engine == "llama":
            self.port = free_port()
            cmd = [a.llama_server, "-m", model, "-t", t, "-tb", t, "-np", str(slots), "-c", str(slots * a.ctx),
                   "--host", "127.0.0.1", "--port", str(self.port)]
        else:
            cmd = [a.slim, "serve", "--model", model, "--host", "127.0.0.1", "--http-port", "0", "--allow-grpc", "false",
                   "--metrics-port", "0", "--threads", t, "--max-sequences", str(slots), "--ctx-size", str(a.ctx),
                   *a.slim_args.split()]
        self.cmd = cmd
        self.logf = open(logpath, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.logf, stderr=subprocess.STDOUT, env=llamacpp.slim_env(a.isa))
        try:
            self._wait_ready(600)
        except Exception:
            self.stop()
            raise

    def _wait_ready(self, timeout):
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("%s exited (%d) before it was ready:\n%s" % (self.cmd[0], self.proc.returncode,
                                                                               self.log_tail()))
            if self.engine == "llama":
                try:
                    with urllib.request.urlopen("http://127.0.0.1:%d/health" % self.port, timeout=5) as r:
                        if r.status == 200:
                            return
                except (urllib.error.URLError, OSError):
                    pass
            else:
                with open(self.logpath) as f:
                    text = f.read()
                for line in text.splitlines():
                    if line.startswith("slim serve: HTTP listening on "):
                        self.port = int(line.rsplit(":", 1)[1])
                if self.port and "slim serve: ready" in text:
                    return
            time.sleep(0.2)
        raise RuntimeError("%s not ready after %d s:\n%s" % (self.cmd[0], timeout, self.log_tail()))

    def log_tail(self):
        with open(self.logpath) as f:
            return "".join(f.readlines()[-20:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()


def slug(label):
    return "".join(c if c.isalnum() else "-" for c in label.lower())


def check(a, engine, label, model, logdir):
    """`slim check` against the engine serving model (one slot): writes its report into the
    results and returns a one-line summary: exit code, protocols that answered, models."""
    server = Server(engine, a, model, 1, os.path.join(logdir, "%s-check.log" % engine))
    try:
        # 30 s a request, not the default 3: on two shared cores llama-server's spinning threads
        # can take longer than 3 s for a 4-token completion, and this checks protocols, not speed.
        p = subprocess.run([a.slim, "check", "http://127.0.0.1:%d" % server.port, "--timeout-ms", "30000"],
                           capture_output=True, text=True, timeout=600)
    finally:
        server.stop()
    try:
        report = json.loads(p.stdout)
    except ValueError:
        raise RuntimeError("slim check against %s printed no JSON report (exit %d):\n%s" % (engine, p.returncode,
                                                                                          p.stderr))
    with open(os.path.join(a.results, "check_%s_%s.json" % (engine, slug(label))), "w") as f:
        json.dump(report, f, indent=2)
    protocols = [k for k, v in (report.get("protocols") or {}).items() if v.get("answered")]
    models = []
    for m in report.get("models") or []:
        lat = m.get("latency") or {}
        models.append("%s [%s%s]" % (m["name"], "+".join(m["protocols"]) or "no protocol",
                                     ", median %s ms" % fmt(lat["median_ms"]) if lat.get("median_ms") else ""))
    name = {"llama": "llama-server", "slim": "slim serve"}[engine]
    srv = report.get("server") or {}
    return ("slim check vs %s (%s): exit %d; protocols: %s; server: %s; models: %s%s" % (
        name, label, p.returncode, ", ".join(protocols) or "none",
        "%s %s" % (srv["name"], srv["version"]) if srv.get("name") else "unnamed", ", ".join(models) or "none",
        "; problems: " + "; ".join(report["problems"]) if report.get("problems") else ""))


def median_summary(runs):
    """The median of each metric over repeated runs (one run: itself)."""
    out = dict(runs[0])
    for k in METRICS:
        out[k] = statistics.median(r[k] for r in runs)
    return out


def one_level(a, engine, model, level, logdir):
    """One run of a level against a freshly started server: its results dict."""
    mixed = level == "mixed"
    clients = a.mixed_clients if mixed else level
    server = Server(engine, a, model, clients, os.path.join(logdir, "%s-%s.log" % (engine, level)))
    try:
        corpus = loadgen.Corpus(a.corpus)
        name = loadgen.list_model("127.0.0.1", server.port)
        workload = loadgen.Workload(corpus, loadgen.calibrate("127.0.0.1", server.port, name, corpus), a.seed)
        # The mixed run longer: one request in ten is high priority, and their p99 needs some.
        requests = a.requests or max(16, (8 if mixed else 4) * clients)
        summary, records, hi_bodies = loadgen.run_load("127.0.0.1", server.port, name, workload, clients, requests,
                                                       a.duration, a.ctx, mixed)
        out = dict(summary=summary, chars_per_token=workload.cpt, command=server.cmd, load=os.getloadavg()[0])
        if mixed:
            time.sleep(2)  # streams cut at the cap: let the server drop them before the idle replay
            idle = loadgen.replay("127.0.0.1", server.port, hi_bodies)
            out["idle_high"] = loadgen.summarize(idle, sum(r["e2e"] or 0 for r in idle))
        if level == 1 and not a.no_followup:
            out["followup"] = loadgen.followup_probe("127.0.0.1", server.port, name, workload, a.followup_repeats)
        if a.records:
            out["records"] = records
        return out
    finally:
        server.stop()


def fmt(x, digits=1):
    return "-" if x is None or x != x else ("%.*f" % (digits, x))


def ratio(s, l):
    return s / l if s is not None and l and l == l and s == s else float("nan")


def tables(results, engines):
    """Markdown tables: one row per model and level, slim/llama ratios when both ran."""
    both = len(engines) == 2
    head = ["model", "clients"]
    for m, label in (("output_tps", "out tok/s"), ("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "TTFT p99 ms"),
                     ("itl_p50_ms", "ITL p50 ms"), ("itl_p99_ms", "ITL p99 ms")):
        head += ["%s %s" % (e, label) for e in engines] + (["ratio"] if both else [])
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    extra = []
    for model, levels in results.items():
        for level, per in levels.items():
            row = [model, str(per[engines[0]]["summary"]["clients"]) + (" (mixed)" if level == "mixed" else "")]
            for m in ("output_tps", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"):
                vals = [per[e]["summary"][m] for e in engines]
                row += [fmt(v) for v in vals]
                if both:
                    row.append(fmt(ratio(vals[1], vals[0]), 2))
            lines.append("| " + " | ".join(row) + " |")
            for e in engines:
                r = per[e]
                if "idle_high" in r:
                    hi, idle = r["summary"]["high"]["ttft_p99_ms"], r["idle_high"]["ttft_p99_ms"]
                    extra.append("- %s, %s, mixed run: high-priority TTFT p99 %s ms under load (%d requests of %d), "
                                 "%s ms idle: %s x" % (model, e, fmt(hi), r["summary"]["high"]["requests"],
                                                        r["summary"]["requests"], fmt(idle), fmt(ratio(hi, idle), 2)))
                if "followup" in r:
                    f = r["followup"]
                    r0 = f["rows"][0]
                    extra.append("- %s, %s: follow-up turn TTFT %s ms (%d-token prompt after a %d-token turn, %s "
                                 "tokens cached), cold request of %d tokens %s ms: %s x (medians of %d)" % (
                                     model, e, fmt(f["warm_ttft_ms"]), r0["warm_prompt_tokens"], r0["history_tokens"],
                                     r0["warm_cached_tokens"], r0["cold_prompt_tokens"], fmt(f["cold_ttft_ms"]),
                                     fmt(f["ratio"], 2), len(f["rows"])))
    return "\n".join(lines) + "\n\n" + "\n".join(extra) + "\n"


def plot(results, engines, path):
    """Per model: output tokens/s, TTFT p50/p99 and ITL p99 against clients, and the mixed run's
    high-priority TTFT p99 under load next to idle."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = {"llama": "llama-server", "slim": "slim serve"}
    models = list(results)
    fig, axes = plt.subplots(len(models), 4, figsize=(17, 3.6 * len(models)), squeeze=False)
    for row, model in zip(axes, models):
        levels = [lv for lv in results[model] if lv != "mixed"]
        for ax, metrics, label in ((row[0], ("output_tps",), "output tokens/s"),
                                   (row[1], ("ttft_p99_ms", "ttft_p50_ms"), "TTFT p99 (solid), p50 (dashed), ms"),
                                   (row[2], ("itl_p99_ms",), "inter-token latency p99, ms")):
            for i, e in enumerate(engines):
                for m, style in zip(metrics, ("-", "--")):
                    ax.plot(levels, [results[model][lv][e]["summary"][m] for lv in levels], style, marker="o",
                            color="C%d" % i, label=names[e] if style == "-" else None)
            ax.set_xlabel("concurrent clients")
            ax.set_title("%s: %s" % (model, label), fontsize=9)
            ax.set_xticks(levels)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        ax = row[3]
        mixed = results[model].get("mixed")
        if mixed:
            for i, e in enumerate(engines):
                vals = (mixed[e]["summary"]["high"]["ttft_p99_ms"], mixed[e]["idle_high"]["ttft_p99_ms"])
                ax.bar([i - 0.2, i + 0.2], vals, width=0.4, color=["C%d" % i, "none"], edgecolor="C%d" % i)
            ax.set_xticks(range(len(engines)), [names[e] + "\nloaded | idle" for e in engines])
            ax.set_title("%s: high-priority TTFT p99, ms (mixed run)" % model, fontsize=9)
            ax.grid(alpha=0.3, axis="y")
        else:
            ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slim", default=os.path.join(ROOT, "build", "tools", "slim"))
    ap.add_argument("--llama-server", help="llama-server binary (default: build it with bench/llamacpp.py)")
    ap.add_argument("--isa", choices=("native", "avx2"), default="native",
                    help="both engines' instruction set (slim: SLIM_ISA; llama-server: its build variant)")
    ap.add_argument("--only", choices=ENGINES, help="run one server only")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", default="1,8,16,32", help="concurrency levels (comma-separated)")
    ap.add_argument("--mixed-clients", type=int, default=16, help="normal clients (= slots) of the mixed run; 0: none")
    ap.add_argument("--requests", type=int, default=0, help="requests per run (default: 4 per client, 8 in the mixed run, at least 16)")
    ap.add_argument("--duration", type=float, default=300, help="wall-clock cap of one run, seconds")
    ap.add_argument("--repeats", type=int, default=1, help="runs per level and server (the table shows medians)")
    ap.add_argument("--ctx", type=int, default=2048, help="context tokens per slot")
    ap.add_argument("--model", action="append", default=[], help="GGUF file (repeatable; default the shared slimlm)")
    ap.add_argument("--random-1b", nargs="?", const="q4_0", choices=("q4_0", "q8_0"),
                    help="also the random-weight 1.1 B Llama (slow)")
    ap.add_argument("--no-followup", action="store_true", help="skip the follow-up turn probe")
    ap.add_argument("--followup-repeats", type=int, default=3)
    ap.add_argument("--slim-args", default="", help="extra arguments for slim serve")
    ap.add_argument("--records", action="store_true", help="keep every request's record in the JSON")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--corpus", default=llamacpp.find_shared("heldout-long.txt"))
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    ap.add_argument("--check-only", action="store_true", help="only run `slim check` against each server")
    a = ap.parse_args()
    sys.setswitchinterval(0.0005)  # see loadgen.main
    engines = [e for e in ENGINES if a.only in (None, e)]
    if "llama" in engines and not a.llama_server:
        a.llama_server = llamacpp.build("llama-server", a.isa, HERE)
    models = [(os.path.basename(m), m) for m in a.model]
    if not models:
        shared = llamacpp.find_shared("slimlm-f16.gguf")
        if not shared:
            sys.exit("shared/models/slimlm-f16.gguf not found next to the repository: name a model with --model")
        models.append(("slimlm F16", shared))
    if a.random_1b:
        models.append(("random 1.1B " + a.random_1b.upper(), llamacpp.random_llama(a.random_1b)))
    levels = [int(c) for c in a.clients.split(",") if c] + (["mixed"] if a.mixed_clients else [])
    logdir = os.path.join(llamacpp.WORK, "serve_llm")
    os.makedirs(logdir, exist_ok=True)
    os.makedirs(a.results, exist_ok=True)

    checks = [check(a, e, label, path, logdir) for label, path in models for e in engines]
    print("\n".join(checks), flush=True)
    if a.check_only:
        return 0

    results = {}
    print("%-16s %8s %5s | %9s %9s %9s %8s %8s | %s" % ("model", "clients", "srv", "out tok/s", "TTFT p50", "TTFT p99",
                                                        "ITL p50", "ITL p99", "errors/cut, load"))
    for label, path in models:
        results[label] = {}
        for level in levels:
            runs = {e: [] for e in engines}
            for _ in range(a.repeats):
                for e in engines:
                    runs[e].append(one_level(a, e, path, level, logdir))
            per = {}
            for e in engines:
                per[e] = dict(runs[e][-1])
                per[e]["summary"] = median_summary([r["summary"] for r in runs[e]])
                per[e]["repeats"] = [r["summary"] for r in runs[e]]
                s = per[e]["summary"]
                print("%-16s %8s %5s | %9.1f %9.1f %9.1f %8.1f %8.1f | %d/%d, %.1f" % (
                    label, level, e, s["output_tps"], s["ttft_p50_ms"], s["ttft_p99_ms"], s["itl_p50_ms"],
                    s["itl_p99_ms"], s["errors"], s["cut"], per[e]["load"]), flush=True)
                if s["errors"]:
                    log("  first errors:", s["first_errors"])
            results[label][level] = per
    info = dict(threads=a.threads, ctx_per_slot=a.ctx, isa=a.isa, engines=engines, models=dict(models),
                llama_server=a.llama_server, slim=a.slim, checks=checks, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    with open(os.path.join(a.results, "serve_llm.json"), "w") as f:
        json.dump(dict(info=info, results=results), f, indent=1)
    md = tables(results, engines)
    with open(os.path.join(a.results, "results.md"), "w") as f:
        f.write("Threads %d, %d context tokens per slot, ISA %s, %s.\n\n" % (a.threads, a.ctx, a.isa, info["date"]))
        f.write(md)
        f.write("\n" + "".join("- %s\n" % c for c in checks))
    print(md)
    try:
        plot(results, engines, os.path.join(a.results, "serve_llm.png"))
    except ImportError:
        log("matplotlib is missing (run.sh installs python3-matplotlib): no plot")
    return 0


if __name__ == "__main__":
    sys.exit(main())
