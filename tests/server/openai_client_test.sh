#!/usr/bin/env bash
# The official `openai` Python package (pinned, from PyPI) against the real daemon.
#
# Creates a virtual environment in the user's cache once (~/.cache/specinfer/openai-venv, reused
# by later runs, other build folders and other checkouts), starts
# `specinfer serve` on a free loopback port with an API key -- on the default model
# (SmolLM2-135M-Instruct, placed by scripts/fetch_model.sh) if present, else on stories260K with
# the chatml template -- and runs openai_client_test.py against it. Exits 77 (skipped) when the
# package cannot be installed (no route to PyPI).
# Usage: openai_client_test.sh PATH_TO_SPECINFER_SERVER   (SPECINFER_SOURCE_DIR set by CTest)
set -u
BIN="$1"
SRC="${SPECINFER_SOURCE_DIR:?}"
OPENAI_VERSION="1.109.1"
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/specinfer/openai-venv"
TMP=$(mktemp -d)
SERVER_PID=""
cleanup() {
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT

if ! "$VENV/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" \
    2>/dev/null; then
  rm -rf "$VENV"
  if ! python3 -m venv "$VENV" >"$TMP/venv.log" 2>&1; then
    echo "SKIP: python3 -m venv failed:"; tail -3 "$TMP/venv.log"
    exit 77
  fi
  if ! timeout 600 "$VENV/bin/pip" install --quiet --disable-pip-version-check \
      "openai==$OPENAI_VERSION" >"$TMP/pip.log" 2>&1; then
    echo "SKIP: could not install openai==$OPENAI_VERSION from PyPI (no network?):"
    tail -5 "$TMP/pip.log"
    rm -rf "$VENV"
    exit 77
  fi
fi

MODEL_ARGS=()
if [ -f "$SRC/models/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
  MODEL_ARGS=(--model "$SRC/models/SmolLM2-135M-Instruct.Q4_1.gguf")
else
  echo "note: default model absent (scripts/fetch_model.sh); using stories260K"
  MODEL_ARGS=(--model "$SRC/tests/data/stories260K/stories260K.bin"
              --tokenizer "$SRC/tests/data/stories260K/tok512.bin" --chat-template chatml)
fi
API_KEY="sk-specinfer-test-$$"
SPECINFER_API_KEY="$API_KEY" "$BIN" serve "${MODEL_ARGS[@]}" --port 0 --grpc-port 0 --threads 2 \
  >"$TMP/out" 2>"$TMP/err" &
SERVER_PID=$!
for _ in $(seq 1 600); do
  grep -q '^listening ' "$TMP/out" && break
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.1
done
LINE=$(grep '^listening ' "$TMP/out")
if [ -z "$LINE" ]; then
  echo "FAIL: the daemon did not start:"; cat "$TMP/out" "$TMP/err"
  exit 1
fi
HTTP=$(sed -n 's/.*http=\([^ ]*\).*/\1/p' <<<"$LINE")
NAME=$(sed -n 's/.* model=\(.*\)$/\1/p' <<<"$LINE")

SPECINFER_BASE_URL="http://$HTTP" SPECINFER_API_KEY="$API_KEY" SPECINFER_MODEL_NAME="$NAME" \
  "$VENV/bin/python" "$SRC/tests/server/openai_client_test.py"
rc=$?

# A clean shutdown on SIGTERM.
kill -TERM "$SERVER_PID"
wait "$SERVER_PID"
src=$?
SERVER_PID=""
if [ $src -ne 0 ]; then
  echo "FAIL: the daemon exited with status $src on SIGTERM:"; tail -20 "$TMP/err"
  rc=1
fi
[ $rc -ne 0 ] && { echo "daemon log:"; tail -30 "$TMP/err"; }
exit $rc
