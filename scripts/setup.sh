#!/usr/bin/env bash
# Installs whatever specinfer still lacks on this machine (Debian packages), then configures and
# builds it into build/. Safe to run again: it installs nothing that is present and rebuilds
# incrementally.
#
#   scripts/setup.sh            # packages + release build
#   BUILD_DIR=out scripts/setup.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"

# Debian packages the build, the tests and the servers need. Why each is there: README.md.
PACKAGES=(
  build-essential cmake ninja-build pkg-config python3 python3-pip python3-venv
  libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev libgtest-dev
  libopenblas-dev libpcre2-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libcpp-httplib-dev libyaml-cpp-dev libgloo-dev libboost-context-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# CUDA is optional: with nvcc present (e.g. /usr/local/cuda) the CUDA backend is compiled too.
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
