#!/usr/bin/python3
"""bench/quant: `slim quantize` on pretrained models from npm packages and the demo's
digits classifier, with calibration and held-out data made from real inputs that fit each
model (README.md names them). For every model and calibrator setting it quantizes
(statistics from the calibration cache after the first run), evaluates the QDQ model
against the float one on the held-out set (`slim quantize --eval`) and, for the text
recognizer, decodes both models' CTC outputs. Then it times the float model and the
default QDQ export in ONNX Runtime (onnxruntime-node) and in slim, alternating engines.

Models are fetched as tests/real_models does (npm pack into its cache; its functions are
reused). Writes results.json and the README table between its markers.
Plain AVX2 (no VNNI: Haswell..Skylake, Zen 1-3) on a newer CPU: --isa avx2 --no-avx-vnni;
with --reduce-range every setting writes 7-bit weights, which that path runs unsplit.
Usage: run.py [--slim PATH] [--models a,b] [--rounds N] [--threads N] [--markdown README]
              [--isa avx2|scalar] [--no-avx-vnni] [--reduce-range]"""
import argparse
import glob
import importlib.util
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
spec = importlib.util.spec_from_file_location("real_models", os.path.join(ROOT, "tests", "real_models", "run.py"))
real = importlib.util.module_from_spec(spec)
spec.loader.exec_module(real)

FONTS = ["DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "DejaVuSans-Bold.ttf", "DejaVuSansCondensed.ttf",
         "DejaVuSerif-Italic.ttf"]
TEXT = "/usr/share/common-licenses/GPL-3"  # real English prose, in every Debian (base-files)

# (label, slim quantize options). The first is ONNX Runtime's quantize_static default
# (MinMax, per-tensor weights, u8 activations).
SETTINGS = [
    ("minmax, per-tensor (ORT default)", ["--calibrator", "minmax", "--per-tensor"]),
    ("minmax", ["--calibrator", "minmax"]),
    ("percentile 99.99", ["--calibrator", "percentile", "--percentile", "99.99"]),
    ("entropy", ["--calibrator", "entropy"]),
    ("mse", ["--calibrator", "mse"]),
    ("percentile + bias correction", ["--calibrator", "percentile", "--percentile", "99.99", "--bias-correction"]),
]
# Settings for one model only: the recognizer's SVTR blocks (MatMul) with SmoothQuant, and
# them alone with its CNN backbone left in float.
EXTRA = {"ppocr-v4-rec": [
    ("percentile + SmoothQuant 0.5", ["--calibrator", "percentile", "--percentile", "99.99", "--smoothquant", "0.5"]),
    ("percentile, SVTR blocks only", ["--calibrator", "percentile", "--percentile", "99.99", "--ops",
                                      "MatMul,Transpose,Reshape,Squeeze,Flatten"]),
]}
DEFAULT_EXPORT = "minmax"  # the setting whose file is timed


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def slim_env(args):
    """slim's environment: passive OpenMP waits, SLIM_ISA when --isa holds it down, and
    SLIM_AVX_VNNI=0 with --no-avx-vnni (plain AVX2 on a CPU with AVX-VNNI)."""
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    if getattr(args, "isa", None):
        env["SLIM_ISA"] = args.isa
    if getattr(args, "no_avx_vnni", False):
        env["SLIM_AVX_VNNI"] = "0"
    return env


def sh(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])}...: exit {p.returncode}\n{p.stderr[-2000:]}")
    return p


# ---------------------------------------------------------------- data

def phrases(n, rng, words=(1, 5)):
    """n phrases of real English text (GPL-3's prose), case and punctuation as written."""
    text = open(TEXT).read().split()
    out = []
    while len(out) < n:
        k = rng.randint(*words)
        i = rng.randrange(0, len(text) - k)
        s = " ".join(text[i:i + k])
        if 2 <= len(s) <= 40:
            out.append(s)
    return out


def render_line(text, font, height, width):
    """A text line as PaddleOCR feeds it: height `height`, aspect kept, right-padded to
    `width`, scaled to [-1, 1] (ocr_line in tests/real_models with a chosen font)."""
    from PIL import Image, ImageDraw, ImageFont
    f = ImageFont.truetype(os.path.join(os.path.dirname(real.FONT), font), 30)
    box = f.getbbox(text)
    img = Image.new("RGB", (box[2] + 12, 30 + 12 + max(0, box[3] - 30)), (246, 244, 238))
    ImageDraw.Draw(img).text((6, 6), text, fill=(20, 20, 30), font=f)
    w = min(width, int(round(img.width * height / img.height)))
    img = img.resize((w, height), Image.BILINEAR)
    x = np.zeros((3, height, width), np.float32)
    x[:, :, :w] = (np.asarray(img, np.float32).transpose(2, 0, 1) / 255 - 0.5) / 0.5
    return x


