#!/usr/bin/python3
"""bench/prune: `slim prune model.onnx` (channel pruning) on two pretrained PP-OCR CNNs from
npm packages, with calibration and held-out data that fit each model:

- ppocr-cls, the text direction classifier (MobileNetV3 with squeeze-excitation): text
  lines rendered from real English prose, half of them turned 180 degrees, with labels
  (bench/quant's data); agreement = top-1 agreement with the unpruned model.
- ppocr-v4-det, the text detector (DBNet): pages of rendered text lines; agreement = IoU
  of the thresholded probability maps (> 0.3) of the pruned and unpruned models.

For each model and criterion it prunes to --target-flops (default 0.7), then times the
original and the pruned files in slim (`slim prune`'s own timing: both models in one
process, alternating run by run, so that the load of a shared machine hits both alike) and
in ONNX Runtime (onnxruntime-node, bench/vs_ort/ort_bench.js, rounds alternating), 1 thread,
medians; and runs each pruned
file in both engines on a held-out sample (max |slim - ORT|). Writes results.json and the
table in README.md between its markers.
Usage: run.py [--slim PATH] [--models a,b] [--criteria l2,output] [--rounds N]"""
import argparse
import glob
import importlib.util
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


real = load("real_models", os.path.join(ROOT, "tests", "real_models", "run.py"))
bq = load("bench_quant", os.path.join(ROOT, "bench", "quant", "run.py"))

# (label, extra options): every criterion with bias correction, recalibration and multiples
# of 8; for the data-driven one also without the correction, without the rounding, and
# ranked by importance per MAC saved.
VARIANTS = [("l2", ["--criterion", "l2"]),
            ("bn", ["--criterion", "bn"]),
            ("output", ["--criterion", "output"]),
            ("output, no correction", ["--criterion", "output", "--no-bias-correction"]),
            ("output, any channel count", ["--criterion", "output", "--channel-multiple", "1"]),
            ("output, multiples of 16", ["--criterion", "output", "--channel-multiple", "16"]),
            ("output, cost weight 1", ["--criterion", "output", "--cost-weight", "1"])]
TIMED = "output"  # the variant timed in ONNX Runtime too


def log(*a):
    if sys.stderr.isatty():
        print("\r\033[K" + " ".join(str(x) for x in a), end="", file=sys.stderr, flush=True)


def sh(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])}...: exit {p.returncode}\n{p.stderr[-2000:]}")
    return p


def data_det(work, n_calib=16, n_held=16):
    """Pages of 3 to 6 rendered text lines (real prose, several fonts and sizes) at 256 x 640,
    normalized as PaddleOCR's detector takes them."""
    from PIL import Image, ImageDraw, ImageFont
    rng = random.Random(5)
    xs = []
    for i in range(n_calib + n_held):
        lines = bq.phrases(rng.randint(3, 6), rng, (2, 6))
        size = rng.choice([20, 24, 28, 32])
        font = ImageFont.truetype(os.path.join(os.path.dirname(real.FONT), bq.FONTS[i % len(bq.FONTS)]), size)
        canvas = Image.new("RGB", (640, 256), (246, 244, 238))
        d = ImageDraw.Draw(canvas)
        y = rng.randint(4, 20)
        for s in lines:
            d.text((rng.randint(4, 60), y), s, fill=(20, 20, 30), font=font)
            y += size + rng.randint(8, 20)
            if y > 256 - size:
                break
        x = np.asarray(canvas, np.float32) / 255
        xs.append(((x - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]).transpose(2, 0, 1).astype(np.float32))
    xs = np.stack(xs)
    bq.save(os.path.join(work, "calib"), {"x": xs[:n_calib]})
    bq.save(os.path.join(work, "held"), {"x": xs[n_calib:]})


def slim_outputs(args, model, x_path, d):
    shutil.rmtree(d, ignore_errors=True)
    sh([args.slim, "run", model, "-i", f"x={x_path}", "-o", d, "--threads", str(args.threads)])
    return np.load(glob.glob(os.path.join(d, "*.npy"))[0])


def mask_iou(a, b, thresh=0.3):
    ma, mb = a > thresh, b > thresh
    union = np.logical_or(ma, mb).sum()
    return float(np.logical_and(ma, mb).sum() / union) if union else 1.0


