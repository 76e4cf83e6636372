#!/usr/bin/python3
"""bench/quant/mixed.py: `slim quantize --latency-budget-ms` (mixed precision) on PP-OCR's
recognizer and direction classifier, against the same number of int8 layers chosen by
position (the first k, the last k).

For each model: one measuring run (`--plan-out`) gives the all-fp32 and all-int8 latencies
and every layer's loss and times (int8, and int4 weight-only for MatMul/Gemm layers with
constant weights); then for budgets spread between the two latencies (when all-int8 is
slower than all-fp32 on this machine, the range is still [min, max] of the two, its low end
raised to the fastest plan the measurements predict)
`slim quantize --measurements PLAN --latency-budget-ms B` chooses (measuring the loss of
`--search-evaluations` candidate plans) and builds a plan, and two baselines quantize as
many layers (k: the plan's int8 and int4 layers) in int8, the first k and the last k in
topological order (the plan file edited, applied with `--plan`), and two more take the
fewest layers by position (k', first and last) whose latency, timed as below, fits the
budget, as the plan's own is held to it. The models and the float one are timed with
`slim bench` (one thread, engines alternating, median of the rounds' p50) and evaluated on
the held-out set (`--eval`: top-1 agreement and KL against the float model; for the
recognizer also the share of lines whose greedy CTC decode is the float model's).
Data builders and models are bench/quant/run.py's. Writes mixed_results.json and the table
in README.md between the `mixed table` markers.
"""

import argparse
import glob
import importlib.util
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
_spec = importlib.util.spec_from_file_location("quant_run", os.path.join(HERE, "run.py"))
qr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(qr)
real = qr.real
log, sh = qr.log, qr.sh

CALIBRATOR = ["--calibrator", "percentile", "--percentile", "99.99"]
ENV = dict(os.environ, OMP_WAIT_POLICY="passive")
# The chosen plan; as many int8 layers (k) by position; the fewest by position (k') whose
# measured latency fits the budget (k_measured).
VARIANTS = ("mixed", "first k", "last k", "first k'", "last k'")


def quantize(args, m, out, extra):
    js = out[:-5] + ".json"
    cmd = [args.slim, "quantize", m["path"], "-o", out, "--calib", os.path.join(m["work"], "calib"), "--calib-cache",
           os.path.join(args.work, "calib_cache"), "--threads", str(args.threads), "--eval",
           os.path.join(m["work"], "held"), "--json", js] + CALIBRATOR + extra
    if os.path.exists(os.path.join(m["work"], "labels.npy")):
        cmd += ["--labels", os.path.join(m["work"], "labels.npy")]
    p = sh(cmd, env=ENV)
    r = json.load(open(js))
    r["stdout"] = p.stdout
    return r


def held_metrics(r):
    o = r["eval"]["outputs"][0]
    return {"agreement": o.get("top1_agreement"), "kl": o.get("kl_mean"), "cosine": o["cosine"]}


def bench_p50(args, model, feeds):
    js = os.path.join(args.work, "bench.json")
    cmd = [args.slim, "bench", model, "--threads", str(args.threads), "--iters", str(args.iters), "--json", js]
    for name, path in feeds.items():
        cmd += ["-i", f"{name}={path}"]
    sh(cmd, env=ENV)
    return json.load(open(js))["p50_ms"]


def time_all(args, models, feeds):
    """Median over rounds of each model's `slim bench` p50, the models alternating."""
    times = {k: [] for k in models}
    for _ in range(args.rounds):
        for k, path in models.items():
            times[k].append(bench_p50(args, path, feeds))
    return {k: statistics.median(v) for k, v in times.items()}


def by_position(plan, k, first):
    n = len(plan["layers"])
    chosen = set(range(k)) if first else set(range(n - k, n))
    p = json.loads(json.dumps(plan))
    for i, l in enumerate(p["layers"]):
        l["precision"] = "int8" if i in chosen else "fp32"
    return p


def predicted(plan, precision):
    """docs/quantization.md §11's T(P) from a plan file's measurements."""
    ls, n, t = plan["layers"], len(plan["layers"]), 0.0
    int8 = [p == "int8" for p in precision]
    for i, l in enumerate(ls):
        if precision[i] == "int4":
            t += l["int4_ms"] - l["fp32_ms"]
        if not int8[i]:
            continue
        b = max(0.0, l["int8_alone_ms"] - l["int8_ms"])
        t += l["int8_ms"] - l["fp32_ms"]
        t += 0.5 * b * ((i == 0 or not int8[i - 1]) + (i + 1 == n or not int8[i + 1]))
    return plan["fp32_ms"] + plan.get("scale", 1.0) * t


