#!/usr/bin/env bash
# One-off generation: sets up whatever is missing (packages, build, the default model), then
# generates text with the default model, SmolLM2-135M-Instruct (Q4_1 GGUF). Extra arguments go to
# `specinfer generate`, e.g.
#   scripts/run.sh --prompt "The capital of France is" --max-tokens 64 --temperature 0
# Set SPECINFER_MODEL (and SPECINFER_TOKENIZER for llama2.c files) to use another model.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
"$ROOT/scripts/setup.sh" >&2
MODEL="${SPECINFER_MODEL:-$("$ROOT/scripts/fetch_model.sh")}"
args=(--model "$MODEL")
[ -n "${SPECINFER_TOKENIZER:-}" ] && args+=(--tokenizer "$SPECINFER_TOKENIZER")
has_prompt=0
for a in "$@"; do case "$a" in -p|--prompt|--prompt=*) has_prompt=1 ;; esac; done
[ "$has_prompt" -eq 1 ] || args+=(--prompt "Once upon a time")
exec "$BUILD_DIR/specinfer" generate "${args[@]}" "$@"
