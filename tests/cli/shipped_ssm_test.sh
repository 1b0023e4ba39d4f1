#!/usr/bin/env bash
# The trained draft shipped under models/ssm/ (scripts/boost_tune.py, README "Trained drafts")
# loads as `--draft model:...` on the default model, keeps greedy output identical to plain
# decoding, and is a real trained draft: more than 1.8 tokens per LLM pass on chat prompts that
# were not in its training set (topics held out by boost_tune.py), with tree 1,1,3,1,1.
# Usage: shipped_ssm_test.sh PATH_TO_SPECINFER   (SPECINFER_SOURCE_DIR set by CTest)
set -u
BIN="$1"
SRC="${SPECINFER_SOURCE_DIR:?}"
MODEL="$SRC/models/SmolLM2-135M-Instruct.Q4_1.gguf"
SSM="$SRC/models/ssm/smollm2-135m-instruct-boost0.gguf"
if [ ! -f "$MODEL" ]; then
  echo "default model absent: run scripts/fetch_model.sh"
  exit 77
fi
failures=0
passes=0
generated=0
llm_passes=0
for prompt in "What is photosynthesis?" "Write a short poem about penguins." \
              "Give me five tips related to gardening."; do
  plain=$("$BIN" generate -m "$MODEL" --chat -p "$prompt" -n 96 --temperature 0 --json \
          --threads 2 2>/dev/null)
  spec=$("$BIN" generate -m "$MODEL" --chat -p "$prompt" -n 96 --temperature 0 --json \
         --threads 2 --draft "model:$SSM" --tree 1,1,3,1,1 --spec-budget static 2>/dev/null)
  a=$(printf '%s' "$plain" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
  b=$(printf '%s' "$spec" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
  if [ -n "$a" ] && [ "$a" = "$b" ]; then passes=$((passes + 1)); else
    echo "FAIL: '$prompt': speculative output differs from plain decoding"; failures=$((failures + 1)); fi
  read -r n p < <(printf '%s' "$spec" | python3 -c \
    'import json,sys; j=json.load(sys.stdin); print(len(j["tokens"]), j["speculation"]["llm_passes"])')
  generated=$((generated + n)); llm_passes=$((llm_passes + p))
done
tpp=$(awk -v g="$generated" -v p="$llm_passes" 'BEGIN { printf "%.2f", g / (p > 0 ? p : 1) }')
echo "shipped SSM: $generated tokens in $llm_passes LLM passes ($tpp per pass)"
if awk -v t="$tpp" 'BEGIN { exit !(t > 1.8) }'; then passes=$((passes + 1)); else
  echo "FAIL: $tpp tokens per pass: not a trained draft"; failures=$((failures + 1)); fi
echo "$passes passed, $failures failed"
[ "$failures" -eq 0 ]
