#!/usr/bin/python3
"""slim's estimate and carbon against the packages' own code: for the same CPU time, wall
time, vCPUs, memory, coefficients, country and PUE, `slim energy estimate` must give the
kWh of Cloud Carbon Footprint's ComputeEstimator and MemoryEstimator
(@cloud-carbon-footprint/core, with its cloud packages' coefficients) and the gCO2e of
those kWh at CO2.js's (@tgwf/co2) intensity, to 12 significant digits (the formulas
multiply in another order); `slim energy regions` must list CO2.js's table exactly.

The packages go into the npm cache of scripts/energy_tables.py (bench/.work/energy_npm or
SLIM_ENERGY_NPM_CACHE). Exit 77 (skipped) when the registry cannot be reached and the
cache lacks them."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import energy_tables  # noqa: E402

SLIM = os.path.join(os.environ.get("SLIM_BINARY_DIR", os.path.join(ROOT, "build")), "tools", "slim")
RUNNER = os.environ.get("SLIM_TEST_RUNNER", "").split()
REL = 1e-12

# Every microarchitecture with coefficients and the average, over countries, aggregates and PUEs.
CASES = [
    ("Cascade Lake", 10, 12.5, 4, 2, "FRA", 1.2),
    ("Skylake", 3600, 1800, 2, 0.5, "USA", 1.135),
    ("Broadwell", 0.25, 0.01, 8, 16, "DEU", 1.0),
    ("Haswell", 86400, 86400 * 3, 4, 64, "IND", 1.185),
    ("Coffee Lake", 1.5, 1.5, 1, 0, "CHN", 1.5),
    ("Sandy Bridge", 60, 7, 16, 8, "BRA", 1.1),
    ("Ivy Bridge", 7, 13, 2, 1, "AUS", 1.0),
    ("AMD EPYC 1st Gen", 42, 100, 64, 256, "WORLD", 1.3),
    ("AMD EPYC 2nd Gen", 0.001, 0.0005, 2, 0.25, "EU", 1.05),
    ("AMD EPYC 3rd Gen", 123.456, 78.9, 96, 384, "JPN", 1.12),
    ("AWS Graviton2", 30, 45, 2, 4, "SWE", 1.0),
    ("CCF average", 600, 300, 2, 3, "ZAF", 1.4),
]


def close(a, b):
    return a == b or abs(a - b) <= REL * max(abs(a), abs(b))


def slim(*args):
    p = subprocess.run(RUNNER + [SLIM] + list(args), capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        sys.exit("slim %s: exit %d: %s" % (" ".join(args), p.returncode, p.stderr.strip()))
    return p.stdout


def main():
    cache = energy_tables.default_cache()
    try:
        modules, clouds = energy_tables.ensure_packages(cache)
    except energy_tables.Unreachable as e:
        print("SKIPPED: %s (and the cache %s lacks the packages)" % (e, cache), flush=True)
        return 77
    cases = [dict(zip(("cpu_model", "seconds", "cpu_seconds", "vcpus", "memory_gb", "region", "pue"), c)) for c in CASES]
    env = dict(os.environ, NODE_PATH=modules, SLIM_CLOUD_MODULES=clouds)
    p = subprocess.run(["node", "--no-deprecation", os.path.join(HERE, "ccf_reference.js"), json.dumps(cases)],
                       capture_output=True, text=True, env=env, timeout=300)
    if p.returncode != 0:
        sys.exit("ccf_reference.js: " + p.stderr.strip()[-2000:])
    ref = json.loads(p.stdout)

    failures = []
    json_path = os.path.join(os.environ.get("SLIM_TEST_TMP", "/tmp"), "slim_energy_estimate_%d.json" % os.getpid())
    for c, r in zip(cases, ref["cases"]):
        before = len(failures)
        slim("energy", "estimate", "--cpu-model", c["cpu_model"], "--seconds", repr(c["seconds"]),
             "--cpu-seconds", repr(c["cpu_seconds"]), "--vcpus", str(c["vcpus"]), "--memory-gb", repr(c["memory_gb"]),
             "--region", c["region"], "--pue", repr(c["pue"]), "--json", json_path)
        with open(json_path) as f:
            s = json.load(f)
        # slim's kWh are the IT equipment's; CCF's include the PUE.
        pairs = [("min_watts", s["min_watts"], r["min_watts"]), ("max_watts", s["max_watts"], r["max_watts"]),
                 ("g_per_kwh", s["g_per_kwh"], r["g_per_kwh"]),
                 ("compute kWh x PUE", s["compute_kwh"] * c["pue"], r["compute_kwh"]),
                 ("memory kWh x PUE", s["memory_kwh"] * c["pue"], r["memory_kwh"]),
                 ("compute gCO2e", s["compute_gco2e"], r["compute_gco2e"]),
                 ("memory gCO2e", s["memory_gco2e"], r["memory_gco2e"])]
        exact = {"min_watts", "max_watts", "g_per_kwh"}
        for name, mine, theirs in pairs:
            ok = mine == theirs if name in exact else close(mine, theirs)
            if not ok:
                failures.append("%s %s: slim %.17g, reference %.17g" % (c["cpu_model"], name, mine, theirs))
        print("%-18s %-6s %12.6g kWh %12.6g gCO2e  %s" % (c["cpu_model"], c["region"], r["compute_kwh"] + r["memory_kwh"],
                                                          r["compute_gco2e"] + r["memory_gco2e"],
                                                          "ok" if len(failures) == before else "differs"))
    os.remove(json_path)

    table = {}
    for line in slim("energy", "regions").splitlines():
        if line and not line.startswith("#"):
            code, value = line.rsplit(None, 1)
            code = code.strip()
            table[code] = float(value)
    for code, value in ref["grid"].items():
        if table.get(code) != value:
            failures.append("region %s: slim %s, @tgwf/co2 %s" % (code, table.get(code), value))
    for code in set(table) - set(ref["grid"]):
        failures.append("region %s: not in @tgwf/co2" % code)
    print("%d regions compared with @tgwf/co2's averageIntensity" % len(ref["grid"]))

    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
