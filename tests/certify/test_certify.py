"""`slim certify` and `slim certify verify` end to end, on generated fixtures of every model
kind: an ONNX classifier and a perturbed copy, a tiny GGUF (tests/fixtures/make_gguf.py) and
its `slim quantize` copy, an XGBoost model and its `slim forest compile` quantized copy.
Metrics are checked against numpy (ONNX, forests: xgboost's own predictions) and `slim
perplexity --kl-base` (GGUF); thresholds, exit codes, the signed bundle and each tampering
that `certify verify` must catch (model, data, report, bundle, key).

Run by ctest with SLIM_BINARY_DIR set to the build folder (SLIM_TEST_RUNNER, an emulator
command line, goes in front of slim when set).
"""
import hashlib
import json
import os
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))
import make_gguf  # noqa: E402

SLIM = shlex.split(os.environ.get("SLIM_TEST_RUNNER", "")) + [
    os.path.join(os.environ["SLIM_BINARY_DIR"], "tools", "slim")]


def slim(*args):
    return subprocess.run(SLIM + [str(a) for a in args], capture_output=True, text=True, timeout=600)


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def logits_model(path, w, b):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", w.shape[0]])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", w.shape[1]])
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["logits"])],
                          "g", [x], [y], [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)


def softmax(z):
    z = z.astype(np.float64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


class Certify(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="slim_certify_")
        d = cls.dir
        r = slim("keygen", "-o", f"{d}/key")
        assert r.returncode == 0, r.stderr
        r = slim("keygen", "--alg", "ed25519", "-o", f"{d}/other")
        assert r.returncode == 0, r.stderr
        # ONNX: x @ w + b and a copy with perturbed weights.
        rng = np.random.default_rng(7)
        cls.w = rng.normal(size=(6, 5)).astype(np.float32)
        cls.b = rng.normal(size=5).astype(np.float32)
        cls.w2 = (cls.w + rng.normal(scale=0.05, size=cls.w.shape)).astype(np.float32)
        logits_model(f"{d}/ref.onnx", cls.w, cls.b)
        logits_model(f"{d}/small.onnx", cls.w2, cls.b)
        cls.xa = rng.normal(size=(40, 6)).astype(np.float32)
        cls.xb = (rng.normal(size=(30, 6)) * 3).astype(np.float32)
        os.mkdir(f"{d}/dom_b")
        np.save(f"{d}/dom_a.npy", cls.xa)  # one-input model: the file is named by the domain
        np.save(f"{d}/dom_b/x.npy", cls.xb)
        # GGUF: a tiny Llama and its Q8_0 copy; text made of the tokenizer's filler pieces.
        make_gguf.make_model(d, "lm", "llama", "F32", 2, False, 11, tokenizer=make_gguf.spm_tokenizer(300),
                             reference=False)
        r = slim("quantize", f"{d}/lm.gguf", "-o", f"{d}/lm_q4.gguf", "--type", "q4_0")
        assert r.returncode == 0, r.stderr
        words = rng.integers(0, 41, size=400)
        with open(f"{d}/text.txt", "w") as f:
            f.write(" ".join("w%d" % i for i in words))
        # Forest: a binary XGBoost model on generated data, and a 4-bit compiled copy.
        import xgboost as xgb
        x = rng.normal(size=(300, 4)).astype(np.float32)
        y = (x[:, 0] + 0.5 * x[:, 1] * x[:, 2] > 0).astype(np.float32)
        bst = xgb.train({"objective": "binary:logistic", "max_depth": 3, "eta": 0.3}, xgb.DMatrix(x, y), 20)
        bst.save_model(f"{d}/trees.json")
        cls.ftest = rng.normal(size=(120, 4)).astype(np.float32)
        cls.flabels = (cls.ftest[:, 0] + 0.5 * cls.ftest[:, 1] * cls.ftest[:, 2] > 0).astype(np.float32)
        np.savetxt(f"{d}/rows.csv", np.column_stack([cls.ftest, cls.flabels]), delimiter=",",
                   header="a,b,c,d,label", comments="", fmt="%.9g")
        r = slim("forest", "compile", f"{d}/trees.json", "-o", f"{d}/trees4.slimf", "--quantize", "4bit",
                 "--calib", f"{d}/rows.csv", "--label-column", "label")
        assert r.returncode == 0, r.stderr
        cls.pref = bst.predict(xgb.DMatrix(cls.ftest))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def certify(self, *args, expect=0):
        r = slim("certify", *args)
        self.assertEqual(r.returncode, expect, r.stdout + r.stderr)
        return r

    def test_onnx_metrics_against_numpy(self):
        d = self.dir
        self.certify(f"{d}/ref.onnx", f"{d}/small.onnx", "--domain", f"a={d}/dom_a.npy", "--domain",
                     f"b={d}/dom_b", "-o", f"{d}/onnx.json", "--markdown", f"{d}/onnx.md", "--batch", "4")
        rep = json.load(open(f"{d}/onnx.json"))
        self.assertEqual(rep["kind"], "onnx")
        self.assertEqual(rep["schema"], "https://slim.dev/certify/v1")
        self.assertEqual(rep["reference"], {"file": "ref.onnx", "sha256": sha256(f"{d}/ref.onnx"),
                                            "bytes": os.path.getsize(f"{d}/ref.onnx")})
        self.assertEqual(rep["compressed"]["sha256"], sha256(f"{d}/small.onnx"))
        self.assertTrue(rep["pass"])
        for dom, x in zip(rep["domains"], [self.xa, self.xb]):
            p = x.astype(np.float64) @ self.w + self.b
            q = x.astype(np.float64) @ self.w2 + self.b
            out = dom["metrics"]["outputs"][0]
            self.assertEqual(out["name"], "logits")
            self.assertEqual(dom["samples"], len(x))
            self.assertAlmostEqual(out["top1_agreement"], np.mean(p.argmax(1) == q.argmax(1)))
            ps, qs = softmax(p), softmax(q)
            self.assertAlmostEqual(out["kl"], np.mean(np.sum(ps * np.log(ps / qs), axis=1)), places=5)
            self.assertAlmostEqual(out["cosine"], np.sum(p * q) / np.sqrt(np.sum(p * p) * np.sum(q * q)), places=5)
            self.assertAlmostEqual(out["max_abs"], np.max(np.abs(p - q)), places=4)
            for side in ("reference", "compressed"):
                self.assertEqual(dom[side]["unit"], "sample")
                self.assertGreater(dom[side]["median_latency_s"], 0)
                self.assertGreaterEqual(dom[side]["energy_j"], 0)
        self.assertEqual(rep["domains"][0]["data"]["sha256"], sha256(f"{d}/dom_a.npy"))
        self.assertIn(rep["energy_basis"], ("measured", "estimated"))
        md = open(f"{d}/onnx.md").read()
        self.assertIn("| a | 40 | logits top-1 ", md)
        self.assertIn("Verdict: **pass**", md)

    def test_thresholds_pass_and_fail(self):
        d = self.dir
        x = self.xb.astype(np.float64)
        kl = np.mean(np.sum(softmax(x @ self.w + self.b) * np.log(softmax(x @ self.w + self.b) / softmax(x @ self.w2 + self.b)), 1))
        r = self.certify(f"{d}/ref.onnx", f"{d}/small.onnx", "--domain", f"a={d}/dom_a.npy", "--domain",
                         f"b={d}/dom_b", "-o", f"{d}/th.json", "--max-kl", kl * 0.999, "--min-cosine", 0.9,
                         "--png", f"{d}/th.png", expect=5)
        self.assertIn("a domain failed its thresholds", r.stderr)
        with open(f"{d}/th.png", "rb") as f:  # a failed report is drawn too: a PNG of the chart's size
            head = f.read(24)
        self.assertEqual(head[:8], b"\x89PNG\r\n\x1a\n")
        self.assertEqual(struct.unpack(">II", head[16:24]), (900, 520))
        rep = json.load(open(f"{d}/th.json"))
        self.assertFalse(rep["pass"])
        b = rep["domains"][1]
        self.assertFalse(b["pass"])
        self.assertEqual([(c["metric"], c["pass"]) for c in b["checks"]], [("kl", False), ("cosine", True)])
        self.assertEqual(rep["thresholds"], {"max-kl": kl * 0.999, "min-cosine": 0.9})
        self.certify(f"{d}/ref.onnx", f"{d}/small.onnx", "--domain", f"b={d}/dom_b", "-o", f"{d}/th2.json",
                     "--max-kl", kl * 1.001)
        r = self.certify(f"{d}/ref.onnx", f"{d}/small.onnx", "--domain", f"b={d}/dom_b", "-o", f"{d}/th3.json",
                         "--max-ppl-ratio", 1.1, expect=2)
        self.assertIn("--max-ppl-ratio does not apply to onnx models", r.stderr)
        r = self.certify(f"{d}/ref.onnx", f"{d}/trees.json", "--domain", f"b={d}/dom_b", "-o", f"{d}/x.json", expect=2)
        self.assertIn("is onnx", r.stderr)
        r = self.certify(f"{d}/ref.onnx", f"{d}/small.onnx", "--domain", "nodata", "-o", f"{d}/x.json", expect=2)
        self.assertIn("--domain 'nodata': expected NAME=FILE", r.stderr)

    def test_gguf_against_perplexity(self):
        d = self.dir
        self.certify(f"{d}/lm.gguf", f"{d}/lm_q4.gguf", "--domain", f"text={d}/text.txt", "--ctx", 64,
                     "-o", f"{d}/lm.json", "--max-ppl-ratio", 2.0, "--min-agreement", 0.0)
        m = json.load(open(f"{d}/lm.json"))["domains"][0]
        r = slim("perplexity", f"{d}/lm_q4.gguf", "-f", f"{d}/text.txt", "--ctx", 64, "--kl-base", f"{d}/lm.gguf")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = dict(l.split(": ", 1) for l in r.stdout.splitlines() if ": " in l)
        met = m["metrics"]
        self.assertEqual("%.4f" % met["ppl_compressed"], lines["perplexity"])
        self.assertEqual("%.4f" % met["ppl_reference"], lines["base perplexity"].split()[0])
        self.assertEqual("%.6f" % met["kl"], lines["mean KL(base || model)"])
        self.assertEqual("%.2f%%" % (100 * met["token_agreement"]), lines["top-1 agreement"])
        self.assertAlmostEqual(met["ppl_ratio"], met["ppl_compressed"] / met["ppl_reference"])
        self.assertEqual(m["reference"]["unit"], "token")
        self.assertEqual([c["metric"] for c in m["checks"]], ["agreement", "ppl_ratio"])
        self.assertTrue(m["pass"])

    def test_forest_against_xgboost(self):
        d = self.dir
        self.certify(f"{d}/trees.json", f"{d}/trees4.slimf", "--domain", f"all={d}/rows.csv", "--label-column",
                     "label", "-o", f"{d}/forest.json", "--max-auc-drop", 1.0)
        m = json.load(open(f"{d}/forest.json"))["domains"][0]
        import xgboost as xgb
        # The compressed side's outputs come from `slim forest predict`, checked against numpy.
        r = slim("forest", "predict", f"{d}/trees4.slimf", "--csv", f"{d}/rows.csv", "--label-column", "label",
                 "--output", f"{d}/p4.csv")
        self.assertEqual(r.returncode, 0, r.stderr)
        q = np.loadtxt(f"{d}/p4.csv", delimiter=",", ndmin=1, skiprows=1 if not open(f"{d}/p4.csv").read(1).isdigit() else 0)
        q = q.reshape(len(self.pref), -1)[:, -1]
        p = self.pref
        met = m["metrics"]
        self.assertEqual(met["rows"], 120)
        self.assertAlmostEqual(met["class_agreement"], np.mean((p >= 0.5) == (q >= 0.5)))
        self.assertAlmostEqual(met["max_score_diff"], np.max(np.abs(p - q)), places=5)

        def auc(s, y):
            pos, neg = s[y == 1], s[y == 0]
            return (np.sum(pos[:, None] > neg[None, :]) + 0.5 * np.sum(pos[:, None] == neg[None, :])) / (len(pos) * len(neg))
        self.assertAlmostEqual(met["auc_reference"], auc(p, self.flabels), places=6)
        self.assertAlmostEqual(met["auc_compressed"], auc(q, self.flabels), places=6)
        self.assertEqual(m["checks"][0]["metric"], "auc_drop")
        self.assertTrue(m["pass"])
        np.save(f"{d}/rows.npy", self.ftest)
        self.certify(f"{d}/trees.json", f"{d}/trees4.slimf", "--domain", f"npy={d}/rows.npy", "-o",
                     f"{d}/forest_npy.json", "--max-abs", 0.0, expect=5 if met["max_score_diff"] > 0 else 0)

    def test_regression_forest_reports_rmse(self):
        # A regressor with labels has no AUC: the RMSE of both models against the labels.
        import xgboost as xgb
        d = self.dir
        rng = np.random.default_rng(3)
        x = rng.normal(size=(200, 3)).astype(np.float32)
        y = (2 * x[:, 0] - x[:, 1] + rng.normal(scale=0.1, size=200)).astype(np.float32)
        bst = xgb.train({"objective": "reg:squarederror", "max_depth": 3, "eta": 0.3}, xgb.DMatrix(x, y), 15)
        bst.save_model(f"{d}/reg.json")
        np.savetxt(f"{d}/reg.csv", np.column_stack([x, y]), delimiter=",", header="a,b,c,label", comments="", fmt="%.9g")
        r = slim("forest", "compile", f"{d}/reg.json", "-o", f"{d}/reg4.slimf", "--quantize", "4bit", "--calib",
                 f"{d}/reg.csv", "--label-column", "label")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.certify(f"{d}/reg.json", f"{d}/reg4.slimf", "--domain", f"all={d}/reg.csv", "--label-column", "label",
                     "-o", f"{d}/reg_report.json")
        met = json.load(open(f"{d}/reg_report.json"))["domains"][0]["metrics"]
        self.assertNotIn("auc_reference", met)
        self.assertNotIn("class_agreement", met)
        xs = np.loadtxt(f"{d}/reg.csv", delimiter=",", skiprows=1, dtype=np.float32)
        p = bst.predict(xgb.DMatrix(xs[:, :3]))
        self.assertAlmostEqual(met["rmse_reference"], float(np.sqrt(np.mean((p.astype(np.float64) - xs[:, 3]) ** 2))),
                               places=5)
        self.assertGreater(met["rmse_compressed"], 0)

    def test_signed_report_and_tampering(self):
        d = self.dir
        w = f"{d}/sig"
        os.makedirs(w, exist_ok=True)
        for f in ("ref.onnx", "small.onnx", "dom_a.npy"):
            shutil.copy(f"{d}/{f}", f"{w}/{f}")
        self.certify(f"{w}/ref.onnx", f"{w}/small.onnx", "--domain", f"a={w}/dom_a.npy", "-o", f"{w}/report.json",
                     "--sign", f"{d}/key", "--bundle", f"{w}/report.sigstore.json")
        bundle = json.load(open(f"{w}/report.sigstore.json"))
        self.assertEqual(bundle["mediaType"], "application/vnd.dev.sigstore.bundle.v0.3+json")
        import base64
        st = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        self.assertEqual(st["_type"], "https://in-toto.io/Statement/v1")
        self.assertEqual(st["predicateType"], "https://slim.dev/certify/v1")
        self.assertEqual(st["predicate"], json.load(open(f"{w}/report.json")))
        self.assertEqual(st["subject"], [
            {"name": "reference:ref.onnx", "digest": {"sha256": sha256(f"{w}/ref.onnx")}},
            {"name": "compressed:small.onnx", "digest": {"sha256": sha256(f"{w}/small.onnx")}},
            {"name": "data/a:dom_a.npy", "digest": {"sha256": sha256(f"{w}/dom_a.npy")}}])

        def verify(*extra, expect=0, pub=f"{d}/key.pub"):
            r = slim("certify", "verify", f"{w}/report.sigstore.json", "--pub", pub, *extra)
            self.assertEqual(r.returncode, expect, r.stdout + r.stderr)
            return r

        ok = verify("--models", f"{w}/ref.onnx", f"{w}/small.onnx", "--data", f"a={w}/dom_a.npy", "--report",
                    f"{w}/report.json")
        self.assertIn("verdict pass", ok.stdout)
        # A wrong key.
        self.assertIn("signed by another key", verify(pub=f"{d}/other.pub", expect=3).stderr)
        # A changed compressed model.
        blob = bytearray(open(f"{w}/small.onnx", "rb").read())
        blob[-5] ^= 1
        open(f"{w}/small2.onnx", "wb").write(blob)
        r = verify("--models", f"{w}/ref.onnx", f"{w}/small2.onnx", expect=3)
        self.assertIn("compressed model " + f"{w}/small2.onnx changed: sha256 " + sha256(f"{w}/small2.onnx"), r.stderr)
        # A changed data file.
        x = np.load(f"{w}/dom_a.npy")
        x[0, 0] += 1
        np.save(f"{w}/dom_a2.npy", x)
        r = verify("--data", f"a={w}/dom_a2.npy", expect=3)
        self.assertIn("data of domain 'a' " + f"{w}/dom_a2.npy changed", r.stderr)
        self.assertIn("no domain 'zz' was certified", verify("--data", f"zz={w}/dom_a.npy", expect=3).stderr)
        # A changed report file.
        rep = json.load(open(f"{w}/report.json"))
        rep["domains"][0]["metrics"]["outputs"][0]["kl"] = 0.0
        json.dump(rep, open(f"{w}/report2.json", "w"))
        r = verify("--report", f"{w}/report2.json", expect=3)
        self.assertIn("report2.json: differs from the signed report at /domains/0/metrics/outputs/0/kl", r.stderr)
        # A changed report inside the bundle: the signature no longer verifies.
        st["predicate"]["pass"] = not st["predicate"]["pass"]
        bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(st).encode()).decode()
        json.dump(bundle, open(f"{w}/report.sigstore.json", "w"))
        self.assertIn("the signature does not verify", verify(expect=3).stderr)


if __name__ == "__main__":
    unittest.main()