def k_within(plan, budget, first):
    """The fewest layers by position (first or last) whose predicted latency fits the budget."""
    n = len(plan["layers"])
    for k in range(n + 1):
        x = ["int8" if ((i < k) if first else (i >= n - k)) else "fp32" for i in range(n)]
        if predicted(plan, x) <= budget:
            return k
    return n


def k_measured(args, m, plan, budget, first, feeds, work, tag, steps=8):
    """The fewest layers by position whose *measured* latency fits the budget, as the mixed
    plan is held to it: from k_within's k, down while the next fewer still fits, else up
    until one fits (each k quantized with --plan and timed with `slim bench` alternating
    with the float model, normalized to the measuring run's load)."""
    n = len(plan["layers"])

    def fits(k):
        pp = os.path.join(work, f"kmeas_{tag}_{'first' if first else 'last'}_{k}.plan.json")
        json.dump(by_position(plan, k, first), open(pp, "w"))
        f = pp[:-len(".plan.json")] + ".onnx"
        quantize(args, m, f, ["--plan", pp])
        lat = time_all(args, {"float": m["path"], "k": f}, feeds)
        return lat["k"] * plan["fp32_ms"] / lat["float"] <= budget

    k = k_within(plan, budget, first)
    if fits(k):
        for _ in range(steps):
            if k == 0 or not fits(k - 1):
                break
            k -= 1
        return k
    for _ in range(steps):
        if k == n:
            break
        k += 1
        if fits(k):
            return k
    return k


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slim", default=os.path.join(ROOT, "build", "tools", "slim"))
    ap.add_argument("--cache", default=os.environ.get("SLIM_MODEL_CACHE") or os.path.join(ROOT, "bench", ".work", "real_models"))
    ap.add_argument("--work", default=os.path.join(ROOT, "bench", ".work", "quant_mixed"))
    ap.add_argument("--models", default="ppocr-v4-rec,ppocr-cls")
    ap.add_argument("--budgets", default="0.25,0.5,0.75", help="budgets as fractions of the way from min to max latency")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--latency-runs", type=int, default=10, help="slim quantize --latency-runs")
    ap.add_argument("--samples", type=int, default=64,
                    help="slim quantize --sensitivity-samples (the search chooses on losses measured on these)")
    ap.add_argument("--search-evaluations", type=int, default=24, help="slim quantize --search-evaluations")
    ap.add_argument("--rounds", type=int, default=3, help="slim bench rounds (models alternate)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=os.path.join(HERE, "mixed_results.json"))
    ap.add_argument("--markdown", default=os.path.join(HERE, "README.md"))
    ap.add_argument("--report-only", action="store_true", help="rewrite the table from --json, running nothing")
    args = ap.parse_args()
    if args.report_only:
        saved = json.load(open(args.json))
        return report(args, saved["models"], saved["meta"])
    args.slim = os.path.abspath(args.slim)
    args.work = os.path.abspath(args.work)
    manifest = {m["name"]: m for m in json.load(open(os.path.join(ROOT, "tests", "real_models", "models.json")))["models"]}
    results = []
    for name in args.models.split(","):
        work = os.path.join(args.work, name)
        os.makedirs(work, exist_ok=True)
        m = {"name": name, "work": work}
        m["path"], pkg = real.model_path(os.path.abspath(args.cache), manifest[name])
        log(f"bench/quant/mixed: {name}: data")
        if name == "ppocr-cls":
            qr.data_cls(work)
        elif name == "ppocr-v4-rec":
            qr.data_rec(work)
            keys = open(os.path.join(pkg, manifest[name]["keys"])).read().splitlines()
        else:
            raise SystemExit(f"no data builder for {name} here")
        feeds = {}  # one held-out sample, what `slim bench` times
        for k, a in qr.one_input(m).items():
            feeds[k] = os.path.join(work, f"one_{k}.npy")
            np.save(feeds[k], a)
        held = os.path.join(work, "held")
        float_texts = None
        if name == "ppocr-v4-rec":
            float_texts = qr.ctc_texts(args, m["path"], os.path.join(held, "x.npy"), keys, work)

        log(f"bench/quant/mixed: {name}: measuring the layers")
        plan_path = os.path.join(work, "measured.json")
        t0 = time.time()
        r0 = quantize(args, m, os.path.join(work, "measure.onnx"),
                      ["--latency-budget-ms", "1e9", "--plan-out", plan_path, "--latency-runs", str(args.latency_runs),
                       "--sensitivity-samples", str(args.samples), "--search-evaluations", "0",
                       "--pareto-png", os.path.join(work, "pareto.png")])
        measure_s = time.time() - t0
        plan = json.load(open(plan_path))
        # No plan is predicted faster than the front's fastest point (slim refuses a budget below it).
        lo = max(min(plan["fp32_ms"], plan["int8_ms"]), plan["fastest_ms"])
        hi = max(plan["fp32_ms"], plan["int8_ms"])
        res = {"name": name, "layers": len(plan["layers"]), "fp32_ms": plan["fp32_ms"], "int8_ms": plan["int8_ms"],
               "fastest_ms": plan["fastest_ms"], "int8_loss": plan["int8_loss"], "measure_seconds": measure_s,
               "metric": plan["metric"], "budgets": []}
        # The all-int8 model on the held-out set, for reference.
        all8 = by_position(plan, len(plan["layers"]), True)
        json.dump(all8, open(os.path.join(work, "all8.json"), "w"))
        r8 = quantize(args, m, os.path.join(work, "all8.onnx"), ["--plan", os.path.join(work, "all8.json")])
        res["int8_held"] = held_metrics(r8)
        if float_texts is not None:
            t8 = qr.ctc_texts(args, os.path.join(work, "all8.onnx"), os.path.join(held, "x.npy"), keys, work)
            res["int8_held"]["text"] = float(np.mean([a == b for a, b in zip(t8, float_texts)]))
        for frac in [float(f) for f in args.budgets.split(",")]:
            budget = lo + frac * (hi - lo)
            log(f"bench/quant/mixed: {name}: budget {budget:.3f} ms")
            tag = f"b{int(round(frac * 100))}"
            out = os.path.join(work, f"mixed_{tag}.onnx")
            mp_plan = os.path.join(work, f"plan_{tag}.json")
            rm = quantize(args, m, out, ["--measurements", plan_path, "--latency-budget-ms", f"{budget:.4f}",
                                         "--plan-out", mp_plan, "--latency-runs", str(args.latency_runs),
                                         "--sensitivity-samples", str(args.samples), "--search-evaluations",
                                         str(args.search_evaluations), "--pareto-png",
                                         os.path.join(work, f"pareto_{tag}.png")])
            chosen = json.load(open(mp_plan))
            k = sum(l["precision"] != "fp32" for l in chosen["layers"])
            k4 = sum(l["precision"] == "int4" for l in chosen["layers"])
            cands = chosen.get("candidates", [])
            row = {"fraction": frac, "budget_ms": budget, "quantized_layers": k, "int4_layers": k4,
                   "candidates": len(cands), "searched_best_source": next((c["source"] for c in cands if c["chosen"]), None),
                   "front_choice_loss": cands[0]["loss"] if cands else None,
                   "predicted_ms": chosen["predicted"]["latency_ms"],
                   "predicted_loss": chosen["predicted"]["loss"], "measured": chosen["measured"], "tries": chosen.get("tries"),
                   "variants": {}}
            files = {"float": m["path"], "mixed": out}
            row["variants"]["mixed"] = held_metrics(rm)
            row["k_within"] = {"first": k_measured(args, m, plan, budget, True, feeds, work, tag),
                               "last": k_measured(args, m, plan, budget, False, feeds, work, tag)}
            for label, first, kk in (("first k", True, k), ("last k", False, k),
                                     ("first k'", True, row["k_within"]["first"]),
                                     ("last k'", False, row["k_within"]["last"])):
                pp = os.path.join(work, f"{label.replace(' ', '').replace(chr(39), 'p')}_{tag}.plan.json")
                json.dump(by_position(plan, kk, first), open(pp, "w"))
                f = pp[:-len(".plan.json")] + ".onnx"
                rb = quantize(args, m, f, ["--plan", pp])
                row["variants"][label] = held_metrics(rb)
                row["variants"][label]["predicted_ms"] = predicted(plan, [l["precision"] for l in
                                                                          json.load(open(pp))["layers"]])
                files[label] = f
            if float_texts is not None:
                for label in VARIANTS:
                    t = qr.ctc_texts(args, files[label], os.path.join(held, "x.npy"), keys, work)
                    row["variants"][label]["text"] = float(np.mean([a == b for a, b in zip(t, float_texts)]))
            lat = time_all(args, files, feeds)
            for label in VARIANTS:
                row["variants"][label]["bench_p50_ms"] = lat[label]
                # At the load of the measuring run: scaled by the float model's p50 in the same rounds.
                row["variants"][label]["bench_normalized_ms"] = lat[label] * plan["fp32_ms"] / lat["float"]
            row["float_bench_p50_ms"] = lat["float"]
            res["budgets"].append(row)
            log(json.dumps(row))
        results.append(res)
    load = os.getloadavg()
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": real.machine(), "threads": args.threads,
            "load": f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"}
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "models": results}, f, indent=1)
    return report(args, results, meta)


