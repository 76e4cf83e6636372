#!/usr/bin/env python3
"""`slim serve --energy` end to end: the energy and carbon counters per model, version and
priority grow with requests and price their joules exactly; two models served at once each
keep their own share of the energy (oneDNN's OpenMP threads included); the exposition passes
`promtool check metrics`; a request's energy is in its response only when it asks (KServe v2
parameter `energy` over REST and gRPC, `slim_energy` in an OpenAI request: usage.energy with
prefill and decode apart), and asking a server without --energy is a 400 naming the flag."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest

import numpy as np
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_repository  # noqa: E402
import test_grpc  # noqa: E402
from serve_harness import request, start_server  # noqa: E402
from test_server import metric  # noqa: E402

FRA = 44.18  # g/kWh, the bundled table's France (Ember via CO2.js 0.19.0)


def chain_model(length):
    """y = x @ I @ I ... (`length` MatMuls of 256 x 256, run by oneDNN on OpenMP threads)."""
    eye = numpy_helper.from_array(np.eye(256, dtype=np.float32), "eye")
    nodes, prev = [], "x"
    for i in range(length):
        out = "y" if i == length - 1 else "h%d" % i
        nodes.append(helper.make_node("MatMul", [prev, "eye"], [out], name="mm%d" % i))
        prev = out
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 256])], initializer=[eye])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


CHAIN_CONFIG = """name: "%s"
max_batch_size: 64
input [ { name: "x" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 256 ] } ]
"""


def setUpModule():
    test_grpc.setUpModule()  # the gRPC stubs


def tearDownModule():
    test_grpc.tearDownModule()


def make_repo(tmp):
    repo = os.path.join(tmp, "repo")
    subprocess.run(["/usr/bin/python3", os.path.join(HERE, "make_repository.py"), repo], check=True)
    for name, length in (("heavy", 100), ("light", 10)):
        make_repository.write(os.path.join(repo, name, "config.pbtxt"), CHAIN_CONFIG % name)
        make_repository.save(chain_model(length), os.path.join(repo, name, "1", "model.onnx"))
    return repo


def infer(srv, model, rows, **params):
    body = {"inputs": [{"name": "x", "shape": [rows, 256], "datatype": "FP32", "data": [0.5] * (rows * 256)}]}
    if model == "digits":
        body = {"inputs": [{"name": "pixels", "shape": [rows, 64], "datatype": "FP32", "data": [1.0] * (rows * 64)}]}
    if params:
        body["parameters"] = params
    return request(srv, "/v2/models/%s/infer" % model, body)


class EnergyMetricsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="slim_serve_energy_")
        cls.repo = make_repo(cls.tmp)
        subprocess.run(["/usr/bin/python3", os.path.join(HERE, "make_llm.py"), cls.tmp], check=True)
        cls.srv = start_server(cls.repo, ["--threads", "2", "--energy", "--region", "FRA", "--pue", "1.5",
                                          "--model", os.path.join(cls.tmp, "chat.gguf")])

    @classmethod
    def tearDownClass(cls):
        rc = cls.srv.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        assert rc == 0, "slim serve exited %d after SIGTERM" % rc

    def metrics(self):
        status, _ = request(self.srv, "/v2/health/live")
        self.assertEqual(status, 200)
        import urllib.request
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.srv.metrics_port) as r:
            return r.read().decode()

    def energy(self, text, model, **labels):
        """(joules, grams, requests) of one model's series, summed over the others' labels."""
        out = [0.0, 0.0, 0.0]
        for line in text.splitlines():
            for k, name in enumerate(("slim_energy_joules_total", "slim_carbon_grams_total",
                                      "slim_energy_requests_total")):
                if line.startswith(name + "{") and ('model="%s"' % model) in line and all(
                        '%s="%s"' % kv in line for kv in labels.items()):
                    out[k] += float(line.rsplit(" ", 1)[1])
        return out

    def test_counters_grow_with_requests_and_price_their_joules(self):
        before = self.metrics()
        for _ in range(10):
            self.assertEqual(infer(self.srv, "digits", 3, priority=1)[0], 200)
        for _ in range(4):
            self.assertEqual(infer(self.srv, "digits", 1, priority=3)[0], 200)
        after = self.metrics()
        source = "estimated" if 'source="estimated"' in after else None
        for level, n in ((1, 10), (3, 4)):
            j0, g0, r0 = self.energy(before, "digits", priority=str(level))
            j1, g1, r1 = self.energy(after, "digits", priority=str(level))
            self.assertEqual(r1 - r0, n)
            self.assertGreater(j1 - j0, 0)
            # gCO2e = kWh x g/kWh x PUE, series by series.
            self.assertAlmostEqual(g1 / (j1 / 3.6e6 * FRA * 1.5), 1, places=9)
        self.assertEqual(metric(after, "slim_carbon_intensity_grams_per_kwh", region="FRA"), FRA)
        self.assertEqual(metric(after, "slim_carbon_pue"), 1.5)
        if source:  # this machine's meter is the estimate: its idle power is the model's
            self.assertGreater(metric(after, "slim_energy_idle_joules_total", source=source), 0)
        self.assertGreater(metric(after, "slim_energy_process_joules_total"), 0)
        # Requests of another level did not move level 2.
        self.assertEqual(self.energy(after, "digits", priority="2")[2], self.energy(before, "digits", priority="2")[2])

    def test_metrics_pass_promtool(self):
        self.assertEqual(infer(self.srv, "digits", 2)[0], 200)
        text = self.metrics()
        promtool = os.environ.get("SLIM_PROMTOOL", "promtool")
        p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn('slim_carbon_grams_total{model="digits",version="1",priority="2",source="', text)

    def per_request(self, models, seconds_or_count, clients=2):
        """Per-request joules of each model while `clients` threads per model send requests
        of 16 rows: (joules per request by model, joules of the process above idle)."""
        before = self.metrics()
        stop = threading.Event()
        errors = []

        def loop(model):
            sent = 0
            while not stop.is_set() and sent < seconds_or_count:
                status, body = infer(self.srv, model, 16)
                if status != 200:
                    errors.append(body)
                sent += 1

        threads = [threading.Thread(target=loop, args=(m,)) for m in models for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        after = self.metrics()
        self.assertEqual(errors, [])
        out = {}
        for m in models:
            j0, _, r0 = self.energy(before, m)
            j1, _, r1 = self.energy(after, m)
            out[m] = ((j1 - j0) / (r1 - r0), j1 - j0)
        process = (metric(after, "slim_energy_process_joules_total") -
                   metric(before, "slim_energy_process_joules_total"))
        return out, process

    def test_two_models_at_once_keep_their_own_shares(self):
        alone = {}
        # Alone with as many clients as together: two clients' requests may share a batch,
        # which halves what each costs, so a one-client baseline would overstate it.
        for m in ("heavy", "light"):
            alone[m] = self.per_request([m], 30)[0][m][0]
        self.assertGreater(alone["heavy"], 3 * alone["light"])
        both, process = self.per_request(["heavy", "light"], 30)
        for m in ("heavy", "light"):
            # Near what it costs alone (the machine is shared and contention moves CPU time):
            # an even split of the time they overlap would charge the light model about five
            # times its own cost.
            self.assertLess(both[m][0], 2.5 * alone[m], (m, both, alone))
            self.assertGreater(both[m][0], 0.4 * alone[m], (m, both, alone))
        # What the two models were charged is most of the process's work (HTTP and JSON
        # threads and the gaps between batches are the rest): the OpenMP threads' CPU time is
        # in it (charging only what the CpuTimeScopes see gives about 0.4 here).
        charged = both["heavy"][1] + both["light"][1]
        self.assertLessEqual(charged, 1.05 * process, (both, process))
        self.assertGreater(charged, 0.5 * process, (both, process))

    def grams_of(self, joules):
        return joules / 3.6e6 * FRA * 1.5

    def test_rest_responses_carry_energy_only_when_asked(self):
        before = self.metrics()
        got = []
        for rows in (1, 4, 9):
            status, body = infer(self.srv, "digits", rows, priority=1, energy=True)
            self.assertEqual(status, 200, body)
            p = body["parameters"]
            self.assertEqual(sorted(p), ["carbon_grams", "energy_joules", "energy_source", "region"])
            self.assertGreater(p["energy_joules"], 0)
            self.assertAlmostEqual(p["carbon_grams"] / self.grams_of(p["energy_joules"]), 1, places=9)
            self.assertEqual(p["region"], "FRA")
            self.assertTrue(p["energy_source"] == "estimated" or p["energy_source"].startswith("measured:"))
            got.append(p["energy_joules"])
        # One request at a time: each batch held one request, and the counter grew by exactly
        # what the responses said.
        j0, _, _ = self.energy(before, "digits", priority="1")
        j1, _, _ = self.energy(self.metrics(), "digits", priority="1")
        self.assertAlmostEqual((j1 - j0) / sum(got), 1, places=9)
        for params in ({}, {"energy": False}):
            status, body = infer(self.srv, "digits", 2, **params)
            self.assertEqual(status, 200)
            self.assertNotIn("parameters", body)
        status, body = infer(self.srv, "digits", 2, energy="yes")
        self.assertEqual((status, body["error"]), (400, "request parameter 'energy' must be true or false"))

    def test_grpc_responses_carry_energy_only_when_asked(self):
        import grpc
        pb = test_grpc.pb
        with grpc.insecure_channel("127.0.0.1:%d" % self.srv.grpc_port) as ch:
            stub = test_grpc.pb_grpc.GRPCInferenceServiceStub(ch)

            def call(**params):
                req = pb.ModelInferRequest(model_name="digits")
                x = req.inputs.add(name="pixels", datatype="FP32", shape=[2, 64])
                x.contents.fp32_contents.extend([1.0] * 128)
                for k, v in params.items():
                    req.parameters[k].CopyFrom(pb.InferParameter(**v))
                return stub.ModelInfer(req, timeout=30)

            r = call(energy={"bool_param": True})
            p = r.parameters
            self.assertEqual(sorted(p), ["carbon_grams", "energy_joules", "energy_source", "region"])
            self.assertGreater(p["energy_joules"].double_param, 0)
            self.assertAlmostEqual(p["carbon_grams"].double_param / self.grams_of(p["energy_joules"].double_param),
                                   1, places=9)
            self.assertEqual(p["region"].string_param, "FRA")
            self.assertEqual(len(call().parameters), 0)
            with self.assertRaises(grpc.RpcError) as e:
                call(energy={"int64_param": 1})
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertEqual(e.exception.details(), "parameter 'energy' must be a bool_param")

    def completion(self, **extra):
        body = {"model": "chat", "prompt": "The server said hello to the client", "max_tokens": 6,
                "temperature": 0}
        body.update(extra)
        return request(self.srv, "/v1/completions", body)

    def test_openai_usage_carries_energy_only_when_asked(self):
        before = self.metrics()
        total = 0
        for _ in range(3):
            status, r = self.completion(slim_energy=True)
            self.assertEqual(status, 200, r)
            e = r["usage"]["energy"]
            self.assertEqual(list(e), ["joules", "prefill_joules", "decode_joules", "source", "carbon_grams",
                                       "region"])
            self.assertGreater(e["prefill_joules"], 0)
            self.assertGreater(e["decode_joules"], 0)
            self.assertAlmostEqual(e["joules"], e["prefill_joules"] + e["decode_joules"], places=15)
            self.assertAlmostEqual(e["carbon_grams"] / self.grams_of(e["joules"]), 1, places=9)
            self.assertEqual(e["region"], "FRA")
            total += e["joules"]
        # Requests one at a time: every step's energy went to the one sequence in it.
        after = self.metrics()
        j0, _, r0 = self.energy(before, "chat", version="1", priority="0")
        j1, _, r1 = self.energy(after, "chat", version="1", priority="0")
        self.assertEqual(r1 - r0, 3)
        self.assertAlmostEqual((j1 - j0) / total, 1, places=9)
        status, r = self.completion()
        self.assertEqual(status, 200)
        self.assertNotIn("energy", r["usage"])
        # Streamed: the usage chunk carries it.
        import urllib.request
        body = {"model": "chat", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, "slim_energy": True}
        req = urllib.request.Request(self.srv.url("/v1/completions"), data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            chunks = [json.loads(line[6:]) for line in resp.read().decode().splitlines()
                      if line.startswith("data: {")]
        self.assertGreater(chunks[-1]["usage"]["energy"]["joules"], 0)
        status, r = self.completion(slim_energy=1)
        self.assertEqual((status, r["error"]["message"]), (400, "'slim_energy' must be true or false"))


class WithoutEnergyTest(unittest.TestCase):
    def test_asking_a_server_without_energy_names_the_flag(self):
        with tempfile.TemporaryDirectory() as tmp:
            repo = os.path.join(tmp, "repo")
            subprocess.run(["/usr/bin/python3", os.path.join(HERE, "make_repository.py"), repo], check=True)
            subprocess.run(["/usr/bin/python3", os.path.join(HERE, "make_llm.py"), tmp], check=True)
            with start_server(repo, ["--threads", "1", "--model", os.path.join(tmp, "chat.gguf")]) as srv:
                status, body = infer(srv, "digits", 1, energy=True)
                self.assertEqual((status, body["error"]),
                                 (400, "request parameter 'energy': this server does not meter energy (start slim "
                                       "serve with --energy)"))
                status, body = request(srv, "/v1/completions", {"model": "chat", "prompt": "hi", "max_tokens": 2,
                                                                "slim_energy": True})
                self.assertEqual((status, body["error"]["message"]),
                                 (400, "'slim_energy': this server does not meter energy (start slim serve with "
                                       "--energy)"))
                import urllib.request
                with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % srv.metrics_port) as r:
                    self.assertNotIn("slim_energy", r.read().decode())


if __name__ == "__main__":
    unittest.main()
