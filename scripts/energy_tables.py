#!/usr/bin/python3
"""Regenerates src/energy/tables.cc, the coefficient and grid tables slim's energy module
bundles, from the npm packages that publish them:

- Cloud Carbon Footprint's CPU power coefficients (min and max watts per vCPU for each
  microarchitecture, SPECpower-derived) and its memory coefficient, from the cloud packages
  @cloud-carbon-footprint/azure and /aws (the coefficients live there, not in
  @cloud-carbon-footprint/core, which holds the formulas). CPU rows are the union of both
  (they agree where both have a row); a CPU with no row uses Azure's averages.
- Ember's annual average grid carbon intensity per country (ISO alpha-3) and region, from
  @tgwf/co2 (CO2.js).

The packages go into a git-ignored npm cache (bench/.work/energy_npm, or SLIM_ENERGY_NPM_CACHE):
core and co2 installed with their dependencies (tests/energy/test_vs_ccf.py runs their code),
the cloud packages unpacked from their tarballs (only their constants file is read, which
needs core alone). Usage: scripts/energy_tables.py [--cache DIR] [--output FILE]"""
import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE = ("@cloud-carbon-footprint/core", "1.0.0")
CO2 = ("@tgwf/co2", "0.19.0")
CLOUDS = [("@cloud-carbon-footprint/azure", "1.8.0", "AzureFootprintEstimationConstants", "AZURE_CLOUD_CONSTANTS"),
          ("@cloud-carbon-footprint/aws", "0.15.0", "AwsFootprintEstimationConstants", "AWS_CLOUD_CONSTANTS")]
# CO2.js ships the values without Ember's year; its repository's
# data/output/average-intensities.json at v0.19.0 has them per country.
GRID_YEARS = "each country's latest year in Ember's data when CO2.js 0.19.0 was built (2022-2024)"
# Rows of the cloud tables that are accelerators, not CPUs.
ACCELERATOR_PREFIXES = ("Nvidia", "AMD Radeon", "Xilinx")


class Unreachable(Exception):
    """The npm registry could not be reached for a package the cache lacks."""


def default_cache():
    return os.environ.get("SLIM_ENERGY_NPM_CACHE") or os.path.join(ROOT, "bench", ".work", "energy_npm")


def installed_version(modules, name):
    try:
        with open(os.path.join(modules, name, "package.json")) as f:
            return json.load(f)["version"]
    except (OSError, ValueError, KeyError):
        return None


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1200, **kw)


def ensure_packages(cache):
    """Installs (once) the pinned packages into the cache; returns (node_modules of core and
    co2, node_modules of the unpacked cloud packages)."""
    modules = os.path.join(cache, "npm", "node_modules")
    if any(installed_version(modules, n) != v for n, v in (CORE, CO2)):
        os.makedirs(os.path.join(cache, "npm"), exist_ok=True)
        p = run(["npm", "install", "--prefix", os.path.join(cache, "npm"), "--ignore-scripts", "--no-audit",
                 "--no-fund", "--no-package-lock", "%s@%s" % CORE, "%s@%s" % CO2])
        if p.returncode != 0:
            raise Unreachable("npm install %s@%s %s@%s: %s" % (*CORE, *CO2, p.stderr.strip()[-300:]))
    clouds = os.path.join(cache, "cloud", "node_modules")
    for name, version, _, _ in CLOUDS:
        if installed_version(clouds, name) == version:
            continue
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            p = run(["npm", "pack", "%s@%s" % (name, version), "--pack-destination", tmp, "--json"])
            if p.returncode != 0:
                raise Unreachable("npm pack %s@%s: %s" % (name, version, p.stderr.strip()[-300:]))
            dest = os.path.join(clouds, name)
            os.makedirs(dest, exist_ok=True)
            with tarfile.open(os.path.join(tmp, json.loads(p.stdout)[0]["filename"])) as t:
                for m in t.getmembers():  # package/... -> dest/...
                    m.name = m.name.split("/", 1)[1] if "/" in m.name else ""
                    if m.name and (m.isfile() or m.isdir()):
                        t.extract(m, dest)
    return modules, clouds


def node(script, modules, clouds):
    """Runs a node program with the cached packages resolvable; returns its stdout as JSON."""
    env = dict(os.environ, NODE_PATH=modules, SLIM_CLOUD_MODULES=clouds)
    p = run(["node", "--no-deprecation", "-e", script], env=env)
    if p.returncode != 0:
        raise RuntimeError("node: " + p.stderr.strip()[-2000:])
    return json.loads(p.stdout)


