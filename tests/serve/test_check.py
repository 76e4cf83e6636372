#!/usr/bin/env python3
"""`slim check URL` end to end: slim serve on free loopback ports with the test repository
(tests/serve/make_repository.py) and a language model (make_llm.py), probed by `slim check`,
whose JSON report and exit code are checked; then a port nobody listens on (exit 2), one
that accepts and never answers (exit 2 after --timeout-ms), a stand-in for llama-server
loading its model (exit 1, not ready) and a repository with a model that fails to load
(exit 1). The verdict's exit 3 (a signature or integrity failure) is tested on hand-built
reports in check_test.cc. Also GET /v2/models/M/config, the Triton
route the report's batching comes from. Run by ctest with SLIM_BINARY_DIR set.
"""
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import unittest
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_repository  # noqa: E402
from serve_harness import slim_command, start_server  # noqa: E402

TMP = tempfile.mkdtemp(prefix="slim_check_test_")
REPO = os.path.join(TMP, "repo")
subprocess.run(["/usr/bin/python3", os.path.join(HERE, "make_repository.py"), REPO], check=True)
subprocess.run(["/usr/bin/python3", os.path.join(HERE, "make_llm.py"), TMP], check=True)
LLM = os.path.join(TMP, "chat.gguf")
SAMPLES = 3
# Generous: under an emulator both the server and slim check are slow.
TIMEOUT_MS = "60000"


def check(url, *args):
    """(exit code, report, stderr) of `slim check URL ARGS`."""
    p = subprocess.run(slim_command("check", url, *args), capture_output=True, text=True, timeout=600)
    return p.returncode, json.loads(p.stdout), p.stderr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url):
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


