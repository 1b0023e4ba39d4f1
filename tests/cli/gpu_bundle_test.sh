#!/usr/bin/env bash
# scripts/gpu_bundle.sh packs the GPU test and benchmark programs with the shared libraries they
# need beyond the CUDA toolkit and the C runtime, and a run.sh that refuses clearly where there is
# no GPU. Exits 77 (skipped) in a build without the CUDA programs.
# Usage: gpu_bundle_test.sh PATH_TO_SPECINFER   (SPECINFER_SOURCE_DIR set by CTest)
set -u
BUILD_DIR="$(cd "$(dirname "$1")" && pwd)"
SRC="${SPECINFER_SOURCE_DIR:?}"
if [[ ! -x "$BUILD_DIR/tests/cuda_tests" ]]; then
  echo "skipped: no CUDA build (tests/cuda_tests)"
  exit 77
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

BUILD_DIR="$BUILD_DIR" "$SRC/scripts/gpu_bundle.sh" "$TMP/b.tgz" >"$TMP/out" 2>&1 ||
  fail "gpu_bundle.sh failed: $(cat "$TMP/out")"
mkdir "$TMP/x"
tar xzf "$TMP/b.tgz" -C "$TMP/x" || fail "the bundle does not unpack"
for f in run.sh tests/cuda_tests bench_cuda_attention bench_cuda_step BUNDLE_INFO; do
  [[ -e "$TMP/x/$f" ]] || fail "the bundle lacks $f"
done
grep -q "^source_dir=$SRC\$" "$TMP/x/BUNDLE_INFO" || fail "BUNDLE_INFO: $(cat "$TMP/x/BUNDLE_INFO")"
for lib in "$TMP"/x/lib/*; do
  case "$(basename "$lib")" in
    libc.so* | libstdc++.so* | libcudart.so* | libcublas* | libcuda.so*)
      fail "the bundle carries $(basename "$lib")" ;;
  esac
done
# The project's own dependencies (a GPU machine's image need not have them) travel with it.
for dep in libspdlog libfmt libopenblas; do
  if ldd "$BUILD_DIR/tests/cuda_tests" | grep -q "$dep"; then
    ls "$TMP"/x/lib/"$dep"* >/dev/null 2>&1 || fail "the bundle lacks $dep"
  fi
done
if ! nvidia-smi -L >/dev/null 2>&1; then
  (cd "$SRC" && "$TMP/x/run.sh" tests) >"$TMP/run" 2>&1
  rc=$?
  [[ $rc -eq 2 ]] || fail "run.sh without a GPU exited $rc, want 2"
  grep -q "no NVIDIA GPU found" "$TMP/run" || fail "run.sh without a GPU said: $(cat "$TMP/run")"
fi

if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "ok"
