#!/usr/bin/env bash
# Builds and runs ceiling.cc against BUILD_DIR's libslim_llm (not part of ctest): this
# machine's FMA peak and the matmul-only bound on what batching 8 sequences can gain.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
exec bash "$HERE/../run_cc.sh" "${1:-build}" "$HERE/ceiling.cc" "slim_llm slim_text slim_core" -lzstd
