#!/usr/bin/python3
"""slim's 8-bit and float16 paths against ONNX Runtime (onnxruntime-node), on small models
shaped like the real ones (tests/real_models: @imgly's ISNet, quantized by ORT's dynamic
quantizer and converted to float16 by onnxconverter-common), built with the onnx package:

- 8-bit: DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul(scale) -> Add(reshaped bias)
  -> Relu chains (uint8 and int8 weights, per-tensor and per-channel scales, dilations,
  a stride), MaxPool, a bilinear Resize, Concat and a Sigmoid. Every dynamic quantization
  turns an ulp of difference into a different 8-bit value, so slim (cpu,ref) must give
  ORT's intermediate values to the bit; the Sigmoid within 1e-6.
- float16: the input cast to f16, Conv/Relu in f16, a Resize between the model's own
  Casts, a Concat fed by one of them and an isolated one: slim rounds to f16 where ORT
  does (run_float16_in_float32), so 99% of the values agree to f32 rounding (1e-5); the
  rest are where the two convolutions' sums, an ulp apart, rounded to different f16
  values before the Concat (up to 1e-3). Rounding anywhere else would move most values.

Skipped (exit 77) unless onnxruntime-node is installed, as rnn_vs_ort.py.
Usage: quantized_vs_ort.py [--install] [--slim PATH] [--build DIR]."""
import os
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ort_compare  # noqa: E402


def quantized_conv(nodes, inits, rng, x, y, c, oc, *, dilation=1, stride=1, signed=False, per_channel=False):
    """ORT's dynamic quantizer's chain for one Conv (+ Relu)."""
    p = y + "_"
    wt = np.int8 if signed else np.uint8
    lo, hi = (-128, 128) if signed else (0, 256)
    inits += [numpy_helper.from_array(rng.integers(lo, hi, (oc, c, 3, 3)).astype(wt), p + "w"),
              numpy_helper.from_array(np.array(rng.integers(lo, hi), dtype=wt), p + "wz"),
              numpy_helper.from_array((rng.uniform(0.001, 0.01, (oc, 1, 1)) if per_channel
                                       else np.array(0.004)).astype(np.float32), p + "ws"),
              numpy_helper.from_array(rng.uniform(-1, 1, oc).astype(np.float32), p + "b"),
              numpy_helper.from_array(np.array([1, oc, 1, 1], dtype=np.int64), p + "bs")]
    nodes += [helper.make_node("DynamicQuantizeLinear", [x], [p + "q", p + "s", p + "z"]),
              helper.make_node("Mul", [p + "s", p + "ws"], [p + "scale"]),
              helper.make_node("ConvInteger", [p + "q", p + "w", p + "z", p + "wz"], [p + "sums"],
                               pads=[dilation] * 4, dilations=[dilation] * 2, strides=[stride] * 2),
              helper.make_node("Cast", [p + "sums"], [p + "f"], to=TensorProto.FLOAT),
              helper.make_node("Mul", [p + "f", p + "scale"], [p + "scaled"]),
              helper.make_node("Reshape", [p + "b", p + "bs"], [p + "b4"]),
              helper.make_node("Add", [p + "scaled", p + "b4"], [p + "biased"]),
              helper.make_node("Relu", [p + "biased"], [y])]