class CheckSlimServer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = start_server(REPO, ["--model", LLM, "--threads", "2"])
        cls.url = cls.srv.url()

    @classmethod
    def tearDownClass(cls):
        assert cls.srv.stop() == 0

    def test_healthy_server_report(self):
        rc, r, err = check(self.url, "--grpc", "127.0.0.1:%d" % self.srv.grpc_port, "--samples", str(SAMPLES),
                           "--timeout-ms", TIMEOUT_MS)
        self.assertEqual(rc, 0, err)
        self.assertEqual(err, "")
        self.assertEqual((r["answered"], r["error"], r["problems"], r["exit_code"]), (True, None, [], 0))
        self.assertEqual(r["server"]["name"], "slim")
        self.assertIn("model_repository", r["server"]["extensions"])
        self.assertIn("model_configuration", r["server"]["extensions"])
        self.assertIn(r["slim"]["isa"], ("scalar", "avx2", "avx512", "neon"))
        self.assertTrue(r["slim"]["kernels"])
        self.assertIs(r["slim"]["require_signature"], False)

        p = r["protocols"]
        self.assertEqual(p["kserve_rest"], {"answered": True, "live": True, "ready": True})
        self.assertEqual(p["kserve_grpc"], {"address": "127.0.0.1:%d" % self.srv.grpc_port, "requested": True,
                                            "answered": True, "live": True, "ready": True,
                                            "server": {"name": "slim", "version": r["server"]["version"]},
                                            "error": None})
        self.assertEqual(p["openai"], {"answered": True, "health": True})

        models = {m["name"]: m for m in r["models"]}
        self.assertEqual(sorted(models), ["chat", "cnn", "digits", "forest", "plain"])
        for name, m in models.items():
            self.assertEqual(m["errors"], [], name)
            lat = m["latency"]
            self.assertEqual((lat["samples"], lat["succeeded"], lat["error"]), (SAMPLES, SAMPLES, None), name)
            self.assertLessEqual(lat["min_ms"], lat["median_ms"])
            self.assertLessEqual(lat["median_ms"], lat["max_ms"])
            expected = ["openai"] if name == "chat" else ["kserve_rest", "kserve_grpc"]
            self.assertEqual(m["protocols"], expected, name)

        digits = models["digits"]
        self.assertEqual(digits["platform"], "onnxruntime_onnx")
        self.assertEqual(digits["versions"], [{"version": "1", "state": "READY", "reason": "", "signed": None,
                                               "signer": None, "variant": None}])
        self.assertEqual(digits["inputs"], [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}])
        self.assertEqual(digits["outputs"], [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]}])
        batching = digits["batching"]
        self.assertEqual(batching["max_batch_size"], 32)
        db = batching["dynamic_batching"]
        self.assertEqual((db["preferred_batch_size"], db["max_queue_delay_microseconds"], db["priority_levels"],
                          db["default_priority_level"]), ([8, 16, 32], 2000, 3, 2))
        self.assertEqual(db["default_queue_policy"]["max_queue_size"], 256)
        self.assertEqual(db["priority_queue_policy"], {"3": {"timeout_action": "REJECT",
                                                             "default_timeout_microseconds": 5000000,
                                                             "allow_timeout_override": True, "max_queue_size": 64}})

        plain = models["plain"]
        self.assertEqual([(v["version"], v["state"]) for v in plain["versions"]], [("2", "READY"), ("1", "READY")])
        self.assertEqual(plain["inputs"], [{"name": "x", "datatype": "FP32", "shape": [2, 3]}])
        self.assertEqual(plain["batching"], {"max_batch_size": 0, "dynamic_batching": None})
        self.assertEqual(models["cnn"]["inputs"], [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 8, 8]}])
        self.assertEqual(models["forest"]["platform"], "slim_forest")

        chat = models["chat"]
        self.assertEqual((chat["platform"], chat["inputs"], chat["batching"]), ("slim_llm", [], None))
        self.assertEqual([(v["version"], v["state"]) for v in chat["versions"]], [("1", "READY")])

    def test_grpc_is_not_probed_off_port_8000_unless_asked(self):
        rc, r, err = check(self.url, "--samples", "0", "--timeout-ms", TIMEOUT_MS)
        self.assertEqual(rc, 0, err)
        self.assertEqual(r["protocols"]["kserve_grpc"], {"address": None, "requested": False, "answered": None})
        self.assertTrue(all(m["latency"] is None for m in r["models"]))
        self.assertEqual({m["name"]: m["protocols"] for m in r["models"]},
                         {"chat": ["openai"], "cnn": ["kserve_rest"], "digits": ["kserve_rest"],
                          "forest": ["kserve_rest"], "plain": ["kserve_rest"]})

    def test_an_explicit_grpc_address_that_does_not_answer_fails(self):
        dead = "127.0.0.1:%d" % free_port()
        rc, r, err = check(self.url, "--grpc", dead, "--samples", "0", "--timeout-ms", TIMEOUT_MS)
        self.assertEqual(rc, 1)
        g = r["protocols"]["kserve_grpc"]
        self.assertEqual((g["address"], g["requested"], g["answered"]), (dead, True, False))
        self.assertTrue(g["error"].startswith("ServerLive: "), g["error"])
        self.assertEqual(r["problems"], ["KServe v2 gRPC at %s: %s" % (dead, g["error"])])
        self.assertIn("slim check: KServe v2 gRPC at " + dead, err)

    def test_model_config_route(self):
        status, cnn = get_json(self.srv.url("/v2/models/cnn/config"))
        self.assertEqual(status, 200)
        # config.json names the backend only: the platform is completed, as Triton does.
        self.assertEqual((cnn["name"], cnn["platform"], cnn["backend"], cnn["max_batch_size"]),
                         ("cnn", "onnxruntime_onnx", "onnxruntime", 16))
        self.assertEqual(cnn["input"], [{"name": "image", "data_type": "TYPE_FP32", "dims": [1, 8, 8],
                                         "allow_ragged_batch": False}])
        self.assertEqual(cnn["output"], [{"name": "logits", "data_type": "TYPE_FP32", "dims": [4]}])
        status, plain = get_json(self.srv.url("/v2/models/plain/versions/1/config"))
        self.assertEqual((status, plain["version_policy"]), (200, {"all": {}}))
        status, err = get_json(self.srv.url("/v2/models/plain/versions/7/config"))
        self.assertEqual((status, err), (404, {"error": "model 'plain' has no version '7' (serving: 2, 1)"}))


