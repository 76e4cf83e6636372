#!/usr/bin/python3
"""slim's RNN, GRU and LSTM against ONNX Runtime (onnxruntime-node): one-node models
built with the onnx package (every direction, batch 3, sequence_lens with short and
empty sequences, initial states, peepholes, clip, input_forget, linear_before_reset,
activations with alpha/beta, each set of outputs), run by `slim run` with providers ref
and cpu,ref and by bench/vs_ort/ort_bench.js; every output must agree within 1e-4.
Layout 1 is left out: ONNX Runtime's CPU kernels refuse batch-first layers.

Skipped (exit 77) unless onnxruntime-node is installed (ort_compare.py).
Usage: rnn_vs_ort.py [--install] [--slim PATH] [--build DIR]."""
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ort_compare  # noqa: E402

TOLERANCE = 1e-4

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def case(op, direction="forward", T=5, N=3, I=4, H=6, bias=True, lens=None, states=False, peepholes=False,
         outputs=(True, True, True), opset=14, **attrs):
    return dict(op=op, direction=direction, T=T, N=N, I=I, H=H, bias=bias, lens=lens, states=states,
                peepholes=peepholes, outputs=outputs, opset=opset, attrs=attrs)


CASES = [
    # LSTM
    case("LSTM"),
    case("LSTM", "reverse", states=True),
    case("LSTM", "bidirectional", states=True, peepholes=True),
    case("LSTM", "forward", lens=[5, 2, 1], states=True, peepholes=True),
    case("LSTM", "bidirectional", lens=[3, 5, 1], states=True),
    case("LSTM", "reverse", lens=[4, 5, 2], outputs=(False, True, True)),
    case("LSTM", outputs=(True, False, False), N=1),
    case("LSTM", "bidirectional", outputs=(False, False, True), N=1, states=True),
    case("LSTM", clip=0.7, states=True),
    case("LSTM", input_forget=1, peepholes=True),
    case("LSTM", "bidirectional", activations=["HardSigmoid", "LeakyRelu", "Softsign", "Sigmoid", "Elu", "Tanh"],
         activation_alpha=[0.3, 0.05, 0.9], activation_beta=[0.4]),
    case("LSTM", opset=7, states=True),
    # GRU
    case("GRU"),
    case("GRU", "reverse", states=True),
    case("GRU", "bidirectional", states=True),
    case("GRU", linear_before_reset=1, states=True),
    case("GRU", "bidirectional", linear_before_reset=1, lens=[2, 5, 4]),
    case("GRU", "reverse", lens=[1, 5, 3], states=True),
    case("GRU", clip=0.5, linear_before_reset=1),
    case("GRU", activations=["HardSigmoid", "Softsign"], activation_alpha=[0.25], activation_beta=[0.45]),
    case("GRU", outputs=(True, False), N=1),
    case("GRU", opset=7, linear_before_reset=1),
    # RNN
    case("RNN"),
    case("RNN", "reverse", states=True),
    case("RNN", "bidirectional", states=True, lens=[5, 3, 2]),
    case("RNN", activations=["Relu"]),
    case("RNN", activations=["LeakyRelu"], activation_alpha=[0.2]),
    case("RNN", "bidirectional", activations=["Sigmoid", "Affine"], activation_alpha=[0.5], activation_beta=[0.1]),
    case("RNN", activations=["ThresholdedRelu"], activation_alpha=[0.1]),
    case("RNN", activations=["ScaledTanh"], activation_alpha=[1.5], activation_beta=[0.7]),
    case("RNN", activations=["Softplus"], clip=1.5),
    case("RNN", opset=7),
]


