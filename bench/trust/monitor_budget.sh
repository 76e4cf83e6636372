#!/usr/bin/env bash
# Builds and runs monitor_budget.cc against BUILD_DIR's libslim_trust (not part of ctest).
set -euo pipefail
BUILD=${1:-build}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
g++ -std=c++20 -O2 -I"$ROOT/include" "$HERE/monitor_budget.cc" \
  "$BUILD/src/libslim_trust.a" "$BUILD/src/libslim_core.a" -lcrypto -lxxhash -lpthread -o "$OUT/monitor_budget"
"$OUT/monitor_budget"
