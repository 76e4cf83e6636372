#!/usr/bin/env python3
"""Per-expert accounting of a Mixture-of-Experts model in `slim serve --energy` (make_llm.py
--moe: qwen2moe, 3 layers, 4 experts, 2 per token, a shared expert): the
slim_llm_expert_* counters grow by exactly the routing of the requests sent (k per token
and layer, the shared expert every token), FLOPs and joules follow, the experts' joules add
up to the model's energy counter and to the requests' usage.energy, and the exposition
passes promtool; `usage.experts` over curl and the openai npm client's JSON; `slim report
energy --by expert` on the live scrape, exact tables of fixed fixtures (a scrape and a
`slim generate --json`), and its refusals."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_harness import Server, slim_command  # noqa: E402

FRA = 44.18  # g/kWh, the bundled table's France
L, E, K = 3, 4, 2
PROMPTS = ["Once upon a time", "The cat sat on the mat", "In a hole in the ground", "hello there"]


def series(text, name):
    """{(layer, expert): value} of one family."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels = dict(kv.split("=", 1) for kv in line[len(name) + 1:line.index("}")].split(","))
            labels = {k: v.strip('"') for k, v in labels.items()}
            out[(labels["layer"], labels["expert"])] = float(line.rsplit(" ", 1)[1])
    return out


def delta(after, before):
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def report(*args):
    return subprocess.run(slim_command("report", "energy", *args), capture_output=True, text=True)


class ServedExpertsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="slim_serve_experts_")
        subprocess.run(["/usr/bin/python3", os.path.join(HERE, "make_llm.py"), cls.tmp, "--moe"], check=True)
        cls.srv = Server(["--model", os.path.join(cls.tmp, "chat-moe.gguf"), "--model-name", "moe", "--host",
                          "127.0.0.1", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--threads",
                          "2", "--energy", "--region", "FRA", "--pue", "1.5"])

    @classmethod
    def tearDownClass(cls):
        rc = cls.srv.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        assert rc == 0, "slim serve exited %d after SIGTERM" % rc

    def metrics(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.srv.metrics_port) as r:
            return r.read().decode()

    def curl(self, body):
        p = subprocess.run(["curl", "-s", "-H", "Content-Type: application/json", "-d", json.dumps(body),
                            self.srv.url("/v1/completions")], capture_output=True, text=True, check=True)
        return json.loads(p.stdout)

    def test_counters_grow_by_the_routing_of_the_requests(self):
        before = self.metrics()
        usages = []
        for prompt in PROMPTS:  # one at a time: each step holds one request
            r = self.curl({"model": "moe", "prompt": prompt, "max_tokens": 6, "temperature": 0, "slim_energy": True})
            usages.append(r["usage"])
        after = self.metrics()
        routed = delta(series(after, "slim_llm_expert_routed_tokens_total"),
                       series(before, "slim_llm_expert_routed_tokens_total"))
        flops = delta(series(after, "slim_llm_expert_flops_total"), series(before, "slim_llm_expert_flops_total"))
        joules = delta(series(after, "slim_llm_expert_joules_total"), series(before, "slim_llm_expert_joules_total"))
        grams = delta(series(after, "slim_llm_expert_carbon_grams_total"),
                      series(before, "slim_llm_expert_carbon_grams_total"))
        self.assertEqual(len(routed), L * (E + 1))  # a series per layer and expert, the shared one too
        self.assertEqual(set(joules), set(routed) | {("all", "other")})
        evaluated = 0
        for u in usages:
            x = u["experts"]
            # Every token evaluated (the prompt, then each generated token but the last) goes
            # to k experts in each layer.
            self.assertEqual(u["prompt_tokens_details"]["cached_tokens"], 0)
            self.assertEqual(x["evaluated_tokens"], u["prompt_tokens"] + u["completion_tokens"] - 1)
            self.assertEqual([sum(layer) for layer in x["routed"]], [x["evaluated_tokens"] * K] * L)
            evaluated += x["evaluated_tokens"]
            # The request's energy split by FLOPs adds up to its energy.
            parts = sum(x["expert_j"]) + x["shared_j"] + x["other_j"]
            self.assertAlmostEqual(parts / u["energy"]["joules"], 1, places=9)
            self.assertEqual(x["energy_basis"], u["energy"]["source"])
            self.assertAlmostEqual(x["total_flops"], sum(x["expert_flops"]) + x["shared_flops"] + x["other_flops"])
        # The counters grew by exactly the requests' routing.
        for l in range(L):
            for e in range(E):
                self.assertEqual(routed[(str(l), str(e))], sum(u["experts"]["routed"][l][e] for u in usages))
            self.assertEqual(routed[(str(l), "shared")], evaluated)
        for e in range(E):
            self.assertAlmostEqual(sum(flops[(str(l), str(e))] for l in range(L)) /
                                   sum(u["experts"]["expert_flops"][e] for u in usages), 1, places=12)
        self.assertAlmostEqual(flops[("all", "other")] / sum(u["experts"]["other_flops"] for u in usages), 1,
                               places=12)
        # The counters split each step's energy by that step's FLOPs, a request's usage its
        # whole energy by its FLOPs (as slim generate does): they agree in total.
        for k, f in flops.items():
            self.assertEqual(joules[k] > 0, f > 0, k)
        # The experts' joules are the model's energy counter's growth and the requests' energy.
        energy = model_joules(after) - model_joules(before)
        self.assertAlmostEqual(sum(joules.values()) / energy, 1, places=9)
        self.assertAlmostEqual(sum(joules.values()) / sum(u["energy"]["joules"] for u in usages), 1, places=9)
        # gCO2e = kWh x g/kWh x PUE, series by series.
        for k, j in joules.items():
            if j > 0:
                self.assertAlmostEqual(grams[k] / (j / 3.6e6 * FRA * 1.5), 1, places=9)

    def test_no_experts_in_usage_unless_asked(self):
        r = self.curl({"model": "moe", "prompt": "hi", "max_tokens": 2})
        self.assertNotIn("experts", r["usage"])
        self.assertNotIn("energy", r["usage"])

    def test_metrics_pass_promtool(self):
        self.curl({"model": "moe", "prompt": "hi", "max_tokens": 2})
        text = self.metrics()
        promtool = os.environ.get("SLIM_PROMTOOL", "promtool")
        p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn('slim_llm_expert_carbon_grams_total{model="moe",version="1",layer="2",expert="shared",'
                      'source="', text)

    def test_report_by_expert_on_the_scrape(self):
        self.curl({"model": "moe", "prompt": "a b c", "max_tokens": 3})
        text = self.metrics()
        path = os.path.join(self.tmp, "metrics.txt")
        with open(path, "w") as f:
            f.write(text)
        out, png = os.path.join(self.tmp, "experts.json"), os.path.join(self.tmp, "experts.png")
        p = report(path, "--by", "expert", "--region", "FRA", "--json", out, "--png", png)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.splitlines()[0].split(),
                         ["model", "expert", "region", "count", "compute", "energy", "per", "unit", "carbon", "per",
                          "unit", "source"])
        with open(out) as f:
            rows = json.load(f)["rows"]
        self.assertEqual([r["expert"] for r in rows], ["0", "1", "2", "3", "shared", "other"])
        routed = series(text, "slim_llm_expert_routed_tokens_total")
        joules = series(text, "slim_llm_expert_joules_total")
        for r in rows[:4]:
            self.assertEqual(r["count"], sum(routed[(str(l), r["expert"])] for l in range(L)))
            self.assertAlmostEqual(r["joules"], sum(joules[(str(l), r["expert"])] for l in range(L)), places=15)
            # Priced again for FRA with the scrape's PUE.
            self.assertAlmostEqual(r["gco2e"] / (r["joules"] / 3.6e6 * FRA * 1.5), 1, places=9)
        with open(png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


def model_joules(text):
    """slim_energy_joules_total of the model, summed over priorities."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("slim_energy_joules_total{") and 'model="moe"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


SCRAPE = """# TYPE slim_llm_expert_routed_tokens_total counter
slim_llm_expert_routed_tokens_total{model="moe",version="1",layer="0",expert="10"} 30
slim_llm_expert_routed_tokens_total{model="moe",version="1",layer="1",expert="10"} 10
slim_llm_expert_routed_tokens_total{model="moe",version="1",layer="0",expert="2"} 10
slim_llm_expert_routed_tokens_total{model="moe",version="1",layer="1",expert="2"} 30
slim_llm_expert_routed_tokens_total{model="moe",version="1",layer="0",expert="shared"} 20
slim_llm_expert_routed_tokens_total{model="moe",version="1",layer="1",expert="shared"} 20
# TYPE slim_llm_expert_flops_total counter
slim_llm_expert_flops_total{model="moe",version="1",layer="0",expert="10"} 3e6
slim_llm_expert_flops_total{model="moe",version="1",layer="1",expert="10"} 1e6
slim_llm_expert_flops_total{model="moe",version="1",layer="0",expert="2"} 1e6
slim_llm_expert_flops_total{model="moe",version="1",layer="1",expert="2"} 3e6
slim_llm_expert_flops_total{model="moe",version="1",layer="0",expert="shared"} 2e6
slim_llm_expert_flops_total{model="moe",version="1",layer="1",expert="shared"} 2e6
slim_llm_expert_flops_total{model="moe",version="1",layer="all",expert="other"} 6e6
# TYPE slim_llm_expert_joules_total counter
slim_llm_expert_joules_total{model="moe",version="1",layer="0",expert="10",source="estimated"} 0.3
slim_llm_expert_joules_total{model="moe",version="1",layer="1",expert="10",source="estimated"} 0.1
slim_llm_expert_joules_total{model="moe",version="1",layer="0",expert="2",source="estimated"} 0.1
slim_llm_expert_joules_total{model="moe",version="1",layer="1",expert="2",source="estimated"} 0.3
slim_llm_expert_joules_total{model="moe",version="1",layer="0",expert="shared",source="estimated"} 0.2
slim_llm_expert_joules_total{model="moe",version="1",layer="1",expert="shared",source="estimated"} 0.2
slim_llm_expert_joules_total{model="moe",version="1",layer="all",expert="other",source="estimated"} 0.6
# TYPE slim_llm_expert_carbon_grams_total counter
slim_llm_expert_carbon_grams_total{model="moe",version="1",layer="0",expert="10",source="estimated",region="FRA"} 3e-6
slim_llm_expert_carbon_grams_total{model="moe",version="1",layer="1",expert="10",source="estimated",region="FRA"} 1e-6
slim_llm_expert_carbon_grams_total{model="moe",version="1",layer="0",expert="2",source="estimated",region="FRA"} 1e-6
slim_llm_expert_carbon_grams_total{model="moe",version="1",layer="1",expert="2",source="estimated",region="FRA"} 3e-6
slim_llm_expert_carbon_grams_total{model="moe",version="1",layer="0",expert="shared",source="estimated",region="FRA"} 2e-6
slim_llm_expert_carbon_grams_total{model="moe",version="1",layer="1",expert="shared",source="estimated",region="FRA"} 2e-6
slim_llm_expert_carbon_grams_total{model="moe",version="1",layer="all",expert="other",source="estimated",region="FRA"} 6e-6
# TYPE slim_carbon_pue gauge
slim_carbon_pue 1
"""

SCRAPE_TABLE = """\
model  expert  region  count      compute  energy  per unit  carbon    per unit    source
moe    2       FRA     40 tokens  4 MFLOP  400 mJ  10 mJ     4 ugCO2e  100 ngCO2e  estimated
moe    10      FRA     40 tokens  4 MFLOP  400 mJ  10 mJ     4 ugCO2e  100 ngCO2e  estimated
moe    shared  FRA     40 tokens  4 MFLOP  400 mJ  10 mJ     4 ugCO2e  100 ngCO2e  estimated
moe    other   FRA     -          6 MFLOP  600 mJ  -         6 ugCO2e  -           estimated
"""

# Two requests of `slim generate --expert-stats --energy --json` (2 layers, 2 experts, k 1,
# a shared expert), trimmed to what the report reads.
GENERATE = {
    "model": "dir/moe.gguf",
    "requests": [
        {"energy": {"prefill": {"work_j": 0.5, "basis": "estimated", "region": "DEU", "pue": 1.0}},
         "experts": {"evaluated_tokens": 5, "routed": [[3, 2], [1, 4]], "expert_flops": [4e3, 6e3],
                     "shared_flops": 1e4, "other_flops": 2e4, "total_flops": 4e4, "energy_basis": "estimated",
                     "expert_j": [0.04, 0.06], "expert_gco2e": [4e-6, 6e-6], "shared_j": 0.1, "shared_gco2e": 1e-5,
                     "other_j": 0.2, "other_gco2e": 2e-5}},
        {"energy": {"prefill": {"work_j": 0.5, "basis": "estimated", "region": "DEU", "pue": 1.0}},
         "experts": {"evaluated_tokens": 5, "routed": [[5, 0], [5, 0]], "expert_flops": [1e4, 0],
                     "shared_flops": 1e4, "other_flops": 2e4, "total_flops": 4e4, "energy_basis": "estimated",
                     "expert_j": [0.1, 0], "expert_gco2e": [1e-5, 0], "shared_j": 0.1, "shared_gco2e": 1e-5,
                     "other_j": 0.2, "other_gco2e": 2e-5}}],
    "moe": {"cumulative": {"evaluated_tokens": 10, "routed": [[8, 2], [6, 4]]}},
}

GENERATE_TABLE = """\
model     expert  region  count      compute   energy  per unit  carbon     per unit  source
moe.gguf  0       DEU     14 tokens  14 kFLOP  140 mJ  10 mJ     14 ugCO2e  1 ugCO2e  estimated
moe.gguf  1       DEU     6 tokens   6 kFLOP   60 mJ   10 mJ     6 ugCO2e   1 ugCO2e  estimated
moe.gguf  shared  DEU     20 tokens  20 kFLOP  200 mJ  10 mJ     20 ugCO2e  1 ugCO2e  estimated
moe.gguf  other   DEU     -          40 kFLOP  400 mJ  -         40 ugCO2e  -         estimated
"""


class ReportByExpertTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="slim_report_experts_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text if isinstance(text, str) else json.dumps(text))
        return path

    def test_exact_table_of_a_scrape(self):
        p = report(self.write("m.txt", SCRAPE), "--by", "expert")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, SCRAPE_TABLE)
        out = os.path.join(self.tmp, "fra.json")
        p = report(self.write("m.txt", SCRAPE), "--by", "expert", "--region", "FRA", "--json", out)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(out) as f:
            rows = json.load(f)["rows"]
        self.assertEqual([(r["expert"], r["count"], r["flops"], r["joules"]) for r in rows],
                         [("2", 40, 4e6, 0.4), ("10", 40, 4e6, 0.4), ("shared", 40, 4e6, 0.4),
                          ("other", 0, 6e6, 0.6)])
        for r in rows:
            self.assertAlmostEqual(r["gco2e"] / (r["joules"] / 3.6e6 * FRA), 1, places=12)

    def test_exact_table_of_a_generate_json(self):
        p = report(self.write("g.json", GENERATE), "--by", "expert")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, GENERATE_TABLE)

    def test_refusals_name_the_problem(self):
        dense = self.write("dense.txt", 'slim_energy_joules_total{model="m",version="1",priority="0",'
                                        'source="estimated"} 1\n')
        no_energy = self.write("noenergy.txt", "\n".join(
            l for l in SCRAPE.splitlines() if "joules" not in l and "carbon_grams" not in l) + "\n")
        no_energy_json = dict(GENERATE)
        no_energy_json["requests"] = [{"experts": {"evaluated_tokens": 1, "routed": [[1]], "expert_flops": [1]}}]
        broken = dict(GENERATE)
        broken["requests"] = [{"experts": {"routed": [[1]], "expert_flops": [1], "expert_j": [1]}}]
        cases = [
            ([dense], "--by expert: %s has no slim_llm_expert_* series (`slim serve` writes them for "
                      "Mixture-of-Experts language models)" % dense),
            ([no_energy], "--by expert: %s has no slim_llm_expert_joules_total series: the server ran without "
                          "--energy" % no_energy),
            ([self.write("bench.json", {"model": "m.onnx", "run": {"work_j": 1, "basis": "estimated"}})],
             "--by expert: %s has no expert statistics: write it with `slim generate --energy --json` on a "
             "Mixture-of-Experts model" % os.path.join(self.tmp, "bench.json")),
            ([self.write("ne.json", no_energy_json)],
             "--by expert: %s has expert statistics without energy: write it with --energy"
             % os.path.join(self.tmp, "ne.json")),
        ]
        for args, message in cases:
            p = report(*args, "--by", "expert")
            self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
            self.assertEqual(p.stderr.strip(), "slim: error [invalid_argument]: " + message)
        p = report(self.write("broken.json", broken), "--by", "expert")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("malformed expert statistics", p.stderr)


if __name__ == "__main__":
    unittest.main()