def build(c, work, index):
    """Writes the model and its inputs; returns (model path, {name: array})."""
    rng = np.random.default_rng(100 + index)
    op, T, N, I, H = c["op"], c["T"], c["N"], c["I"], c["H"]
    D = 2 if c["direction"] == "bidirectional" else 1
    G = GATES[op]
    f32 = lambda *s, scale=1.0: (rng.standard_normal(s) * scale).astype(np.float32)
    feeds = {"X": f32(T, N, I), "W": f32(D, G * H, I, scale=0.5), "R": f32(D, G * H, H, scale=0.5)}
    names = ["X", "W", "R"]
    if c["bias"]:
        feeds["B"] = f32(D, 2 * G * H, scale=0.3)
    names.append("B" if c["bias"] else "")
    if c["lens"] is not None:
        feeds["sequence_lens"] = np.array(c["lens"], dtype=np.int32)
    names.append("sequence_lens" if c["lens"] is not None else "")
    if c["states"]:
        feeds["initial_h"] = f32(D, N, H, scale=0.5)
        if op == "LSTM":
            feeds["initial_c"] = f32(D, N, H, scale=0.5)
    names.append("initial_h" if c["states"] else "")
    if op == "LSTM":
        names.append("initial_c" if c["states"] else "")
        if c["peepholes"]:
            feeds["P"] = f32(D, 3 * H, scale=0.5)
        names.append("P" if c["peepholes"] else "")
    while names[-1] == "":
        names.pop()
    out_names = ["Y", "Y_h", "Y_c"][: 3 if op == "LSTM" else 2]
    outs = [n if want else "" for n, want in zip(out_names, c["outputs"])]
    while outs[-1] == "":
        outs.pop()
    node = helper.make_node(op, names, outs, hidden_size=H, direction=c["direction"], **c["attrs"])
    shapes = {"Y": [T, D, N, H], "Y_h": [D, N, H], "Y_c": [D, N, H]}
    graph = helper.make_graph(
        [node], "rnn",
        [helper.make_tensor_value_info(k, TensorProto.INT32 if k == "sequence_lens" else TensorProto.FLOAT,
                                       list(v.shape)) for k, v in feeds.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, shapes[o]) for o in outs if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", c["opset"])])
    model.ir_version = 7
    path = os.path.join(work, f"case{index}.onnx")
    onnx.save(model, path)
    return path, feeds


def partition(slim, model):
    out = subprocess.run([slim, "inspect", model, "--partition"], check=True, capture_output=True, text=True).stdout
    m = re.search(r"^\s+(\w+)\s+(?:LSTM|GRU|RNN) ", out, re.M)
    return m.group(1) if m else "?"


def main():
    args, node_modules = ort_compare.setup(__doc__)
    if not node_modules:
        return 77
    slim = args.slim
    failures = []
    print(f"{'case':<72} {'ref':>9} {'cpu,ref':>9}  cpu ran")
    for i, c in enumerate(CASES):
        label = (f"{c['op']}-{c['opset']} {c['direction']} N={c['N']}" + (f" lens={c['lens']}" if c["lens"] else "") +
                 (" states" if c["states"] else "") + (" P" if c["peepholes"] else "") +
                 "".join(f" {k}={v}" for k, v in c["attrs"].items()) +
                 " out=" + "".join("1" if o else "0" for o in c["outputs"]))
        with tempfile.TemporaryDirectory(prefix="slim_rnn_ort_") as work:
            model, feeds = build(c, work, i)
            want = ort_compare.run_ort(node_modules, model, feeds, work)
            diffs = []
            for providers in ("ref", "cpu,ref"):
                got = ort_compare.run_slim(slim, model, feeds, work, providers)
                worst = 0.0
                for name, ref in want.items():
                    g = got(name)
                    if g.shape != ref.shape:
                        failures.append(f"{label}: {name} shape {g.shape} vs ORT {ref.shape}")
                        worst = float("inf")
                        continue
                    worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - ref))) if ref.size else 0.0)
                diffs.append(worst)
                if not worst <= TOLERANCE:
                    failures.append(f"{label} [{providers}]: max abs diff {worst:.2e}")
            print(f"{label[:72]:<72} {diffs[0]:9.1e} {diffs[1]:9.1e}  {partition(slim, model)}", flush=True)
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print(f"\nall {len(CASES)} cases within {TOLERANCE:g} of ONNX Runtime {ort_compare.ORT_VERSION}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
