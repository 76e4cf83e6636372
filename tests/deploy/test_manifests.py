#!/usr/bin/env python3
"""The Dockerfile and deploy/ checked against the server's real interface, since nothing
here runs Docker or Kubernetes: every `slim serve` flag they pass is one `slim serve --help`
lists (with a value it accepts), container ports are the ports the flags set, probes and
the health check are routes a running server answers 200, the HPA's metric is in the
server's /metrics, selectors select the Deployment's pods, paths the flags name lie on
mounted volumes, the runtime image's package list is exactly the packages owning the
libraries `ldd` shows for the binary, and configuring without tests needs no test tools.

Run by ctest with SLIM_SOURCE_DIR and SLIM_BINARY_DIR set.
"""
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import unittest

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("SLIM_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
DEPLOY = os.path.join(SOURCE, "deploy")
sys.path.insert(0, os.path.join(SOURCE, "tests", "serve"))
import make_repository  # noqa: E402
from serve_harness import slim_command, start_server  # noqa: E402
from test_rest import curl  # noqa: E402

PORT_FLAGS = {"http": "--http-port", "grpc": "--grpc-port", "metrics": "--metrics-port"}


def serve_help():
    """{flag: (takes_value, choices or None, description)} from `slim serve --help`."""
    out = subprocess.run(slim_command("serve", "--help"), capture_output=True, text=True, check=True).stdout
    options, current = {}, None
    for line in out.splitlines()[out.splitlines().index("Options:") + 1:]:
        m = re.match(r"^  (-\S+)(?: (\S+))?\s*(.*)$", line)
        if m:
            names = [n for n in m.group(1).split(",") if n.startswith("--")]
            typ = m.group(2) or ""
            choices = re.search(r"\{([^}]*)\}", typ)
            current = {"value": bool(typ), "choices": set(choices.group(1).split(",")) if choices else None,
                       "text": m.group(3)}
            for n in names:
                options[n] = current
        elif current is not None:
            current["text"] += " " + line.strip()
    return options


def load_yaml():
    """Every document of every YAML file under deploy/: [(relative path, document)]."""
    docs = []
    for path in sorted(glob.glob(os.path.join(DEPLOY, "**", "*.yaml"), recursive=True)):
        with open(path) as f:
            docs += [(os.path.relpath(path, DEPLOY), d) for d in yaml.safe_load_all(f) if d is not None]
    return docs


def parse_dockerfile(path):
    """[(instruction, argument text)], continuation lines joined, comments dropped."""
    out, pending = [], ""
    with open(path) as f:
        for line in f:
            if line.lstrip().startswith("#"):
                continue
            pending += line.rstrip("\n")
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            if pending.strip():
                word, _, rest = pending.strip().partition(" ")
                out.append((word.upper(), rest.strip()))
            pending = ""
    return out


def exec_form(text):
    """A Dockerfile's JSON (exec) form, or its shell form split like a shell."""
    return json.loads(text) if text.startswith("[") else shlex.split(text)


class DeployTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.help = serve_help()
        cls.docs = load_yaml()
        cls.dockerfile = parse_dockerfile(os.path.join(SOURCE, "Dockerfile"))

    def kind(self, kind):
        found = [d for _, d in self.docs if d.get("kind") == kind]
        self.assertEqual(len(found), 1, "deploy/ should hold exactly one %s" % kind)
        return found[0]

    def serve_flags(self, args, where):
        """Checks ARGS (`serve` then its flags) against --help; returns {flag: value}."""
        self.assertEqual(args[0], "serve", where)
        flags, i = {}, 1
        while i < len(args):
            token = args[i]
            self.assertTrue(token.startswith("--"), "%s: %r is not a flag" % (where, token))
            name, eq, value = token.partition("=")
            known = self.help.get(name)
            if not eq and (known["value"] if known else i + 1 < len(args) and not args[i + 1].startswith("--")):
                i += 1
                value = args[i]
            flags[name] = value if (eq or known is None or known["value"]) else True
            i += 1
        for name, value in flags.items():
            with self.subTest(where=where, flag=name):
                known = self.help.get(name)
                if known is None:
                    self.fail("%s: `slim serve --help` lists no %s" % (where, name))
                if known["choices"] is not None and value not in known["choices"]:
                    self.fail("%s: %s %s is none of %s" % (where, name, value, sorted(known["choices"])))
        return flags

    def port(self, flags, door):
        """The port FLAGS make a front door listen on: the flag's value or --help's default."""
        flag = PORT_FLAGS[door]
        if flag in flags:
            return int(flags[flag])
        return int(re.search(r"default (\d+)", self.help[flag]["text"]).group(1))

    def check_container(self, container, volumes, where):
        """A Deployment's or ServingRuntime's container: flags, non-root read-only root
        filesystem, resources, env the args refer to, and the flags' paths on volumes."""
        flags = self.serve_flags(container["args"], where)
        for ref in re.findall(r"\$\((\w+)\)", " ".join(container["args"])):
            self.assertIn(ref, [e["name"] for e in container.get("env", [])], "%s: $(%s) is not set" % (where, ref))
        sc = container["securityContext"]
        self.assertTrue(sc["readOnlyRootFilesystem"], where)
        self.assertFalse(sc["allowPrivilegeEscalation"], where)
        self.assertEqual(sc["capabilities"]["drop"], ["ALL"], where)
        res = container["resources"]
        for r in ("cpu", "memory"):
            self.assertIn(r, res["requests"], where)
            self.assertIn(r, res["limits"], where)
        mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
        by_name = {v["name"]: v for v in volumes}
        for flag in ("--model-repository", "--require-signature", "--audit-log"):
            if flag not in flags:
                continue
            path = flags[flag]
            mount = [m for p, m in mounts.items() if path == p or path.startswith(p.rstrip("/") + "/")]
            if flag == "--model-repository" and path == "/mnt/models":
                continue  # KServe's storage initializer mounts it
            self.assertTrue(mount, "%s: %s %s is on no mounted volume (the root is read-only)" % (where, flag, path))
            volume = by_name[mount[0]["name"]]
            if flag == "--require-signature":
                self.assertIn("secret", volume, "%s: the signer key comes from a Secret" % where)
            if flag == "--audit-log":
                self.assertFalse(mount[0].get("readOnly", False), "%s: the audit log's volume is writable" % where)
        return flags

    # -- the Dockerfile

    def test_dockerfile(self):
        stages, current = [], None
        for word, arg in self.dockerfile:
            if word == "FROM":
                current = {"from": arg, "steps": []}
                stages.append(current)
            else:
                current["steps"].append((word, arg))
        self.assertGreaterEqual(len(stages), 2, "a multi-stage build")
        build, runtime = stages[0], stages[-1]
        self.assertEqual(build["from"].split(), ["debian:12", "AS", "build"])
        runs = " ".join(a for w, a in build["steps"] if w == "RUN")
        self.assertIn("scripts/setup.sh --build", runs)
        self.assertIn("-DSLIM_BUILD_TESTS=OFF", runs)
        self.assertIn("--target slim", runs)

        self.assertEqual(runtime["from"], "debian:12-slim")
        steps = runtime["steps"]
        one = lambda word: [a for w, a in steps if w == word]  # noqa: E731
        self.assertIn("--from=build /build/tools/slim /usr/local/bin/slim", one("COPY"))
        self.assertTrue(any("deploy/runtime-packages.txt" in a for a in one("COPY")),
                        "the runtime stage installs deploy/runtime-packages.txt")
        install = " ".join(one("RUN"))
        self.assertRegex(install, r"apt-get install .*curl .*runtime-packages\.txt")
        self.assertRegex(install, r"useradd .*--uid 10001 .*slim")
        self.assertEqual(one("USER"), ["10001"], "the server runs as the non-root user")

        self.assertEqual(one("ENTRYPOINT"), ['["slim"]'])
        flags = self.serve_flags(exec_form(one("CMD")[0]), "Dockerfile CMD")
        self.assertEqual(one("VOLUME"), [flags["--model-repository"]])
        self.assertEqual(sorted(int(p) for p in one("EXPOSE")[0].split()),
                         sorted(self.port(flags, d) for d in PORT_FLAGS))
        health = one("HEALTHCHECK")
        self.assertEqual(len(health), 1)
        self.assertIn("CMD curl -fsS -o /dev/null http://127.0.0.1:%d/v2/health/ready" % self.port(flags, "http"),
                      health[0])

    # -- Kubernetes

    def test_kustomization_lists_every_manifest(self):
        listed = self.kind("Kustomization")["resources"]
        here = sorted(os.path.basename(p) for p in glob.glob(os.path.join(DEPLOY, "*.yaml")))
        self.assertEqual(sorted(listed + ["kustomization.yaml"]), here)

    def test_deployment(self):
        dep = self.kind("Deployment")
        pod = dep["spec"]["template"]["spec"]
        self.assertTrue(pod["securityContext"]["runAsNonRoot"])
        self.assertNotEqual(pod["securityContext"]["runAsUser"], 0)
        (container,) = pod["containers"]
        flags = self.check_container(container, pod["volumes"], "Deployment")
        self.assertEqual({p["name"]: p["containerPort"] for p in container["ports"]},
                         {d: self.port(flags, d) for d in PORT_FLAGS})
        for probe, path in (("startupProbe", "/v2/health/live"), ("livenessProbe", "/v2/health/live"),
                            ("readinessProbe", "/v2/health/ready")):
            self.assertEqual(container[probe]["httpGet"], {"path": path, "port": "http"}, probe)
        models = {v["name"]: v for v in pod["volumes"]}[
            next(m["name"] for m in container["volumeMounts"] if m["mountPath"] == flags["--model-repository"])]
        pvc = self.kind("PersistentVolumeClaim")
        self.assertEqual(models["persistentVolumeClaim"]["claimName"], pvc["metadata"]["name"])
        # SIGTERM drains for --exit-timeout-secs: the kubelet must wait longer than that.
        self.assertGreater(pod["terminationGracePeriodSeconds"], int(flags["--exit-timeout-secs"]))

    def test_selectors_select_the_pods(self):
        dep = self.kind("Deployment")
        labels = dep["spec"]["template"]["metadata"]["labels"]
        selectors = {"Deployment": dep["spec"]["selector"]["matchLabels"],
                     "Service": self.kind("Service")["spec"]["selector"],
                     "PodDisruptionBudget": self.kind("PodDisruptionBudget")["spec"]["selector"]["matchLabels"]}
        for kind, selector in selectors.items():
            self.assertTrue(selector, kind)
            self.assertLessEqual(selector.items(), labels.items(), "%s selects the Deployment's pods" % kind)
        ports = {p["name"]: p["targetPort"] for p in self.kind("Service")["spec"]["ports"]}
        self.assertEqual(ports, {d: d for d in PORT_FLAGS}, "Service ports target the named container ports")
        self.assertLess(self.kind("PodDisruptionBudget")["spec"]["minAvailable"], dep["spec"]["replicas"])

    def test_hpa_scales_on_the_adapter_metric(self):
        hpa = self.kind("HorizontalPodAutoscaler")
        self.assertEqual(hpa["apiVersion"], "autoscaling/v2")
        self.assertEqual(hpa["spec"]["scaleTargetRef"],
                         {"apiVersion": "apps/v1", "kind": "Deployment", "name": self.kind("Deployment")["metadata"]["name"]})
        (metric,) = hpa["spec"]["metrics"]
        self.assertEqual(metric["type"], "Pods")
        rules = yaml.safe_load(self.kind("ConfigMap")["data"]["config.yaml"])["rules"]
        rule = next(r for r in rules if r["name"]["as"] == metric["pods"]["metric"]["name"])
        self.assertEqual(rule["resources"]["overrides"]["pod"], {"resource": "pod"})
        self.assertTrue(rule["seriesQuery"].startswith("slim_inference_pending_requests{"))

    def test_kserve_runtime(self):
        rt = self.kind("ServingRuntime")
        self.assertEqual(rt["apiVersion"], "serving.kserve.io/v1alpha1")
        self.assertEqual({f["name"] for f in rt["spec"]["supportedModelFormats"]}, {"onnx", "xgboost", "lightgbm"})
        self.assertIn("v2", rt["spec"]["protocolVersions"])
        (container,) = rt["spec"]["containers"]
        self.assertEqual(container["name"], "kserve-container")
        flags = self.check_container(container, rt["spec"].get("volumes", []), "ServingRuntime")
        self.assertEqual(flags["--model-repository"], "/mnt/models")
        self.assertEqual([p["containerPort"] for p in container["ports"]], [self.port(flags, "http")])
        self.assertEqual(self.port(flags, "http"), 8080)
        self.assertEqual(rt["spec"]["annotations"]["prometheus.kserve.io/port"], str(self.port(flags, "metrics")))
        isvc = self.kind("InferenceService")["spec"]["predictor"]["model"]
        self.assertEqual(isvc["runtime"], rt["metadata"]["name"])
        self.assertIn(isvc["modelFormat"]["name"], {f["name"] for f in rt["spec"]["supportedModelFormats"]})

    # -- against a running server

    def test_probes_and_metric_against_the_server(self):
        pod = self.kind("Deployment")["spec"]["template"]["spec"]["containers"][0]
        paths = {pod[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe", "readinessProbe")}
        health = next(a for w, a in self.dockerfile if w == "HEALTHCHECK")
        paths.add(re.search(r"http://127\.0\.0\.1:\d+(\S+)", health).group(1))
        metric = self.kind("HorizontalPodAutoscaler")["spec"]["metrics"][0]["pods"]["metric"]["name"]
        with tempfile.TemporaryDirectory() as repo:
            subprocess.run([sys.executable, make_repository.__file__, repo], check=True)
            with start_server(repo, ["--threads", "1"]) as srv:
                for path in sorted(paths):
                    with self.subTest(path=path):
                        self.assertEqual(curl(srv.url(path)).status, 200)
                text = curl("http://127.0.0.1:%d/metrics" % srv.metrics_port).body.decode()
        self.assertRegex(text, r"(?m)^%s\{" % re.escape(metric))

    # -- the runtime image's packages and the build stage's configuration

    def test_runtime_packages_are_the_libraries_of_the_binary(self):
        if os.environ.get("SLIM_TEST_RUNNER"):
            self.skipTest("a cross build: ldd cannot read the binary (the image builds natively)")
        with open(os.path.join(DEPLOY, "runtime-packages.txt")) as f:
            listed = {line.split("#")[0].strip() for line in f} - {""}
        binary = slim_command()[-1]
        ldd = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
        needed = {}
        for path in re.findall(r"(/\S+) \(0x", ldd):
            real = os.path.realpath(path)
            candidates = [path, real] + ["/usr" + p for p in (path, real) if not p.startswith("/usr/")]
            for c in candidates:
                p = subprocess.run(["dpkg", "-S", c], capture_output=True, text=True)
                if p.returncode == 0:
                    needed[path] = p.stdout.split(":")[0].split(",")[0].strip()
                    break
            else:
                self.fail("dpkg -S knows no package that holds %s" % path)
        missing = {lib: pkg for lib, pkg in needed.items() if pkg not in listed}
        self.assertEqual(missing, {}, "libraries whose packages deploy/runtime-packages.txt lacks")
        self.assertEqual(listed - set(needed.values()), set(), "packages of no library the binary loads")

    def test_configure_without_tests_needs_no_test_tools(self):
        with tempfile.TemporaryDirectory() as build:
            p = subprocess.run(["cmake", "-S", SOURCE, "-B", build, "-G", "Ninja", "-DSLIM_BUILD_TESTS=OFF"],
                               capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            with open(os.path.join(build, "CMakeCache.txt")) as f:
                cache = f.read()
        for tool in ("SLIM_PROMTOOL", "GTest_DIR", "SLIM_QEMU_X86_64", "SLIM_VALGRIND"):
            self.assertNotIn(tool + ":", cache, "the Docker build stage has no " + tool)


if __name__ == "__main__":
    unittest.main()