DUMP = r"""
const path = require('path');
const clouds = JSON.parse(process.argv[1]);
const out = {clouds: {}};
for (const [name, file, constant] of clouds) {
  const c = require(path.join(process.env.SLIM_CLOUD_MODULES, name, 'dist', 'domain', file))[constant];
  out.clouds[name] = {min: c.MIN_WATTS_BY_COMPUTE_PROCESSOR, max: c.MAX_WATTS_BY_COMPUTE_PROCESSOR,
                      min_avg: c.MIN_WATTS_AVG, max_avg: c.MAX_WATTS_AVG, memory: c.MEMORY_COEFFICIENT};
}
out.grid = require('@tgwf/co2').averageIntensity.data;
console.log(JSON.stringify(out));
"""


def load_tables(modules, clouds):
    script = DUMP.replace("process.argv[1]", json.dumps(json.dumps([[n, f, c] for n, _, f, c in CLOUDS])))
    return node(script, modules, clouds)


def c_string(s):
    return json.dumps(s)  # a JSON string of ASCII is a valid C++ string literal


def generate(data):
    rows, sources = {}, {}
    for name, version, _, _ in CLOUDS:
        c = data["clouds"][name]
        for cpu, lo in c["min"].items():
            if cpu.startswith(ACCELERATOR_PREFIXES):
                continue
            hi = c["max"][cpu]
            if cpu in rows and rows[cpu] != (lo, hi):
                sys.exit("energy_tables: %s disagrees on %s: %s vs %s" % (name, cpu, (lo, hi), rows[cpu]))
            rows[cpu] = (lo, hi)
            sources.setdefault(cpu, []).append("%s@%s" % (name.split("/")[1], version))
    memory = {data["clouds"][n]["memory"] for n, *_ in CLOUDS}
    if len(memory) != 1:
        sys.exit("energy_tables: the cloud packages disagree on the memory coefficient: %s" % memory)
    first = data["clouds"][CLOUDS[0][0]]
    pkg = lambda n, v: "%s@%s" % (n, v)
    grid = "Ember annual averages via %s, %s" % (pkg(*CO2), GRID_YEARS)
    lines = [
        "// Generated by scripts/energy_tables.py from npm packages; do not edit: change the pinned",
        "// versions there and run it again.",
        "// CPU rows: MIN/MAX_WATTS_BY_COMPUTE_PROCESSOR (watts per vCPU, SPECpower-derived) of",
        "//   %s;" % ", ".join(pkg(n, v) for n, v, *_ in CLOUDS),
        "//   the average: %s MIN/MAX_WATTS_AVG;" % pkg(*CLOUDS[0][:2]),
        "// memory: MEMORY_COEFFICIENT (kWh per GB-hour), the same in both.",
        "// Grid: averageIntensity.data (gCO2e/kWh) of %s, Ember's annual averages," % pkg(*CO2),
        "//   %s." % GRID_YEARS,
        '#include "energy/tables.h"',
        "",
        "namespace slim::energy::tables {",
        "",
        "const char* const kGridSource = %s;" % c_string(grid),
        "const double kMemoryKwhPerGbHour = %r;" % memory.pop(),
        "const CpuRow kCpuAverage = {\"CCF average\", %r, %r, %s};" % (
            first["min_avg"], first["max_avg"], c_string(pkg(*CLOUDS[0][:2]))),
        "",
        "const CpuRow kCpuRows[] = {",
    ]
    for cpu in sorted(rows):
        lo, hi = rows[cpu]
        lines.append("    {%s, %r, %r, %s}," % (c_string(cpu), lo, hi, c_string(", ".join(sources[cpu]))))
    lines += ["};", "const size_t kNumCpuRows = sizeof(kCpuRows) / sizeof(kCpuRows[0]);", "",
              "const GridRow kGridRows[] = {"]
    for region in sorted(data["grid"]):
        lines.append("    {%s, %r}," % (c_string(region), data["grid"][region]))
    lines += ["};", "const size_t kNumGridRows = sizeof(kGridRows) / sizeof(kGridRows[0]);", "",
              "}  // namespace slim::energy::tables", ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default=default_cache())
    ap.add_argument("--output", default=os.path.join(ROOT, "src", "energy", "tables.cc"))
    args = ap.parse_args()
    try:
        modules, clouds = ensure_packages(os.path.abspath(args.cache))
    except Unreachable as e:
        sys.exit("energy_tables: " + str(e))
    with open(args.output, "w") as f:
        f.write(generate(load_tables(modules, clouds)))
    print("wrote", os.path.relpath(args.output, ROOT))


if __name__ == "__main__":
    main()
