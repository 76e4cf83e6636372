#!/usr/bin/python3
"""A pruned model whose layers differ in width runs in llama.cpp as slim writes it: `slim
prune` on a small random llama model (generated here) writes `deci` (llama.cpp reads its
per-layer head_count, head_count_kv and feed_forward_length arrays; its `llama`
architecture builds every layer with layer 0's widths and refuses such a file), and
llama.cpp's greedy tokens on the deci file are slim's, token for token. The same plan
written as `llama` computes the same in slim. llama.cpp is the llama-server that
bench/llamacpp.py builds into bench/.work (`bench/llamacpp.py llama-server`); the test
exits 77 (skipped) when it is not built. Run by ctest with SLIM_BINARY_DIR set."""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import llamacpp  # noqa: E402
import make_gguf as mg  # noqa: E402

PROMPT = [1, 300, 301, 302, 400, 5, 77, 260]
N = 24
SEED = 11


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_server_greedy(server, path):
    """(tokens, None) from llama-server on `path`, or (None, the reason it did not load)."""
    port = free_port()
    log = tempfile.TemporaryFile()
    p = subprocess.Popen([server, "-m", path, "-t", "1", "-c", "256", "-np", "1", "-fa", "off", "--host", "127.0.0.1",
                          "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            if p.poll() is not None:
                log.seek(0)
                lines = log.read().decode(errors="replace").splitlines()
                why = [l for l in lines if "error" in l.lower() or "wrong" in l.lower()]
                return None, (why or lines[-3:] or ["exited"])[0].strip()
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.3)
        body = json.dumps({"prompt": PROMPT, "n_predict": N, "temperature": 0, "top_k": 1, "return_tokens": True,
                           "cache_prompt": False, "ignore_eos": True}).encode()
        req = urllib.request.Request("http://127.0.0.1:%d/completion" % port, body,
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return json.loads(r.read())["tokens"], None
        except urllib.error.HTTPError as e:
            return None, "HTTP %d: %s" % (e.code, e.read().decode(errors="replace")[:300])
    finally:
        p.terminate()
        p.wait()


def architecture(path):
    """general.architecture of a GGUF file (a string value: type 8, u64 length, bytes)."""
    with open(path, "rb") as f:
        head = f.read(1 << 20)
    i = head.index(b"general.architecture") + len("general.architecture") + 4
    n = int.from_bytes(head[i:i + 8], "little")
    return head[i + 8:i + 8 + n].decode()


def slim_greedy(slim, path):
    out = subprocess.run([slim, "generate", path, "--tokens", ",".join(map(str, PROMPT)), "-n", str(N), "--temp", "0",
                          "--ids", "--ignore-eos", "--threads", "1"], check=True, capture_output=True, text=True)
    return [int(t) for t in out.stdout.split()]


def main():
    server = os.path.join(llamacpp.WORK, "llama.cpp-native", "bin", "llama-server")
    if not os.path.exists(server):
        print("llama.cpp's llama-server is not built (bench/llamacpp.py llama-server): skipped")
        return 77
    slim = os.path.join(os.environ["SLIM_BINARY_DIR"], "tools", "slim")
    tmp = tempfile.mkdtemp(prefix="slim_prune_llamacpp_")
    # F32 weights, embeddings 5x the rest (as in moe_vs_llamacpp: fewer near ties), a
    # byte-level BPE vocabulary without merges whose tokens 3..96 are the printable ASCII
    # characters (one token each, so the calibration text has tokens; every output decodes).
    toks = [chr(30 + i) if 3 <= i < 97 else "<tok%d>" % i for i in range(512)]
    tokenizer = [("tokenizer.ggml.model", ("str", "gpt2")), ("tokenizer.ggml.tokens", ("strs", toks)),
                 ("tokenizer.ggml.token_type", ("i32s", [1] * 512)), ("tokenizer.ggml.merges", ("strs", [])),
                 ("tokenizer.ggml.bos_token_id", ("u32", 1)), ("tokenizer.ggml.eos_token_id", ("u32", 2))]
    mg.make_model(tmp, "dense", "llama", {"default": "F32"}, 2, False, SEED, n_ff=512, n_layer=3, vocab=512,
                  n_ctx=256, embd_std=0.4, tokenizer=tokenizer, reference=False)
    src = os.path.join(tmp, "dense.gguf")
    calib = os.path.join(tmp, "calib.txt")
    with open(calib, "w") as f:
        f.write(" ".join("word%d said %s" % (i, "abcdefghij"[i % 10] * (i % 7 + 1)) for i in range(600)))
    files = {}
    for arch in ("auto", "llama"):
        out = os.path.join(tmp, "pruned-%s.gguf" % arch)
        subprocess.run([slim, "prune", src, "-o", out, "--calib", calib, "--target-params", "0.8", "--ctx", "64",
                        "--chunks", "2", "--refit-chunks", "8", "--threads", "1", "--arch", arch], check=True,
                       capture_output=True, text=True)
        files[arch] = out
    failures = []
    if architecture(files["auto"]) != "deci":
        failures.append("the variable-width plan was not written as deci")
    ours = slim_greedy(slim, files["auto"])
    if slim_greedy(slim, files["llama"]) != ours:
        failures.append("slim's greedy tokens differ between the deci and the llama file")
    theirs, why = llama_server_greedy(server, files["auto"])
    if theirs is None:
        failures.append("llama.cpp does not load the deci file: %s" % why)
    else:
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        print("deci file: %s" % ("slim and llama.cpp pick the same %d tokens" % N if ours == theirs else
                                 "DIFFERENT from token %s: slim %s, llama.cpp %s" % (first, ours, theirs)))
        if ours != theirs:
            failures.append("greedy tokens differ")
    _, why = llama_server_greedy(server, files["llama"])
    print("the same plan as a llama file in llama.cpp: %s" % ("loads" if why is None else "refused (%s)" % why))
    for f in failures:
        print("FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
