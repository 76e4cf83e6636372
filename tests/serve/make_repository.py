#!/usr/bin/env python3
"""Writes a Triton-style model repository for the slim serve tests and benchmarks.

Usage: make_repository.py OUT_DIR

OUT_DIR/
  digits/config.pbtxt   1/model.onnx  ONNX MLP: pixels FP32 [-1,64] -> probabilities FP32 [-1,10];
                                      max_batch_size 32, dynamic batching, 3 priority levels
  cnn/config.json       1/model.onnx  ONNX conv net: image FP32 [-1,1,8,8] -> logits FP32 [-1,4];
                                      max_batch_size 16, dynamic batching (JSON config form)
  forest/config.pbtxt   1/model.json  XGBoost regressor: input FP32 [-1,8] -> output FP32 [-1]
  plain/config.pbtxt    1/model.onnx  no batching (max_batch_size 0): x FP32 [2,3] -> y = x + 1
                        2/model.onnx  version 2: y = x + 2
Weights come from fixed seeds, so every run writes the same files.
"""
import json
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DIGITS_CONFIG = """name: "digits"
platform: "onnxruntime_onnx"
max_batch_size: 32
input [
  {
    name: "pixels"
    data_type: TYPE_FP32
    dims: [ 64 ]
  }
]
output [
  {
    name: "probabilities"
    data_type: TYPE_FP32
    dims: [ 10 ]
  }
]
instance_group [ { count: 1, kind: KIND_CPU } ]
dynamic_batching {
  preferred_batch_size: [ 8, 16, 32 ]
  max_queue_delay_microseconds: 2000
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy { max_queue_size: 256 }
  priority_queue_policy {
    key: 3
    value: { timeout_action: REJECT, default_timeout_microseconds: 5000000,
             allow_timeout_override: true, max_queue_size: 64 }
  }
}
"""

CNN_CONFIG = {
    "name": "cnn",
    "backend": "onnxruntime",
    "max_batch_size": 16,
    "input": [{"name": "image", "data_type": "TYPE_FP32", "dims": [1, 8, 8]}],
    "output": [{"name": "logits", "data_type": "TYPE_FP32", "dims": [4]}],
    "dynamic_batching": {"preferred_batch_size": [16], "max_queue_delay_microseconds": 1000},
}

FOREST_CONFIG = """name: "forest"
backend: "fil"
max_batch_size: 256
input [ { name: "input", data_type: TYPE_FP32, dims: [ 8 ] } ]
output [ { name: "output", data_type: TYPE_FP32, dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
"""

PLAIN_CONFIG = """name: "plain"
platform: "onnxruntime_onnx"
max_batch_size: 0
version_policy: { all { } }
input [ { name: "x", data_type: TYPE_FP32, dims: [ 2, 3 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 2, 3 ] } ]
"""


def save(model, path):
    model.ir_version = 8
    onnx.checker.check_model(model)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    onnx.save(model, path)


def digits_model(rng):
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.2, (64, 32)).astype(np.float32), "w0"),
        numpy_helper.from_array(rng.normal(0, 0.1, (32,)).astype(np.float32), "b0"),
        numpy_helper.from_array(rng.normal(0, 0.3, (32, 10)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.1, (10,)).astype(np.float32), "b1"),
    ]
    nodes = [
        helper.make_node("Gemm", ["pixels", "w0", "b0"], ["h0"], name="fc0"),
        helper.make_node("Relu", ["h0"], ["a0"], name="relu0"),
        helper.make_node("Gemm", ["a0", "w1", "b1"], ["h1"], name="fc1"),
        helper.make_node("Softmax", ["h1"], ["probabilities"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "digits",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 10])],
        initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def cnn_model(rng):
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (4, 1, 3, 3)).astype(np.float32), "conv_w"),
        numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "conv_b"),
        numpy_helper.from_array(rng.normal(0, 0.2, (64, 4)).astype(np.float32), "fc_w"),
        numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "fc_b"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "conv_w", "conv_b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes, "cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])],
        initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def plain_model(offset):
    inits = [numpy_helper.from_array(np.array(offset, dtype=np.float32), "offset")]
    nodes = [helper.make_node("Add", ["x", "offset"], ["y"], name="add")]
    graph = helper.make_graph(
        nodes, "plain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def forest_model(path):
    import xgboost as xgb
    rng = np.random.default_rng(3)
    x = rng.normal(size=(512, 8)).astype(np.float32)
    y = (x[:, 0] * 2 + np.sin(x[:, 1]) - x[:, 2] * x[:, 3]).astype(np.float32)
    booster = xgb.train({"max_depth": 4, "eta": 0.3, "objective": "reg:squarederror",
                         "nthread": 1, "seed": 0}, xgb.DMatrix(x, label=y), num_boost_round=20)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    booster.save_model(path)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) == 2 else 2)
    out = sys.argv[1]
    rng = np.random.default_rng(7)
    write(os.path.join(out, "digits", "config.pbtxt"), DIGITS_CONFIG)
    save(digits_model(rng), os.path.join(out, "digits", "1", "model.onnx"))
    write(os.path.join(out, "cnn", "config.json"), json.dumps(CNN_CONFIG, indent=2))
    save(cnn_model(rng), os.path.join(out, "cnn", "1", "model.onnx"))
    write(os.path.join(out, "forest", "config.pbtxt"), FOREST_CONFIG)
    forest_model(os.path.join(out, "forest", "1", "model.json"))
    write(os.path.join(out, "plain", "config.pbtxt"), PLAIN_CONFIG)
    save(plain_model(1.0), os.path.join(out, "plain", "1", "model.onnx"))
    save(plain_model(2.0), os.path.join(out, "plain", "2", "model.onnx"))


if __name__ == "__main__":
    main()
