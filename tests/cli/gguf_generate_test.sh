#!/usr/bin/env bash
# `specinfer generate` on the default GGUF model (SmolLM2-135M-Instruct Q4_1, placed by
# scripts/fetch_model.sh), and clear errors for corrupt GGUF files.
# Usage: gguf_generate_test.sh PATH_TO_SPECINFER   (SPECINFER_SOURCE_DIR set by CTest)
set -u
BIN="$1"
SRC="${SPECINFER_SOURCE_DIR:?}"
MODEL="$SRC/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$MODEL" ]; then
  echo "default model absent: run scripts/fetch_model.sh"
  exit 77
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
passes=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { passes=$((passes + 1)); }

out=$("$BIN" generate -m "$MODEL" -p "The capital of France is" -n 8 --temperature 0 2>"$TMP/err")
rc=$?
if [ $rc -eq 0 ] && [[ "$out" == " Paris."* ]]; then pass; else fail "greedy: rc=$rc out='$out'"; cat "$TMP/err"; fi

# Corrupt files: each a clear error, non-zero exit, no signal.
expect_error() {
  local name="$1" pattern="$2" file="$3"
  "$BIN" generate -m "$file" -p hi -n 2 >/dev/null 2>"$TMP/err"
  local rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 128 ]; then fail "$name: rc=$rc"; cat "$TMP/err"; return; fi
  if ! grep -qiE "$pattern" "$TMP/err"; then fail "$name: stderr lacks /$pattern/"; cat "$TMP/err"; return; fi
  pass
}
head -c 4000000 "$MODEL" >"$TMP/truncated.gguf"
expect_error truncated "truncated|past the end|beyond|cannot fit" "$TMP/truncated.gguf"
head -c 100 "$MODEL" >"$TMP/header_only.gguf"
expect_error header-only "truncated|past the end|beyond|cannot fit" "$TMP/header_only.gguf"
{ printf 'GGUF'; printf '\x63\x00\x00\x00'; head -c 200 /dev/zero; } >"$TMP/version.gguf"
expect_error bad-version "version" "$TMP/version.gguf"

echo "$passes passed, $failures failed"
[ "$failures" -eq 0 ]
