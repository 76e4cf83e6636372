#!/usr/bin/python3
"""Quantized ONNX models in slim and ONNX Runtime (onnxruntime-node), value for value.

1. `slim quantize` exports (tests/fixtures/quant_fixtures.py's CNN and transformer block,
   each calibrator, per-channel and per-tensor weights, u8/i8 and symmetric activations,
   SmoothQuant, bias correction) run in both engines; every quantized activation (each
   DequantizeLinear output, made a graph output here) and the model outputs are compared
   with ONNX Runtime running the ops as written (graph optimizations off). The 8-bit values
   must be the same up to rounding ties: an ulp of difference in a float sum that lands on
   a .5 moves one value by one step, and that step travels on (a float output after it
   within 1% of its largest value). With its optimizations on, ONNX Runtime runs its own
   integer kernels, which round elsewhere; the model outputs must stay within 10%.
2. Models in the layouts other tools write, built here with the onnx package: ONNX
   Runtime's QOperator format (QuantizeLinear, QLinearConv with per-channel int8 weights
   and int32 bias, MaxPool on uint8, QLinearMatMul, DequantizeLinear), its dynamic
   quantization of MatMul (DynamicQuantizeLinear, MatMulInteger, Cast, Mul, Add) and Conv
   (ConvInteger, int8 weights, per-channel scales), NNCF's QDQ (symmetric int8
   activations, per-channel weights, Q/DQ around Add, Concat and MaxPool) and a QDQ Gemm
   with uint8 weights.
3. Weight-only int4 from mixed precision: a plan of the transformer block (`slim quantize
   --accuracy-budget --plan-out`) edited so that every MatMul/Gemm layer offered int4 is
   int4 (com.microsoft MatMulNBits), the rest fp32, then int4 and int8 alternating, and
   re-applied with `--plan`; the outputs agree with ONNX Runtime's MatMulNBits within 1e-3
   of their largest value (both dequantize the same 4-bit weights; sums round apart), 1%
   with int8 layers between (a rounding tie moves an 8-bit value by a step).
Also `slim inspect` and `slim run` on every export. Skipped (exit 77) unless
onnxruntime-node is installed (tests/runtime/ort_compare.py).
Usage: qdq_vs_ort.py [--install] [--slim PATH] [--build DIR]."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "runtime"))
import ort_compare  # noqa: E402

EXPORTS = [
    ("cnn", ["--calibrator", "minmax"]),
    ("cnn", ["--calibrator", "entropy", "--per-tensor"]),
    ("cnn", ["--calibrator", "percentile", "--percentile", "99.9", "--activations", "i8"]),
    ("cnn", ["--calibrator", "mse", "--activations", "i8", "--symmetric", "--bias-correction"]),
    ("encoder", ["--calibrator", "minmax", "--smoothquant", "0.5"]),
    ("encoder", ["--calibrator", "mse", "--smoothquant", "0.8", "--smooth-clip", "99", "--bias-correction",
                 "--activations", "i8"]),
]


def with_dequantized_outputs(path, out):
    """The model with every activation's DequantizeLinear output as a graph output."""
    m = onnx.load(path)
    inits = {i.name for i in m.graph.initializer}
    have = {o.name for o in m.graph.output}
    for n in m.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] not in inits and n.output[0] not in have:
            m.graph.output.append(helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT, None))
    onnx.save(m, out)
    return [o.name for o in m.graph.output]


def compare(name, want, got, scales, failures, exact_share, float_tolerance):
    """Each output: the share of values equal and the largest difference in steps."""
    worst_equal, worst_steps, worst_rel = 1.0, 0.0, 0.0
    for out, w in want.items():
        g = got(out).astype(np.float64)
        step = scales.get(out)
        d = np.abs(g - w)
        equal = float(np.mean(d <= (1e-6 * np.abs(w) + 1e-7)))
        if step:
            steps = float(d.max() / step)
            ok = equal >= exact_share and steps <= 2.01
            detail = f"{100 * equal:.2f}% equal, max {steps:.2f} steps"
            worst_equal, worst_steps = min(worst_equal, equal), max(worst_steps, steps)
        else:  # a float output after the last quantized value
            rel = float(d.max() / max(np.abs(w).max(), 1e-12))
            ok = rel <= float_tolerance
            detail = f"max diff {rel:.2e} of the largest value"
            worst_rel = max(worst_rel, rel)
        if not ok:
            failures.append(f"{name} {out}: {detail}")
    print(f"{name}: {len(want)} outputs, 8-bit values {100 * worst_equal:.2f}% equal (worst output), "
          f"at most {worst_steps:.0f} steps apart; float outputs within {worst_rel:.1e} of their largest value")


