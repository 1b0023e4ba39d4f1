#!/usr/bin/env bash
# Sets up and builds what is missing (scripts/setup.sh), then runs the whole test suite with
# CTest. GPU tests carry the label `gpu` and report themselves skipped on machines without one.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
"$ROOT/scripts/setup.sh"
# The default model (SmolLM2-135M-Instruct GGUF): the GGUF, tokenizer and forward-pass tests use it.
"$ROOT/scripts/fetch_model.sh" >/dev/null
cd "$BUILD_DIR"
ctest --output-on-failure -j "$(nproc)" "$@"
