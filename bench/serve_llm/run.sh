#!/usr/bin/env bash
# bench/serve_llm: slim serve vs llama-server under chat load (see README.md). Installs what
# only this bench needs (python3-matplotlib for the plot), builds `slim` in $BUILD (default
# build; set SLIM to use an existing binary) and runs run.py, which builds llama-server once
# into bench/.work (bench/llamacpp.py: node-llama-cpp is installed with npm into
# bench/serve_llm/node_modules for the llama.cpp sources it ships). Extra arguments go to
# run.py (--help). Results: bench/serve_llm/results/.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-matplotlib >/dev/null
fi
if [ -z "${SLIM:-}" ]; then
  BUILD=${BUILD:-build}
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD" --target slim -j2 >/dev/null
  SLIM=$BUILD/tools/slim
fi
exec /usr/bin/python3 bench/serve_llm/run.py --slim "$SLIM" "$@"
