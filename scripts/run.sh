#!/usr/bin/env bash
# The main job: sets up whatever is missing (packages, build), then generates text with the
# embedded default model. Extra arguments go to `specinfer generate`, e.g.
#   scripts/run.sh --prompt "Once upon a time" --max-tokens 100 --temperature 0.8
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
"$ROOT/scripts/setup.sh" >&2
MODEL="${SPECINFER_MODEL:-$ROOT/tests/data/stories260K/stories260K.bin}"
TOKENIZER="${SPECINFER_TOKENIZER:-$ROOT/tests/data/stories260K/tok512.bin}"
has_prompt=0
for a in "$@"; do case "$a" in -p|--prompt|--prompt=*) has_prompt=1 ;; esac; done
extra=()
[ "$has_prompt" -eq 1 ] || extra=(--prompt "Once upon a time")
exec "$BUILD_DIR/specinfer" generate --model "$MODEL" --tokenizer "$TOKENIZER" "${extra[@]}" "$@"
