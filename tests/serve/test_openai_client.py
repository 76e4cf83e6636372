#!/usr/bin/env python3
"""The official `openai` npm package (a pinned version, installed by this test into the
build folder) against `slim serve` on the shared slimlm model when ../shared/models has it,
else on the generated chat model of make_llm.py, with --energy (usage.energy when a request
sends `slim_energy`); then on make_llm.py's Mixture-of-Experts model (usage.experts). Run by ctest with SLIM_BINARY_DIR set."""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_harness import Server  # noqa: E402

OPENAI_VERSION = "6.30.1"


def main():
    if not shutil.which("node") or not shutil.which("npm"):
        sys.exit("node and npm are needed (scripts/setup.sh installs them)")
    npm_dir = os.path.join(os.environ["SLIM_BINARY_DIR"], "npm-openai")
    pkg = os.path.join(npm_dir, "node_modules", "openai", "package.json")
    if not os.path.exists(pkg) or '"version": "%s"' % OPENAI_VERSION not in open(pkg).read():
        os.makedirs(npm_dir, exist_ok=True)
        subprocess.run(["npm", "install", "--prefix", npm_dir, "--no-audit", "--no-fund", "--no-package-lock",
                        "openai@" + OPENAI_VERSION], check=True, stdout=subprocess.DEVNULL)
    root = os.path.dirname(os.path.dirname(HERE))
    shared = os.path.join(os.path.dirname(root), "shared", "models", "slimlm-f16.gguf")
    if os.path.exists(shared):
        model, name = shared, "slimlm"
    else:
        tmp = tempfile.mkdtemp(prefix="slim_openai_")
        subprocess.run(["/usr/bin/python3", os.path.join(HERE, "make_llm.py"), tmp], check=True)
        model, name = os.path.join(tmp, "chat.gguf"), "chat"
    moe_dir = tempfile.mkdtemp(prefix="slim_openai_moe_")
    subprocess.run(["/usr/bin/python3", os.path.join(HERE, "make_llm.py"), moe_dir, "--moe"], check=True)
    runs = ((model, name, []), (os.path.join(moe_dir, "chat-moe.gguf"), "moe", ["2"]))
    try:
        check_all(npm_dir, runs)
    finally:
        shutil.rmtree(moe_dir, ignore_errors=True)


def check_all(npm_dir, runs):
    for model, name, extra in runs:
        print("model:", model, flush=True)
        with Server(["--model", model, "--model-name", name, "--host", "127.0.0.1", "--http-port", "0",
                     "--allow-grpc", "false", "--allow-metrics", "false", "--threads", "2", "--energy"]) as srv:
            p = subprocess.run(["node", os.path.join(HERE, "openai_client.mjs"), npm_dir, srv.url(), name] + extra)
            code = srv.stop()
        if p.returncode != 0 or code != 0:
            sys.exit("openai client checks failed (node exit %d, server exit %d)" % (p.returncode, code))


if __name__ == "__main__":
    main()
