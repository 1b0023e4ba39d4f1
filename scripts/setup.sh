#!/usr/bin/env bash
# Installs whatever specinfer still lacks on this machine (Debian packages), then configures and
# builds it into build/. Safe to run again: it installs nothing that is present and rebuilds
# incrementally.
#
#   scripts/setup.sh            # packages + release build
#   BUILD_DIR=out scripts/setup.sh
#
# Compiles through ccache (installed here): a rebuild of the same sources, in this checkout or
# another, takes the cached objects. Environment: CMAKE_ARGS (configure arguments of a new build
# folder), SPECINFER_EXTRA_PACKAGES (more Debian packages, e.g. clang), SPECINFER_BUILD_TARGETS
# (what to build; default all), SPECINFER_STAGE_LOG (a file that gets "STAGE SECONDS" lines).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"

# Debian packages the build, the tests and the servers need. Why each is there: README.md.
PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config python3 python3-pip python3-venv
  libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev libgtest-dev
  libopenblas-dev libpcre2-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libcpp-httplib-dev libyaml-cpp-dev libgloo-dev libboost-context-dev
)
# shellcheck disable=SC2206  # a space-separated list of package names
PACKAGES+=(${SPECINFER_EXTRA_PACKAGES:-})

stage_start=$SECONDS
stage_done() {  # stage_done NAME: the seconds since the last stage, to SPECINFER_STAGE_LOG
  [ -z "${SPECINFER_STAGE_LOG:-}" ] || echo "$1 $((SECONDS - stage_start))" >>"$SPECINFER_STAGE_LOG"
  stage_start=$SECONDS
}

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

stage_done packages

# CUDA is optional: with nvcc present (e.g. /usr/local/cuda) the CUDA backend is compiled too.
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  # shellcheck disable=SC2086  # CMAKE_ARGS is a list of arguments
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
fi
stage_done configure
targets=()
# shellcheck disable=SC2206
[ -z "${SPECINFER_BUILD_TARGETS:-}" ] || targets=(--target ${SPECINFER_BUILD_TARGETS})
cmake --build "$BUILD_DIR" -j "$(nproc)" "${targets[@]}"
stage_done build