def step_sizes(path):
    """Output name -> the scale of the DequantizeLinear that produces it (per tensor)."""
    m = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    out = {}
    for n in m.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[1] in inits and inits[n.input[1]].size == 1:
            out[n.output[0]] = float(inits[n.input[1]])
    return out


# ---------------------------------------------------------------- other tools' layouts

def qoperator_model(path, rng):
    """ORT's QOperator static layout."""
    inits = [
        numpy_helper.from_array(np.array(0.02, np.float32), "x_s"), numpy_helper.from_array(np.array(128, np.uint8), "x_z"),
        numpy_helper.from_array(rng.integers(-127, 128, (8, 3, 3, 3)).astype(np.int8), "w1"),
        numpy_helper.from_array(rng.uniform(0.002, 0.01, 8).astype(np.float32), "w1_s"),
        numpy_helper.from_array(np.zeros(8, np.int8), "w1_z"),
        numpy_helper.from_array(rng.integers(-2000, 2000, 8).astype(np.int32), "b1"),
        numpy_helper.from_array(np.array(0.03, np.float32), "y1_s"), numpy_helper.from_array(np.array(0, np.uint8), "y1_z"),
        numpy_helper.from_array(rng.integers(0, 256, (8, 8, 3, 3)).astype(np.uint8), "w2"),
        numpy_helper.from_array(np.array(0.004, np.float32), "w2_s"), numpy_helper.from_array(np.array(131, np.uint8), "w2_z"),
        numpy_helper.from_array(np.array(0.05, np.float32), "y2_s"), numpy_helper.from_array(np.array(100, np.uint8), "y2_z"),
        numpy_helper.from_array(np.array([1, 8 * 4 * 4], np.int64), "shape"),
        numpy_helper.from_array(rng.integers(-127, 128, (128, 10)).astype(np.int8), "wm"),
        numpy_helper.from_array(np.array(0.01, np.float32), "wm_s"), numpy_helper.from_array(np.array(0, np.int8), "wm_z"),
        numpy_helper.from_array(np.array(0.2, np.float32), "ym_s"), numpy_helper.from_array(np.array(120, np.uint8), "ym_z"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["xq"]),
        helper.make_node("QLinearConv", ["xq", "x_s", "x_z", "w1", "w1_s", "w1_z", "y1_s", "y1_z", "b1"], ["y1"], pads=[1] * 4),
        helper.make_node("QLinearConv", ["y1", "y1_s", "y1_z", "w2", "w2_s", "w2_z", "y2_s", "y2_z"], ["y2"], pads=[1] * 4,
                         strides=[2, 2]),
        helper.make_node("MaxPool", ["y2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Reshape", ["p", "shape"], ["flat"]),
        helper.make_node("QLinearMatMul", ["flat", "y2_s", "y2_z", "wm", "wm_s", "wm_z", "ym_s", "ym_z"], ["ym"]),
        helper.make_node("DequantizeLinear", ["ym", "ym_s", "ym_z"], ["y"]),
        helper.make_node("DequantizeLinear", ["y1", "y1_s", "y1_z"], ["y1f"]),
        helper.make_node("DequantizeLinear", ["p", "y2_s", "y2_z"], ["pf"]),
    ]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "y1f", "pf")]
    g = helper.make_graph(nodes, "qoperator", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])], outs, inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    return {"x": rng.uniform(-2, 2, (1, 3, 16, 16)).astype(np.float32)}, {"y": 0.2, "y1f": 0.03, "pf": 0.05}


