#!/usr/bin/python3
"""Runs slim (`slim bench`) and ONNX Runtime (ort_bench.js on onnxruntime-node) on the
same inputs, alternating the two engines round by round, and prints per model, batch and
thread count both median latencies, the slim/ORT ratio, both cold starts and how far the
outputs are apart. Where slim is slower it names the op types that dominate its profile."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# name: its inputs as (name, dtype, shape), "B" marking the batch dim.
MODELS = {
    "resnet18": [("input", np.float32, ("B", 3, 224, 224))],
    "mobilenet_v2": [("input", np.float32, ("B", 3, 224, 224))],
    "squeezenet1_1": [("input", np.float32, ("B", 3, 224, 224))],
    "bert6": [("input_ids", np.int64, ("B", 128))],
    # Real models from the npm registry (run.sh fetches them): PaddleOCR's PP-OCRv4 text
    # detector (DBNet with an FPN that upsamples with Resize) and recognizer.
    "ppocr_det": [("x", np.float32, ("B", 3, 640, 640))],
    "ppocr_rec": [("x", np.float32, ("B", 3, 48, 320))],
}
# The speech RNNs of export_models.py: x [steps, batch, hidden] and the states [2, batch, hidden].
for _kind, _hidden in [("lstm", 64), ("lstm", 128), ("gru", 128)]:
    for _steps in (1, 100):
        MODELS[f"{_kind}_h{_hidden}_t{_steps}"] = [("x", np.float32, (_steps, "B", _hidden))] + [
            (s, np.float32, (2, "B", _hidden)) for s in (["h", "c"] if _kind == "lstm" else ["h"])]


def text_images(shape, rng, det):
    """Rendered lines of text, normalized as PaddleOCR normalizes them: the OCR models see
    what they were trained on (a random input leaves the detector's map near 0, where
    float noise is all there is to compare). Needs Debian's python3-pil."""
    from PIL import Image, ImageDraw, ImageFont
    n, _, h, w = shape
    try:
        font = ImageFont.truetype("DejaVuSans.ttf", 28 if det else 30)
    except OSError:
        font = ImageFont.load_default()
    words = "every real onnx model runs fast slim text detection recognizer 2026".split()
    out = np.empty(shape, np.float32)
    for i in range(n):
        img = Image.new("RGB", (w, h), "white")
        draw = ImageDraw.Draw(img)
        for y in range(8, h - 30, 48):
            line = " ".join(rng.choice(words, 6))
            draw.text((int(rng.integers(4, 40)), y), line, fill="black", font=font)
        a = np.asarray(img, dtype=np.float32) / 255.0
        if det:
            a = (a - np.array([0.485, 0.456, 0.406], np.float32)) / np.array([0.229, 0.224, 0.225], np.float32)
        else:
            a = (a - 0.5) / 0.5
        out[i] = a.transpose(2, 0, 1)
    return out


def make_input(model, batch, work):
    """Writes each input as .npy (slim) and raw (ORT) plus ORT's spec; returns the slim
    -i arguments and the spec's path."""
    rng = np.random.default_rng(1234 + batch)
    slim_args, spec = [], {"inputs": []}
    for name, dtype, rest in MODELS[model]:
        shape = tuple(batch if d == "B" else d for d in rest)
        if dtype == np.int64:
            x = rng.integers(0, 8000, size=shape, dtype=np.int64)
        elif model.startswith("ppocr_"):
            x = text_images(shape, rng, model == "ppocr_det")
        else:
            x = rng.standard_normal(shape, dtype=np.float32)
        base = os.path.join(work, f"{model}_b{batch}_{name}")
        np.save(base + ".npy", x)
        x.tofile(base + ".bin")
        slim_args += ["-i", f"{name}={base}.npy"]
        spec["inputs"].append({"name": name, "file": base + ".bin", "shape": list(shape),
                               "dtype": "float32" if dtype == np.float32 else "int64"})
    spec_path = os.path.join(work, f"{model}_b{batch}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    return slim_args, spec_path


def run_slim(args, model_path, input_args, batch, threads, iters, out_dir):
    res = os.path.join(out_dir, "slim.json")
    cmd = [args.slim, "bench", model_path, "--batch", str(batch), "--threads", str(threads),
           "--warmup", str(args.warmup), "--iters", str(iters)] + input_args + [
           "-o", out_dir, "--json", res, "--top", "0"] + (["--isa", args.isa] if args.isa else [])
    env = dict(os.environ, OMP_WAIT_POLICY="passive") if args.no_spin else None
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=args.timeout, env=env)
    with open(res) as f:
        return json.load(f)


def run_ort(args, model_path, spec_path, threads, iters, out_dir):
    cmd = ["node", os.path.join(HERE, "ort_bench.js"), model_path, spec_path, str(threads),
           str(args.warmup), str(iters), out_dir, "0" if args.no_spin else "1"]
    env = dict(os.environ, NODE_PATH=os.path.join(HERE, "node_modules"))
    subprocess.run(cmd, check=True, env=env, timeout=args.timeout)
    with open(os.path.join(out_dir, "result.json")) as f:
        return json.load(f)


# The bar: slim's outputs within 1e-4 of ORT's, relative to the largest |output|.
REL_TOLERANCE = 1e-4


