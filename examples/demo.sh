#!/usr/bin/env bash
# The bundled example: train a digits classifier, export it to ONNX, and let slim
# inspect it and classify held-out digit images.
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
slim="$build/tools/slim"
data="$build/examples/digits"

echo "== training a digits classifier (sklearn) and writing ONNX"
/usr/bin/python3 "$here/digits/make_digits_model.py" "$data"
echo
echo "== slim inspect"
"$slim" inspect "$data/digits_mlp.onnx"
echo
echo "== slim run on held-out digit images"
"$slim" run "$data/digits_mlp.onnx" --input "pixels=$data/digits.npy" --output-dir "$data/out" --argmax
echo
/usr/bin/python3 "$here/digits/show_predictions.py" "$data" "$data/out/probabilities.npy"
