#!/usr/bin/env bash
# Sets up and builds what is missing (scripts/setup.sh), then runs the whole test suite with
# CTest. GPU tests carry the label `gpu` and report themselves skipped on machines without one.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
"$ROOT/scripts/setup.sh"
cd "$BUILD_DIR"
ctest --output-on-failure -j "$(nproc)" "$@"
