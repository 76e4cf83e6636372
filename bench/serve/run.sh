#!/usr/bin/env bash
# bench/serve: slim serve under load (see README.md). Builds `slim` and `serve_loadgen` in
# $BUILD (default build; set SLIM to use an existing slim binary), installs what only this
# benchmark needs (python3-matplotlib for the plot, python3-torch/torchvision to export
# the models), writes the models into bench/.work/serve, and runs run.py; extra arguments
# go to run.py (--help). Results: bench/serve/results/.
set -euo pipefail
cd "$(dirname "$0")/../.."
missing=()
/usr/bin/python3 -c "import matplotlib" 2>/dev/null || missing+=(python3-matplotlib)
/usr/bin/python3 -c "import torch, torchvision" 2>/dev/null || missing+=(python3-torch python3-torchvision)
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
BUILD=${BUILD:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
targets=(serve_loadgen)
[ -z "${SLIM:-}" ] && targets+=(slim)
cmake --build "$BUILD" --target "${targets[@]}" -j2 >/dev/null
SLIM=${SLIM:-$BUILD/tools/slim}
WORK=bench/.work/serve
/usr/bin/python3 bench/serve/make_models.py "$WORK/models" 2> >(grep -v -i warn >&2)
exec /usr/bin/python3 bench/serve/run.py --slim "$SLIM" --loadgen "$BUILD/bench/serve/serve_loadgen" --work "$WORK" "$@"
