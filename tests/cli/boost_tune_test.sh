#!/usr/bin/env bash
# scripts/boost_tune.py end to end on stories260K, a few steps: the LLM's answers through a real
# `specinfer serve` (gRPC), two boost-tuned SSMs trained and exported to GGUF, then loaded by
# `specinfer generate --draft model:...` alone and merged, whose greedy output must equal plain
# decoding (the script exits non-zero otherwise).
#
# The Python packages (scripts/requirements-boost.txt: PyTorch, about 5 GB with its CUDA wheels)
# go into a virtual environment under .venv-boost/ at the repository root, made once and shared
# by the normal and sanitizer builds. Exits 77 (skipped) when they cannot be installed (no
# route to PyPI).
# Usage: boost_tune_test.sh PATH_TO_SPECINFER   (SPECINFER_SOURCE_DIR set by CTest)
set -u
BIN="$1"
SRC="${SPECINFER_SOURCE_DIR:?}"
VENV="${SPECINFER_BOOST_VENV:-$SRC/.venv-boost}"
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
if [ "$failures" -eq 0 ]; then echo "1 passed, 0 failed"; else echo "0 passed, 1 failed"; fi
exit "$failures"