class CheckUnreachable(unittest.TestCase):
    def test_a_port_nobody_listens_on_is_exit_2(self):
        url = "http://127.0.0.1:%d" % free_port()
        rc, r, err = check(url)
        self.assertEqual(rc, 2)
        self.assertEqual(r, {"url": url, "answered": False, "error": "GET /v2: cannot connect (refused or unreachable)",
                             "problems": ["the server does not answer: GET /v2: cannot connect (refused or "
                                          "unreachable)"],
                             "exit_code": 2})

    def test_a_server_that_never_answers_is_exit_2_after_the_timeout(self):
        with socket.socket() as s:  # connections queue in the backlog, nobody reads them
            s.bind(("127.0.0.1", 0))
            s.listen(8)
            rc, r, _ = check("http://127.0.0.1:%d" % s.getsockname()[1], "--timeout-ms", "300")
        self.assertEqual(rc, 2)
        self.assertEqual(r["error"], "GET /v2: no answer within 300 ms, or the connection closed")

    def test_a_malformed_url_is_exit_2(self):
        p = subprocess.run(slim_command("check", "ftp://127.0.0.1:1"), capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertEqual(p.stderr, "slim: error [invalid_argument]: 'ftp://127.0.0.1:1': only http:// servers can "
                                   "be checked\n")


class CheckLoadingLlamaServer(unittest.TestCase):
    def test_an_openai_server_that_is_loading_is_exit_1_not_ready(self):
        # llama-server while it loads its model: every route answers 503 with an OpenAI error.
        body = json.dumps({"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}).encode()

        class Loading(http.server.BaseHTTPRequestHandler):
            def answer(self):
                self.send_response(503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = answer

            def log_message(self, *args):
                pass

        with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Loading) as srv:
            threading.Thread(target=srv.serve_forever, daemon=True).start()
            rc, r, err = check("http://127.0.0.1:%d" % srv.server_address[1])
            srv.shutdown()
        self.assertEqual(rc, 1)
        self.assertEqual(r["protocols"]["kserve_rest"], {"answered": False, "live": None, "ready": None})
        self.assertEqual(r["protocols"]["openai"], {"answered": True, "health": False})
        self.assertEqual((r["models"], r["problems"]), ([], ["OpenAI API: GET /health says the server is not ready"]))


class CheckModelThatFailsToLoad(unittest.TestCase):
    def test_not_ready_is_exit_1(self):
        repo = os.path.join(TMP, "broken_repo")
        shutil.copytree(REPO, repo)
        # The digits model with a config that contradicts it (65 pixels, not 64).
        make_repository.write(os.path.join(repo, "broken", "config.pbtxt"),
                              make_repository.DIGITS_CONFIG.replace('name: "digits"', 'name: "broken"')
                              .replace("dims: [ 64 ]", "dims: [ 65 ]"))
        shutil.copytree(os.path.join(repo, "digits", "1"), os.path.join(repo, "broken", "1"))
        with start_server(repo, ["--threads", "2"]) as srv:
            rc, r, err = check(srv.url(), "--samples", "1", "--timeout-ms", TIMEOUT_MS)
        self.assertEqual(rc, 1)
        self.assertEqual(r["protocols"]["kserve_rest"], {"answered": True, "live": True, "ready": False})
        self.assertEqual(r["protocols"]["openai"], {"answered": True, "health": False})
        self.assertEqual(r["problems"], ["KServe v2 REST: the server is not ready",
                                         "OpenAI API: GET /health says the server is not ready"])
        models = {m["name"]: m for m in r["models"]}
        broken = models["broken"]
        self.assertEqual(len(broken["versions"]), 1)
        v = broken["versions"][0]
        self.assertEqual((v["version"], v["state"]), (None, "UNAVAILABLE"))
        self.assertIn("config dims [65] contradict the model's [64]", v["reason"])
        self.assertEqual((broken["inputs"], broken["latency"], broken["errors"]), (None, None, []))
        self.assertEqual(models["digits"]["latency"]["succeeded"], 1)
        self.assertIn("slim check: KServe v2 REST: the server is not ready\n", err)


if __name__ == "__main__":
    try:
        unittest.main()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