def save(d, arrays):
    os.makedirs(d, exist_ok=True)
    for name, a in arrays.items():
        np.save(os.path.join(d, name + ".npy"), a)


def data_digits(work, model_dir):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    sh(["/usr/bin/python3", os.path.join(ROOT, "examples", "digits", "make_digits_model.py"), model_dir])
    d = load_digits()
    x, y = d.data.astype(np.float32), d.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=0)  # the demo's split
    save(os.path.join(work, "calib"), {"pixels": xtr[:256]})
    save(os.path.join(work, "held"), {"pixels": xte})
    np.save(os.path.join(work, "labels.npy"), yte)
    return os.path.join(model_dir, "digits_mlp.onnx"), "pixels"


def data_cls(work, n_calib=64, n_held=320):
    """Rendered text lines, half of them turned 180°: label 0 upright, 1 upside down."""
    rng = random.Random(7)
    lines = phrases(n_calib + n_held, rng)
    xs, ys = [], []
    for i, t in enumerate(lines):
        x = render_line(t, FONTS[i % len(FONTS)], 48, 192)
        flip = i % 2
        xs.append(x[:, ::-1, ::-1] if flip else x)
        ys.append(flip)
    xs = np.stack(xs).astype(np.float32)
    save(os.path.join(work, "calib"), {"x": xs[:n_calib]})
    save(os.path.join(work, "held"), {"x": xs[n_calib:]})
    np.save(os.path.join(work, "labels.npy"), np.array(ys[n_calib:], np.int64))


def data_rec(work, n_calib=64, n_held=120):
    rng = random.Random(11)
    lines = phrases(n_calib + n_held, rng, (2, 5))
    xs = np.stack([render_line(t, FONTS[i % len(FONTS)], 48, 320) for i, t in enumerate(lines)]).astype(np.float32)
    save(os.path.join(work, "calib"), {"x": xs[:n_calib]})
    save(os.path.join(work, "held"), {"x": xs[n_calib:]})
    with open(os.path.join(work, "held_text.json"), "w") as f:
        json.dump(lines[n_calib:], f)


def render_page(rng, width=640, height=256):
    """A page as PaddleOCR's detector takes it (tests/real_models' ocr_det input): 2-5 lines
    of real prose in one of the fonts, at a random size, place and ink on a light,
    slightly uneven background, ImageNet-normalized, NCHW."""
    from PIL import Image, ImageDraw, ImageFont
    bg = tuple(rng.randint(215, 252) for _ in range(3))
    img = Image.new("RGB", (width, height), bg)
    d = ImageDraw.Draw(img)
    for _ in range(rng.randint(0, 3)):  # faint blotches: paper, shadows
        x0, y0 = rng.randrange(width), rng.randrange(height)
        d.ellipse((x0, y0, x0 + rng.randint(40, 300), y0 + rng.randint(20, 120)),
                  fill=tuple(max(0, c - rng.randint(5, 25)) for c in bg))
    y = rng.randint(4, 30)
    for text in phrases(rng.randint(2, 5), rng, (2, 7)):
        size = rng.randint(16, 34)
        f = ImageFont.truetype(os.path.join(os.path.dirname(real.FONT), rng.choice(FONTS)), size)
        if y + size + 4 > height:
            break
        ink = tuple(rng.randint(0, 90) for _ in range(3))
        d.text((rng.randint(4, 200), y), text, fill=ink, font=f)
        y += size + rng.randint(8, 30)
    x = np.asarray(img, np.float32) / 255
    return ((x - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]).transpose(2, 0, 1).astype(np.float32)


def data_det(work, n_calib=16, n_held=32):
    rng = random.Random(13)
    xs = np.stack([render_page(rng) for _ in range(n_calib + n_held)])
    save(os.path.join(work, "calib"), {"x": xs[:n_calib]})
    save(os.path.join(work, "held"), {"x": xs[n_calib:]})


def det_masks(args, model, held, work, threshold=0.3):
    """The text masks (probability > DB's 0.3 threshold) of every held-out page."""
    d = os.path.join(work, "det_" + os.path.basename(model)[:-5])
    shutil.rmtree(d, ignore_errors=True)
    sh([args.slim, "run", model, "-i", f"x={held}", "-o", d, "--threads", str(args.threads)],
       env=slim_env(args))
    return np.load(glob.glob(os.path.join(d, "*.npy"))[0]) > threshold