def dynamic_model(path, rng):
    """ORT's dynamic quantization: MatMul through MatMulInteger, Conv through ConvInteger."""
    inits = [numpy_helper.from_array(rng.integers(0, 256, (16, 12)).astype(np.uint8), "w"),
             numpy_helper.from_array(np.array(125, np.uint8), "w_z"),
             numpy_helper.from_array(np.array(0.006, np.float32), "w_s"),
             numpy_helper.from_array(rng.standard_normal(12).astype(np.float32), "b"),
             numpy_helper.from_array(rng.integers(-127, 128, (4, 2, 3, 3)).astype(np.int8), "cw"),
             numpy_helper.from_array(np.array(3, np.int8), "cw_z"),
             numpy_helper.from_array(np.array([0.01, 0.02, 0.005, 0.03], np.float32).reshape(1, 4, 1, 1), "cw_s")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("MatMulInteger", ["xq", "w", "xz", "w_z"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["xs", "w_s"], ["s"]),
             helper.make_node("Mul", ["accf", "s"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["y"]),
             helper.make_node("DynamicQuantizeLinear", ["img"], ["iq", "is", "iz"]),
             helper.make_node("ConvInteger", ["iq", "cw", "iz", "cw_z"], ["cacc"], pads=[1] * 4),
             helper.make_node("Cast", ["cacc"], ["caccf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["is", "cw_s"], ["cs"]),
             helper.make_node("Mul", ["caccf", "cs"], ["c"])]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 16]),
           helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 2, 8, 8])]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "c")]
    g = helper.make_graph(nodes, "dynamic", ins, outs, inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    return ({"x": rng.standard_normal((5, 16)).astype(np.float32), "img": rng.standard_normal((1, 2, 8, 8)).astype(np.float32)},
            {"y": None, "c": None})


def nncf_model(path, rng):
    """NNCF's QDQ: symmetric int8 activations, per-channel int8 weights (axis 0), Q/DQ
    pairs on the inputs of Conv, Add, Concat and around MaxPool, and a QDQ Gemm with uint8
    weights (zero point 128)."""
    inits, nodes = [], []

    def qdq(x, scale, zp, dtype=np.int8, axis=None, name=None):
        name = name or x
        inits.extend([numpy_helper.from_array(np.asarray(scale, np.float32), name + "_s"),
                      numpy_helper.from_array(np.asarray(zp, dtype), name + "_z")])
        kw = {} if axis is None else {"axis": axis}
        nodes.extend([helper.make_node("QuantizeLinear", [x, name + "_s", name + "_z"], [name + "_q"], **kw),
                      helper.make_node("DequantizeLinear", [name + "_q", name + "_s", name + "_z"], [name + "_dq"], **kw)])
        return name + "_dq"

    def weight(name, w, axis=0):
        amax = np.abs(w).max(axis=tuple(i for i in range(w.ndim) if i != axis))
        s = (amax / 127).astype(np.float32)
        shape = [1] * w.ndim
        shape[axis] = -1
        inits.extend([numpy_helper.from_array(np.clip(np.round(w / s.reshape(shape)), -127, 127).astype(np.int8), name),
                      numpy_helper.from_array(s, name + "_s"), numpy_helper.from_array(np.zeros(len(s), np.int8), name + "_z")])
        nodes.append(helper.make_node("DequantizeLinear", [name, name + "_s", name + "_z"], [name + "_dq"], axis=axis))
        return name + "_dq"

    x = qdq("x", 0.02, 0)
    w1 = weight("w1", rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3)
    nodes.append(helper.make_node("Conv", [x, w1], ["c1"], pads=[1] * 4))
    c1 = qdq("c1", 0.05, 0)
    nodes.append(helper.make_node("MaxPool", [c1], ["p"], kernel_shape=[2, 2], strides=[2, 2]))
    p = qdq("p", 0.05, 0)
    w2 = weight("w2", rng.standard_normal((8, 8, 1, 1)).astype(np.float32) * 0.3)
    nodes.append(helper.make_node("Conv", [p, w2], ["c2"]))
    c2 = qdq("c2", 0.04, 0)
    nodes.append(helper.make_node("Add", [c2, p], ["a"]))
    a = qdq("a", 0.06, 0)
    nodes.append(helper.make_node("Concat", [a, p], ["cat"], axis=1))
    cat = qdq("cat", 0.06, 0)
    nodes.append(helper.make_node("GlobalAveragePool", [cat], ["gap"]))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"]))
    flat = qdq("flat", 0.03, 128, np.uint8)
    wg = rng.integers(0, 256, (16, 6)).astype(np.uint8)
    inits.extend([numpy_helper.from_array(wg, "wg"), numpy_helper.from_array(np.array(0.01, np.float32), "wg_s"),
                  numpy_helper.from_array(np.array(128, np.uint8), "wg_z")])
    nodes.append(helper.make_node("DequantizeLinear", ["wg", "wg_s", "wg_z"], ["wg_dq"]))
    nodes.append(helper.make_node("Gemm", [flat, "wg_dq"], ["y"]))
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "c1_dq", "a_dq", "cat_dq")]
    g = helper.make_graph(nodes, "nncf", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 12, 12])], outs, inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    return {"x": rng.uniform(-2, 2, (2, 3, 12, 12)).astype(np.float32)}, {"y": None, "c1_dq": 0.05, "a_dq": 0.06, "cat_dq": 0.06}


