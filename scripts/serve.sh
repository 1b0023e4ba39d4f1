#!/usr/bin/env bash
# Starts the serving daemon -- OpenAI-compatible HTTP on 127.0.0.1:8000 and gRPC on
# 127.0.0.1:50051 -- on the default model (SmolLM2-135M-Instruct, Q4_1 GGUF), setting up whatever
# is missing first (packages, build, model). Extra arguments go to the daemon (the options of
# `specinfer serve`), e.g.
#   scripts/serve.sh --port 8080 --grpc-port 0 --api-key "$KEY" --host 0.0.0.0
# Set SPECINFER_MODEL (and SPECINFER_TOKENIZER for llama2.c files) to serve another model.
# Stop it with Ctrl-C (SIGINT) or SIGTERM.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
"$ROOT/scripts/setup.sh" >&2
MODEL="${SPECINFER_MODEL:-$("$ROOT/scripts/fetch_model.sh")}"
args=(--model "$MODEL")
[ -n "${SPECINFER_TOKENIZER:-}" ] && args+=(--tokenizer "$SPECINFER_TOKENIZER")
exec "$BUILD_DIR/specinfer" serve "${args[@]}" "$@"
