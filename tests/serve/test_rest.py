#!/usr/bin/env python3
"""The KServe v2 REST front door end to end: `slim serve` on free loopback ports, called
with curl (a real HTTP client, in a subprocess).

Outputs are checked against references computed outside slim: the digits MLP from its
ONNX weights in numpy (Debian's onnx 1.12 has no onnx.reference), the forest with
XGBoost's own predict. Run by ctest with SLIM_BINARY_DIR set to the build folder.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import onnx
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_harness import slim_command, start_server  # noqa: E402


class Reply:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # lower-case names
        self.body = body

    def json(self):
        return json.loads(self.body)

    def error(self):
        return self.json()["error"]


def curl(url, body=None, headers=(), method=None):
    """One request with curl; the body is bytes, sent as is."""
    with tempfile.TemporaryDirectory() as tmp:
        out, head = os.path.join(tmp, "out"), os.path.join(tmp, "head")
        args = ["curl", "-sS", "--max-time", "120", "-o", out, "-D", head, "-w", "%{http_code}"]
        if body is not None:
            with open(os.path.join(tmp, "body"), "wb") as f:
                f.write(body)
            args += ["--data-binary", "@" + os.path.join(tmp, "body")]
        if method:
            args += ["-X", method]
        for h in headers:
            args += ["-H", h]
        p = subprocess.run(args + [url], capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError("curl %s failed: %s" % (url, p.stderr))
        with open(head, "rb") as f:
            blocks = [b for b in f.read().decode("latin-1").split("\r\n\r\n") if b.strip()]
        headers_out = {}
        for line in blocks[-1].split("\r\n")[1:]:  # the last block: after "100 Continue"
            name, _, value = line.partition(":")
            headers_out[name.strip().lower()] = value.strip()
        body_out = b""
        if os.path.exists(out):
            with open(out, "rb") as f:
                body_out = f.read()
        return Reply(int(p.stdout), headers_out, body_out)


def post_json(url, obj, headers=()):
    return curl(url, json.dumps(obj).encode(), headers)


def digits_reference(model_path, x):
    """The digits MLP (Gemm, Relu, Gemm, Softmax) from the model's own weights."""
    model = onnx.load(model_path)
    assert [n.op_type for n in model.graph.node] == ["Gemm", "Relu", "Gemm", "Softmax"]
    w = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    h = np.maximum(x.astype(np.float64) @ w["w0"] + w["b0"], 0) @ w["w1"] + w["b1"]
    e = np.exp(h - h.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def infer_body(name, datatype, shape, data, **extra):
    body = {"inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": data}]}
    body.update(extra)
    return body


