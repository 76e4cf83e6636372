#!/usr/bin/env bash
# Installs every Debian package that slim's build, tests and demo need; with --build, only
# what building the `slim` binary needs (the Dockerfile's build stage).
# Idempotent and non-interactive: packages already present are skipped.
set -euo pipefail

build_only=false
if [ "${1:-}" = "--build" ]; then build_only=true; fi

packages=(
  build-essential cmake ninja-build pkg-config
  libprotobuf-dev protobuf-compiler libonnx-dev
  nlohmann-json3-dev libcli11-dev
  libssl-dev libxxhash-dev libzstd-dev
  # Debian's oneDNN is built with its OpenCL GPU runtime: its CMake config needs the
  # OpenCL headers and loader, which libdnnl-dev only recommends.
  libdnnl-dev ocl-icd-opencl-dev opencl-c-headers
  # slim serve: HTTP (cpp-httplib) and gRPC front doors.
  libcpp-httplib-dev libgrpc++-dev protobuf-compiler-grpc
  # The PNG charts of `slim report` (tools/slim/plot.cc).
  libcairo2-dev
  # slim quantize: calibration images (PNG, JPEG).
  libpng-dev libjpeg62-turbo-dev
)
if ! $build_only; then
  packages+=(
    git clang libclang-rt-14-dev libonnx-testdata libgtest-dev libgmock-dev
    openssl python3-cryptography
    python3 python3-numpy python3-onnx python3-sklearn python3-xgboost python3-regex python3-pil
    python3-sentencepiece sentencepiece
    # The emulation tests run kernels under qemu-x86_64 and valgrind as CPUs without
    # AVX-512 / AVX2.
    qemu-user valgrind
    # The server tests call it with curl and Python grpcio (stubs from grpc_python_plugin),
    # and check metrics with promtool (below).
    python3-grpcio curl
    # The chat-template renderer is checked byte for byte against Python's jinja2.
    python3-jinja2
    # The deployment test parses deploy/*.yaml.
    python3-yaml
  )
fi

. "$(dirname "$0")/packages.sh"
missing_packages "${packages[@]}"

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
else
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if $build_only; then exit 0; fi

# Node.js and npm run the official `openai` client in the server tests (and the benchmarks'
# npm peers). Only when missing: a Node.js from elsewhere (NodeSource) brings its own npm,
# which Debian's npm package would conflict with.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "setup: installing nodejs npm"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
fi

# promtool, which the server tests run on the metrics text, comes in Debian's prometheus
# package, whose installation would also start a Prometheus server on the machine: take
# the one binary out of the package into build-tools/bin (git-ignored) instead.
tools="$(cd "$(dirname "$0")/.." && pwd)/build-tools"
if [ ! -x "$tools/bin/promtool" ]; then
  tmp=$(mktemp -d)
  # apt-get download run as root fetches as the _apt user, which must be able to write there.
  if [ "$(id -u)" -eq 0 ]; then chown _apt "$tmp" 2>/dev/null || true; fi
  if ! (cd "$tmp" && apt-get download -qq prometheus 2>/dev/null); then
    $SUDO apt-get update -qq
    (cd "$tmp" && apt-get download -qq prometheus)
  fi
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/unpacked"
  mkdir -p "$tools/bin"
  cp "$tmp/unpacked/usr/bin/promtool" "$tools/bin/promtool"
  rm -rf "$tmp"
  echo "setup: promtool unpacked into $tools/bin"
fi
