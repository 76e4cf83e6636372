#!/usr/bin/env bash
# Builds one benchmark program against a build directory's slim libraries and runs it
# (not part of ctest): bench/run_cc.sh BUILD_DIR SOURCE.cc "slim_a slim_b ..." [-lfoo ...]
# The libraries are named as their targets, in link order; the rest goes to the linker.
set -euo pipefail
BUILD=$1 SRC=$2 LIBS=$3
shift 3
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
archives=()
for lib in $LIBS; do archives+=("$BUILD/src/lib$lib.a"); done
g++ -std=c++20 -O2 -I"$ROOT/include" "$SRC" "${archives[@]}" "$@" -lpthread -o "$OUT/program"
"$OUT/program"