def time_ort(args, ctx, models, feeds, work):
    """Median latency (ms) of each model in ONNX Runtime, models alternating within each round."""
    d = os.path.join(work, "lat")
    real.save_inputs(d, feeds)
    env = dict(os.environ, OMP_WAIT_POLICY="passive", NODE_PATH=ctx.node_path)
    res = {m: [] for m in models}
    for _ in range(args.rounds):
        for m in models:
            r = real.sh(["node", real.ORT_BENCH, m, os.path.join(d, "spec.json"), str(args.threads), "3",
                         str(args.iters), os.path.join(d, "ort"), "0"], env=env)
            if r.returncode != 0:
                raise RuntimeError("ORT: " + r.stderr[-500:])
            res[m].append(statistics.median(json.load(open(os.path.join(d, "ort", "result.json")))["runs_ms"]))
    return {m: statistics.median(v) for m, v in res.items()}


def run_model(args, ctx, manifest, name):
    work = os.path.join(args.work, name)
    os.makedirs(work, exist_ok=True)
    path, _ = real.model_path(ctx.cache, manifest[name])
    log(f"bench/prune: {name}: data")
    if name == "ppocr-cls":
        bq.data_cls(work)
    elif name == "ppocr-v4-det":
        data_det(work)
    else:
        raise SystemExit(f"no data builder for {name}")
    held = os.path.join(work, "held", "x.npy")
    hx = np.load(held)
    r = {"name": name, "task": manifest[name]["task"], "held": len(hx), "variants": {}}
    base_out = None if name == "ppocr-cls" else slim_outputs(args, path, held, os.path.join(work, "out_base"))
    for label, opts in VARIANTS:
        log(f"bench/prune: {name}: {label}")
        out = os.path.join(work, "pruned_" + label.replace(" ", "_").replace(",", "") + ".onnx")
        js = out[:-5] + ".json"
        cmd = [args.slim, "prune", path, "-o", out, "--target-flops", str(args.target_flops), "--calib",
               os.path.join(work, "calib"), "--eval", os.path.join(work, "held"), "--threads", str(args.threads),
               "--latency-rounds", str(args.rounds), "--json", js] + opts
        if os.path.exists(os.path.join(work, "labels.npy")):
            cmd += ["--labels", os.path.join(work, "labels.npy")]
        t0 = time.time()
        sh(cmd, env=dict(os.environ, OMP_WAIT_POLICY="passive"))
        rep = json.load(open(js))
        v = {"seconds": time.time() - t0, "file": out, "params": [rep["before"]["params"], rep["after"]["params"]],
             "macs": [rep["before"]["macs"], rep["after"]["macs"]],
             "groups": len(rep["groups"]), "prunable": sum(g["prunable"] for g in rep["groups"]),
             "pruned": sum(g["prunable"] and g["kept"] < g["channels"] for g in rep["groups"])}
        o = rep["eval"]["outputs"][0]
        if name == "ppocr-cls":
            v["agreement"] = o["top1_agreement"]
            v["accuracy"] = [o.get("accuracy_before"), o.get("accuracy_after")]
        else:
            pruned = slim_outputs(args, out, held, os.path.join(work, "out_pruned"))
            v["agreement"] = float(np.mean([mask_iou(a[0], b[0]) for a, b in zip(base_out, pruned)]))
        v["cosine"] = o["cosine"]
        v["slim_ms"] = [rep["before"]["latency_ms"], rep["after"]["latency_ms"]]
        r["variants"][label] = v
    log(f"bench/prune: {name}: slim vs ONNX Runtime")
    feeds = {"x": hx[:1]}
    for label, v in r["variants"].items():
        ort = real.ort_once(ctx, v["file"], feeds)
        d = os.path.join(work, "one")
        os.makedirs(d, exist_ok=True)
        np.save(os.path.join(d, "x.npy"), hx[:1])
        s = slim_outputs(args, v["file"], os.path.join(d, "x.npy"), os.path.join(work, "out_one"))
        v["slim_vs_ort_max_abs"] = float(np.abs(s - list(ort.values())[0]).max())
    log(f"bench/prune: {name}: ONNX Runtime latency")
    lat = time_ort(args, ctx, [path, r["variants"][TIMED]["file"]], feeds, work)
    r["latency"] = {"original": {"ort": lat[path],
                                 "slim": statistics.median(v["slim_ms"][0] for v in r["variants"].values())}}
    for label, v in r["variants"].items():
        v["latency"] = {"slim": v["slim_ms"][1], "ort": lat.get(v["file"]) if label == TIMED else None}
    return r