def int4_vs_ort(args, node_modules, models, fixtures, failures):
    work = tempfile.mkdtemp(dir=fixtures)
    src = os.path.join(models, "encoder.onnx")
    calib = ["--calib", os.path.join(models, "encoder_calib"), "--calib-cache", os.path.join(fixtures, "cache")]
    plan_path = os.path.join(work, "plan.json")
    subprocess.run([args.slim, "quantize", src, "-o", os.path.join(work, "measured.onnx"), "--threads", "1",
                    "--accuracy-budget", "0", "--latency-runs", "1", "--sensitivity-samples", "2",
                    "--search-evaluations", "0", "--plan-out", plan_path] + calib, check=True, stdout=subprocess.DEVNULL)
    plan = json.load(open(plan_path))
    offered = [i for i, l in enumerate(plan["layers"]) if l.get("int4")]
    if not offered:
        failures.append("int4: no layer of the transformer block is offered int4")
        return
    x = np.load(os.path.join(models, "encoder_held", "x.npy"))[:8]
    for label, pick, tolerance in (("int4", lambda k: "int4", 1e-3),
                                   ("int4/int8", lambda k: "int4" if k % 2 == 0 else "int8", 1e-2)):
        for i, l in enumerate(plan["layers"]):
            l["precision"] = pick(offered.index(i)) if i in offered else "fp32"
        edited = os.path.join(work, label.replace("/", "_") + ".json")
        json.dump(plan, open(edited, "w"))
        out = edited[:-5] + ".onnx"
        subprocess.run([args.slim, "quantize", src, "-o", out, "--plan", edited] + calib, check=True,
                       stdout=subprocess.DEVNULL)
        want = ort_compare.run_ort(node_modules, out, {"x": x}, work, "disabled")
        for providers in ("cpu,ref", "ref"):
            got = ort_compare.run_slim(args.slim, out, {"x": x}, work, providers)
            compare(f"mixed precision {label}, {len(offered)} MatMul/Gemm layers offered int4 [{providers}]", want,
                    got, {}, failures, 0, tolerance)


def main():
    args, node_modules = ort_compare.setup(__doc__)
    if not node_modules:
        return 77
    failures = []
    fixtures = tempfile.mkdtemp(prefix="slim_qdq_ort_")
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tests", "fixtures", "quant_fixtures.py"), fixtures], check=True,
                   stdout=subprocess.DEVNULL)
    models = os.path.join(fixtures, "models")
    for i, (name, opts) in enumerate(EXPORTS):
        work = tempfile.mkdtemp(dir=fixtures)
        out = os.path.join(work, f"{name}.int8.onnx")
        cmd = [args.slim, "quantize", os.path.join(models, name + ".onnx"), "-o", out, "--calib",
               os.path.join(models, name + "_calib"), "--calib-cache", os.path.join(fixtures, "cache")] + opts
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        inspect = subprocess.run([args.slim, "inspect", out], capture_output=True, text=True)
        if inspect.returncode != 0 or "unsupported ops: none" not in inspect.stdout:
            failures.append(f"slim inspect {out}: exit {inspect.returncode}\n{inspect.stdout}{inspect.stderr}")
        probe = os.path.join(work, "probe.onnx")
        with_dequantized_outputs(out, probe)
        x = np.load(os.path.join(models, name + "_held", "x.npy"))[:8]
        # ONNX Runtime running the QDQ ops as written: the same 8-bit values everywhere.
        want = ort_compare.run_ort(node_modules, probe, {"x": x}, work, "disabled")
        scales = step_sizes(probe)
        label = f"slim quantize {name} {' '.join(opts)}"
        for providers in ("cpu,ref", "ref"):
            got = ort_compare.run_slim(args.slim, probe, {"x": x}, work, providers)
            compare(f"{label} [{providers}]", want, got, scales, failures, 0.995, 0.01)
        # With its graph optimizations ONNX Runtime fuses the QDQ patterns into integer
        # kernels (QLinearConv, QLinearSoftmax, ...) that round elsewhere: the model's
        # outputs stay close.
        want = ort_compare.run_ort(node_modules, out, {"x": x}, work)
        got = ort_compare.run_slim(args.slim, out, {"x": x}, work, "cpu,ref")
        compare(f"{label} [ORT's fused kernels]", want, got, {}, failures, 0, 0.1)
    int4_vs_ort(args, node_modules, models, fixtures, failures)
    rng = np.random.default_rng(24)
    for name, build in (("qoperator", qoperator_model), ("dynamic", dynamic_model), ("nncf", nncf_model)):
        work = tempfile.mkdtemp(dir=fixtures)
        path = os.path.join(work, name + ".onnx")
        feeds, scales = build(path, rng)
        want = ort_compare.run_ort(node_modules, path, feeds, work)
        for providers in ("cpu,ref", "ref"):
            got = ort_compare.run_slim(args.slim, path, feeds, work, providers)
            compare(f"{name} [{providers}]", want, got, {k: v for k, v in scales.items() if v}, failures, 0.99, 1e-5)
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print(f"\nevery quantized model agrees with ONNX Runtime {ort_compare.ORT_VERSION}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
