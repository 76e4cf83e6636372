#!/usr/bin/env bash
# Fuzzes the ONNX importer for SECONDS (default 60), seeded with the models of the ONNX
# backend test data. Usage: fuzz/run_onnx_fuzz.sh [BUILD_DIR] [SECONDS]
set -euo pipefail
build=${1:-build-fuzz}
seconds=${2:-60}
work="$build/onnx_fuzz"
mkdir -p "$work/corpus" "$work/seeds" "$work/artifacts"
if [ -z "$(ls -A "$work/seeds")" ] && [ -d /usr/share/libonnx-testdata/data/node ]; then
  # The corpus keeps small, diverse models; big weights only slow each run down.
  find /usr/share/libonnx-testdata/data -name model.onnx -size -16k | sort | while read -r f; do
    cp "$f" "$work/seeds/$(echo "$f" | md5sum | cut -c1-12).onnx"
  done
fi
"$build/fuzz/onnx_import_fuzz" -max_total_time="$seconds" -rss_limit_mb=2048 \
  -artifact_prefix="$work/artifacts/" -print_final_stats=1 "$work/corpus" "$work/seeds"
