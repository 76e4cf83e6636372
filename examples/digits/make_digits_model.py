#!/usr/bin/env python3
"""Trains a small digits classifier on the 8x8 digits data shipped with Debian's
python3-sklearn and writes it as ONNX with python3-onnx, plus held-out digit images as
.npy for `slim run`.

Usage: make_digits_model.py OUT_DIR
Writes OUT_DIR/digits_mlp.onnx, digits.npy (f32[N,64], raw pixel values 0..16),
labels.npy (i64[N]) and sklearn_pred.npy (i64[N], the classifier's own predictions).
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) == 2 else 2)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)

    digits = load_digits()
    x = digits.data.astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0)
    clf = MLPClassifier(hidden_layer_sizes=(64, 32), max_iter=600, random_state=0)
    clf.fit(x_train / 16.0, y_train)
    print(f"sklearn MLP: test accuracy {clf.score(x_test / 16.0, y_test):.4f} on {len(y_test)} held-out digits")

    # pixels/16 -> Gemm -> Relu -> Gemm -> Relu -> Gemm -> Softmax
    inits = [numpy_helper.from_array(np.array(1.0 / 16.0, dtype=np.float32), "scale")]
    nodes = [helper.make_node("Mul", ["pixels", "scale"], ["x0"], name="normalize")]
    prev = "x0"
    n_layers = len(clf.coefs_)
    for i, (w, b) in enumerate(zip(clf.coefs_, clf.intercepts_)):
        inits.append(numpy_helper.from_array(w.astype(np.float32), f"fc{i}.weight"))
        inits.append(numpy_helper.from_array(b.astype(np.float32), f"fc{i}.bias"))
        nodes.append(helper.make_node("Gemm", [prev, f"fc{i}.weight", f"fc{i}.bias"], [f"h{i}"], name=f"fc{i}"))
        prev = f"h{i}"
        if i + 1 < n_layers:
            nodes.append(helper.make_node("Relu", [prev], [f"a{i}"], name=f"relu{i}"))
            prev = f"a{i}"
    nodes.append(helper.make_node("Softmax", [prev], ["probabilities"], name="softmax", axis=1))
    graph = helper.make_graph(
        nodes, "digits_mlp",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 10])],
        initializer=inits)
    model = helper.make_model(graph, producer_name="slim-examples",
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(out, "digits_mlp.onnx"))

    n = 24
    np.save(os.path.join(out, "digits.npy"), x_test[:n])
    np.save(os.path.join(out, "labels.npy"), y_test[:n])
    np.save(os.path.join(out, "sklearn_pred.npy"), clf.predict(x_test[:n] / 16.0).astype(np.int64))
    print(f"wrote {out}/digits_mlp.onnx and {n} held-out digits")


if __name__ == "__main__":
    main()
