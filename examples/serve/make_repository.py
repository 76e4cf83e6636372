#!/usr/bin/env python3
"""Writes the example model repository for `slim serve` (Triton's layout) from the demo's
trained digits classifier, plus a gradient-boosted forest trained on the same digits,
and a KServe v2 request body with held-out digits.

Usage: make_repository.py DIGITS_DIR OUT_DIR
  DIGITS_DIR: the output of examples/digits/make_digits_model.py (digits_mlp.onnx, digits.npy)
Writes OUT_DIR/repo/digits/{config.pbtxt,1/model.onnx}, OUT_DIR/repo/digits_trees/
{config.pbtxt,1/model.json} and OUT_DIR/request.json (four digits, FP32 [4,64]).
"""
import json
import os
import shutil
import sys

import numpy as np

DIGITS = """name: "digits"
platform: "onnxruntime_onnx"
max_batch_size: 32
input [ { name: "pixels", data_type: TYPE_FP32, dims: [ 64 ] } ]
output [ { name: "probabilities", data_type: TYPE_FP32, dims: [ 10 ] } ]
dynamic_batching {
  preferred_batch_size: [ 16, 32 ]
  max_queue_delay_microseconds: 1000
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy { max_queue_size: 256 }
}
"""

TREES = """name: "digits_trees"
backend: "fil"
max_batch_size: 256
input [ { name: "input", data_type: TYPE_FP32, dims: [ 64 ] } ]
output [ { name: "output", data_type: TYPE_FP32, dims: [ 10 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
"""


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def main():
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help") else 2)
    digits_dir, out = sys.argv[1], sys.argv[2]
    repo = os.path.join(out, "repo")
    shutil.rmtree(repo, ignore_errors=True)
    write(os.path.join(repo, "digits", "config.pbtxt"), DIGITS)
    os.makedirs(os.path.join(repo, "digits", "1"))
    shutil.copy(os.path.join(digits_dir, "digits_mlp.onnx"), os.path.join(repo, "digits", "1", "model.onnx"))

    import xgboost as xgb
    from sklearn.datasets import load_digits
    d = load_digits()
    booster = xgb.train({"objective": "multi:softprob", "num_class": 10, "max_depth": 4, "eta": 0.3,
                         "nthread": 1, "seed": 0},
                        xgb.DMatrix(d.data.astype(np.float32), label=d.target), num_boost_round=30)
    write(os.path.join(repo, "digits_trees", "config.pbtxt"), TREES)
    os.makedirs(os.path.join(repo, "digits_trees", "1"))
    booster.save_model(os.path.join(repo, "digits_trees", "1", "model.json"))

    x = np.load(os.path.join(digits_dir, "digits.npy"))[:4].astype(np.float32)
    body = {"inputs": [{"name": "pixels", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    write(os.path.join(out, "request.json"), json.dumps(body))
    print(f"wrote {repo} (digits: ONNX MLP; digits_trees: XGBoost, 30 rounds x 10 classes) and {out}/request.json")


if __name__ == "__main__":
    main()