def mask_iou(a, b):
    """Intersection over union of two sets of masks, over all pages."""
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def data_oww(ctx, work):
    """openWakeWord's front end (mel frames, 76-frame windows) on espeak-ng speech of
    English phrases in several voices and speeds, computed by ONNX Runtime as the
    real-model suite does."""
    rng = random.Random(3)
    texts = phrases(36, rng, (2, 6))
    wins = []
    for t in texts:
        wins.append(real.oww_features(ctx, t, 3.0)[2])
    calib = np.concatenate(wins[:8])[::3][:64]
    held = np.concatenate(wins[8:])[::3][:240]
    save(os.path.join(work, "calib"), {"input_1": calib.astype(np.float32)})
    save(os.path.join(work, "held"), {"input_1": held.astype(np.float32)})


# ---------------------------------------------------------------- quantize + eval

def quantize(args, m, label, opts, cache):
    out = os.path.join(m["work"], "q_" + label.replace(" ", "_").replace(",", "").replace("(", "").replace(")", "")
                       .replace("+", "").replace(".", "") + ("_7bit" if args.reduce_range else "") + ".onnx")
    js = out[:-5] + ".json"
    cmd = [args.slim, "quantize", m["path"], "-o", out, "--calib", os.path.join(m["work"], "calib"), "--eval",
           os.path.join(m["work"], "held"), "--calib-cache", cache, "--json", js, "--threads", str(args.threads)] + opts
    if args.reduce_range:
        cmd.append("--reduce-range")
    if os.path.exists(os.path.join(m["work"], "labels.npy")):
        cmd += ["--labels", os.path.join(m["work"], "labels.npy")]
    t0 = time.time()
    p = sh(cmd, env=slim_env(args))
    r = json.load(open(js))
    r["seconds"] = time.time() - t0
    r["stdout"] = p.stdout
    r["file"] = out
    return r


def ctc_texts(args, model, held, keys, work):
    """Greedy CTC decode of every held-out line by `model` (run through slim)."""
    d = os.path.join(work, "ctc_" + os.path.basename(model)[:-5])
    shutil.rmtree(d, ignore_errors=True)
    sh([args.slim, "run", model, "-i", f"x={held}", "-o", d, "--threads", str(args.threads)],
       env=slim_env(args))
    probs = np.load(glob.glob(os.path.join(d, "*.npy"))[0])
    return [real.ctc_decode(p, keys) for p in probs]


# ---------------------------------------------------------------- latency

def one_input(m):
    x = {}
    for f in glob.glob(os.path.join(m["work"], "held", "*.npy")):
        a = np.load(f)
        x[os.path.basename(f)[:-4]] = a[:1]
    return x


def time_all(args, ctx, models, feeds, work, rounds, iters):
    """Median latency (ms, 1 sample) of each of `models` (name -> file) in ONNX Runtime and
    in slim: every round runs them all, engines and models alternating, each a median of
    `iters` runs; the result is the median of the rounds'. Returns ({"ort_<name>": ms,
    "slim_<name>": ms}, slim's kernels)."""
    d = os.path.join(work, "lat")
    inputs = real.save_inputs(d, feeds)
    times = {}
    isa = "?"
    env = slim_env(args)
    for _ in range(rounds):
        for name, model in models.items():
            r = real.sh(["node", real.ORT_BENCH, model, os.path.join(d, "spec.json"), str(args.threads), "3",
                         str(iters), os.path.join(d, "ort"), "0"],
                        env=dict(os.environ, OMP_WAIT_POLICY="passive", NODE_PATH=ctx.node_path))
            if r.returncode != 0:
                raise RuntimeError("ORT: " + r.stderr[-500:])
            times.setdefault("ort_" + name, []).append(
                statistics.median(json.load(open(os.path.join(d, "ort", "result.json")))["runs_ms"]))
            js = os.path.join(d, "slim.json")
            cmd = [args.slim, "bench", model, "--threads", str(args.threads), "--warmup", "3", "--iters", str(iters),
                   "--json", js, "--top", "0"]
            for i in inputs:
                cmd += ["-i", i]
            sh(cmd, env=env)
            b = json.load(open(js))
            times.setdefault("slim_" + name, []).append(b["p50_ms"])
            isa = b["kernels"]
    return {k: statistics.median(v) for k, v in times.items()}, isa


# ---------------------------------------------------------------- report

