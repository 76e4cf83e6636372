#!/usr/bin/env python3
"""slim serve running unattended: repository polling with hot swaps under load, versions
still being written left alone, the signature gate, integrity self-healing, rollback, and
the audit trail (verified with `slim audit`, also after kill -9). The server runs on free
loopback ports; the models come from make_repository.py (`plain`: y = x + 1 in version 1,
y = x + 2 in version 2, so the answer tells which version served). Run by ctest with
SLIM_BINARY_DIR set to the build folder.
"""
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_harness import audit_events, clients, request, slim_command, start_server, wait_for  # noqa: E402

FIXTURES = tempfile.mkdtemp(prefix="slim_ops_fixtures_")
subprocess.run(["/usr/bin/python3", os.path.join(HERE, "make_repository.py"), FIXTURES], check=True,
               stdout=subprocess.DEVNULL)
PLAIN = os.path.join(FIXTURES, "plain")


def slim(*args, check=True):
    p = subprocess.run(slim_command(*args), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError("slim %s failed (%d): %s" % (" ".join(args), p.returncode, p.stderr))
    return p


def new_repo(versions=(1,)):
    repo = tempfile.mkdtemp(prefix="slim_ops_repo_")
    os.makedirs(os.path.join(repo, "plain"))
    with open(os.path.join(PLAIN, "config.pbtxt")) as f:  # served: the newest version only
        config = f.read().replace("version_policy: { all { } }", "version_policy: { latest { num_versions: 1 } }")
    with open(os.path.join(repo, "plain", "config.pbtxt"), "w") as f:
        f.write(config)
    for v in versions:
        add_version(repo, v, source=v)
    shutil.copytree(os.path.join(FIXTURES, "forest"), os.path.join(repo, "forest"))
    return repo


def add_version(repo, version, source):
    """Version `version` of plain with the model of fixture version `source`, written to a
    temporary folder and moved in whole."""
    tmp = os.path.join(repo, ".incoming-%d" % version)
    os.makedirs(tmp)
    shutil.copy(os.path.join(PLAIN, str(source), "model.onnx"), os.path.join(tmp, "model.onnx"))
    os.rename(tmp, os.path.join(repo, "plain", str(version)))
    return os.path.join(repo, "plain", str(version))




def infer_plain(srv):
    """The served version's offset (1 or 2), from y = x + offset."""
    status, r = request(srv, "/v2/models/plain/infer",
                        {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [0] * 6}]})
    if status != 200:
        raise RuntimeError("infer failed: %d %s" % (status, r))
    return round(r["outputs"][0]["data"][0])


def served_versions(srv):
    return request(srv, "/v2/models/plain")[1].get("versions")