def pct(x):
    return "" if x is None else f"{100 * x:.1f}%"


def markdown(results, meta):
    lines = [f"Measured {meta['date']} on {meta['machine']}, {meta['threads']} thread(s), load average {meta['load']}.", ""]
    for r in results:
        lines.append(f"**{r['name']}**: {r['layers']} layers; all fp32 {r['fp32_ms']:.2f} ms, all int8 {r['int8_ms']:.2f} ms "
                     f"(process CPU time, medians, alternating), fastest plan {r['fastest_ms']:.2f} ms; all int8 on the "
                     f"held-out set: agreement {pct(r['int8_held'].get('agreement'))}"
                     + (f", text {pct(r['int8_held'].get('text'))}" if 'text' in r['int8_held'] else "")
                     + f"; measuring took {r['measure_seconds']:.0f} s.")
        lines.append("")
        text = any("text" in v for b in r["budgets"] for v in b["variants"].values())
        lines.append("| budget ms | plan | layers quantized (int4) | predicted ms | re-measured ms (normalized) | bench p50 ms (normalized) | "
                     + ("text / " if text else "") + "agreement / KL |")
        lines.append("|---|---|---|---|---|---|---|")
        for b in r["budgets"]:
            for v in VARIANTS:
                x = b["variants"].get(v)
                if x is None:
                    continue
                k = b["quantized_layers"] if v in ("mixed", "first k", "last k") else b["k_within"][v.split()[0]]
                if v == "mixed":
                    k = f"{k} ({b['int4_layers']})"
                    pred = f"{b['predicted_ms']:.2f}"
                    meas = f"{b['measured']['latency_ms']:.2f} ({b['measured']['normalized_latency_ms']:.2f})"
                    if len(b.get("tries") or []) > 1:
                        meas += f", {len(b['tries'])} builds"
                else:
                    pred, meas = (f"{x['predicted_ms']:.2f}" if "predicted_ms" in x else ""), ""
                q = (pct(x.get("text")) + " / " if text else "") + pct(x.get("agreement")) + f" / {x.get('kl') or 0:.4f}"
                lines.append(f"| {b['budget_ms']:.2f} | {v} | {k} | {pred} | {meas} | "
                             f"{x['bench_p50_ms']:.2f} ({x['bench_normalized_ms']:.2f}) | {q} |")
        lines.append("")
        for b in r["budgets"]:
            if b.get("candidates"):
                tries = b.get("tries") or []
                lines.append(f"- {b['budget_ms']:.2f} ms: {b['candidates']} candidate plans measured on the calibration "
                             f"samples over {len(tries)} build(s); at the budget the knapsack's choice lost "
                             f"{b['front_choice_loss']:.4f} and the first build's plan {tries[0]['loss']:.4f} "
                             f"(re-measured {tries[0]['normalized_ms']:.2f} ms); the written plan ({b['searched_best_source']}, "
                             f"aimed at {tries[-1]['target_ms']:.2f} ms) {b['measured']['loss']:.4f}")
        lines.append("")
    return "\n".join(lines)


def report(args, results, meta):
    table = markdown(results, meta)
    print(table)
    if args.markdown and os.path.exists(args.markdown):
        md = open(args.markdown).read()
        b, e = "<!-- mixed table: begin -->", "<!-- mixed table: end -->"
        if b in md and e in md:
            md = md[:md.index(b) + len(b)] + "\n" + table + "\n" + md[md.index(e):]
            open(args.markdown, "w").write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
