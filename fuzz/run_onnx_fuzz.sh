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
  i=0
  while read -r f; do
    i=$((i + 1))
    cp "$f" "$work/seeds/testdata_$i.onnx"
  done < <(find /usr/share/libonnx-testdata/data -name model.onnx -size -16k | sort)
  # Models with external data ("weights.bin", which the fuzzer's scratch folder has).
  /usr/bin/python3 tests/fixtures/make_onnx_importer_fixtures.py "$work/fixtures" >/dev/null
  cp "$work/fixtures/external/model.onnx" "$work/seeds/external.onnx"
  cp "$work/fixtures/encodings.onnx" "$work/seeds/encodings.onnx"
  cp "$work/fixtures/functions.onnx" "$work/seeds/functions.onnx"
fi
"$build/fuzz/onnx_import_fuzz" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=32768 \
  -artifact_prefix="$work/artifacts/" -print_final_stats=1 "$work/corpus" "$work/seeds"
