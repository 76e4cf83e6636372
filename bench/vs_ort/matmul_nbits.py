#!/usr/bin/python3
"""MatMulNBits (com.microsoft, 4-bit blockwise weights) in slim and ONNX Runtime at LLM
sizes: one single-node model per (K = N, M, accuracy_level), weights as initializers, A
as the input. Both engines run the same input files, alternating round by round as in
run.py (whose helpers this reuses); prints medians, the slim/ORT ratio and how far the
outputs are apart. accuracy_level 0 keeps A in float (both engines dequantize the
weights on the fly); 4 quantizes A to int8 per block (integer dot products), which is
what ONNX Runtime GenAI's CPU int4 models ask for.

Usage (after bench/vs_ort/run.sh installed onnxruntime-node):
  bench/vs_ort/matmul_nbits.py --slim build/tools/slim [--sizes 2048,4096] [--rows 1,32]
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run  # noqa: E402  (run.py: run_slim, run_ort, compare_outputs)


def write_model(path, k, n, m, block, accuracy):
    rng = np.random.default_rng(k + n + accuracy)
    k_blocks = (k + block - 1) // block
    b = rng.integers(0, 256, (n, k_blocks, block // 2), dtype=np.uint8)
    scales = (rng.random(n * k_blocks) * 0.02 + 0.001).astype(np.float32)
    zp = rng.integers(0, 256, (n, (k_blocks + 1) // 2), dtype=np.uint8)
    node = helper.make_node("MatMulNBits", ["A", "B", "scales", "zero_points"], ["Y"], domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=block, accuracy_level=accuracy)
    graph = helper.make_graph(
        [node], "matmul_nbits", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(b, "B"), numpy_helper.from_array(scales, "scales"),
         numpy_helper.from_array(zp, "zero_points")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    onnx.save_model(model, path)


def write_input(base, k, m):
    x = np.random.default_rng(m * 7 + k).standard_normal((m, k), dtype=np.float32)
    np.save(base + ".npy", x)
    x.tofile(base + ".bin")
    with open(base + ".json", "w") as f:
        f.write('{"inputs": [{"name": "A", "file": "%s.bin", "shape": [%d, %d], "dtype": "float32"}]}'
                % (base, m, k))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slim", required=True, help="path of the slim binary")
    ap.add_argument("--work", default=os.path.join(HERE, "..", ".work", "matmul_nbits"))
    ap.add_argument("--sizes", default="2048,4096", help="K = N values")
    ap.add_argument("--rows", default="1,32", help="M values (rows of A)")
    ap.add_argument("--accuracy", default="0,4", help="accuracy_level values")
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--isa", default=os.environ.get("SLIM_ISA", ""))
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    load = os.getloadavg()
    print(f"# MatMulNBits: slim vs ONNX Runtime  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  "
          f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; 4-bit, block "
          f"{args.block}, packed zero points; {args.rounds} alternating rounds x {args.iters} runs")
    header = "| K = N | M | accuracy_level | threads | slim p50 ms | ORT p50 ms | slim/ORT | max rel diff |"
    print(header)
    print("|" + "---|" * 8)
    ort_res = slim_res = None
    for size in [int(s) for s in args.sizes.split(",")]:
        for m in [int(r) for r in args.rows.split(",")]:
            base = os.path.join(args.work, f"a_{size}_{m}")
            write_input(base, size, m)
            for acc in [int(a) for a in args.accuracy.split(",")]:
                model = os.path.join(args.work, f"nbits_{size}_{m}_{acc}.onnx")
                write_model(model, size, size, m, args.block, acc)
                for threads in [int(t) for t in args.threads.split(",")]:
                    out = os.path.join(args.work, "out", f"{size}_{m}_{acc}_{threads}")
                    slim_runs, ort_runs = [], []
                    for r in range(args.rounds):
                        for engine in (["slim", "ort"] if r % 2 == 0 else ["ort", "slim"]):
                            if engine == "slim":
                                slim_res = run.run_slim(args, model, ["-i", f"A={base}.npy"], m, threads,
                                                        args.iters, os.path.join(out, "slim"))
                                slim_runs += slim_res["runs_ms"]
                            else:
                                ort_res = run.run_ort(args, model, base + ".json", threads, args.iters,
                                                      os.path.join(out, "ort"))
                                ort_runs += ort_res["runs_ms"]
                    s50, o50 = statistics.median(slim_runs), statistics.median(ort_runs)
                    _, rel = run.compare_outputs(os.path.join(out, "slim"), ort_res)
                    print(f"| {size} | {m} | {acc} | {threads} | {s50:.3f} | {o50:.3f} | {s50 / o50:.2f} | "
                          f"{rel:.1e} |", flush=True)
    print(f"\nONNX Runtime {ort_res['version'] if ort_res else '?'} (onnxruntime-node); slim's kernels at "
          f"{slim_res['kernels'] if slim_res else '?'} (ONNX Runtime's MLAS picks its own by cpuid)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