def compare_outputs(slim_dir, ort_result):
    worst_abs, worst_rel = 0.0, 0.0
    for o in ort_result["outputs"]:
        ref = np.fromfile(o["file"], dtype=np.float32).reshape(o["dims"])
        got = np.load(os.path.join(slim_dir, o["name"] + ".npy"))
        if got.shape != ref.shape:
            raise SystemExit(f"output {o['name']}: slim {got.shape} vs ORT {ref.shape}")
        diff = float(np.max(np.abs(got.astype(np.float64) - ref)))
        worst_abs = max(worst_abs, diff)
        worst_rel = max(worst_rel, diff / max(float(np.max(np.abs(ref))), 1e-30))
    return worst_abs, worst_rel


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--slim", required=True, help="path of the slim binary")
    ap.add_argument("--work", required=True, help="folder with the exported models")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3, help="alternating slim/ORT rounds")
    ap.add_argument("--iters", type=int, default=10, help="timed runs per round at batch 1")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per engine process")
    ap.add_argument("--markdown", help="also write the table here")
    ap.add_argument("--no-spin", action="store_true",
                    help="waiting threads sleep instead of spinning, in both engines (slim: "
                         "OMP_WAIT_POLICY=passive for libgomp, ORT: session.intra_op.allow_spinning 0): "
                         "for machines whose cores other processes share")
    ap.add_argument("--isa", default=os.environ.get("SLIM_ISA", ""),
                    help="hold slim's kernels (its own and oneDNN's) to scalar, avx2 or avx512 "
                         "(default: SLIM_ISA, else the CPU's best)")
    args = ap.parse_args()

    load = os.getloadavg()
    print(f"# slim vs ONNX Runtime  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  "
          f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"# {args.rounds} alternating rounds per engine, {args.iters} timed runs per round "
          f"at batch 1 (fewer at batch 8), {args.warmup} warm-up runs; medians over all runs"
          + ("; threads sleep instead of spinning (--no-spin)" if args.no_spin else ""))
    header = ("| model | batch | threads | slim p50 ms | ORT p50 ms | slim/ORT | "
              "slim cold ms | ORT cold ms | max abs diff | max rel diff | slim's top ops |")
    rows = [header, "|" + "---|" * 11]
    print(header)
    print(rows[1])
    notes, mismatches = [], []
    for model in args.models.split(","):
        model_path = os.path.join(args.work, model + ".onnx")
        for batch in [int(b) for b in args.batches.split(",")]:
            input_args, spec_path = make_input(model, batch, args.work)
            iters = max(2, args.iters // batch * 2) if batch > 1 else args.iters
            for threads in [int(t) for t in args.threads.split(",")]:
                slim_runs, ort_runs, slim_cold, ort_cold = [], [], [], []
                slim_res = ort_res = None
                out = os.path.join(args.work, "out", f"{model}_b{batch}_t{threads}")
                for r in range(args.rounds):
                    order = ["slim", "ort"] if r % 2 == 0 else ["ort", "slim"]
                    for engine in order:
                        if engine == "slim":
                            slim_res = run_slim(args, model_path, input_args, batch, threads,
                                                iters, os.path.join(out, "slim"))
                            slim_runs += slim_res["runs_ms"]
                            slim_cold.append(slim_res["cold_start_ms"])
                        else:
                            ort_res = run_ort(args, model_path, spec_path, threads, iters,
                                              os.path.join(out, "ort"))
                            ort_runs += ort_res["runs_ms"]
                            ort_cold.append(ort_res["cold_start_ms"])
                s50, o50 = statistics.median(slim_runs), statistics.median(ort_runs)
                diff_abs, diff_rel = compare_outputs(os.path.join(out, "slim"), ort_res)
                top = ", ".join(f"{o['op']} {o['ms']:.1f}" for o in slim_res["ops"][:3])
                row = (f"| {model} | {batch} | {threads} | {s50:.2f} | {o50:.2f} | {s50 / o50:.2f} | "
                       f"{statistics.median(slim_cold):.0f} | {statistics.median(ort_cold):.0f} | "
                       f"{diff_abs:.2e} | {diff_rel:.2e} | {top} |")
                rows.append(row)
                print(row, flush=True)
                if not diff_rel <= REL_TOLERANCE:
                    mismatches.append(f"{model} b{batch} t{threads}: outputs differ from ORT's by "
                                      f"{diff_rel:.2e} of the largest |output| (tolerance {REL_TOLERANCE:g})")
                if s50 > o50:
                    notes.append(f"{model} b{batch} t{threads}: slim {s50 / o50:.2f}x ORT; "
                                 f"slim's time per run by op type: {top} (ms)")
    if notes:
        print("\nWhere slim is slower:")
        for n in notes:
            print("  " + n)
    print(f"\nONNX Runtime {ort_res['version'] if ort_res else '?'} (onnxruntime-node)")
    print(f"ISA: slim's kernels (its own and oneDNN's) ran at {slim_res['kernels'] if slim_res else '?'}; "
          "ONNX Runtime picks its MLAS kernels by cpuid and cannot be held lower, so on an "
          "AVX-512 CPU it ran its AVX-512 kernels whatever --isa says")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(rows) + "\n")
    if mismatches:
        print("\nOUTPUT MISMATCH (the timings of these rows do not count):", file=sys.stderr)
        for m in mismatches:
            print("  " + m, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