def markdown(results, meta):
    lines = [f"Measured {meta['date']} on {meta['machine']} (slim kernels: {meta['isa']}"
             + (f", SLIM_ISA={meta['slim_isa']}" if meta.get("slim_isa") else "")
             + (", SLIM_AVX_VNNI=0" if meta.get("no_avx_vnni") else "")
             + (", weights `--reduce-range` (7-bit)" if meta.get("reduce_range") else "") + "), ONNX Runtime "
             f"{meta['ort_version']}, {meta['threads']} thread(s), load average {meta['load']}.", "",
             "Agreement of the quantized model with the float one on the held-out set (top-1 per row for the "
             "classifiers, decoded text for the recognizer, cosine for the embedding, IoU of the text masks for the detector):", "",
             "| model | held-out | " + " | ".join(s[0] for s in SETTINGS) + " | other settings |",
             "|---|---|" + "---|" * (len(SETTINGS) + 1)]
    for r in results:
        cells = [r["settings"][label]["summary"] if label in r["settings"] else "-" for label, _ in SETTINGS]
        extra = "; ".join(f"{label}: {r['settings'][label]['summary']}" for label, _ in EXTRA.get(r["name"], [])
                          if label in r["settings"])
        held = f"{r['held']}" + (f" (float reads {100 * r['float_text_accuracy']:.1f}% of the lines right)"
                                 if "float_text_accuracy" in r else "")
        lines.append(f"| {r['name']} | {held} | " + " | ".join(cells) + f" | {extra} |")
    lines += ["", "Latency of one sample (median of the rounds' medians, ms; engines and models alternating), "
              f"the float model and the `{DEFAULT_EXPORT}` QDQ export:", "",
              "| model | ORT float | ORT QDQ | slim float | slim QDQ | slim int8 speedup (slim float / slim QDQ) "
              "| slim QDQ / ORT QDQ |", "|---|---|---|---|---|---|---|"]
    ms = lambda v: f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 10 else f"{v:.1f}"
    for r in results:
        t = r.get("latency")
        if t:
            lines.append(f"| {r['name']} | {ms(t['ort_float'])} | {ms(t['ort_qdq'])} | {ms(t['slim_float'])} | "
                         f"{ms(t['slim_qdq'])} | {t['slim_float'] / t['slim_qdq']:.2f}x | "
                         f"{t['slim_qdq'] / t['ort_qdq']:.2f} |")
    return "\n".join(lines) + "\n"


