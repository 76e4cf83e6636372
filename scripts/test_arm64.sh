#!/usr/bin/env bash
# Cross-builds slim for aarch64 and runs its tests under qemu-user: installs what that
# needs (setup_arm64.sh), configures BUILD (default build-arm64) with
# cmake/aarch64-linux-gnu.cmake, builds, and runs ctest, which starts every test binary
# through qemu-aarch64 (CMAKE_CROSSCOMPILING_EMULATOR). qemu's CPU model has ASIMD and SDOT,
# so the scalar, NEON and NEON+dotprod kernel sets all run and are held to the scalar
# results. Emulated timings say nothing about speed.
#   scripts/test_arm64.sh [BUILD] [ctest arguments...]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build-arm64}
shift || true
JOBS=${JOBS:-$(nproc)}
cd "$ROOT"

bash scripts/setup_arm64.sh
start=$(date +%s)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release --toolchain cmake/aarch64-linux-gnu.cmake
cmake --build "$BUILD" -j "$JOBS"
built=$(date +%s)
echo "test_arm64: build took $((built - start)) s"
mkdir -p "$BUILD/test_tmp"
cd "$BUILD"
# Tests spawn python3 (fixtures) and, for the CLI tests, qemu themselves; a test binary
# under qemu is some 5-20x slower than native, hence the longer timeout.
rc=0
SLIM_TEST_TMP="$(pwd)/test_tmp" ctest --output-on-failure -j "$JOBS" --timeout 1800 "$@" || rc=$?
echo "test_arm64: tests took $(($(date +%s) - built)) s"
exit $rc
