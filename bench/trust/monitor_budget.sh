#!/usr/bin/env bash
# Builds and runs monitor_budget.cc against BUILD_DIR's libslim_trust (not part of ctest).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
exec bash "$HERE/../run_cc.sh" "${1:-build}" "$HERE/monitor_budget.cc" "slim_trust slim_core" -lcrypto -lxxhash
