#!/usr/bin/env python3
"""Memory-aware model variants in slim serve: a model whose config lists `variants` (model
files of its version folder, largest first) is switched to a smaller one when memory runs
short and back when it is plentiful, as a hot swap, audited and shown in metrics, metadata
and `slim check`.

Two memory sources drive it: a folder of cgroup v2 files the test writes (--memory-source),
and a real cgroup (tests/serve/cgroup_run.sh) whose limit the test lowers while the server
runs; there a server without switching is OOM-killed when a second model arrives, and one
with switching is not. The real-cgroup test is skipped (and says so) where the machine gives
no cgroup with a memory controller.

The variants are two MLPs x[batch,1024] -> y[batch,256] with the same signature whose outputs
tell them apart on an input of ones: 1024 from the large one, 2048 from the small one. Run by
ctest with SLIM_BINARY_DIR set to the build folder.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_harness import audit_events, clients, request, slim_command, start_server, wait_for  # noqa: E402

MiB = 1 << 20
CGROUP_RUN = os.path.join(HERE, "cgroup_run.sh")
VARIANTS = "model.onnx, model.small.onnx"
LARGE, SMALL = 1024, 2048  # each variant's output on ones


def mlp(hidden, scale):
    """x @ w1 @ w2 with w1 = 1/hidden and w2 = scale: y = 1024 * scale on ones."""
    w1 = np.full((1024, hidden), 1.0 / hidden, np.float32)
    w2 = np.full((hidden, 256), scale, np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 256])],
        initializer=[numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


FIXTURES = tempfile.mkdtemp(prefix="slim_variants_")
for name, hidden, scale in (("model.onnx", 2048, 1.0), ("model.small.onnx", 128, 2.0),  # 10.5 MB, 0.7 MB
                            ("model.huge.onnx", 12288, 1.0)):  # 63 MB: the cgroup test's large variant
    onnx.save(mlp(hidden, scale), os.path.join(FIXTURES, name))


def add_model(repo, name, large="model.onnx", variants=VARIANTS):
    """REPO/NAME with the two variants in version 1, written aside and moved in whole."""
    tmp = os.path.join(repo, ".incoming-" + name)
    os.makedirs(os.path.join(tmp, "1"))
    shutil.copy(os.path.join(FIXTURES, large), os.path.join(tmp, "1", "model.onnx"))
    shutil.copy(os.path.join(FIXTURES, "model.small.onnx"), os.path.join(tmp, "1", "model.small.onnx"))
    with open(os.path.join(tmp, "config.pbtxt"), "w") as f:
        f.write('max_batch_size: 4\nparameters { key: "variants" value: { string_value: "%s" } }\n' % variants)
    os.rename(tmp, os.path.join(repo, name))




def infer(srv, model="mlp"):
    """The serving variant's answer on ones: LARGE or SMALL."""
    status, r = request(srv, "/v2/models/%s/infer" % model,
                        {"inputs": [{"name": "x", "shape": [1, 1024], "datatype": "FP32", "data": [1.0] * 1024}]})
    if status != 200:
        raise RuntimeError("infer failed: %d %s" % (status, r))
    return round(r["outputs"][0]["data"][0])


def variant(srv, model="mlp"):
    status, md = request(srv, "/v2/models/" + model)
    return md.get("slim", {}).get("variant") if status == 200 else None


def metric(srv, line_start):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % srv.metrics_port, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(line_start + " "):
                return float(line.rsplit(" ", 1)[1])
    return None






def write_memory(folder, limit, current):
    for name, value in (("memory.max", limit), ("memory.current", current)):
        with open(os.path.join(folder, name + ".tmp"), "w") as f:
            f.write("%d\n" % value)
        os.replace(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))


SWITCH_FLAGS = ["--memory-interval-secs", "1", "--variant-min-dwell-secs", "1", "--variant-settle-secs", "1"]