def summary(model, q):
    """The table cell of one quantized model."""
    outs = q["eval"]["outputs"]
    if model["metric"] == "top1":
        o = outs[0]
        s = f"{100 * o['top1_agreement']:.2f}%"
        if "accuracy_quantized" in o:
            s += f" (acc {100 * o['accuracy_quantized']:.1f}% vs {100 * o['accuracy_float']:.1f}%)"
        return s
    if model["metric"] == "mask":
        return f"mask IoU {q['mask_iou']:.3f} (cos {outs[0]['cosine']:.4f})"
    if model["metric"] == "ctc":
        return (f"{100 * q['text_agreement']:.1f}% text, {100 * q['text_accuracy']:.1f}% right "
                f"({100 * outs[0]['top1_agreement']:.1f}% frames)")
    return f"cos {outs[0]['cosine']:.4f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slim", default=os.path.join(ROOT, "build", "tools", "slim"))
    ap.add_argument("--cache", default=os.environ.get("SLIM_MODEL_CACHE") or os.path.join(ROOT, "bench", ".work", "real_models"))
    ap.add_argument("--work", default=os.path.join(ROOT, "bench", ".work", "quant"))
    ap.add_argument("--models", default="digits,ppocr-cls,ppocr-v4-det,ppocr-v4-rec,oww-embedding")
    ap.add_argument("--settings", help="only these calibrator settings (labels, comma-separated; the timed "
                    f"`{DEFAULT_EXPORT}` is always run)")
    ap.add_argument("--isa", help="SLIM_ISA for slim's runs (avx2, scalar): its kernels held to that level")
    ap.add_argument("--no-avx-vnni", action="store_true",
                    help="SLIM_AVX_VNNI=0: with --isa avx2, plain AVX2 as on CPUs without VNNI")
    ap.add_argument("--reduce-range", action="store_true",
                    help="quantize every setting with --reduce-range (7-bit weights, unsplit without VNNI)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="latency rounds (engines alternate)")
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
    cache = os.path.join(args.work, "calib_cache")
    results, isa = [], "?"
    for name in args.models.split(","):
        work = os.path.join(args.work, name)
        os.makedirs(work, exist_ok=True)
        m = {"name": name, "work": work}
        log(f"bench/quant: {name}: data")
        if name == "digits":
            m["path"], _ = data_digits(work, os.path.join(work, "model"))
            m["metric"], m["task"] = "top1", "digits classifier (sklearn MLP, the demo's)"
        else:
            m["path"], pkg = real.model_path(ctx.cache, manifest[name])
            m["task"] = manifest[name]["task"]
            if name == "ppocr-cls":
                data_cls(work)
                m["metric"] = "top1"
            elif name == "ppocr-v4-rec":
                data_rec(work)
                m["metric"], m["keys"] = "ctc", open(os.path.join(pkg, manifest[name]["keys"])).read().splitlines()
            elif name == "oww-embedding":
                data_oww(ctx, work)
                m["metric"] = "cosine"
            elif name == "ppocr-v4-det":
                data_det(work)
                m["metric"] = "mask"
            else:
                raise SystemExit(f"no data builder for {name}")
        held = os.path.join(work, "held")
        n_held = len(np.load(glob.glob(os.path.join(held, "*.npy"))[0], mmap_mode="r"))
        n_calib = len(np.load(glob.glob(os.path.join(work, "calib", "*.npy"))[0], mmap_mode="r"))
        r = {"name": name, "task": m["task"], "held": n_held, "calib": n_calib, "settings": {}}
        settings = SETTINGS + EXTRA.get(name, [])
        if args.settings:
            keep = set(args.settings.split(",")) | {DEFAULT_EXPORT}
            settings = [s for s in settings if s[0] in keep]
        if m["metric"] == "mask":
            float_masks = det_masks(args, m["path"], os.path.join(held, "x.npy"), work)
        if m["metric"] == "ctc":
            truth = json.load(open(os.path.join(work, "held_text.json")))
            float_texts = ctc_texts(args, m["path"], os.path.join(held, "x.npy"), m["keys"], work)
            r["float_text_accuracy"] = float(np.mean([a == b for a, b in zip(float_texts, truth)]))
        for label, opts in settings:
            log(f"bench/quant: {name}: {label}")
            q = quantize(args, m, label, opts, cache)
            if m["metric"] == "ctc":
                texts = ctc_texts(args, q["file"], os.path.join(held, "x.npy"), m["keys"], work)
                q["text_agreement"] = float(np.mean([a == b for a, b in zip(texts, float_texts)]))
                q["text_accuracy"] = float(np.mean([a == b for a, b in zip(texts, truth)]))
            if m["metric"] == "mask":
                q["mask_iou"] = mask_iou(det_masks(args, q["file"], os.path.join(held, "x.npy"), work), float_masks)
            q["summary"] = summary(m, q)
            r["settings"][label] = {k: v for k, v in q.items() if k not in ("stdout", "ranges", "model", "output")}
        log(f"bench/quant: {name}: latency")
        feeds = one_input(m)
        qdq = r["settings"][DEFAULT_EXPORT]["file"]
        r["latency"], isa = time_all(args, ctx, {"float": m["path"], "qdq": qdq}, feeds, work, args.rounds,
                                     args.iters)
        t = r["latency"]
        log(f"bench/quant: {name}: slim float {t['slim_float']:.3f} ms, QDQ {t['slim_qdq']:.3f} ms "
            f"({t['slim_float'] / t['slim_qdq']:.2f}x); ORT float {t['ort_float']:.3f}, QDQ {t['ort_qdq']:.3f} "
            f"(slim QDQ / ORT QDQ {t['slim_qdq'] / t['ort_qdq']:.2f})")
        results.append(r)
        log(json.dumps({k: v for k, v in r.items() if k != "settings"}))
    load = os.getloadavg()
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": real.machine(), "isa": isa,
            "ort_version": real.ORT_VERSION, "threads": args.threads, "slim_isa": args.isa or "",
            "no_avx_vnni": args.no_avx_vnni, "reduce_range": args.reduce_range, "load": f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"}
    for r in results:  # paths of this machine stay out of the saved results
        for q in r["settings"].values():
            q.pop("file", None)
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "models": results}, f, indent=1)
    return report(args, results, meta)


def report(args, results, meta):
    for r in results:  # the cells again, so a changed summary() applies to saved results
        m = {"metric": "ctc" if "float_text_accuracy" in r else "mask" if r["name"] == "ppocr-v4-det"
             else "top1" if r["name"] != "oww-embedding" else "cosine"}
        for q in r["settings"].values():
            q["summary"] = summary(m, q)
    table = markdown(results, meta)
    print(table)
    if args.markdown and os.path.exists(args.markdown):
        real.BEGIN, real.END = "<!-- quant table: begin -->", "<!-- quant table: end -->"
        real.write_markdown(args.markdown, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
