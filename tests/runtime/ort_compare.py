"""What the tests that hold slim to ONNX Runtime share (rnn_vs_ort.py, quantized_vs_ort.py,
quant/qdq_vs_ort.py): finding onnxruntime-node, running a model through it
(bench/vs_ort/ort_bench.js) and through `slim run`.

onnxruntime-node (about 300 MB) is the real-model suite's copy: bench/vs_ort/node_modules
or the model cache's npm folder (tests/real_models/run.py's installed_ort / ensure_ort;
SLIM_MODEL_CACHE, else bench/.work/real_models). With `--install` (how ctest runs these
tests) it is installed there first when missing; without it, or when the npm registry
cannot be reached, the test exits 77 (ctest: skipped)."""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "real_models"))
import run as real_models  # noqa: E402

ORT_VERSION = real_models.ORT_VERSION


def setup(description):
    """Parses --install/--build/--slim; returns (args with args.slim set, the node_modules
    folder holding onnxruntime-node, or None after saying why the test is skipped)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--install", action="store_true", help="install onnxruntime-node into the model cache if missing")
    ap.add_argument("--build", default=os.environ.get("SLIM_BINARY_DIR", os.path.join(ROOT, "build")))
    ap.add_argument("--slim", help="slim binary (default: BUILD/tools/slim)")
    args = ap.parse_args()
    args.slim = args.slim or os.path.join(args.build, "tools", "slim")
    found = real_models.installed_ort(real_models.DEFAULT_CACHE)
    if not found and args.install:
        try:
            found = real_models.ensure_ort(real_models.DEFAULT_CACHE)
        except real_models.Unreachable as e:
            print(f"{e}; skipped")
            return args, None
    if not found:
        print("onnxruntime-node is not installed (bench/vs_ort/run.sh, or --install); skipped")
    return args, found


def run_ort(node_modules, model, feeds, work, optimization="all"):
    """ONNX Runtime's outputs of `model` on `feeds` (float32 or int32 arrays), by name;
    `optimization` is its graph optimization level ("disabled": the model's own ops)."""
    spec = {"inputs": []}
    for name, arr in feeds.items():
        f = os.path.join(work, name + ".bin")
        arr.tofile(f)
        spec["inputs"].append({"name": name, "file": f, "shape": list(arr.shape),
                               "dtype": "int32" if arr.dtype == np.int32 else "float32"})
    spec_path = os.path.join(work, "spec.json")
    json.dump(spec, open(spec_path, "w"))
    out = os.path.join(work, "ort")
    env = dict(os.environ, NODE_PATH=node_modules)
    subprocess.run(["node", os.path.join(ROOT, "bench", "vs_ort", "ort_bench.js"), model, spec_path, "1", "0", "1",
                    out, "1", optimization], check=True, env=env)
    res = json.load(open(os.path.join(out, "result.json")))
    return {o["name"]: np.fromfile(o["file"], dtype=np.float32).reshape(o["dims"]) for o in res["outputs"]}


def run_slim(slim, model, feeds, work, providers):
    """Runs `slim run` with `providers`; returns a function from output name to array."""
    args = [slim, "run", model, "--providers", providers, "-o", os.path.join(work, providers)]
    for name, arr in feeds.items():
        f = os.path.join(work, name + ".npy")
        np.save(f, arr)
        args += ["-i", f"{name}={f}"]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    return lambda name: np.load(os.path.join(work, providers, name + ".npy"))
