#!/usr/bin/env python3
"""The server core seen from outside: a model whose config contradicts it fails alone,
request validation, version policy, explicit model control, the dynamic batcher and
priority queues (observed through the metrics endpoint), a full queue answered 429 at
once, SIGTERM draining requests in flight, and `promtool check metrics` on the output.

A "slow" model (a chain of identity MatMuls, about 0.1-1 s per request) keeps the
executor busy so that the tests can queue requests behind it; each step waits for the
queue state it needs by polling the metrics, not for a time. Run by ctest with
SLIM_BINARY_DIR set to the build folder (and SLIM_TEST_RUNNER to the emulator in a cross
build: there slim runs some 100x slower than these clients, so the chain is shorter).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_repository  # noqa: E402
from serve_harness import start_server  # noqa: E402
from test_rest import curl, post_json  # noqa: E402

SLOW_CONFIG = """name: "slow"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "x", data_type: TYPE_FP32, dims: [ -1, 256 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ -1, 256 ] } ]
dynamic_batching {
  priority_levels: 2
  default_priority_level: 2
  priority_queue_policy { key: 2 value { max_queue_size: 2 } }
}
"""

# The digits model again, with a config that contradicts it (65 pixels, not 64).
BROKEN_CONFIG = make_repository.DIGITS_CONFIG.replace('name: "digits"', 'name: "broken"').replace(
    "dims: [ 64 ]", "dims: [ 65 ]")


def slow_model(chain=25 if os.environ.get("SLIM_TEST_RUNNER") else 400):
    eye = numpy_helper.from_array(np.eye(256, dtype=np.float32), "eye")
    nodes, prev = [], "x"
    for i in range(chain):
        out = "y" if i == chain - 1 else "h%d" % i
        nodes.append(helper.make_node("MatMul", [prev, "eye"], [out], name="mm%d" % i))
        prev = out
    graph = helper.make_graph(
        nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "rows", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "rows", 256])], initializer=[eye])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def metric(text, name, **labels):
    """The value of one series, or 0.0 when it is absent."""
    for line in text.splitlines():
        m = re.match(r"^(\w+)(\{[^}]*\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == str(v) for k, v in labels.items()):
            return float(m.group(3))
    return 0.0


def make_repo(tmp):
    """The fixture repository plus the slow model; returns its path."""
    repo = os.path.join(tmp, "repo")
    subprocess.run(["/usr/bin/python3", os.path.join(HERE, "make_repository.py"), repo], check=True)
    make_repository.write(os.path.join(repo, "slow", "config.pbtxt"), SLOW_CONFIG)
    make_repository.save(slow_model(), os.path.join(repo, "slow", "1", "model.onnx"))
    return repo


class ServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="slim_serve_core_")
        cls.repo = make_repo(cls.tmp)
        make_repository.write(os.path.join(cls.repo, "broken", "config.pbtxt"), BROKEN_CONFIG)
        os.makedirs(os.path.join(cls.repo, "broken", "1"))
        shutil.copy(os.path.join(cls.repo, "digits", "1", "model.onnx"), os.path.join(cls.repo, "broken", "1"))
        cls.srv = start_server(cls.repo, ["--threads", "2"])

    @classmethod
    def tearDownClass(cls):
        rc = cls.srv.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        assert rc == 0, "slim serve exited %d after SIGTERM" % rc

    def infer(self, model, inputs, version=None, params=None, outputs=None):
        body = {"inputs": [{"name": n, "shape": list(a.shape), "datatype": d, "data": a.ravel().tolist()}
                           for n, d, a in inputs]}
        if params:
            body["parameters"] = params
        if outputs:
            body["outputs"] = [{"name": o} for o in outputs]
        path = "/v2/models/%s%s/infer" % (model, "/versions/%s" % version if version else "")
        return post_json(self.srv.url(path), body)

    def metrics(self):
        r = curl("http://127.0.0.1:%d/metrics" % self.srv.metrics_port)
        self.assertEqual(r.status, 200)
        return r.body.decode()

    def wait_metric(self, name, value, timeout=60, above=False, **labels):
        """Until the series equals VALUE (exceeds it with ABOVE)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = metric(self.metrics(), name, **labels)
            if got > value if above else got == value:
                return
            time.sleep(0.005)
        self.fail("%s%s never %s %s" % (name, labels, "exceeded" if above else "reached", value))

    def test_a_broken_model_fails_alone(self):
        index = post_json(self.srv.url("/v2/repository/index"), {}).json()
        states = {e["name"]: e for e in index}
        self.assertEqual(states["broken"]["state"], "UNAVAILABLE")
        self.assertIn("config dims [65] contradict the model's [64]", states["broken"]["reason"])
        for name in ("digits", "cnn", "forest", "plain", "slow"):
            self.assertEqual(states[name]["state"], "READY", name)
        self.assertEqual(curl(self.srv.url("/v2/models/digits/ready")).status, 200)
        # Triton's strict readiness: a model that should serve and does not makes the server not ready.
        self.assertEqual(curl(self.srv.url("/v2/health/ready")).status, 503)
        r = self.infer("broken", [("pixels", "FP32", np.zeros((1, 65), np.float32))])
        self.assertEqual(r.status, 503)
        self.assertIn("model 'broken' is not ready", r.error())

    def test_requests_are_checked_against_the_config(self):
        x = np.zeros((2, 64), np.float32)
        cases = [
            ([("pixels", "FP64", x.astype(np.float64))], {}, "input 'pixels' is FP64, model 'digits' expects FP32"),
            ([("pixels", "FP32", np.zeros((2, 63), np.float32))], {},
             "input 'pixels' has shape [2,63], model 'digits' expects [-1,64]"),
            ([("pixels", "FP32", np.zeros((33, 64), np.float32))], {},
             "input 'pixels' has batch size 33, model 'digits' takes 1 to 32"),
            ([("pixels", "FP32", x), ("extra", "FP32", x)], {},
             "model 'digits' has no input 'extra' (its inputs: pixels)"),
            ([], {}, "model 'digits' needs input 'pixels'"),
            ([("pixels", "FP32", x)], {"priority": 4}, "priority 4 is outside 1..3 of model 'digits'"),
        ]
        for inputs, params, message in cases:
            r = self.infer("digits", inputs, params=params)
            self.assertEqual(r.status, 400, message)
            self.assertIn(message, r.error())
        r = self.infer("digits", [("pixels", "FP32", x)], outputs=["nope"])
        self.assertEqual(r.status, 400)
        self.assertIn("model 'digits' has no output 'nope' (its outputs: probabilities)", r.error())
        r = self.infer("nomodel", [("pixels", "FP32", x)])
        self.assertEqual(r.status, 404)
        self.assertIn("unknown model 'nomodel'", r.error())

    def test_version_policy_serves_every_version(self):
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        for version, offset in (("1", 1), ("2", 2), (None, 2)):
            r = self.infer("plain", [("x", "FP32", x)], version=version)
            self.assertEqual(r.status, 200, r.body)
            out = r.json()["outputs"][0]
            self.assertEqual(r.json()["model_version"], version or "2")
            np.testing.assert_array_equal(np.array(out["data"], np.float32).reshape(out["shape"]), x + offset)
        r = self.infer("plain", [("x", "FP32", x)], version="3")
        self.assertEqual(r.status, 404)
        self.assertIn("model 'plain' has no version '3' (serving: 2, 1)", r.error())

    def test_batching_priorities_and_a_full_queue(self):
        before = self.metrics()
        execs0 = metric(before, "slim_inference_exec_count_total", model="slow", version="1")
        queued0 = metric(before, "slim_inference_queue_duration_seconds_total", model="slow", version="1")
        results = {}

        def send(tag, rows, priority=None):
            x = np.full((1, rows, 256), float(len(tag)), np.float32)
            params = {"priority": priority} if priority else None
            results[tag] = (self.infer("slow", [("x", "FP32", x)], params=params), time.monotonic())

        threads = []

        def start(tag, rows, priority=None):
            t = threading.Thread(target=send, args=(tag, rows, priority))
            t.start()
            threads.append(t)

        start("a", 512)  # the blocker: runs while the others queue
        # An executor took it: its queue time is counted as its batch starts.
        self.wait_metric("slim_inference_queue_duration_seconds_total", queued0, above=True, model="slow",
                         version="1")
        start("bb", 128)
        start("ccc", 128)
        self.wait_metric("slim_inference_pending_requests", 2, model="slow", version="1", priority="2")
        # The third low-priority request finds its level's queue full: refused at once.
        r = self.infer("slow", [("x", "FP32", np.zeros((1, 32, 256), np.float32))])
        self.assertEqual(r.status, 429)
        self.assertIn("the queue of model 'slow' at priority level 2 is full (2 requests)", r.error())
        start("dddd", 8, priority=1)  # more urgent, another shape: its own batch, first
        self.wait_metric("slim_inference_pending_requests", 1, model="slow", version="1", priority="1")
        for t in threads:
            t.join()
        for tag in ("a", "bb", "ccc", "dddd"):
            self.assertEqual(results[tag][0].status, 200, results[tag][0].body)
            out = results[tag][0].json()["outputs"][0]
            self.assertEqual(out["data"][0], float(len(tag)))
        self.assertLess(results["dddd"][1], results["bb"][1])
        self.assertLess(results["dddd"][1], results["ccc"][1])
        after = self.metrics()
        # a, then dddd alone, then bb and ccc together (same sample shape): three executions.
        self.assertEqual(metric(after, "slim_inference_exec_count_total", model="slow", version="1") - execs0, 3)
        self.assertGreaterEqual(metric(after, "slim_inference_request_failure_total", model="slow", version="1",
                                       reason="rejected"), 1)
        self.assertGreaterEqual(metric(after, "slim_inference_batch_size_bucket", model="slow", version="1",
                                       le="2"), 1)

    def test_metrics_pass_promtool(self):
        self.assertEqual(self.infer("digits", [("pixels", "FP32", np.ones((3, 64), np.float32))]).status, 200)
        text = self.metrics()
        promtool = os.environ.get("SLIM_PROMTOOL", "promtool")
        p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertGreaterEqual(metric(text, "slim_inference_count_total", model="digits", version="1"), 3)
        self.assertGreater(metric(text, "process_resident_memory_bytes"), 1e6)
        self.assertGreater(metric(text, "slim_model_memory_bytes", model="digits", version="1"), 0)


class ControlAndShutdownTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="slim_serve_ctl_")
        self.repo = make_repo(self.tmp)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_explicit_model_control(self):
        with start_server(self.repo, ["--model-control-mode", "explicit", "--load-model", "digits"]) as srv:
            states = {e["name"]: e["state"] for e in post_json(srv.url("/v2/repository/index"), {}).json()}
            self.assertEqual(states, {"cnn": "UNAVAILABLE", "digits": "READY", "forest": "UNAVAILABLE",
                                      "plain": "UNAVAILABLE", "slow": "UNAVAILABLE"})
            self.assertEqual(curl(srv.url("/v2/health/ready")).status, 200)
            self.assertEqual(post_json(srv.url("/v2/repository/models/forest/load"), {}).status, 200)
            self.assertEqual(curl(srv.url("/v2/models/forest/ready")).status, 200)
            self.assertEqual(post_json(srv.url("/v2/repository/models/digits/unload"), {}).status, 200)
            r = post_json(srv.url("/v2/models/digits/infer"),
                          {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [0] * 64}]})
            self.assertEqual(r.status, 503)
            self.assertIn("model 'digits' is not ready: unloaded", r.error())
            r = post_json(srv.url("/v2/repository/models/nothere/load"), {})
            self.assertEqual(r.status, 404)
            self.assertIn("no model 'nothere' in repository", r.error())

    def test_sigterm_drains_requests_in_flight(self):
        srv = start_server(self.repo, ["--threads", "2"])
        results = []

        def send():
            x = np.full((1, 256, 256), 3.0, np.float32)
            body = {"inputs": [{"name": "x", "shape": [1, 256, 256], "datatype": "FP32", "data": x.ravel().tolist()}]}
            results.append(post_json(srv.url("/v2/models/slow/infer"), body))

        threads = [threading.Thread(target=send) for _ in range(2)]  # the level's queue holds 2
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until a request waits in the queue
            text = curl("http://127.0.0.1:%d/metrics" % srv.metrics_port).body.decode()
            if metric(text, "slim_inference_pending_requests", model="slow", version="1", priority="2") >= 1:
                break
            time.sleep(0.005)
        rc = srv.stop()
        for t in threads:
            t.join()
        self.assertEqual(rc, 0, "\n".join(srv.stderr_lines))
        self.assertEqual([r.status for r in results], [200, 200])
        self.assertTrue(any("SIGTERM: draining" in line for line in srv.stderr_lines), srv.stderr_lines)


if __name__ == "__main__":
    unittest.main()
