#!/usr/bin/env bash
# Installs what the aarch64 cross build and its tests need on a Debian 12 (amd64) machine:
# Debian's cross toolchain, qemu-user to run the tests, and the arm64 builds of slim's
# dependencies through multiarch (protoc and grpc_cpp_plugin stay the host's).
# Idempotent and non-interactive: packages already present are skipped. The host packages
# come from scripts/setup.sh (python3 and its modules generate the test fixtures and run
# the server tests' clients on the build machine).
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
apt_get() { $SUDO apt-get -o DPkg::Lock::Timeout=600 "$@"; }

bash "$(dirname "$0")/setup.sh"

# Two -dev packages cannot sit beside their amd64 twins, which the native build needs:
# libonnx-dev:arm64 (its libonnxifi:arm64 ships /usr/lib/libonnxifi.so outside the multiarch
# folders) and libdnnl-dev:arm64 (its dnnl_config.h says no GPU runtime, the amd64 one
# OpenCL). So the build takes ONNX's headers from the amd64 libonnx-dev (they are the
# same protoc 3.21 output) and links libonnx1:arm64's libonnx_proto.so.1, and oneDNN's
# arm64 headers and CMake config are unpacked (not installed) into DEPS below.
packages=(
  crossbuild-essential-arm64 qemu-user
  libprotobuf-dev:arm64 libonnx1:arm64 libssl-dev:arm64 libzstd-dev:arm64 libxxhash-dev:arm64
  libgtest-dev:arm64 libgmock-dev:arm64 libdnnl2:arm64 libgomp1:arm64
  # The serve module. Code generation runs the host's protoc and grpc_cpp_plugin
  # (protobuf-compiler, protobuf-compiler-grpc: Multi-Arch foreign, from setup.sh), which
  # gRPC's arm64 CMake config finds at /usr/bin.
  libgrpc++-dev:arm64 libcpp-httplib-dev:arm64
  # The PNG charts of `slim report`.
  libcairo2-dev:arm64
  # The quant module's image decoders.
  libpng-dev:arm64 libjpeg62-turbo-dev:arm64
  # The fuzz replay tests are built with ASan and UBSan (the cross toolchain's copies sit
  # outside qemu's library prefix).
  libasan8:arm64 libubsan1:arm64
  # The tests run under qemu with / as its library prefix (see cmake/aarch64-linux-gnu.cmake).
  libc6:arm64
)
# Where oneDNN's arm64 development files are unpacked (cmake/aarch64-linux-gnu.cmake looks
# there by default).
DEPS=${SLIM_ARM64_DEPS:-$(cd "$(dirname "$0")/.." && pwd)/build-arm64-deps}

unpack_dnnl() {
  local cfg="$DEPS/usr/lib/aarch64-linux-gnu/cmake/dnnl/dnnl-config.cmake"
  local want
  want=$(dpkg-query -W -f='${Version}' libdnnl2:arm64)
  if [ -f "$cfg" ] && [ "$(cat "$DEPS/.dnnl-version" 2>/dev/null)" = "$want" ]; then return; fi
  echo "setup_arm64: unpacking libdnnl-dev:arm64 $want into $DEPS"
  local tmp
  tmp=$(mktemp -d)
  # apt-get download run as root fetches as the _apt user, which must be able to write there.
  if [ "$(id -u)" -eq 0 ]; then chown _apt "$tmp" 2>/dev/null || true; fi
  (cd "$tmp" && apt-get download -qq "libdnnl-dev:arm64=$want" "libdnnl2:arm64=$want")
  rm -rf "$DEPS"
  mkdir -p "$DEPS"
  for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$DEPS"; done
  echo "$want" > "$DEPS/.dnnl-version"
  rm -rf "$tmp"
}

updated=0
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "setup_arm64: adding the arm64 architecture"
  $SUDO dpkg --add-architecture arm64
  apt_get update -qq
  updated=1
fi

. "$(dirname "$0")/packages.sh"
missing_packages "${packages[@]}"

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup_arm64: all ${#packages[@]} packages present"
else
  echo "setup_arm64: installing ${missing[*]}"
  if [ "$updated" -eq 0 ]; then apt_get update -qq; fi
  # The arm64 and amd64 copies of a Multi-Arch: same library must be the same version, so
  # apt may upgrade a few amd64 packages along with them.
  apt_get install -y -qq --no-install-recommends "${missing[@]}"
fi
unpack_dnnl
