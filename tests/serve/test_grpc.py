#!/usr/bin/env python3
"""The KServe v2 gRPC front door, called by a real client: Python grpcio with stubs that
protoc's Python plugin generates at test time from src/serve/grpc_service.proto.

Starts `slim serve` (tests/serve/serve_harness.py) on free loopback ports over the
repository tests/serve/make_repository.py writes, calls every RPC, and checks outputs
against numpy and XGBoost.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from concurrent.futures import ThreadPoolExecutor

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from serve_harness import slim_command, start_server  # noqa: E402

import grpc  # noqa: E402

pb = pb_grpc = None  # the generated modules, imported in setUpModule
TMP = None
REPO = None


def setUpModule():
    global pb, pb_grpc, TMP, REPO
    TMP = tempfile.mkdtemp(prefix="slim_grpc_", dir=os.environ.get("SLIM_TEST_TMP"))
    plugin = shutil.which("grpc_python_plugin")
    if plugin is None:
        raise RuntimeError("grpc_python_plugin not found (Debian package protobuf-compiler-grpc)")
    proto_dir = os.path.join(SOURCE, "src", "serve")
    subprocess.run(["protoc", "-I", proto_dir, "--python_out", TMP, "--grpc_out", TMP,
                    "--plugin=protoc-gen-grpc=" + plugin,
                    os.path.join(proto_dir, "grpc_service.proto")], check=True)
    sys.path.insert(0, TMP)
    import grpc_service_pb2
    import grpc_service_pb2_grpc
    pb, pb_grpc = grpc_service_pb2, grpc_service_pb2_grpc
    REPO = os.path.join(TMP, "repo")
    subprocess.run([sys.executable, os.path.join(HERE, "make_repository.py"), REPO], check=True)


def tearDownModule():
    shutil.rmtree(TMP, ignore_errors=True)


def digits_reference(x):
    """The digits MLP (Gemm, Relu, Gemm, Softmax) in float64 numpy from the model's weights
    (Debian's onnx predates onnx.reference)."""
    import onnx
    from onnx import numpy_helper
    model = onnx.load(os.path.join(REPO, "digits", "1", "model.onnx"))
    assert [n.op_type for n in model.graph.node] == ["Gemm", "Relu", "Gemm", "Softmax"]
    w = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    logits = np.maximum(x.astype(np.float64) @ w["w0"] + w["b0"], 0) @ w["w1"] + w["b1"]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def forest_reference(x):
    import xgboost as xgb
    booster = xgb.Booster()
    booster.load_model(os.path.join(REPO, "forest", "1", "model.json"))
    return booster.predict(xgb.DMatrix(x))


def infer_request(model, inputs, raw=True, version="", **params):
    """inputs: [(name, array, datatype)]; params: name -> InferParameter kwargs."""
    req = pb.ModelInferRequest(model_name=model, model_version=version, id="req-1")
    for name, array, datatype in inputs:
        t = req.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        if raw:
            req.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
        elif datatype == "FP32":
            t.contents.fp32_contents.extend(array.ravel().tolist())
        else:
            raise ValueError(datatype)
    for key, value in params.items():
        req.parameters[key].CopyFrom(pb.InferParameter(**value))
    return req


def output_array(resp, index=0):
    out = resp.outputs[index]
    assert out.datatype == "FP32", out.datatype
    return np.frombuffer(resp.raw_output_contents[index], dtype=np.float32).reshape(list(out.shape))


class GrpcCase(unittest.TestCase):
    """One `slim serve` per test class, started with SERVER_ARGS, and a stub on its port."""
    SERVER_ARGS = ["--threads", "2"]

    @classmethod
    def setUpClass(cls):
        cls.server = start_server(REPO, cls.SERVER_ARGS)
        cls.channel = grpc.insecure_channel(f"127.0.0.1:{cls.server.grpc_port}")
        cls.stub = pb_grpc.GRPCInferenceServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        assert cls.server.stop() == 0

    def assert_error(self, call, request, code, message):
        with self.assertRaises(grpc.RpcError) as cm:
            call(request, timeout=30)
        self.assertEqual(cm.exception.code(), code, cm.exception.details())
        self.assertEqual(cm.exception.details(), message)


class GrpcFrontDoor(GrpcCase):

    def test_health(self):
        self.assertTrue(self.stub.ServerLive(pb.ServerLiveRequest()).live)
        self.assertTrue(self.stub.ServerReady(pb.ServerReadyRequest()).ready)
        self.assertTrue(self.stub.ModelReady(pb.ModelReadyRequest(name="digits")).ready)
        self.assertTrue(self.stub.ModelReady(pb.ModelReadyRequest(name="plain", version="2")).ready)
        self.assertFalse(self.stub.ModelReady(pb.ModelReadyRequest(name="nosuch")).ready)

    def test_server_metadata(self):
        m = self.stub.ServerMetadata(pb.ServerMetadataRequest())
        self.assertEqual(m.name, "slim")
        version = subprocess.run(slim_command("--version"), capture_output=True, text=True,
                                 check=True).stdout.split()[1]
        self.assertEqual(m.version, version)
        self.assertIn("model_repository", m.extensions)

    def test_model_metadata(self):
        m = self.stub.ModelMetadata(pb.ModelMetadataRequest(name="digits"))
        self.assertEqual(m.name, "digits")
        self.assertEqual(list(m.versions), ["1"])
        self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in m.inputs],
                         [("pixels", "FP32", [-1, 64])])
        self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in m.outputs],
                         [("probabilities", "FP32", [-1, 10])])
        plain = self.stub.ModelMetadata(pb.ModelMetadataRequest(name="plain"))
        self.assertEqual(list(plain.versions), ["2", "1"])
        self.assertEqual(list(plain.inputs[0].shape), [2, 3])
        self.assert_error(self.stub.ModelMetadata, pb.ModelMetadataRequest(name="nosuch"),
                          grpc.StatusCode.NOT_FOUND, "unknown model 'nosuch'")

    def check_digits(self, raw):
        x = np.random.default_rng(1).random((3, 64), dtype=np.float32)
        resp = self.stub.ModelInfer(infer_request("digits", [("pixels", x, "FP32")], raw=raw))
        self.assertEqual((resp.model_name, resp.model_version, resp.id), ("digits", "1", "req-1"))
        self.assertEqual([o.name for o in resp.outputs], ["probabilities"])
        self.assertEqual(len(resp.raw_output_contents), 1)
        np.testing.assert_allclose(output_array(resp), digits_reference(x), atol=1e-5, rtol=0)

    def test_digits_raw_contents(self):
        self.check_digits(raw=True)

    def test_digits_typed_contents(self):
        self.check_digits(raw=False)

    def check_forest(self, raw):
        x = np.random.default_rng(2).normal(size=(5, 8)).astype(np.float32)
        resp = self.stub.ModelInfer(infer_request("forest", [("input", x, "FP32")], raw=raw))
        self.assertEqual([o.name for o in resp.outputs], ["output"])
        self.assertEqual(list(resp.outputs[0].shape)[0], 5)
        np.testing.assert_allclose(output_array(resp).ravel(), forest_reference(x), atol=1e-5, rtol=0)

    def test_forest_raw_contents(self):
        self.check_forest(raw=True)

    def test_forest_typed_contents(self):
        self.check_forest(raw=False)

    def test_requested_output_and_version(self):
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        for version, offset in (("1", 1), ("2", 2), ("", 2)):
            req = infer_request("plain", [("x", x, "FP32")], version=version)
            req.outputs.add(name="y")
            resp = self.stub.ModelInfer(req)
            self.assertEqual(resp.model_version, version or "2")
            np.testing.assert_array_equal(output_array(resp), x + offset)
        self.assert_error(self.stub.ModelInfer, infer_request("plain", [("x", x, "FP32")], version="7"),
                          grpc.StatusCode.NOT_FOUND, "model 'plain' has no version '7' (serving: 2, 1)")

    def test_priority_and_timeout_parameters(self):
        x = np.random.default_rng(3).random((1, 64), dtype=np.float32)
        expected = digits_reference(x)
        for params in ({"priority": {"uint64_param": 1}}, {"priority": {"int64_param": 3}},
                       {"priority": {"uint64_param": 0}}, {"timeout": {"int64_param": 10_000_000}}):
            resp = self.stub.ModelInfer(infer_request("digits", [("pixels", x, "FP32")], **params))
            np.testing.assert_allclose(output_array(resp), expected, atol=1e-5, rtol=0)
        self.assert_error(self.stub.ModelInfer,
                          infer_request("digits", [("pixels", x, "FP32")], priority={"string_param": "high"}),
                          grpc.StatusCode.INVALID_ARGUMENT,
                          "parameter 'priority' must be an integer (int64_param or uint64_param)")
        self.assert_error(self.stub.ModelInfer,
                          infer_request("digits", [("pixels", x, "FP32")], priority={"int64_param": -1}),
                          grpc.StatusCode.INVALID_ARGUMENT, "parameter 'priority' must not be negative (got -1)")
        self.assert_error(self.stub.ModelInfer,
                          infer_request("digits", [("pixels", x, "FP32")], priority={"uint64_param": 4}),
                          grpc.StatusCode.INVALID_ARGUMENT, "priority 4 is outside 1..3 of model 'digits'")

    def test_request_errors(self):
        x = np.zeros((1, 64), dtype=np.float32)
        infer = self.stub.ModelInfer
        self.assert_error(infer, infer_request("nosuch", [("pixels", x, "FP32")]),
                          grpc.StatusCode.NOT_FOUND, "unknown model 'nosuch'")
        self.assert_error(infer, infer_request("digits", [("pixels", np.zeros((1, 63), np.float32), "FP32")]),
                          grpc.StatusCode.INVALID_ARGUMENT,
                          "input 'pixels' has shape [1,63], model 'digits' expects [-1,64]")

        req = infer_request("digits", [("pixels", x, "FP32")])
        req.raw_input_contents[0] = req.raw_input_contents[0][:-4]
        self.assert_error(infer, req, grpc.StatusCode.INVALID_ARGUMENT,
                          "input 'pixels': raw_input_contents holds 252 bytes, shape [1,64] of FP32 "
                          "needs 64 x 4")
        req = infer_request("digits", [("pixels", x, "FP32")])
        req.raw_input_contents.append(b"\0" * 4)
        self.assert_error(infer, req, grpc.StatusCode.INVALID_ARGUMENT,
                          "raw_input_contents has 2 entries for 1 inputs (one per input, or none)")
        req = infer_request("digits", [("pixels", x, "FP32")])
        req.inputs[0].contents.fp32_contents.extend([0.0] * 64)
        self.assert_error(infer, req, grpc.StatusCode.INVALID_ARGUMENT,
                          "input 'pixels': typed contents in a request that sends "
                          "raw_input_contents (one form per request)")

        req = infer_request("digits", [("pixels", x[:, :10], "FP32")], raw=False)
        req.inputs[0].shape[:] = [1, 64]
        self.assert_error(infer, req, grpc.StatusCode.INVALID_ARGUMENT,
                          "input 'pixels': contents hold 10 values, shape [1,64] needs 64")
        req = infer_request("digits", [("pixels", x, "FP32")], raw=False)
        req.inputs[0].contents.Clear()
        req.inputs[0].contents.int64_contents.extend([0] * 64)
        self.assert_error(infer, req, grpc.StatusCode.INVALID_ARGUMENT,
                          "input 'pixels': FP32 values belong in contents.fp32_contents, but the "
                          "contents use another field")
        req = pb.ModelInferRequest(model_name="digits")
        t = req.inputs.add(name="pixels", datatype="INT8", shape=[1, 2])
        t.contents.int_contents.extend([1, 300])
        self.assert_error(infer, req, grpc.StatusCode.INVALID_ARGUMENT,
                          "input 'pixels': value 300 at index 1 does not fit INT8")

        # A datatype the model does not take, one slim does not know, one it does not serve.
        self.assert_error(infer, infer_request("digits", [("pixels", x.astype(np.float64), "FP64")]),
                          grpc.StatusCode.INVALID_ARGUMENT, "input 'pixels' is FP64, model 'digits' expects FP32")
        req = infer_request("digits", [("pixels", x, "FP32")])
        req.inputs[0].datatype = "FP33"
        self.assert_error(infer, req, grpc.StatusCode.INVALID_ARGUMENT,
                          "input 'pixels': unknown KServe datatype 'FP33'")
        req = pb.ModelInferRequest(model_name="digits")
        req.inputs.add(name="pixels", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"x")
        self.assert_error(infer, req, grpc.StatusCode.UNIMPLEMENTED,
                          "input 'pixels': string tensors are not supported (BYTES)")

    def test_concurrent_calls(self):
        rows = np.random.default_rng(4).random((64, 64), dtype=np.float32)
        expected = digits_reference(rows)

        def call(i):
            params = {"priority": {"uint64_param": 1 + i % 3}}
            req = infer_request("digits", [("pixels", rows[i:i + 1], "FP32")], raw=i % 2 == 0, **params)
            req.id = str(i)
            return self.stub.ModelInfer(req, timeout=60)

        with ThreadPoolExecutor(32) as pool:
            responses = list(pool.map(call, range(len(rows))))
        for i, resp in enumerate(responses):
            self.assertEqual(resp.id, str(i))
            np.testing.assert_allclose(output_array(resp)[0], expected[i], atol=1e-5, rtol=0)