class RestServer(unittest.TestCase):
    """Every model loaded (model control mode none)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.repo = os.path.join(cls.tmp.name, "repo")
        subprocess.run([sys.executable, os.path.join(HERE, "make_repository.py"), cls.repo], check=True)
        cls.srv = start_server(cls.repo, ["--threads", "2"])
        cls.base = "http://127.0.0.1:%d" % cls.srv.http_port

    @classmethod
    def tearDownClass(cls):
        code = cls.srv.stop()
        cls.tmp.cleanup()
        assert code == 0, "slim serve exited with %d after SIGTERM" % code

    def url(self, path):
        return self.base + path

    def infer(self, model, body, headers=()):
        return post_json(self.url("/v2/models/%s/infer" % model), body, headers)

    def assert_error(self, reply, status, message):
        self.assertEqual(reply.status, status, reply.body)
        self.assertEqual(reply.headers["content-type"], "application/json")
        self.assertEqual(reply.error(), message)

    # Health and metadata.

    def test_health(self):
        for path in ("/v2/health/live", "/v2/health/ready"):
            r = curl(self.url(path))
            self.assertEqual((r.status, r.body), (200, b""), path)

    def test_server_metadata(self):
        version = subprocess.run(slim_command("--version"), capture_output=True, text=True,
                                 check=True).stdout.split()[1]
        meta = curl(self.url("/v2")).json()
        self.assertEqual(meta["name"], "slim")
        self.assertEqual(meta["version"], version)
        self.assertIn("binary_tensor_data", meta["extensions"])
        self.assertIn("model_repository", meta["extensions"])

    def test_model_metadata(self):
        expected = {"name": "digits", "versions": ["1"], "platform": "onnxruntime_onnx",
                    "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}],
                    "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]}]}
        for path in ("/v2/models/digits", "/v2/models/digits/versions/1"):
            r = curl(self.url(path))
            self.assertEqual(r.status, 200)
            self.assertEqual(r.headers["content-type"], "application/json")
            self.assertEqual(r.json(), expected)
        plain = curl(self.url("/v2/models/plain")).json()
        self.assertEqual(plain["versions"], ["2", "1"])
        self.assertEqual(plain["inputs"], [{"name": "x", "datatype": "FP32", "shape": [2, 3]}])

    def test_model_ready(self):
        for path in ("/v2/models/digits/ready", "/v2/models/digits/versions/1/ready",
                     "/v2/models/plain/versions/2/ready", "/v2/models/forest/ready"):
            r = curl(self.url(path))
            self.assertEqual((r.status, r.body), (200, b""), path)
        self.assert_error(curl(self.url("/v2/models/nothing/ready")), 400,
                          "model 'nothing' is not ready")
        self.assert_error(curl(self.url("/v2/models/digits/versions/9/ready")), 400,
                          "model 'digits' version '9' is not ready")

    # Inference with JSON tensors.

    def test_digits_json_flat_and_nested(self):
        x = np.random.default_rng(1).random((3, 64), dtype=np.float32)
        expected = digits_reference(os.path.join(self.repo, "digits", "1", "model.onnx"), x)
        for data in (x.flatten().tolist(), x.tolist()):
            r = self.infer("digits", infer_body("pixels", "FP32", [3, 64], data, id="r-1"))
            self.assertEqual(r.status, 200, r.body)
            self.assertEqual(r.headers["content-type"], "application/json")
            out = r.json()
            self.assertEqual(out["model_name"], "digits")
            self.assertEqual(out["model_version"], "1")
            self.assertEqual(out["id"], "r-1")
            self.assertEqual(len(out["outputs"]), 1)
            o = out["outputs"][0]
            self.assertEqual((o["name"], o["datatype"], o["shape"]), ("probabilities", "FP32", [3, 10]))
            np.testing.assert_allclose(np.array(o["data"]).reshape(3, 10), expected, atol=1e-5, rtol=0)

    def test_forest_json_matches_xgboost(self):
        import xgboost as xgb
        x = np.random.default_rng(2).normal(size=(5, 8)).astype(np.float32)
        booster = xgb.Booster(model_file=os.path.join(self.repo, "forest", "1", "model.json"))
        expected = booster.predict(xgb.DMatrix(x))
        r = self.infer("forest", infer_body("input", "FP32", [5, 8], x.flatten().tolist()))
        self.assertEqual(r.status, 200, r.body)
        o = r.json()["outputs"][0]
        self.assertEqual((o["name"], o["datatype"]), ("output", "FP32"))
        self.assertEqual(o["shape"][0], 5)
        np.testing.assert_allclose(np.array(o["data"]), expected, atol=1e-5, rtol=1e-5)

    def test_versions_and_parameters(self):
        x = [[1, 2, 3], [4, 5, 6]]
        for path, version, offset in (("/v2/models/plain/infer", "2", 2),
                                      ("/v2/models/plain/versions/2/infer", "2", 2),
                                      ("/v2/models/plain/versions/1/infer", "1", 1)):
            r = post_json(self.url(path), infer_body("x", "FP32", [2, 3], x,
                                                     parameters={"timeout": 10000000}))
            self.assertEqual(r.status, 200, r.body)
            out = r.json()
            self.assertEqual(out["model_version"], version)
            self.assertNotIn("id", out)
            self.assertEqual(out["outputs"][0]["data"], [v + offset for v in range(1, 7)])
        x = np.zeros((1, 64), np.float32).tolist()
        r = self.infer("digits", infer_body("pixels", "FP32", [1, 64], x, parameters={"priority": 1}))
        self.assertEqual(r.status, 200, r.body)

    # The binary tensor data extension.

    def binary_request(self, header, tensors, headers=()):
        head = json.dumps(header).encode()
        return curl(self.url("/v2/models/digits/infer"), head + b"".join(tensors),
                    ["Inference-Header-Content-Length: %d" % len(head),
                     "Content-Type: application/octet-stream"] + list(headers))

    @staticmethod
    def split_binary(reply):
        n = int(reply.headers["inference-header-content-length"])
        return json.loads(reply.body[:n]), reply.body[n:]

    def test_binary_in_and_out(self):
        x = np.random.default_rng(3).random((2, 64), dtype=np.float32)
        expected = digits_reference(os.path.join(self.repo, "digits", "1", "model.onnx"), x)
        header = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [2, 64],
                              "parameters": {"binary_data_size": x.nbytes}}],
                  "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}]}
        r = self.binary_request(header, [x.tobytes()])
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.headers["content-type"], "application/octet-stream")
        meta, raw = self.split_binary(r)
        o = meta["outputs"][0]
        self.assertEqual(o, {"name": "probabilities", "datatype": "FP32", "shape": [2, 10],
                             "parameters": {"binary_data_size": 80}})
        self.assertEqual(len(raw), 80)
        np.testing.assert_allclose(np.frombuffer(raw, "<f4").reshape(2, 10), expected, atol=1e-5, rtol=0)

    def test_binary_in_json_out_and_binary_data_output(self):
        x = np.random.default_rng(4).random((1, 64), dtype=np.float32)
        header = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64],
                              "parameters": {"binary_data_size": x.nbytes}}]}
        r = self.binary_request(header, [x.tobytes()])
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.headers["content-type"], "application/json")
        self.assertNotIn("inference-header-content-length", r.headers)
        json_out = np.array(r.json()["outputs"][0]["data"], np.float32)
        # binary_data_output: every output as binary data; JSON input this time.
        r = self.infer("digits", infer_body("pixels", "FP32", [1, 64], x.tolist(),
                                            parameters={"binary_data_output": True}))
        self.assertEqual(r.status, 200, r.body)
        meta, raw = self.split_binary(r)
        self.assertEqual(meta["outputs"][0]["parameters"], {"binary_data_size": 40})
        self.assertNotIn("data", meta["outputs"][0])
        # Two runs of the model, not one output twice: equal up to the kernels' rounding.
        np.testing.assert_allclose(np.frombuffer(raw, "<f4"), json_out, atol=1e-6, rtol=0)

    # Refusals: status and message.

    def test_codec_errors(self):
        r = curl(self.url("/v2/models/digits/infer"), b"{\"inputs\": [", ["Content-Type: application/json"])
        self.assert_error(r, 400, "request body is not valid JSON: parse error at line 1, column 13: "
                                  "syntax error while parsing value - unexpected end of input; "
                                  "expected '[', '{', or a literal")
        self.assert_error(self.infer("digits", infer_body("pixels", "FP32", [2, 64], [0.0] * 127)), 400,
                          "input 'pixels': shape [2,64] has 128 elements but 'data' has 127")
        self.assert_error(self.infer("digits", infer_body("pixels", "FP32", [1, 2], [[1, 2, 3]])), 400,
                          "input 'pixels': 'data' must be a flat array of 2 elements or arrays "
                          "nested like shape [1,2]")
        self.assert_error(self.infer("digits", infer_body("pixels", "FP32", [1, 1], ["a"])), 400,
                          "input 'pixels': element 0 (\"a\") is not a number, as needed for FP32")
        self.assert_error(self.infer("digits", infer_body("pixels", "BYTES", [1], ["a"])), 400,
                          "input 'pixels': string tensors are not supported (BYTES)")
        self.assert_error(self.infer("digits", infer_body("pixels", "FP32", [268435457], [])), 400,
                          "input 'pixels': shape dim 268435457 is above the limit of 268435456 "
                          "elements per tensor")
        self.assert_error(self.infer("digits", {"inputs": [], "id": 3}), 400, "request 'id' must be a string")
        self.assert_error(self.infer("digits", infer_body("pixels", "FP32", [1], [1],
                                                          parameters={"priority": -1})), 400,
                          "request parameter 'priority' must be a non-negative integer")

    def test_model_errors(self):
        z = [0.0] * 64
        cases = [
            ("nothing", infer_body("pixels", "FP32", [1, 64], z), 404, "unknown model 'nothing'"),
            ("digits/versions/3", infer_body("pixels", "FP32", [1, 64], z), 404,
             "model 'digits' has no version '3' (serving: 1)"),
            ("digits", infer_body("pix", "FP32", [1, 64], z), 400,
             "model 'digits' has no input 'pix' (its inputs: pixels)"),
            ("digits", {"inputs": []}, 400, "model 'digits' needs input 'pixels'"),
            ("digits", infer_body("pixels", "INT32", [1, 64], [0] * 64), 400,
             "input 'pixels' is INT32, model 'digits' expects FP32"),
            ("digits", infer_body("pixels", "FP32", [1, 63], z[:63]), 400,
             "input 'pixels' has shape [1,63], model 'digits' expects [-1,64]"),
            ("digits", infer_body("pixels", "FP32", [33, 64], z * 33), 400,
             "input 'pixels' has batch size 33, model 'digits' takes 1 to 32"),
            ("digits", infer_body("pixels", "FP32", [1, 64], z, parameters={"priority": 7}), 400,
             "priority 7 is outside 1..3 of model 'digits'"),
            ("digits", infer_body("pixels", "FP32", [1, 64], z, outputs=[{"name": "nope"}]), 400,
             "model 'digits' has no output 'nope' (its outputs: probabilities)"),
            ("plain", infer_body("x", "FP32", [3, 2], [0] * 6), 400,
             "input 'x' has shape [3,2], model 'plain' expects [2,3]"),
        ]
        for model, body, status, message in cases:
            self.assert_error(self.infer(model, body), status, message)
        self.assert_error(curl(self.url("/v2/models/nothing")), 404, "unknown model 'nothing'")
        self.assert_error(curl(self.url("/v2/models/digits/versions/3")), 404,
                          "model 'digits' has no version '3' (serving: 1)")

    def test_binary_errors(self):
        x = np.zeros((1, 64), np.float32).tobytes()
        header = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64],
                              "parameters": {"binary_data_size": 256}}]}
        self.assert_error(self.binary_request(header, [x[:100]]), 400,
                          "input 'pixels': binary data truncated: 256 bytes needed at offset 0 of "
                          "the binary data, 100 left")
        self.assert_error(self.binary_request(header, [x, b"xyz"]), 400,
                          "3 bytes of binary data after the last binary input")
        header["inputs"][0]["parameters"]["binary_data_size"] = 255
        self.assert_error(self.binary_request(header, [x[:255]]), 400,
                          "input 'pixels': binary_data_size 255 does not match FP32 shape [1,64] "
                          "(256 bytes)")
        body = json.dumps(header).encode()
        url = self.url("/v2/models/digits/infer")
        self.assert_error(curl(url, body, ["Inference-Header-Content-Length: %d" % (len(body) + 1)]), 400,
                          "Inference-Header-Content-Length %d is larger than the body (%d bytes)"
                          % (len(body) + 1, len(body)))
        self.assert_error(curl(url, body, ["Inference-Header-Content-Length: 12a"]), 400,
                          "Inference-Header-Content-Length '12a' is not a byte count")
        self.assert_error(curl(url, body + b" " * 9000, ["Inference-Header-Content-Length: 9000"]), 400,
                          "Inference-Header-Content-Length 9000 is above the limit of 8192 bytes")
        self.assert_error(self.infer("digits", infer_body("pixels", "FP32", [1, 64], None)), 400,
                          "input 'pixels': 'data' must be a flat array of 64 elements or arrays "
                          "nested like shape [1,64]")

    def test_http_errors(self):
        self.assert_error(curl(self.url("/v2/nothing")), 404, "no route for GET /v2/nothing")
        self.assert_error(curl(self.url("/v2/models/digits/infer")), 404,
                          "no route for GET /v2/models/digits/infer")
        url = self.url("/v2/models/digits/infer")
        body = json.dumps(infer_body("pixels", "FP32", [1, 1], [1])).encode()
        self.assert_error(curl(url, body, ["Transfer-Encoding: chunked"]), 411,
                          "a request body needs a Content-Length (no chunked transfer)")
        self.assert_error(curl(url, body, ["Content-Encoding: gzip"]), 415,
                          "compressed request bodies are not accepted (Content-Encoding: gzip)")
        big = b" " * ((64 << 20) + 1)
        self.assert_error(curl(url, big), 413, "request body of %d bytes is above the limit of %d bytes"
                          % (len(big), 64 << 20))

    def test_metrics(self):
        r = curl("http://127.0.0.1:%d/metrics" % self.srv.metrics_port)
        self.assertEqual(r.status, 200)
        self.assertTrue(r.headers["content-type"].startswith("text/plain; version=0.0.4"))
        text = r.body.decode()
        self.assertTrue(text.strip())
        self.assertTrue("nv_" in text or "slim_" in text)
        self.assertEqual(curl("http://127.0.0.1:%d/other" % self.srv.metrics_port).status, 404)


class RestRepository(unittest.TestCase):
    """The repository extension in explicit model control mode."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.repo = os.path.join(cls.tmp.name, "repo")
        subprocess.run([sys.executable, os.path.join(HERE, "make_repository.py"), cls.repo], check=True)
        cls.srv = start_server(cls.repo, ["--threads", "2", "--model-control-mode", "explicit",
                                          "--load-model", "digits"])
        cls.base = "http://127.0.0.1:%d" % cls.srv.http_port

    @classmethod
    def tearDownClass(cls):
        code = cls.srv.stop()
        cls.tmp.cleanup()
        assert code == 0, "slim serve exited with %d after SIGTERM" % code

    def index(self, body=b""):
        r = curl(self.base + "/v2/repository/index", body)
        self.assertEqual(r.status, 200, r.body)
        return {e["name"]: e for e in r.json()}

    def test_index_load_unload(self):
        everything = self.index()
        self.assertEqual(sorted(everything), ["cnn", "digits", "forest", "plain"])
        self.assertEqual(everything["digits"]["state"], "READY")
        self.assertNotEqual(everything["plain"]["state"], "READY")
        self.assertEqual(sorted(self.index(b'{"ready": true}')), ["digits"])

        r = curl(self.base + "/v2/repository/models/plain/load", b"")
        self.assertEqual((r.status, r.json()), (200, {}))
        self.assertEqual(curl(self.base + "/v2/models/plain/ready").status, 200)
        self.assertEqual(self.index(b'{"ready": true}')["plain"]["state"], "READY")
        x = [[0, 0, 0], [1, 1, 1]]
        r = post_json(self.base + "/v2/models/plain/infer", infer_body("x", "FP32", [2, 3], x))
        self.assertEqual(r.json()["outputs"][0]["data"], [2, 2, 2, 3, 3, 3])

        r = curl(self.base + "/v2/repository/models/plain/unload", b"")
        self.assertEqual((r.status, r.json()), (200, {}))
        self.assertEqual(curl(self.base + "/v2/models/plain/ready").status, 400)
        self.assertNotIn("plain", self.index(b'{"ready": true}'))
        r = post_json(self.base + "/v2/models/plain/infer", infer_body("x", "FP32", [2, 3], x))
        self.assertEqual((r.status, r.error()), (503, "model 'plain' is not ready: unloaded"))

    def test_load_errors(self):
        r = curl(self.base + "/v2/repository/models/nothing/load", b"")
        self.assertEqual(r.status, 404)
        self.assertEqual(r.error(), "no model 'nothing' in repository " + self.repo)

    def test_index_errors(self):
        r = curl(self.base + "/v2/repository/index", b'{"ready": "yes"}')
        self.assertEqual(r.status, 400)
        self.assertEqual(r.error(), "repository index 'ready' must be true or false")


if __name__ == "__main__":
    unittest.main(verbosity=2)
