#!/usr/bin/env bash
# Starts the serving daemon -- OpenAI-compatible HTTP on 127.0.0.1:8000 and gRPC on
# 127.0.0.1:50051 -- on the default model (SmolLM2-135M-Instruct, Q4_1 GGUF), setting up whatever
# is missing first (packages, build, model). Extra arguments go to the daemon (the options of
# `specinfer serve`), e.g.
#   scripts/serve.sh --port 8080 --grpc-port 0 --api-key "$KEY" --host 0.0.0.0
# Set SPECINFER_MODEL (and SPECINFER_TOKENIZER for llama2.c files) to serve another model.
# Requests that give no temperature or top_p get the default model's own recommended sampling
# (its model card's temperature 0.2, top_p 0.9) instead of OpenAI's 1 and 1; `--temperature T`
# and `--top-p P` here replace them (the last one given wins); another model gets OpenAI's.
# Stop it with Ctrl-C (SIGINT) or SIGTERM.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
"$ROOT/scripts/setup.sh" >&2
if [ -n "${SPECINFER_MODEL:-}" ]; then
  args=(--model "$SPECINFER_MODEL")
else
  args=(--model "$("$ROOT/scripts/fetch_model.sh")" --temperature 0.2 --top-p 0.9)
fi
[ -n "${SPECINFER_TOKENIZER:-}" ] && args+=(--tokenizer "$SPECINFER_TOKENIZER")
exec "$BUILD_DIR/specinfer" serve "${args[@]}" "$@"