def fmt_ms(x):
    return "-" if x is None else f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 10 else f"{x:.1f}"


def markdown(results, meta):
    def ort_x(v):
        return f" ({r['latency']['original']['ort'] / v['latency']['ort']:.2f}×)" if v["latency"]["ort"] else ""

    lines = [f"Measured {meta['date']} on {meta['machine']}, ONNX Runtime {meta['ort_version']}, "
             f"{meta['threads']} thread, load average {meta['load']}; target {meta['target_flops']} of the MACs, "
             "no fine-tuning.", "",
             "| model | criterion | params | MACs | slim ms: original → pruned | speed-up | ORT ms | agreement | max \\|slim − ORT\\| |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        L = r["latency"]["original"]
        metric = "top-1" if r["name"] == "ppocr-cls" else "IoU"
        acc = ""
        lines.append(f"| {r['name']} | original | {r['variants']['l2']['params'][0]:,} | "
                     f"{r['variants']['l2']['macs'][0] / 1e6:.1f} M | {fmt_ms(L['slim'])} | 1.00× | {fmt_ms(L['ort'])} | "
                     f"{metric} 100% | |")
        for label, v in r["variants"].items():
            if r["name"] == "ppocr-cls" and v.get("accuracy") and v["accuracy"][1] is not None:
                acc = f" (acc {100 * v['accuracy'][1]:.1f}% vs {100 * v['accuracy'][0]:.1f}%)"
            else:
                acc = ""
            lines.append(f"| | {label} | {v['params'][1]:,} ({100 * v['params'][1] / v['params'][0]:.0f}%) | "
                         f"{v['macs'][1] / 1e6:.1f} M ({100 * v['macs'][1] / v['macs'][0]:.0f}%) | "
                         f"{fmt_ms(v['slim_ms'][0])} → {fmt_ms(v['slim_ms'][1])} | {v['slim_ms'][0] / v['slim_ms'][1]:.2f}× | "
                         f"{fmt_ms(v['latency']['ort'])}{ort_x(v)} | {metric} {100 * v['agreement']:.1f}%{acc} | "
                         f"{v['slim_vs_ort_max_abs']:.1e} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slim", default=os.path.join(ROOT, "build", "tools", "slim"))
    ap.add_argument("--cache", default=os.environ.get("SLIM_MODEL_CACHE") or os.path.join(ROOT, "bench", ".work", "real_models"))
    ap.add_argument("--work", default=os.path.join(ROOT, "bench", ".work", "prune"))
    ap.add_argument("--models", default="ppocr-cls,ppocr-v4-det")
    ap.add_argument("--target-flops", type=float, default=0.7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=10,
                    help="latency rounds: slim (in `slim prune`, original and pruned alternating run by run) and "
                         "ONNX Runtime (original and pruned alternating)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=os.path.join(HERE, "results.json"))
    ap.add_argument("--markdown", default=os.path.join(HERE, "README.md"))
    ap.add_argument("--report-only", action="store_true", help="rewrite the table from --json, running nothing")
    args = ap.parse_args()
    if args.report_only:
        saved = json.load(open(args.json))
        return report(args, saved["models"], saved["meta"])
    args.slim = os.path.abspath(args.slim)
    ctx = real.bench_ctx(args.slim, args.cache)
    manifest = ctx.by_name
    results = [run_model(args, ctx, manifest, name) for name in args.models.split(",")]
    load_avg = os.getloadavg()
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": real.machine(),
            "ort_version": real.ORT_VERSION, "threads": args.threads, "target_flops": args.target_flops,
            "load": f"{load_avg[0]:.2f} {load_avg[1]:.2f} {load_avg[2]:.2f}"}
    for r in results:  # paths of this machine stay out of the saved results
        for v in r["variants"].values():
            v.pop("file", None)
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "models": results}, f, indent=1)
    return report(args, results, meta)


def report(args, results, meta):
    if sys.stderr.isatty():
        print("\r\033[K", end="", file=sys.stderr)
    table = markdown(results, meta)
    print(table)
    if args.markdown and os.path.exists(args.markdown):
        real.BEGIN, real.END = "<!-- prune table: begin -->", "<!-- prune table: end -->"
        real.write_markdown(args.markdown, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
