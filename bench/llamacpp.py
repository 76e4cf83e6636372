#!/usr/bin/python3
"""What the benches that compare slim with llama.cpp (vs_llamacpp, serve_llm) share: llama.cpp
tools built from the sources the node-llama-cpp npm package ships, the files of shared/models,
and the generated random-weight 1.1 B Llama.

node-llama-cpp carries llama.cpp as a git bundle (llama/gitRelease.bundle); it is cloned
once into bench/.work/llama.cpp-src and each ISA variant is configured in its own folder,
bench/.work/llama.cpp-<isa>, where any of its targets (llama-bench, llama-server) is built
on demand. native: -DGGML_NATIVE=ON (the build machine's CPU) but no AMX on x86-64: virtual
machines that do not pass the AMX tile state through list amx in /proc/cpuinfo yet fault on
the first tile instruction (SIGILL in ggml_backend_amx_mul_mat on Q4_0/Q8_0 models here), and
slim does not use AMX either; avx2: no native tuning and no AVX-512, so it runs like on an
AVX2-only CPU. The build runs -j2 under nice -n 19: the
machines these benches run on are small and shared (15-30 minutes for one target).

Usage: bench/llamacpp.py TARGET [--isa native|avx2] [--node-dir DIR]
  installs node-llama-cpp into DIR/node_modules if missing, builds TARGET, prints its path.
"""
import argparse
import os
import platform
import shutil
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
WORK = os.path.join(ROOT, "bench", ".work")
NODE_LLAMA_CPP = "node-llama-cpp@3.21.1"
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"  # GCC and Clang: these win over -march=native
ISA_FLAGS = {
    "native": ["-DGGML_NATIVE=ON"] + (["-DCMAKE_C_FLAGS=" + NO_AMX, "-DCMAKE_CXX_FLAGS=" + NO_AMX]
                                      if platform.machine() == "x86_64" else []),
    "avx2": ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
             "-DGGML_AVX512=OFF"],
}


def slim_env(isa):
    """The environment for slim held to an ISA (SLIM_ISA; native: the CPU's best)."""
    env = dict(os.environ)
    env.pop("SLIM_ISA", None)
    if isa != "native":
        env["SLIM_ISA"] = isa
    return env


def find_shared(name):
    """shared/models/NAME in the repository's parent directory (for a git worktree, also the
    parent of the main checkout), or None."""
    parents = [os.path.dirname(ROOT)]
    try:
        common = subprocess.run(["git", "-C", ROOT, "rev-parse", "--path-format=absolute", "--git-common-dir"],
                                check=True, capture_output=True, text=True).stdout.strip()
        parents.append(os.path.dirname(os.path.dirname(common)))
    except (subprocess.CalledProcessError, FileNotFoundError):
        pass
    for p in parents:
        path = os.path.join(p, "shared", "models", name)
        if os.path.exists(path):
            return path
    return None


def random_llama(qtype, layers=22, moe=None):
    """bench/.work/random-1b-QTYPE-L<layers>.gguf (vs_llamacpp/make_random_llama.py: TinyLlama's
    shape, random weights), or with moe ("mixtral" or "qwen2moe") random-moe-MOE-QTYPE-L<layers>.gguf,
    generated if missing; qtype q8_0 or q4_0."""
    path = os.path.join(WORK, ("random-moe-%s-" % moe if moe else "random-1b-") + "%s-L%d.gguf" % (qtype, layers))
    if not os.path.exists(path):
        print("generating %s ..." % path, file=sys.stderr)
        os.makedirs(WORK, exist_ok=True)
        subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "bench", "vs_llamacpp", "make_random_llama.py"),
                        path + ".tmp", qtype, str(layers)] + (["--moe", moe] if moe else []), check=True,
                       capture_output=True)
        os.rename(path + ".tmp", path)
    return path


def ensure_node_llama_cpp(node_dir):
    """Installs node-llama-cpp (npm, no install scripts) into node_dir/node_modules if it is
    not there; node_dir holds a package.json so that npm installs there and not in a parent."""
    if not os.path.isdir(os.path.join(node_dir, "node_modules", "node-llama-cpp")):
        print("installing %s into %s ..." % (NODE_LLAMA_CPP, node_dir), file=sys.stderr)
        subprocess.run(["npm", "install", "--no-save", "--ignore-scripts", "--no-audit", "--no-fund",
                        NODE_LLAMA_CPP], cwd=node_dir, check=True)


def build(target, isa, node_dir):
    """The path of llama.cpp's TARGET executable built for isa, building it if missing."""
    build_dir = os.path.join(WORK, "llama.cpp-" + isa)
    exe = os.path.join(build_dir, "bin", target)
    if os.path.exists(exe):
        return exe
    src = os.path.join(WORK, "llama.cpp-src")
    if not os.path.isdir(src):
        ensure_node_llama_cpp(node_dir)
        bundle = os.path.join(node_dir, "node_modules", "node-llama-cpp", "llama", "gitRelease.bundle")
        print("unpacking llama.cpp sources from %s ..." % bundle, file=sys.stderr)
        os.makedirs(WORK, exist_ok=True)
        subprocess.run(["git", "-c", "advice.detachedHead=false", "clone", "-q", bundle, src], check=True)
    if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.run(["cmake", "-S", src, "-B", build_dir, *gen, "-DCMAKE_BUILD_TYPE=Release", *ISA_FLAGS[isa],
                        "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                        "-DCMAKE_RUNTIME_OUTPUT_DIRECTORY=" + os.path.join(build_dir, "bin")],
                       check=True, stdout=subprocess.DEVNULL)
    print("building %s (%s) in %s (15-30 minutes on two cores) ..." % (target, isa, build_dir), file=sys.stderr)
    subprocess.run(["nice", "-n", "19", "cmake", "--build", build_dir, "--target", target, "-j2"], check=True,
                   stdout=subprocess.DEVNULL)
    return exe


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", help="llama.cpp CMake target, e.g. llama-server or llama-bench")
    ap.add_argument("--isa", choices=sorted(ISA_FLAGS), default="native")
    ap.add_argument("--node-dir", default=os.path.join(ROOT, "bench", "serve_llm"),
                    help="folder whose node_modules holds node-llama-cpp (installed there if missing)")
    a = ap.parse_args()
    print(build(a.target, a.isa, a.node_dir))


if __name__ == "__main__":
    main()