class MemoryFiles(unittest.TestCase):
    def setUp(self):
        self.repo = tempfile.mkdtemp(prefix="slim_variants_repo_")
        self.memory = tempfile.mkdtemp(prefix="slim_variants_memory_")
        self.log = os.path.join(self.memory, "audit.log")

    def serve(self, extra=()):
        return start_server(self.repo, ["--memory-source", self.memory, "--audit-log", self.log, "--threads", "2"] +
                            SWITCH_FLAGS + list(extra))

    def test_switches_down_when_memory_runs_short_and_back_without_failing_a_request(self):
        add_model(self.repo, "mlp")
        write_memory(self.memory, 1000 * MiB, 100 * MiB)
        with self.serve() as srv:
            self.assertEqual(variant(srv), "model.onnx")
            self.assertEqual(infer(srv), LARGE)
            with clients(lambda: infer(srv)) as (seen, failures):
                write_memory(self.memory, 1000 * MiB, 950 * MiB)  # 5 % left: below 15 %
                wait_for(lambda: variant(srv) == "model.small.onnx", what="the switch down")
                self.assertEqual(metric(srv, 'slim_model_variant{model="mlp"}'), 1)
                write_memory(self.memory, 1000 * MiB, 100 * MiB)  # plenty again, after the dwell
                wait_for(lambda: variant(srv) == "model.onnx", what="the switch back")
                time.sleep(0.3)
            self.assertEqual(failures, [])
            self.assertEqual(seen, {LARGE, SMALL})
            self.assertEqual(infer(srv), LARGE)
            self.assertEqual(metric(srv, 'slim_model_variant{model="mlp"}'), 0)
            self.assertEqual(metric(srv, 'slim_variant_switches_total{model="mlp",direction="down"}'), 1)
            self.assertEqual(metric(srv, 'slim_variant_switches_total{model="mlp",direction="up"}'), 1)
            self.assertEqual(metric(srv, "slim_memory_limit_bytes"), 1000 * MiB)
            _, md = request(srv, "/v2/models/mlp")
            self.assertEqual(md["slim"]["variants"], ["model.onnx", "model.small.onnx"])
            report = subprocess.run(slim_command("check", srv.url()), capture_output=True, text=True)
            self.assertEqual(report.returncode, 0, report.stderr)
            versions = {m["name"]: m["versions"] for m in json.loads(report.stdout)["models"]}["mlp"]
            self.assertEqual([v["variant"] for v in versions], ["model.onnx"])
            self.assertEqual(srv.stop(), 0)
        events = audit_events(self.log, "mlp")
        self.assertEqual([(e["event"], e["details"].get("variant")) for e in events],
                         [("model.load", "model.onnx"), ("model.variant_switch", "model.small.onnx"),
                          ("model.variant_switch", "model.onnx")])
        down, up = events[1]["details"], events[2]["details"]
        self.assertEqual((down["from"], down["to"]), ("model.onnx", "model.small.onnx"))
        self.assertIn("headroom 5.0% below 15.0%", down["reason"])
        self.assertIn("files " + self.memory + ": limit 1000.0 MiB", down["memory"])
        self.assertEqual((up["from"], up["to"]), ("model.small.onnx", "model.onnx"))
        self.assertIn("headroom 90.0% above 35.0%", up["reason"])
        p = subprocess.run(slim_command("audit", "verify", self.log), capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)

    def test_a_model_loads_with_the_largest_variant_that_fits(self):
        add_model(self.repo, "mlp")
        write_memory(self.memory, 100 * MiB, 80 * MiB)  # 20 MiB: 10 % left after the large one, 19 % after the small
        with self.serve() as srv:
            self.assertEqual(variant(srv), "model.small.onnx")
            self.assertEqual(infer(srv), SMALL)
            self.assertEqual(srv.stop(), 0)

    def test_without_switching_the_first_variant_serves(self):
        add_model(self.repo, "mlp")
        write_memory(self.memory, 100 * MiB, 90 * MiB)
        with start_server(self.repo, ["--memory-interval-secs", "0"]) as srv:
            self.assertEqual(variant(srv), "model.onnx")
            self.assertEqual(infer(srv), LARGE)

    def test_bad_variant_lists_are_refused_with_the_reason(self):
        add_model(self.repo, "missing", variants="model.onnx, model.tiny.onnx")
        add_model(self.repo, "unordered", variants="model.small.onnx, model.onnx")
        add_model(self.repo, "twice", variants="model.onnx,model.onnx")
        add_model(self.repo, "mlp")
        write_memory(self.memory, 1000 * MiB, 100 * MiB)
        with self.serve() as srv:
            reasons = {e["name"]: e.get("reason", "") for e in request(srv, "/v2/repository/index", {})[1]}
            self.assertIn("variant 'model.tiny.onnx' (parameter 'variants') is not in", reasons["missing"])
            self.assertIn("parameter 'variants' lists the largest first, but 'model.onnx'", reasons["unordered"])
            self.assertIn("parameter 'variants' lists 'model.onnx' twice", reasons["twice"])
            self.assertEqual(infer(srv), LARGE)


