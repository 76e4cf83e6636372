#!/usr/bin/env bash
# slim serve running unattended, start to finish: the demo's digits classifier and a forest
# on the same digits in a model repository, the forest with a quantized variant, all signed;
# the server polls the repository and loads only signed versions; a new signed version is
# dropped in and swapped in while the server serves, an unsigned one is refused; memory runs
# short and the forest switches to its quantized variant; the audit trail tells the story;
# slim check reports on the server; SIGTERM stops it. Loopback only, free ports.
# Usage: examples/serve/operations.sh [BUILD]
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
slim="$build/tools/slim"
data="$build/examples/digits"
work="$build/examples/operations"
rm -rf "$work" && mkdir -p "$work"

/usr/bin/python3 "$here/../digits/make_digits_model.py" "$data" >/dev/null
/usr/bin/python3 "$here/make_repository.py" "$data" "$work" >/dev/null
repo="$work/repo"
echo "== the forest compiled twice: float thresholds, and 4-bit thresholds in the compact encoding"
trees="$repo/digits_trees/1"
"$slim" forest compile "$trees/model.json" -o "$trees/model.slimf"
"$slim" forest compile "$trees/model.json" -o "$trees/model.4bit.slimf" --quantize 4bit --encoding compact
rm "$trees/model.json"
echo 'parameters { key: "variants" value: { string_value: "model.slimf, model.4bit.slimf" } }' \
  >>"$repo/digits_trees/config.pbtxt"

echo
echo "== signing version 1 of each model with a new key"
"$slim" keygen -o "$work/signer" >/dev/null
for m in digits digits_trees; do "$slim" sign "$repo/$m/1" --key "$work/signer" >/dev/null; done
ls "$repo/digits/1" "$trees"
# The memory the server may use: cgroup v2 files the demo writes (--memory-source), so that
# it can make memory run short; without the flag the server reads its own cgroup.
mkdir "$work/memory"
memory() { echo $(($1 << 20)) >"$work/memory/memory.max"; echo $(($2 << 20)) >"$work/memory/memory.current"; }
memory 1024 100

echo
echo "== slim serve: poll the repository every second, signed versions only, audit everything"
"$slim" serve --model-repository "$repo" --host 127.0.0.1 --http-port 0 --grpc-port 0 --metrics-port 0 \
  --model-control-mode poll --repository-poll-secs 1 --require-signature "$work/signer.pub" \
  --audit-log "$work/audit.log" --threads 2 --memory-source "$work/memory" --memory-interval-secs 1 \
  --variant-min-dwell-secs 1 --variant-settle-secs 1 >"$work/serve.out" 2>"$work/serve.err" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 300); do grep -q "slim serve: ready" "$work/serve.out" && break; sleep 0.1; done
grep -q "slim serve: ready" "$work/serve.out" || { cat "$work/serve.err" >&2; exit 1; }
port=$(sed -n 's/^slim serve: HTTP listening on 127.0.0.1:\([0-9]*\)$/\1/p' "$work/serve.out")
url="http://127.0.0.1:$port"
versions() { curl -s "$url/v2/models/digits" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["versions"])'; }
classify() {
  curl -s -d @"$work/request.json" "$url/v2/models/digits/infer" | /usr/bin/python3 -c '
import json, sys
out = json.load(sys.stdin)["outputs"][0]
rows = [out["data"][i * 10:(i + 1) * 10] for i in range(out["shape"][0])]
print("predicted digits:", [max(range(10), key=r.__getitem__) for r in rows])'
}
echo "serving on $url, digits versions $(versions)"
classify

echo
echo "== a new signed version (2) is dropped into the repository"
mkdir "$work/incoming" && cp "$repo/digits/1/model.onnx" "$work/incoming/"
"$slim" sign "$work/incoming" --key "$work/signer" >/dev/null
mv "$work/incoming" "$repo/digits/2"
for _ in $(seq 100); do [ "$(versions)" = "['2']" ] && break; sleep 0.1; done
[ "$(versions)" = "['2']" ] || { echo "version 2 was not swapped in" >&2; exit 1; }
echo "digits versions now $(versions)"
classify

echo
echo "== an unsigned version (3) is dropped in: refused, version 2 keeps serving"
mkdir "$repo/digits/3" && cp "$repo/digits/1/model.onnx" "$repo/digits/3/"
for _ in $(seq 100); do grep -q "failed to load" "$work/serve.err" && break; sleep 0.1; done
grep "failed to load" "$work/serve.err" | grep -q "no signature bundle" || { echo "version 3 was not refused" >&2; exit 1; }
[ "$(versions)" = "['2']" ] || { echo "version 2 stopped serving" >&2; exit 1; }
echo "digits versions still $(versions)"

echo
echo "== memory runs short (1000 of 1024 MiB used): the forest switches to its 4-bit variant"
variant() { curl -s "$url/v2/models/digits_trees" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["slim"]["variant"])'; }
trees_classify() {
  sed 's/"pixels"/"input"/' "$work/request.json" | curl -s -d @- "$url/v2/models/digits_trees/infer" | /usr/bin/python3 -c '
import json, sys
out = json.load(sys.stdin)["outputs"][0]
rows = [out["data"][i * 10:(i + 1) * 10] for i in range(out["shape"][0])]
print("forest predicts:", [max(range(10), key=r.__getitem__) for r in rows])'
}
echo "digits_trees serves $(variant)"
trees_classify
memory 1024 1000
for _ in $(seq 100); do [ "$(variant)" = model.4bit.slimf ] && break; sleep 0.1; done
[ "$(variant)" = model.4bit.slimf ] || { echo "the forest did not switch" >&2; exit 1; }
echo "digits_trees serves $(variant)"
trees_classify
grep "switches from variant" "$work/serve.err"

echo
echo "== slim check"
"$slim" check "$url" --samples 3 | /usr/bin/python3 -c '
import json, sys
r = json.load(sys.stdin)
print("exit code", r["exit_code"], "| signatures required:", r["slim"]["require_signature"])
for m in r["models"]:
    for v in m.get("versions", []):
        print(" ", m["name"], "version", v.get("version"), v.get("state"), "signed:", v.get("signed"),
              "variant:", v.get("variant"))'

echo
echo "== the audit trail of digits and digits_trees"
"$slim" audit show "$work/audit.log" --model digits
"$slim" audit show "$work/audit.log" --model digits_trees
"$slim" audit verify "$work/audit.log" | head -1

echo
echo "== SIGTERM: drain and stop"
kill -TERM $server
wait $server
trap - EXIT
tail -1 "$work/serve.err"
