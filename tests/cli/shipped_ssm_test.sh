#!/usr/bin/env bash
# The trained drafts shipped under models/ssm/ (scripts/boost_tune.py, README "Trained drafts")
# load as `--draft model:...` on the default model, alone and merged, keep greedy output
# identical to plain decoding, and are real trained drafts: boost0 gives more than 1.8 tokens
# per LLM pass on chat prompts that were not in its training set (topics held out by
# boost_tune.py), with tree 1,1,3,1,1, and boost0 merged with boost1 (boosted against it) more
# than boost0 alone.
# Usage: shipped_ssm_test.sh PATH_TO_SPECINFER   (SPECINFER_SOURCE_DIR set by CTest)
set -u
BIN="$1"
SRC="${SPECINFER_SOURCE_DIR:?}"
MODEL="$SRC/models/SmolLM2-135M-Instruct.Q4_1.gguf"
SSM="$SRC/models/ssm/smollm2-135m-instruct-boost0.gguf"
SSM1="$SRC/models/ssm/smollm2-135m-instruct-boost1.gguf"
if [ ! -f "$MODEL" ]; then
  echo "default model absent: run scripts/fetch_model.sh"
  exit 77
fi
failures=0
passes=0
declare -A generated=() llm_passes=()
PROMPTS=("What is photosynthesis?" "Write a short poem about penguins."
         "Give me five tips related to gardening.")
plain_text() {
  "$BIN" generate -m "$MODEL" --chat -p "$1" -n 96 --temperature 0 --json --threads 2 \
    2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])'
}
# speculate NAME PROMPT PLAIN DRAFT...: the drafts' greedy output must be PLAIN; counts the
# tokens and LLM passes under NAME.
speculate() {
  local name="$1" prompt="$2" plain="$3" out got n p
  shift 3
  out=$("$BIN" generate -m "$MODEL" --chat -p "$prompt" -n 96 --temperature 0 --json \
        --threads 2 "$@" --tree 1,1,3,1,1 --spec-budget static 2>/dev/null)
  got=$(printf '%s' "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
  if [ -n "$plain" ] && [ "$plain" = "$got" ]; then passes=$((passes + 1)); else
    echo "FAIL: '$prompt': $name: speculative output differs from plain decoding"
    failures=$((failures + 1))
  fi
  read -r n p < <(printf '%s' "$out" | python3 -c \
    'import json,sys; j=json.load(sys.stdin); print(len(j["tokens"]), j["speculation"]["llm_passes"])')
  generated[$name]=$(( ${generated[$name]:-0} + ${n:-0} ))
  llm_passes[$name]=$(( ${llm_passes[$name]:-0} + ${p:-0} ))
}
for prompt in "${PROMPTS[@]}"; do
  plain=$(plain_text "$prompt")
  speculate boost0 "$prompt" "$plain" --draft "model:$SSM"
  speculate merged "$prompt" "$plain" --draft "model:$SSM" --draft "model:$SSM1"
done
per_pass() { awk -v g="${generated[$1]}" -v p="${llm_passes[$1]}" 'BEGIN { printf "%.2f", g / (p > 0 ? p : 1) }'; }
tpp=$(per_pass boost0)
mtpp=$(per_pass merged)
echo "shipped SSM: ${generated[boost0]} tokens in ${llm_passes[boost0]} LLM passes ($tpp per pass)"
echo "shipped SSMs merged: ${generated[merged]} tokens in ${llm_passes[merged]} LLM passes ($mtpp per pass)"
if awk -v t="$tpp" 'BEGIN { exit !(t > 1.8) }'; then passes=$((passes + 1)); else
  echo "FAIL: $tpp tokens per pass: not a trained draft"; failures=$((failures + 1)); fi
if awk -v m="$mtpp" -v t="$tpp" 'BEGIN { exit !(m > t) }'; then passes=$((passes + 1)); else
  echo "FAIL: merged $mtpp tokens per pass, not more than boost0's $tpp alone"; failures=$((failures + 1)); fi
echo "$passes passed, $failures failed"
[ "$failures" -eq 0 ]
