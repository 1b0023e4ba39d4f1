#!/usr/bin/env bash
# scripts/boost_tune.py end to end on stories260K, a few steps: the LLM's answers through a real
# `specinfer serve` (gRPC), two boost-tuned SSMs trained and exported to GGUF, then loaded by
# `specinfer generate --draft model:...` alone and merged, whose greedy output must equal plain
# decoding (the script exits non-zero otherwise).
#
# The Python packages (scripts/requirements-boost.txt: PyTorch, about 5 GB with its CUDA wheels)
# go into a virtual environment in the user's cache (~/.cache/specinfer/venv-boost, or
# SPECINFER_BOOST_VENV), made once and shared by the normal and sanitizer builds and by every
# checkout on the machine (CI's fresh clones too; installing took minutes of each CI run when it
# lived in the checkout). Exits 77 (skipped) when they cannot be installed (no route to PyPI).
# Usage: boost_tune_test.sh PATH_TO_SPECINFER   (SPECINFER_SOURCE_DIR set by CTest)
set -u
BIN="$1"
SRC="${SPECINFER_SOURCE_DIR:?}"
VENV="${SPECINFER_BOOST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/specinfer/venv-boost}"
REQ="$SRC/scripts/requirements-boost.txt"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# The venv is current when it holds exactly the pinned requirements (a stamp of the file).
if ! cmp -s "$REQ" "$VENV/requirements.stamp"; then
  rm -rf "$VENV"
  if ! python3 -m venv "$VENV" >"$TMP/venv.log" 2>&1; then
    echo "SKIP: python3 -m venv failed:"; tail -3 "$TMP/venv.log"
    exit 77
  fi
  if ! timeout 1200 "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQ" \
      >"$TMP/pip.log" 2>&1; then
    echo "SKIP: could not install scripts/requirements-boost.txt from PyPI (no network?):"
    tail -5 "$TMP/pip.log"
    rm -rf "$VENV"
    exit 77
  fi
  cp "$REQ" "$VENV/requirements.stamp"
fi

ST="$SRC/tests/data/stories260K"
export SPECINFER_BIN="$BIN"
PY="$VENV/bin/python"
set -e
"$PY" "$SRC/scripts/boost_tune.py" data --model "$ST/stories260K.bin" --tokenizer "$ST/tok512.bin" \
  --chat-template none --out "$TMP/work" --prompts 12 --max-tokens 48 --threads 2 | tail -1
# Run again: the answers are all there, so it keeps them and asks the LLM for none.
"$PY" "$SRC/scripts/boost_tune.py" data --model "$ST/stories260K.bin" --tokenizer "$ST/tok512.bin" \
  --chat-template none --out "$TMP/work" --prompts 12 --max-tokens 48 --threads 2 \
  | tee "$TMP/data2.log" | tail -1
"$PY" "$SRC/scripts/boost_tune.py" train --model "$ST/stories260K.bin" --data "$TMP/work" \
  --out "$TMP/work/ssm" --ssms 2 --steps 40 --dim 64 --layers 1 --lr 1e-2 --log-every 40 \
  --heldout-every 40 --threads 2 | tee "$TMP/train.log"
"$PY" "$SRC/scripts/boost_tune.py" eval --model "$ST/stories260K.bin" --tokenizer "$ST/tok512.bin" \
  --chat-template none --data "$TMP/work" --ssm "$TMP/work/ssm/ssm-0.gguf" \
  "$TMP/work/ssm/ssm-1.gguf" --eval-prompts 4 --max-tokens 48 --threads 2 | tee "$TMP/eval.log"
# A boosted SSM added to one trained before (loaded from its GGUF), exported as Q4_1, other
# shape and draft vocabulary; eval checks its greedy output against plain decoding.
"$PY" "$SRC/scripts/boost_tune.py" train --model "$ST/stories260K.bin" --data "$TMP/work" \
  --out "$TMP/work/ssm-b" --boost-from "$TMP/work/ssm/ssm-0.gguf" --ssms 1 --steps 10 --dim 32 \
  --layers 1 --draft-vocab 128 --quant Q4_1 --log-every 10 --threads 2 | tee "$TMP/train-b.log"
"$PY" "$SRC/scripts/boost_tune.py" eval --model "$ST/stories260K.bin" --tokenizer "$ST/tok512.bin" \
  --chat-template none --data "$TMP/work" --ssm "$TMP/work/ssm/ssm-0.gguf" \
  "$TMP/work/ssm-b/ssm-1.gguf" --eval-prompts 4 --max-tokens 48 --threads 2 | tee "$TMP/eval-b.log"
set +e

failures=0
grep -q "boost: SSM 1 down-weights" "$TMP/train.log" || { echo "FAIL: no boosting round"; failures=1; }
grep -q "^  merged " "$TMP/eval.log" || { echo "FAIL: the merged SSMs were not evaluated"; failures=1; }
# Training must have learnt something: the last logged top-1 agreement of SSM 0 above chance.
grep -q "^data: keeping the [1-9][0-9]* answers" "$TMP/data2.log" && grep -q "^data: 0 answers" "$TMP/data2.log" \
  || { echo "FAIL: a second data run did not keep the first one's answers"; failures=1; }
grep -q "ssm 0 step 40/40 held-out top-1 [0-9.]" "$TMP/train.log" \
  || { echo "FAIL: no held-out agreement printed"; failures=1; }
top1=$(grep "ssm 0 step 40/40 loss" "$TMP/train.log" | sed -E 's/.*top-1 ([0-9.]+).*/\1/')
if ! awk -v t="${top1:-0}" 'BEGIN { exit !(t > 0.1) }'; then
  echo "FAIL: SSM 0 top-1 agreement after 40 steps is ${top1:-none}"; failures=1
fi
# --boost-from: the loaded SSM gets as many positions right here as it did in training (its
# weights went through Q8_0, so allow a little), and the new one is boosted against it.
share() { grep "boost: SSM 1 down-weights" "$1" | sed -E 's/.* the ([0-9.]+)% .*/\1/'; }
s1=$(share "$TMP/train.log"); s2=$(share "$TMP/train-b.log")
grep -q "boost: SSM 0 is .*ssm-0.gguf" "$TMP/train-b.log" \
  && awk -v a="${s1:-x}" -v b="${s2:-y}" 'BEGIN { d = a - b; exit !(a > 0 && (d < 0 ? -d : d) < 2) }' \
  || { echo "FAIL: --boost-from: SSM 0's share of positions ${s2:-none}%, in training ${s1:-none}%"; failures=1; }
grep -q "^  ssm-1.gguf .*tokens/pass" "$TMP/eval-b.log" && grep -q "^  merged " "$TMP/eval-b.log" \
  || { echo "FAIL: the Q4_1 SSM trained with --boost-from was not evaluated"; failures=1; }
if [ "$failures" -eq 0 ]; then echo "1 passed, 0 failed"; else echo "0 passed, 1 failed"; fi
exit "$failures"