class Polling(unittest.TestCase):
    def test_hot_swaps_under_load_and_unsettled_versions_wait(self):
        repo = new_repo()
        log = os.path.join(repo, "..", os.path.basename(repo) + ".audit")
        with start_server(repo, ["--model-control-mode", "poll", "--repository-poll-secs", "1",
                                 "--audit-log", log, "--threads", "2"]) as srv:
            self.assertEqual(infer_plain(srv), 1)
            # A file touched, or written again with the same bytes, does not reload the model:
            # after the names, sizes and times, the content decides.
            model1 = os.path.join(repo, "plain", "1", "model.onnx")
            shutil.copy(model1, model1 + ".new")
            os.utime(model1 + ".new", (time.time() + 60, time.time() + 60))
            os.replace(model1 + ".new", model1)
            time.sleep(3.5)  # three polls
            self.assertEqual([e["event"] for e in audit_events(log, "plain")], ["model.load"])
            with clients(lambda: infer_plain(srv)) as (seen, failures):
                add_version(repo, 2, source=2)
                wait_for(lambda: served_versions(srv) == ["2"], what="version 2 to serve")
                time.sleep(0.3)
            self.assertEqual(failures, [])
            self.assertEqual(seen, {1, 2})
            self.assertEqual(infer_plain(srv), 2)

            # Version 3 arrives slowly: its file keeps changing for longer than two polls.
            v3 = os.path.join(repo, "plain", "3")
            os.makedirs(v3)
            good = open(os.path.join(PLAIN, "1", "model.onnx"), "rb").read()
            with open(os.path.join(v3, "model.onnx"), "wb") as f:
                for i in range(8):
                    f.write(good[i * len(good) // 8:(i + 1) * len(good) // 8])
                    f.flush()
                    time.sleep(0.4)
                    self.assertEqual(served_versions(srv), ["2"])
            wait_for(lambda: served_versions(srv) == ["3"], what="version 3 once written")
            self.assertEqual(infer_plain(srv), 1)

            # Rollback by hand restores the version served before.
            status, _ = request(srv, "/v2/repository/models/plain/rollback", {})
            self.assertEqual(status, 200)
            self.assertEqual(served_versions(srv), ["2"])
            self.assertEqual(infer_plain(srv), 2)
            status, r = request(srv, "/v2/repository/models/forest/rollback", {})
            self.assertEqual(status, 404)
            self.assertIn("no earlier version", r["error"])

            # A model folder removed from the repository is unloaded.
            shutil.rmtree(os.path.join(repo, "forest"))
            wait_for(lambda: request(srv, "/v2/models/forest/ready")[0] != 200, what="forest to unload")
            self.assertEqual(srv.stop(), 0)
        events = [(e["event"], e["model"].get("version", "")) for e in audit_events(log, "plain")]
        self.assertEqual(events, [("model.load", "1"), ("model.update", "2"), ("model.update", "3"),
                                  ("model.rollback", "2")])
        self.assertTrue(all(e["model"]["digest"].startswith("sha256:") for e in audit_events(log, "plain")))
        self.assertEqual(audit_events(log, "forest")[-1]["event"], "model.unload")
        self.assertEqual(slim("audit", "verify", log).returncode, 0)


class Canary(unittest.TestCase):
    def trial(self, bounds):
        """Version 2 (y = x + 2) on trial beside version 1 for half the requests for 2 s;
        returns the offsets seen during the trial, after it, and the audit records."""
        repo = new_repo()
        with open(os.path.join(repo, "plain", "config.pbtxt"), "a") as f:
            for k, v in dict(canary_share="0.5", canary_window_secs="2", **bounds).items():
                f.write('parameters { key: "%s" value: { string_value: "%s" } }\n' % (k, v))
        log = os.path.join(tempfile.mkdtemp(), "audit.log")
        with start_server(repo, ["--model-control-mode", "poll", "--repository-poll-secs", "1",
                                 "--audit-log", log]) as srv:
            add_version(repo, 2, source=2)
            wait_for(lambda: any(e["event"] == "model.canary_started" for e in audit_events(log, "plain")),
                     what="the trial")
            during = [infer_plain(srv) for _ in range(40)]
            wait_for(lambda: audit_events(log, "plain")[-1]["event"].startswith("model.canary_") and
                     audit_events(log, "plain")[-1]["event"] != "model.canary_started", what="the decision")
            after = {infer_plain(srv) for _ in range(10)}
            self.assertEqual(srv.stop(), 0)
        return during, after, audit_events(log, "plain")

    def test_a_canary_within_bounds_is_promoted(self):
        during, after, events = self.trial({"canary_max_p99_ratio": "1000"})
        self.assertEqual(sorted(set(during)), [1, 2])
        self.assertEqual(during.count(2), 20)  # every other request
        self.assertEqual(after, {2})
        d = events[-1]
        self.assertEqual(d["event"], "model.canary_promoted")
        self.assertEqual(d["details"]["errors"], [0, 0])
        self.assertGreaterEqual(d["details"]["requests"][1], 20)

    def test_a_canary_beyond_its_bounds_is_rolled_back(self):
        during, after, events = self.trial({"canary_max_p99_ratio": "0"})
        self.assertEqual(sorted(set(during)), [1, 2])
        self.assertEqual(after, {1})
        self.assertEqual(events[-1]["event"], "model.canary_rolled_back")
        self.assertEqual(events[-1]["details"]["reason"], "its p99 latency is above the bound")


def add_parameters(config_path, params):
    with open(config_path, "a") as f:
        for k, v in params.items():
            f.write('parameters { key: "%s" value: { string_value: "%s" } }\n' % (k, v))


class CanaryReference(unittest.TestCase):
    """A config that names a reference input set: the new version runs it beside the
    serving one before its trial, and is dropped at once when its outputs disagree."""

    def test_a_new_version_that_disagrees_on_the_reference_set_is_rolled_back_at_once(self):
        repo = new_repo()
        np.savez(os.path.join(repo, "plain", "reference.npz"),
                 x=np.arange(18, dtype=np.float32).reshape(3, 2, 3))  # 3 samples, one request each
        add_parameters(os.path.join(repo, "plain", "config.pbtxt"),
                       {"canary_share": "0.5", "canary_window_secs": "60", "canary_reference": "reference.npz"})
        log = os.path.join(tempfile.mkdtemp(), "audit.log")
        with start_server(repo, ["--model-control-mode", "poll", "--repository-poll-secs", "1",
                                 "--audit-log", log]) as srv:
            add_version(repo, 2, source=2)  # y = x + 2 against y = x + 1
            wait_for(lambda: audit_events(log, "plain")[-1]["event"] == "model.canary_rolled_back",
                     what="the rollback")
            self.assertEqual({infer_plain(srv) for _ in range(10)}, {1})  # no request reached version 2
            self.assertEqual(served_versions(srv), ["1"])
            time.sleep(2.5)  # two more polls: the refused folder is not tried again
            self.assertEqual(srv.stop(), 0)
        events = audit_events(log, "plain")
        self.assertEqual([e["event"] for e in events], ["model.load", "model.canary_rolled_back"])
        d = events[-1]["details"]
        self.assertEqual(events[-1]["model"]["version"], "1")  # the version that serves on
        self.assertEqual(d["version"], "2")
        self.assertEqual(d["decision"], "rolled back")
        self.assertEqual(d["reason"], "its outputs disagree with the serving version's on the reference inputs: "
                                      "max abs diff 1 on output 'y' is above 0.001")
        self.assertEqual(d["reference"], {"file": "reference.npz", "rows": 3,
                                          "max_abs_diff": {"measured": 1.0, "max": 0.001, "output": "y"}})
        self.assertEqual(slim("audit", "verify", log).returncode, 0)

    def test_a_new_version_that_agrees_on_the_reference_set_runs_its_trial_and_is_promoted(self):
        # digits batches (max_batch_size 32): 40 reference rows go as chunks of 32 and 8.
        repo = tempfile.mkdtemp(prefix="slim_ops_repo_")
        shutil.copytree(os.path.join(FIXTURES, "digits"), os.path.join(repo, "digits"))
        rng = np.random.default_rng(5)
        pixels = rng.uniform(0, 16, (40, 64)).astype(np.float32)
        np.savez(os.path.join(repo, "digits", "reference.npz"), pixels=pixels)
        add_parameters(os.path.join(repo, "digits", "config.pbtxt"),
                       {"canary_share": "1", "canary_window_secs": "2", "canary_max_p99_ratio": "1000",
                        "canary_reference": "reference.npz", "canary_min_top1_agreement": "1"})
        log = os.path.join(tempfile.mkdtemp(), "audit.log")
        body = {"inputs": [{"name": "pixels", "shape": [2, 64], "datatype": "FP32",
                            "data": pixels[:2].ravel().tolist()}]}
        with start_server(repo, ["--model-control-mode", "poll", "--repository-poll-secs", "1",
                                 "--audit-log", log]) as srv:
            tmp = os.path.join(repo, ".incoming")
            shutil.copytree(os.path.join(FIXTURES, "digits", "1"), tmp)  # the same weights again
            os.rename(tmp, os.path.join(repo, "digits", "2"))
            wait_for(lambda: any(e["event"] == "model.canary_started" for e in audit_events(log, "digits")),
                     what="the trial")
            for _ in range(5):
                self.assertEqual(request(srv, "/v2/models/digits/infer", body)[0], 200)
            wait_for(lambda: audit_events(log, "digits")[-1]["event"] == "model.canary_promoted",
                     what="the promotion")
            self.assertEqual(request(srv, "/v2/models/digits")[1]["versions"], ["2"])
            self.assertEqual(srv.stop(), 0)
        events = audit_events(log, "digits")
        self.assertEqual([e["event"] for e in events], ["model.load", "model.canary_started", "model.canary_promoted"])
        agreement = {"file": "reference.npz", "rows": 40,
                     "top1_agreement": {"measured": 1.0, "min": 1.0, "output": "probabilities"}}
        self.assertEqual(events[1]["details"]["reference"], agreement)
        self.assertEqual(events[2]["details"]["reference"], agreement)

    def test_a_bad_reference_set_fails_the_load_and_the_serving_version_stays(self):
        repo = new_repo()
        log = os.path.join(tempfile.mkdtemp(), "audit.log")
        with start_server(repo, ["--model-control-mode", "poll", "--repository-poll-secs", "1",
                                 "--audit-log", log]) as srv:
            self.assertEqual(infer_plain(srv), 1)

            def refused(why):
                wait_for(lambda: any(e["event"] == "model.load_failed" and e["details"]["reason"] == why
                                     for e in audit_events(log, "plain")), what="refusal: " + why)
                self.assertEqual(request(srv, "/v2/models/plain/ready")[0], 200)
                self.assertEqual(served_versions(srv), ["1"])
                self.assertEqual(infer_plain(srv), 1)

            ref = os.path.join(repo, "plain", "reference.npz")
            np.savez(ref, x=np.zeros((2, 3, 3), np.float32))  # samples of the wrong shape
            add_parameters(os.path.join(repo, "plain", "config.pbtxt"),
                           {"canary_share": "0.5", "canary_reference": "reference.npz"})
            add_version(repo, 2, source=2)
            refused("model 'plain': parameter 'canary_reference' (reference.npz), reference row 0: "
                    "input 'x' has shape [3,3], model 'plain' expects [2,3]")
            np.savez(ref, x=np.zeros((2, 2, 3), np.float32), y=np.zeros((3,), np.float32))
            refused("model 'plain': parameter 'canary_reference' (reference.npz): arrays 'x' and 'y' "
                    "disagree on the number of samples (2 and 3)")
            np.savez_compressed(ref, x=np.zeros((2, 2, 3), np.float32))
            refused("model 'plain': parameter 'canary_reference' (reference.npz): " + ref + ": member 'x.npy' "
                    "is compressed (zip method 8); only stored members are read: write the archive with "
                    "numpy.savez, not numpy.savez_compressed")
            self.assertEqual(srv.stop(), 0)
        self.assertEqual([e["event"] for e in audit_events(log, "plain")],
                         ["model.load"] + ["model.load_failed"] * 3)


class Signatures(unittest.TestCase):
    def test_only_versions_signed_by_a_trusted_key_load(self):
        keys = tempfile.mkdtemp(prefix="slim_ops_keys_")
        key, other = os.path.join(keys, "signer"), os.path.join(keys, "stranger")
        slim("keygen", "-o", key)
        slim("keygen", "-o", other)
        repo = new_repo()
        slim("sign", os.path.join(repo, "plain", "1"), "--key", key)
        slim("sign", os.path.join(repo, "forest", "1"), "--key", key)
        log = os.path.join(keys, "audit.log")
        with start_server(repo, ["--model-control-mode", "poll", "--repository-poll-secs", "1",
                                 "--require-signature", key + ".pub", "--audit-log", log,
                                 "--audit-key", key]) as srv:
            self.assertEqual(infer_plain(srv), 1)

            def refused(version, why):
                wait_for(lambda: any(e["event"] == "model.verify_failed" and why in e["details"]["reason"]
                                     for e in audit_events(log, "plain")), what="refusal: " + why)
                self.assertEqual(served_versions(srv), ["1"])
                self.assertEqual(infer_plain(srv), 1)
                shutil.rmtree(os.path.join(repo, "plain", str(version)))

            add_version(repo, 2, source=2)  # unsigned
            refused(2, "no signature bundle")
            v = add_version(repo, 3, source=2)
            slim("sign", v, "--key", other)
            refused(3, "signed by a different key")
            tmp = tempfile.mkdtemp()
            shutil.copy(os.path.join(PLAIN, "2", "model.onnx"), tmp)
            slim("sign", tmp, "--key", key)
            with open(os.path.join(tmp, "model.onnx"), "ab") as f:
                f.write(b"\0")  # tampered after signing
            os.rename(tmp, os.path.join(repo, "plain", "4"))
            refused(4, "model.onnx")
            tmp = tempfile.mkdtemp()
            shutil.copy(os.path.join(PLAIN, "2", "model.onnx"), tmp)
            slim("sign", tmp, "--key", key)
            with open(os.path.join(tmp, "extra.bin"), "wb") as f:
                f.write(b"smuggled")
            os.rename(tmp, os.path.join(repo, "plain", "5"))
            refused(5, "extra.bin")
            v = add_version(repo, 6, source=2)
            slim("sign", v, "--key", key)
            wait_for(lambda: served_versions(srv) == ["6"], what="the signed version 6")
            self.assertEqual(infer_plain(srv), 2)
            meta = request(srv, "/v2/models/plain")[1]["slim"]
            self.assertTrue(meta["signed"])
            self.assertTrue(meta["digest"].startswith("sha256:"))
            # slim check sees the gate and the signed version.
            p = slim("check", srv.url(), "--grpc", "127.0.0.1:%d" % srv.grpc_port)
            report = json.loads(p.stdout)
            self.assertTrue(report["slim"]["require_signature"])
            (plain,) = [m for m in report["models"] if m["name"] == "plain"]
            self.assertTrue(plain["versions"][0]["signed"])
            self.assertEqual(srv.stop(), 0)
        loads = [e for e in audit_events(log, "plain") if e["event"] in ("model.load", "model.update")]
        self.assertEqual([e["details"]["versions"][0]["version"] for e in loads], ["1", "6"])
        self.assertTrue(all(e["details"]["versions"][0]["signer"] for e in loads))
        self.assertIn("audit.checkpoint", [e["event"] for e in audit_events(log)])
        self.assertEqual(slim("audit", "verify", log, "--pub", key + ".pub").returncode, 0)


    def test_every_tamper_case_of_the_trust_tests_is_refused_and_audited(self):
        """The cases of tests/trust/model_signing_test.cc, each dropped into a polled
        repository as a new version of plain: each is refused with its reason audited, and
        version 1 serves on."""
        keys = tempfile.mkdtemp(prefix="slim_ops_keys_")
        key, other = os.path.join(keys, "signer"), os.path.join(keys, "stranger")
        slim("keygen", "-o", key)
        slim("keygen", "--alg", "ed25519", "-o", other)
        repo = new_repo()
        slim("sign", os.path.join(repo, "plain", "1"), "--key", key)
        slim("sign", os.path.join(repo, "forest", "1"), "--key", key)

        def signed(extra=None):
            """A folder with version 2's model (and `extra` files), signed with `key`."""
            tmp = tempfile.mkdtemp()
            shutil.copy(os.path.join(PLAIN, "2", "model.onnx"), tmp)
            for name, data in (extra or {}).items():
                with open(os.path.join(tmp, name), "wb") as f:
                    f.write(data)
            slim("sign", tmp, "--key", key)
            return tmp

        def edit_bundle(folder, change):
            path = os.path.join(folder, "model.sig")
            with open(path) as f:
                bundle = json.load(f)
            change(bundle)
            with open(path, "w") as f:
                json.dump(bundle, f)

        def tampered_payload(bundle):
            envelope = bundle["dsseEnvelope"]
            statement = json.loads(base64.b64decode(envelope["payload"]))
            statement["subject"][0]["digest"]["sha256"] = "0" * 64
            envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()

        def wrong_payload_type(bundle):
            bundle["dsseEnvelope"]["payloadType"] = "text/plain"

        cases = []  # (what, folder, expected words in the reason)
        t = signed()
        with open(os.path.join(t, "model.onnx"), "r+b") as f:
            f.seek(10)
            f.write(b"\xff")
        cases.append(("a changed byte", t, "model.onnx"))
        t = signed({"notes.txt": b"v2"})
        os.rename(os.path.join(t, "notes.txt"), os.path.join(t, "notes.md"))
        cases.append(("a renamed file", t, "notes.txt"))
        t = signed({"notes.txt": b"v2"})
        os.remove(os.path.join(t, "notes.txt"))
        cases.append(("a removed file", t, "notes.txt"))
        t = signed()
        with open(os.path.join(t, "extra.bin"), "wb") as f:
            f.write(b"smuggled")
        cases.append(("an added file", t, "extra.bin"))
        t = signed()
        shutil.copy(os.path.join(repo, "forest", "1", "model.sig"), os.path.join(t, "model.sig"))
        cases.append(("a valid signature over another model", t, "model.onnx"))
        t = signed()
        os.remove(os.path.join(t, "model.sig"))
        slim("sign", t, "--key", other)
        cases.append(("the wrong key", t, "signed by a different key"))
        t = signed()
        edit_bundle(t, tampered_payload)
        cases.append(("a payload changed without re-signing", t, "signature does not verify"))
        t = signed()
        edit_bundle(t, wrong_payload_type)
        cases.append(("another payload type", t, "signature does not verify"))
        t = signed()
        with open(os.path.join(t, "model.sig"), "w") as f:
            f.write("{not json")
        cases.append(("a malformed bundle", t, "model.sig"))
        t = tempfile.mkdtemp()
        shutil.copy(os.path.join(PLAIN, "2", "model.onnx"), t)
        cases.append(("no bundle", t, "no signature bundle"))

        log = os.path.join(keys, "audit.log")
        with start_server(repo, ["--model-control-mode", "poll", "--repository-poll-secs", "1",
                                 "--require-signature", key + ".pub", "--audit-log", log]) as srv:
            for version, (what, folder, why) in enumerate(cases, start=2):
                os.rename(folder, os.path.join(repo, "plain", str(version)))
                wait_for(lambda: len([e for e in audit_events(log, "plain")
                                      if e["event"] == "model.verify_failed"]) == version - 1, what=what)
                reason = [e for e in audit_events(log, "plain")
                          if e["event"] == "model.verify_failed"][-1]["details"]["reason"]
                self.assertIn(why, reason, what)
                self.assertIn("/plain/%d" % version, reason, what)
                self.assertEqual(served_versions(srv), ["1"], what)
                self.assertEqual(infer_plain(srv), 1, what)
                shutil.rmtree(os.path.join(repo, "plain", str(version)))
            self.assertEqual(srv.stop(), 0)
        events = [e["event"] for e in audit_events(log, "plain")]
        self.assertEqual(events, ["model.load"] + ["model.verify_failed"] * len(cases))


class Integrity(unittest.TestCase):
    def test_a_changed_file_takes_the_model_out_until_it_verifies_again(self):
        repo = new_repo()
        log = os.path.join(tempfile.mkdtemp(), "audit.log")
        model = os.path.join(repo, "plain", "1", "model.onnx")
        original = open(model, "rb").read()
        with start_server(repo, ["--integrity-interval-secs", "1", "--audit-log", log]) as srv:
            self.assertEqual(infer_plain(srv), 1)
            with open(model, "r+b") as f:
                f.seek(len(original) // 2)
                f.write(b"\xff\xff\xff\xff")
            t0 = time.monotonic()
            wait_for(lambda: request(srv, "/v2/models/plain/ready")[0] != 200, timeout=10, what="quarantine")
            self.assertLess(time.monotonic() - t0, 2.5)  # one interval plus a second
            status, r = request(srv, "/v2/models/plain/infer",
                                {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [0] * 6}]})
            self.assertEqual(status, 503)
            self.assertIn("failed its integrity check: model.onnx changed", r["error"])
            self.assertEqual(request(srv, "/v2/health/ready")[0], 503)
            self.assertEqual(request(srv, "/v2/models/forest/ready")[0], 200)  # the others serve on
            with open(model, "wb") as f:
                f.write(original)
            wait_for(lambda: request(srv, "/v2/models/plain/ready")[0] == 200, timeout=10, what="restore")
            self.assertEqual(infer_plain(srv), 1)
            self.assertEqual(srv.stop(), 0)
        self.assertEqual([e["event"] for e in audit_events(log, "plain")],
                         ["model.load", "integrity.violation", "model.load", "model.restored"])


class AuditSurvivesKill(unittest.TestCase):
    def test_kill_9_mid_update_leaves_a_verifiable_chain(self):
        repo = new_repo()
        log = os.path.join(tempfile.mkdtemp(), "audit.log")
        srv = start_server(repo, ["--model-control-mode", "poll", "--repository-poll-secs", "1", "--audit-log", log])
        add_version(repo, 2, source=2)
        wait_for(lambda: any(e["event"] == "model.update" for e in audit_events(log)), what="the update")
        add_version(repo, 3, source=1)
        time.sleep(1.5)  # the next load may be under way
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait()
        self.assertEqual(slim("audit", "verify", log).returncode, 0)
        # A new server continues the same chain.
        with start_server(repo, ["--audit-log", log]) as again:
            self.assertEqual(request(again, "/v2/health/ready")[0], 200)
            self.assertEqual(again.stop(), 0)
        self.assertEqual(slim("audit", "verify", log).returncode, 0)
        self.assertEqual(audit_events(log, "plain")[-1]["event"], "model.load")


if __name__ == "__main__":
    unittest.main()