def read_info(path):
    with open(path) as f:
        return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)


def memory_stat(cg):
    with open(os.path.join(cg["dir"], "memory.stat")) as f:
        return dict(line.split() for line in f)


def anon(cg):
    """The cgroup's anonymous memory (memory.stat: anon under v2, total_rss under v1)."""
    return int(memory_stat(cg)["anon" if cg["version"] == "2" else "total_rss"])


def working_set(cg):
    """What the server counts as used: the cgroup's usage less its inactive file pages."""
    v2 = cg["version"] == "2"
    with open(os.path.join(cg["dir"], "memory.current" if v2 else "memory.usage_in_bytes")) as f:
        usage = int(f.read())
    return usage - int(memory_stat(cg)["inactive_file" if v2 else "total_inactive_file"])


class RealCgroup(unittest.TestCase):
    """The server runs in a cgroup with 1 GiB. It loads `a` with the 63 MB variant; then the
    limit shrinks to 8 % above what the cgroup uses, and a second model `b` (the same
    variants) arrives in the polled repository. With switching the server steps `a` down,
    loads `b` small (its first load scales `b`'s file sizes by what `a`'s variants were
    measured to take) and lives; without it, loading `b` large is past the limit: OOM kill."""

    def run_server(self, switching):
        repo = tempfile.mkdtemp(prefix="slim_variants_cgroup_")
        add_model(repo, "a", large="model.huge.onnx")
        info = os.path.join(repo, "..", os.path.basename(repo) + ".info")
        flags = ["--model-control-mode", "poll", "--repository-poll-secs", "1", "--threads", "1"]
        flags += SWITCH_FLAGS if switching else ["--memory-interval-secs", "0"]
        try:
            srv = start_server(repo, flags, prefix=["bash", CGROUP_RUN, "--info", info, str(1 << 30)])
        except RuntimeError as e:
            if "cgroups not available here" in str(e):
                self.skipTest(str(e).splitlines()[-1])
            raise
        with srv:
            cg = read_info(info)
            self.assertEqual(variant(srv, "a"), "model.onnx")
            time.sleep(0.5)  # the server's threads have settled
            anon_before = anon(cg)
            self.assertGreater(anon_before, 60 * MiB)
            with open(cg["limit_file"], "w") as f:  # 7.4 % headroom: a switch down, room for the small one
                f.write(str(int(working_set(cg) * 1.08)))
            if switching:
                wait_for(lambda: srv.proc.poll() is not None or variant(srv, "a") == "model.small.onnx", what="a to step down")
                self.assertIsNone(srv.proc.poll(), "\n".join(srv.stderr_lines))
                wait_for(lambda: anon(cg) < anon_before - 40 * MiB, what="a's large variant to be freed")
            add_model(repo, "b", large="model.huge.onnx")
            if switching:
                wait_for(lambda: request(srv, "/v2/models/b/ready")[0] == 200, what="b to load")
                self.assertEqual(variant(srv, "b"), "model.small.onnx")
                self.assertEqual((infer(srv, "a"), infer(srv, "b")), (SMALL, SMALL), "\n".join(srv.stderr_lines))
                self.assertEqual(srv.stop(), 0)
            else:
                srv.proc.wait(60)
                self.assertEqual(srv.stop(), 137, "\n".join(srv.stderr_lines))
        return read_info(info)

    def test_switching_keeps_the_server_alive_where_without_it_the_kernel_kills_it(self):
        self.assertEqual(self.run_server(switching=True)["oom_kill"], "0")
        self.assertEqual(self.run_server(switching=False)["oom_kill"], "1")


if __name__ == "__main__":
    unittest.main()
