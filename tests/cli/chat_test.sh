#!/usr/bin/env bash
# `specinfer generate --chat` on the default GGUF model (SmolLM2-135M-Instruct Q4_1, placed by
# scripts/fetch_model.sh): the model's ChatML template (with its default system prompt) or a named
# override is applied, chat markers are parsed as special tokens, generation stops at <|im_end|>,
# and bad template names fail cleanly.
#
# Expected prompt ids and greedy continuations were cross-checked with llama.cpp
# (llama-cpp-python 0.3.36, same GGUF, f32 KV cache, tokenize(special=True), greedy): identical
# prompt ids, and the same continuations, with smallest top-1/top-2 logit margins of 1.13
# ("Name the capital of France." with the model's template), 1.40 (chatml override, no system)
# and 0.94 (chatml override + system). Note: with the model's own template (its default system
# prompt), "What is the capital of France?" does NOT answer Paris in llama.cpp either (greedy gives
# "L'Étoile, la Marseillaise, ..."; first-token margin 0.27), so that case checks the prompt ids
# and a clean answer only.
# Usage: chat_test.sh PATH_TO_SPECINFER   (SPECINFER_SOURCE_DIR set by CTest)
set -u
BIN="$1"
SRC="${SPECINFER_SOURCE_DIR:?}"
MODEL="$SRC/models/SmolLM2-135M-Instruct.Q4_1.gguf"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
passes=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { passes=$((passes + 1)); }

# BOS is never doubled: on stories260K (llama2.c; its tokenizer wants BOS and stores it as
# "\n<s>\n"), the llama2, llama3 and gemma templates write BOS themselves, chatml does not: each
# prompt must hold exactly one BOS (id 1), first.
STORIES=(-m "$SRC/tests/data/stories260K/stories260K.bin"
         --tokenizer "$SRC/tests/data/stories260K/tok512.bin")
for t in llama2 llama3 gemma chatml; do
  json=$("$BIN" generate "${STORIES[@]}" --chat --chat-template "$t" --system "Be kind." -p "hi" \
    -n 2 --temperature 0 --json 2>"$TMP/err")
  rc=$?
  if [ $rc -eq 0 ] && python3 -c '
import json, sys
p = json.loads(sys.argv[1])["prompt_tokens"]
sys.exit(0 if p[0] == 1 and p.count(1) == 1 else f"prompt ids {p}")' "$json"; then pass
  else fail "stories260K $t: rc=$rc $json"; cat "$TMP/err"; fi
done

if [ ! -f "$MODEL" ]; then
  echo "default model absent: run scripts/fetch_model.sh ($passes passed, $failures failed)"
  [ "$failures" -eq 0 ] || exit 1
  exit 77
fi

# <|im_start|> = 1 (also this vocabulary's BOS, which add_bos_token=false keeps out), <|im_end|> = 2
# (EOS), "\n" = 198. The default system prompt is SmolLM2's, extracted from its template.
SYS_DEFAULT="1,9690,198,2683,359,253,5356,5646,11173,3365,3511,308,34519,28,7018,411,407,19712,8182,2,198"
SYS_GEO="1,9690,198,2683,359,253,12973,4507,30,2,198"
USER_WHAT="1,4093,198,1780,314,260,3575,282,4649,47,2,198"
USER_NAME="1,4093,198,5820,260,3575,282,4649,30,2,198"
GEN="1,520,9531,198"
PARIS="504,3575,282,4649,314,7042,30,2"  # "The capital of France is Paris." <|im_end|>

# check_json NAME EXPECTED_PROMPT_IDS EXPECTED_TOKENS_OR_EMPTY -- ARGS...
check_json() {
  local name="$1" prompt="$2" tokens="$3"
  shift 4
  local json
  json=$("$BIN" generate -m "$MODEL" --chat --temperature 0 --json "$@" 2>"$TMP/err")
  local rc=$?
  if [ $rc -ne 0 ]; then fail "$name: rc=$rc"; cat "$TMP/err"; return; fi
  if python3 - "$json" "$prompt" "$tokens" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
want_prompt = [int(x) for x in sys.argv[2].split(",")]
if j["prompt_tokens"] != want_prompt:
    sys.exit(f"prompt ids {j['prompt_tokens']} != {want_prompt}")
if sys.argv[3]:
    want = [int(x) for x in sys.argv[3].split(",")]
    if j["tokens"] != want or j["finish_reason"] != "stop":
        sys.exit(f"tokens {j['tokens']} ({j['finish_reason']}) != {want} (stop)")
if "<|im_end|>" in j["text"] or "<|im_start|>" in j["text"] or not j["text"].strip():
    sys.exit(f"bad text {j['text']!r}")
PY
  then pass; else fail "$name: $json"; fi
}

# The brief's question with the model's own template: prompt ids as llama.cpp makes them.
check_json model-template-what "$SYS_DEFAULT,$USER_WHAT,$GEN" "" -- \
  -p "What is the capital of France?" -n 30
# The model's own template, a phrasing the model answers robustly; stops at <|im_end|>.
check_json model-template-name "$SYS_DEFAULT,$USER_NAME,$GEN" "$PARIS" -- \
  -p "Name the capital of France." -n 30
# Named override (plain ChatML: no default system prompt).
check_json chatml-override "$USER_WHAT,$GEN" "$PARIS" -- \
  --chat-template chatml -p "What is the capital of France?" -n 30
# Named override plus a system message.
check_json chatml-system "$SYS_GEO,$USER_NAME,$GEN" "$PARIS" -- \
  --chat-template chatml --system "You are a geography expert." -p "Name the capital of France." -n 30

# Plain-text output mentions Paris and carries no chat markers.
out=$("$BIN" generate -m "$MODEL" --chat --chat-template chatml -p "What is the capital of France?" \
  --temperature 0 -n 30 2>"$TMP/err")
rc=$?
if [ $rc -eq 0 ] && [[ "$out" == *Paris* ]] && [[ "$out" != *"<|im_"* ]]; then pass
else fail "text output: rc=$rc out='$out'"; cat "$TMP/err"; fi

# Bad names and misuse: non-zero exit, no signal, a clear message.
expect_error() {
  local name="$1" pattern="$2"
  shift 2
  "$BIN" generate -m "$MODEL" -p hi -n 2 "$@" >/dev/null 2>"$TMP/err"
  local rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 128 ]; then fail "$name: rc=$rc"; cat "$TMP/err"; return; fi
  if ! grep -qiE "$pattern" "$TMP/err"; then fail "$name: stderr lacks /$pattern/"; cat "$TMP/err"; return; fi
  pass
}
expect_error nonsense-template "unknown chat template 'nonsense'.*chatml, llama2, llama3 or gemma" \
  --chat --chat-template nonsense
expect_error template-without-chat "chat" --chat-template chatml
expect_error system-without-chat "chat" --system "be brief"

echo "$passes passed, $failures failed"
[ "$failures" -eq 0 ]
