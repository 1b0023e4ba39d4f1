#!/usr/bin/env bash
# Sets up and builds what is missing (scripts/setup.sh), then runs the whole test suite with
# CTest. GPU tests carry the label `gpu` and report themselves skipped on machines without one.
#
#   scripts/test.sh                              # the suite (what CI runs first)
#   scripts/test.sh -L server                    # extra arguments go to ctest
#   scripts/test.sh --sanitize address,undefined # ASan + UBSan build in build-asan (CI runs it too)
#   scripts/test.sh --sanitize thread            # TSan build in build-tsan: the concurrent tests
#
# The address,undefined tree is built with clang and also holds the libFuzzer targets that
# scripts/fuzz.sh runs (scripts/sanitizer/env.sh). SPECINFER_STAGE_LOG=FILE appends
# "STAGE SECONDS" lines (packages, configure, build, model, tests) for .ci/run's table.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

sanitize=""
if [ "${1:-}" = "--sanitize" ]; then
  sanitize="${2:?--sanitize needs address,undefined or thread}"
  shift 2
fi

ctest_args=()
if [ -z "$sanitize" ]; then
  BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
else
  # shellcheck source=sanitizer/env.sh
  . "$ROOT/scripts/sanitizer/env.sh"
  sanitizer_env "$sanitize" || exit 2
  case "$sanitize" in
    thread)
      # The tests whose code runs on several threads: servers, scheduler and engine core, batch
      # generation, distributed workers and collectives; not the single-threaded SmolLM2
      # conformance checks (minutes of one thread's arithmetic, tens of times slower under TSan).
      ctest_args+=(-L "server|engine|dist" -E "Conformance")
      ;;
    *)
      # Not the statistical tests (label `statistical`: 4000-20000 draws of the same code each,
      # 3-4 minutes apiece under ASan); the normal build runs them, and the short sampled tests
      # (VerifyStochastic, BatchedDraft, DynamicTree, ...) take that code through ASan here.
      ctest_args+=(-LE statistical)
      ;;
  esac
fi

BUILD_DIR="$BUILD_DIR" "$ROOT/scripts/setup.sh"
start=$SECONDS
# The default model (SmolLM2-135M-Instruct GGUF): the GGUF, tokenizer and forward-pass tests use it.
"$ROOT/scripts/fetch_model.sh" >/dev/null
[ -z "${SPECINFER_STAGE_LOG:-}" ] || echo "model $((SECONDS - start))" >>"$SPECINFER_STAGE_LOG"
start=$SECONDS
cd "$BUILD_DIR"
rc=0
ctest --output-on-failure -j "$(nproc)" "${ctest_args[@]}" "$@" || rc=$?
[ -z "${SPECINFER_STAGE_LOG:-}" ] || echo "tests $((SECONDS - start))" >>"$SPECINFER_STAGE_LOG"
exit "$rc"
