#!/usr/bin/env bash
# Runs the real `specinfer worker --role ssm` for SSM entries with `backend: cuda`: the device each
# replica is started on is the one the config names (`gpu:`), else its place among the GPU SSM
# replicas on its host (dist/cluster_config.h). On a machine with too few GPUs the worker exits
# naming the device it was given ("no CUDA device N (found M)"), which is what this checks; an
# entry on the CPU beside them is not counted. Exits 77 (skipped) in a build without the CUDA
# backend, where no device is ever chosen.
# Usage: cluster_gpu_worker_test.sh PATH_TO_SPECINFER   (SPECINFER_SOURCE_DIR set by CTest)
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

cat >"$TMP/gpu.yaml" <<EOF
models: {llm: {path: $DATA/stories260K.bin, tokenizer: $DATA/tok512.bin}}
ssm:
  - spec: 'layers:2'
    backend: cuda
    replicas: [{port: 0, gpu: 7}, {port: 0}, {port: 0}]
  - spec: ngram
    replicas: [{port: 0}]
  - spec: 'layers:3'
    backend: cuda
    replicas: [{port: 0}]
llm: {}
EOF

# worker INDEX DEVICE: ssm worker INDEX (config order) must be started on DEVICE.
worker() {
  local index="$1" device="$2"
  timeout 120 "$BIN" worker --config "$TMP/gpu.yaml" --role ssm --index "$index" \
    >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if grep -q "no CUDA backend" "$TMP/err"; then
    echo "this build has no CUDA backend: skipping"
    exit 77
  fi
  if [ "$rc" -eq 124 ] || grep -q "listening" "$TMP/out"; then
    echo "ssm[$index] started (this machine has GPU $device): skipping"
    exit 77
  fi
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ]; then
    fail "ssm[$index]: rc=$rc"; cat "$TMP/err"; return
  fi
  if ! grep -qE "no CUDA device $device \(found [0-9]+\)" "$TMP/err"; then
    fail "ssm[$index]: expected device $device:"; cat "$TMP/err"; return
  fi
  pass
}

worker 0 7  # as configured
worker 2 2  # the third replica of the first cuda entry: its place (0: gpu 7's replica, 1, 2)
worker 4 3  # the cuda entry after the ngram one: after the first entry's three replicas

echo "$passes passed, $failures failed"
[ "$failures" -eq 0 ]
