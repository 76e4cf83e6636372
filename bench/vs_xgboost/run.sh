#!/usr/bin/env bash
# slim forest vs XGBoost (Debian libxgboost, C API) on 100x6 and 1000x8 tree models with
# 30 features. Arguments go to vs_xgboost: `--isa avx2` (or SLIM_ISA=avx2) forces slim's
# kernel set lower; `--large-batch-only` times batch 10,000 only. Installs libxgboost-dev itself (the unit tests do not need it), builds
# slim_forest in build-bench-forest, trains the models once into bench/.work/vs_xgboost.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! dpkg-query -W -f='${Status}' libxgboost-dev 2>/dev/null | grep -q "install ok installed"; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends libxgboost-dev
fi
BUILD=${BUILD:-build-bench-forest}
WORK=bench/.work/vs_xgboost
mkdir -p "$WORK"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSLIM_BUILD_TESTS=OFF >/dev/null
cmake --build "$BUILD" --target slim_forest -j2 >/dev/null
/usr/bin/python3 bench/vs_xgboost/train_models.py "$WORK"
g++ -O3 -std=c++20 -Iinclude bench/vs_xgboost/vs_xgboost.cc \
  "$BUILD/src/libslim_forest.a" "$BUILD/src/libslim_core.a" -lxgboost -lxxhash -lpthread \
  -o "$WORK/vs_xgboost"
# XGBoost's OpenMP workers spin after each call by default; on a 2-core machine the
# spinning worker takes the core that the other engine's second thread needs (and slim's
# idle workers would do the same to XGBoost). Passive waiting makes both faster here,
# XGBoost's 2-thread batch about 2x.
OMP_WAIT_POLICY=passive "$WORK/vs_xgboost" "$@" "$WORK/xgb_100x6.json" "$WORK/xgb_1000x8.json"
