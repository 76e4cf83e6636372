#!/usr/bin/env bash
# Builds and runs ceiling.cc against BUILD_DIR's libslim_llm (not part of ctest): this
# machine's FMA peak and the matmul-only bound on what batching 8 sequences can gain.
set -euo pipefail
BUILD=${1:-build}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
g++ -std=c++20 -O2 -I"$ROOT/include" "$HERE/ceiling.cc" \
  "$BUILD/src/libslim_llm.a" "$BUILD/src/libslim_text.a" "$BUILD/src/libslim_core.a" -lzstd -lpthread -o "$OUT/ceiling"
"$OUT/ceiling"
