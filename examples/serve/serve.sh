#!/usr/bin/env bash
# The serving example: the demo's digits classifier (ONNX) and a forest trained on the same
# digits (XGBoost) in a Triton-style repository, served by `slim serve` on Triton's ports
# (HTTP 8000, gRPC 8001, metrics 8002) until Ctrl-C. Usage: examples/serve/serve.sh [BUILD]
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
data="$build/examples/digits"
/usr/bin/python3 "$here/../digits/make_digits_model.py" "$data" >/dev/null
/usr/bin/python3 "$here/make_repository.py" "$data" "$build/examples/serve"
echo "try: curl -s -d @$build/examples/serve/request.json localhost:8000/v2/models/digits/infer"
exec "$build/tools/slim" serve --model-repository "$build/examples/serve/repo"
