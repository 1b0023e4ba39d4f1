#!/usr/bin/env bash
# Runs the real `specinfer generate` binary: output on the happy path, and a clear message with a
# non-zero exit (never a crash) for each kind of bad input.
# Usage: generate_test.sh PATH_TO_SPECINFER   (SPECINFER_SOURCE_DIR set by CTest)
set -u
BIN="$1"
SRC="${SPECINFER_SOURCE_DIR:?}"
DATA="$SRC/tests/data/stories260K"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
passes=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { passes=$((passes + 1)); }

# expect_error NAME PATTERN -- ARGS...: non-zero exit below 128 (no signal) and PATTERN on stderr.
expect_error() {
  local name="$1" pattern="$2"
  shift 3
  "$BIN" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ "$rc" -eq 0 ]; then fail "$name: exit 0"; return; fi
  if [ "$rc" -ge 128 ]; then fail "$name: killed by a signal (rc=$rc)"; cat "$TMP/err"; return; fi
  if ! grep -qiE "$pattern" "$TMP/err"; then
    fail "$name: stderr lacks /$pattern/:"; cat "$TMP/err"; return
  fi
  pass
}

# Happy path: llama2.c's published greedy vector, byte for byte (plus the final newline).
"$BIN" generate -m "$DATA/stories260K.bin" --tokenizer "$DATA/tok512.bin" -p "" -n 200 \
  --temperature 0 >"$TMP/out" 2>"$TMP/err"
{ cat "$DATA/expected_greedy_200.txt"; echo; } >"$TMP/want"
if cmp -s "$TMP/out" "$TMP/want"; then pass; else fail "greedy vector differs"; diff "$TMP/out" "$TMP/want" | head; fi

# --json: one object with text, tokens and timings.
"$BIN" generate -m "$DATA/stories260K.bin" --tokenizer "$DATA/tok512.bin" -p "Once upon a time" \
  -n 20 --temperature 0 --json >"$TMP/json" 2>"$TMP/err"
if python3 - "$TMP/json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["text"].startswith(", there was a little girl"), j["text"]
assert len(j["tokens"]) == 20
assert j["timing"]["decode_tokens_per_second"] > 0
assert j["finish_reason"] == "length"
PY
then pass; else fail "--json output"; cat "$TMP/json"; fi

# Speculation: the greedy published vector again, with prompt lookup and a self-draft merged,
# and the statistics in --json (of full trees: the adaptive controller would choose depths by the
# measured costs, so the tokens per pass would depend on the machine's load). --enforce-eager
# (no CUDA graphs) is accepted on any backend and changes nothing on the CPU.
"$BIN" generate -m "$DATA/stories260K.bin" --tokenizer "$DATA/tok512.bin" -p "" -n 200 \
  --temperature 0 --draft ngram --draft layers:3 --draft-backend cpu,cpu --tree 2,1,1,1 \
  --enforce-eager >"$TMP/out" 2>"$TMP/err"
if cmp -s "$TMP/out" "$TMP/want"; then pass; else fail "speculative greedy vector differs"; cat "$TMP/err"; fi
"$BIN" generate -m "$DATA/stories260K.bin" --tokenizer "$DATA/tok512.bin" -p "" -n 100 \
  --temperature 0 --draft "model:$DATA/stories260K.bin" --tree 1,1,1,1 --spec-budget static \
  --json >"$TMP/json" 2>"$TMP/err"
if python3 - "$TMP/json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
s = j["speculation"]
assert s["tree"] == "1,1,1,1", s
assert s["tokens_per_pass"] > 4.5, s           # the model drafting for itself is always right
assert s["speculators"][0]["accepted_tokens"] == s["accepted_tokens"] > 0, s
assert sum(s["accepted_at_depth"]) == s["accepted_tokens"], s
assert len(j["tokens"]) == 100
PY
then pass; else fail "--json speculation statistics"; cat "$TMP/json"; fi
expect_error "bad tree" "tree width 0" -- generate -m "$DATA/stories260K.bin" \
  --tokenizer "$DATA/tok512.bin" -p "x" --draft ngram --tree 1,0,1
expect_error "too many layers" "1 to 4" -- generate -m "$DATA/stories260K.bin" \
  --tokenizer "$DATA/tok512.bin" -p "x" --draft layers:9
expect_error "draft backends per draft" "2 given for 1 drafts" -- generate \
  -m "$DATA/stories260K.bin" --tokenizer "$DATA/tok512.bin" -p "x" --draft layers:2 \
  --draft-backend cpu,cpu
expect_error "unknown draft backend" "tpu" -- generate -m "$DATA/stories260K.bin" \
  --tokenizer "$DATA/tok512.bin" -p "x" --draft layers:2 --draft-backend tpu
expect_error "unknown draft" "unknown draft" -- generate -m "$DATA/stories260K.bin" \
  --tokenizer "$DATA/tok512.bin" -p "x" --draft eagle

# A tokenizer.bin beside the model is found without --tokenizer.
mkdir -p "$TMP/beside"
cp "$DATA/stories260K.bin" "$TMP/beside/model.bin"
cp "$DATA/tok512.bin" "$TMP/beside/tokenizer.bin"
if "$BIN" generate -m "$TMP/beside/model.bin" -p "" -n 5 --temperature 0 >/dev/null 2>&1; then
  pass; else fail "tokenizer.bin beside the model not found"; fi

# Bad inputs.
head -c 500000 "$DATA/stories260K.bin" >"$TMP/truncated.bin"
expect_error truncated "truncated" -- generate -m "$TMP/truncated.bin" --tokenizer "$DATA/tok512.bin" -p hi
python3 - "$DATA/stories260K.bin" "$TMP/badheader.bin" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
b[12:16] = struct.pack("<i", 7)  # n_heads = 7 does not divide dim = 64
open(sys.argv[2], "wb").write(b)
PY
expect_error bad-header "impossible value" -- generate -m "$TMP/badheader.bin" --tokenizer "$DATA/tok512.bin" -p hi
mkdir -p "$TMP/alone"
cp "$DATA/stories260K.bin" "$TMP/alone/model.bin"
expect_error missing-tokenizer "no tokenizer" -- generate -m "$TMP/alone/model.bin" -p hi
expect_error missing-tokenizer-file "not.?found|cannot open" -- generate -m "$DATA/stories260K.bin" --tokenizer "$TMP/none.bin" -p hi
head -c 100 "$DATA/tok512.bin" >"$TMP/tok_truncated.bin"
expect_error truncated-tokenizer "truncated" -- generate -m "$DATA/stories260K.bin" --tokenizer "$TMP/tok_truncated.bin" -p hi
expect_error missing-model "not found" -- generate -m "$TMP/nope.bin" -p hi
expect_error prompt-too-long "does not fit" -- generate -m "$DATA/stories260K.bin" --tokenizer "$DATA/tok512.bin" \
  --context 16 -p "Once upon a time there was a little girl named Lily who loved to play outside"
expect_error bad-temperature "temperature" -- generate -m "$DATA/stories260K.bin" --tokenizer "$DATA/tok512.bin" -p hi --temperature -1
expect_error bad-top-p "top_p|top-p" -- generate -m "$DATA/stories260K.bin" --tokenizer "$DATA/tok512.bin" -p hi --top-p 0
expect_error no-model-flag "model" -- generate -p hi

echo "$passes passed, $failures failed"
[ "$failures" -eq 0 ]