def int8_model(path):
    rng = np.random.default_rng(7)
    nodes, inits = [], []
    quantized_conv(nodes, inits, rng, "x", "a", 3, 16, stride=2)
    quantized_conv(nodes, inits, rng, "a", "b", 16, 16, signed=True, per_channel=True)
    nodes.append(helper.make_node("MaxPool", ["b"], ["p"], kernel_shape=[2, 2], strides=[2, 2]))
    quantized_conv(nodes, inits, rng, "p", "c", 16, 24, dilation=2)
    inits.append(numpy_helper.from_array(np.array([1, 24, 16, 16], dtype=np.int64), "sizes"))
    nodes += [helper.make_node("Resize", ["c", "", "", "sizes"], ["u"], mode="linear",
                               coordinate_transformation_mode="half_pixel"),
              helper.make_node("Concat", ["u", "b"], ["cat"], axis=1)]
    quantized_conv(nodes, inits, rng, "cat", "d", 40, 8, per_channel=True)
    nodes.append(helper.make_node("Sigmoid", ["d"], ["y"]))
    outs = {"a": [1, 16, 16, 16], "b": [1, 16, 16, 16], "c": [1, 24, 8, 8], "u": [1, 24, 16, 16],
            "d": [1, 8, 16, 16], "y": [1, 8, 16, 16]}
    graph = helper.make_graph(nodes, "int8", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in outs.items()], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return {"x": rng.uniform(-2, 3, (1, 3, 32, 32)).astype(np.float32)}, {k: (1e-6 if k == "y" else 0.0, 1.0) for k in outs}


def float16_model(path):
    rng = np.random.default_rng(8)
    f16 = lambda *s, scale=0.3: (rng.standard_normal(s) * scale).astype(np.float16)
    inits = [numpy_helper.from_array(f16(8, 3, 3, 3), "w1"), numpy_helper.from_array(f16(8), "b1"),
             numpy_helper.from_array(f16(8, 8, 3, 3), "w2"), numpy_helper.from_array(f16(4, 16, 1, 1), "w3"),
             numpy_helper.from_array(np.array([1, 8, 16, 16], dtype=np.int64), "sizes")]
    cast = lambda x, y, to: helper.make_node("Cast", [x], [y], to=to)
    nodes = [cast("x", "x16", TensorProto.FLOAT16),
             helper.make_node("Conv", ["x16", "w1", "b1"], ["c1"], pads=[1] * 4, strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1] * 4),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             cast("p", "p32", TensorProto.FLOAT),
             helper.make_node("Resize", ["p32", "", "", "sizes"], ["u32"], mode="linear"),
             cast("u32", "u16", TensorProto.FLOAT16),
             helper.make_node("Concat", ["u16", "r1"], ["cat_f16"], axis=1),
             helper.make_node("Concat", ["r1", "r2"], ["cat_isolated"], axis=1),
             helper.make_node("Conv", ["cat_f16", "w3"], ["c3"]),
             helper.make_node("Conv", ["cat_isolated", "w3"], ["c4"]),
             cast("c3", "y3", TensorProto.FLOAT), cast("c4", "y4", TensorProto.FLOAT)]
    outs = {"y3": [1, 4, 16, 16], "y4": [1, 4, 16, 16]}
    graph = helper.make_graph(nodes, "fp16", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in outs.items()], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]), path)
    return {"x": rng.uniform(-1, 1, (1, 3, 32, 32)).astype(np.float32)}, {k: (1e-3, 0.99) for k in outs}


def main():
    args, node_modules = ort_compare.setup(__doc__)
    if not node_modules:
        return 77
    failures = []
    for name, build in (("int8", int8_model), ("float16", float16_model)):
        with tempfile.TemporaryDirectory(prefix="slim_quant_ort_") as work:
            model = os.path.join(work, name + ".onnx")
            feeds, tolerances = build(model)
            want = ort_compare.run_ort(node_modules, model, feeds, work)
            got = ort_compare.run_slim(args.slim, model, feeds, work, "cpu,ref")
            for out, (tol, share) in tolerances.items():
                d = np.abs(got(out).astype(np.float64) - want[out])
                diff, close = float(np.max(d)), float(np.mean(d <= 1e-5))
                print(f"{name:8} {out:3} max abs diff {diff:.2e} (allowed {tol:g}), "
                      f"{100 * close:.1f}% within 1e-5 (needed {100 * share:g}%)")
                if not (diff <= tol and close >= share):
                    failures.append(f"{name} {out}: max abs diff {diff:.2e}, {100 * close:.1f}% within 1e-5")
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print(f"\nboth models agree with ONNX Runtime {ort_compare.ORT_VERSION}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
