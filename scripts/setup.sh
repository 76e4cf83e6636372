#!/usr/bin/env bash
# Installs every Debian package that slim's build, tests and demo need.
# Idempotent and non-interactive: packages already present are skipped.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  clang libclang-rt-14-dev
  libprotobuf-dev protobuf-compiler libonnx-dev libonnx-testdata
  nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
  libssl-dev libxxhash-dev libzstd-dev openssl python3-cryptography
  python3 python3-numpy python3-onnx python3-sklearn python3-xgboost python3-regex
  python3-sentencepiece sentencepiece
  # Debian's oneDNN is built with its OpenCL GPU runtime: its CMake config needs the
  # OpenCL headers and loader, which libdnnl-dev only recommends.
  libdnnl-dev ocl-icd-opencl-dev opencl-c-headers
  # The emulation tests run kernels under qemu-x86_64 and valgrind as CPUs without
  # AVX-512 / AVX2.
  qemu-user valgrind
  # slim serve: HTTP (cpp-httplib) and gRPC front doors; its tests call it with curl,
  # Python grpcio (stubs from grpc_python_plugin) and check metrics with promtool.
  libcpp-httplib-dev libgrpc++-dev protobuf-compiler-grpc python3-grpcio curl prometheus
)

. "$(dirname "$0")/packages.sh"
missing_packages "${packages[@]}"

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