class GrpcRepository(GrpcCase):
    """The repository extension, on a server in explicit model-control mode."""
    SERVER_ARGS = ["--threads", "2", "--model-control-mode", "explicit", "--load-model", "digits"]

    def index(self, ready=False):
        resp = self.stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=ready))
        return {m.name: m.state for m in resp.models}

    def test_load_and_unload(self):
        self.assertEqual(self.index(ready=True), {"digits": "READY"})
        self.assertEqual(sorted(self.index()), ["cnn", "digits", "forest", "plain"])
        self.assertFalse(self.stub.ModelReady(pb.ModelReadyRequest(name="forest")).ready)

        self.stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="forest"))
        self.assertTrue(self.stub.ModelReady(pb.ModelReadyRequest(name="forest")).ready)
        x = np.ones((2, 8), dtype=np.float32)
        resp = self.stub.ModelInfer(infer_request("forest", [("input", x, "FP32")]))
        np.testing.assert_allclose(output_array(resp).ravel(), forest_reference(x), atol=1e-5, rtol=0)

        self.stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="forest"))
        self.assertFalse(self.stub.ModelReady(pb.ModelReadyRequest(name="forest")).ready)
        self.assertEqual(self.index(ready=True), {"digits": "READY"})

    def test_repository_errors(self):
        self.assert_error(self.stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name="nosuch"),
                          grpc.StatusCode.NOT_FOUND, f"no model 'nosuch' in repository {REPO}")
        self.assert_error(self.stub.RepositoryIndex, pb.RepositoryIndexRequest(repository_name="other"),
                          grpc.StatusCode.UNIMPLEMENTED,
                          "RepositoryIndex: 'repository_name' is not supported (slim serves one repository)")
        req = pb.RepositoryModelLoadRequest(model_name="cnn")
        req.parameters["config"].string_param = "{}"
        self.assert_error(self.stub.RepositoryModelLoad, req, grpc.StatusCode.UNIMPLEMENTED,
                          "RepositoryModelLoad: parameter 'config' is not supported")


if __name__ == "__main__":
    unittest.main(verbosity=2)
