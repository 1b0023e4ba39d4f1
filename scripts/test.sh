#!/usr/bin/env bash
# Sets up and builds what is missing (scripts/setup.sh), then runs the whole test suite with
# CTest. GPU tests carry the label `gpu` and report themselves skipped on machines without one.
#
#   scripts/test.sh                              # the suite (what CI runs first)
#   scripts/test.sh -L server                    # extra arguments go to ctest
#   scripts/test.sh --sanitize address,undefined # ASan + UBSan build in build-asan (CI runs it too)
#   scripts/test.sh --sanitize thread            # TSan build in build-tsan: the concurrent tests
#
# Sanitizer builds have no CUDA backend: the emulated kernels switch stacks with Boost.Context,
# which the sanitizers cannot follow without fiber annotations; the normal build runs them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

sanitize=""
if [ "${1:-}" = "--sanitize" ]; then
  sanitize="${2:?--sanitize needs address,undefined or thread}"
  shift 2
fi

ctest_args=()
case "$sanitize" in
  "") BUILD_DIR="${BUILD_DIR:-$ROOT/build}" ;;
  address,undefined|address|undefined)
    BUILD_DIR="${BUILD_DIR:-$ROOT/build-asan}"
    # Leaks are checked too (LeakSanitizer); reports name source lines.
    export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:strict_string_checks=1}"
    export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
    # Not the statistical tests (label `statistical`: 4000-20000 draws of the same code each,
    # 3-4 minutes apiece under ASan); the normal build runs them, and the short sampled tests
    # (VerifyStochastic, BatchedDraft, DynamicTree, ...) take that code through ASan here.
    ctest_args+=(-LE statistical)
    ;;
  thread)
    BUILD_DIR="${BUILD_DIR:-$ROOT/build-tsan}"
    # Debian's gRPC, abseil, spdlog and OpenBLAS are not instrumented: see the suppressions file.
    export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$ROOT/scripts/sanitizer/tsan.supp}"
    # The tests whose code runs on several threads: servers, scheduler and engine core, batch
    # generation, distributed workers and collectives; not the single-threaded SmolLM2
    # conformance checks (minutes of one thread's arithmetic, tens of times slower under TSan).
    ctest_args+=(-L "server|engine|dist" -E "Conformance")
    ;;
  *) echo "test.sh: --sanitize takes address,undefined, address, undefined or thread" >&2; exit 2 ;;
esac

if [ -n "$sanitize" ]; then
  export CMAKE_ARGS="${CMAKE_ARGS:-} -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPECINFER_SANITIZE=$sanitize -DSPECINFER_CUDA=OFF"
fi
BUILD_DIR="$BUILD_DIR" "$ROOT/scripts/setup.sh"
# The default model (SmolLM2-135M-Instruct GGUF): the GGUF, tokenizer and forward-pass tests use it.
"$ROOT/scripts/fetch_model.sh" >/dev/null
cd "$BUILD_DIR"
ctest --output-on-failure -j "$(nproc)" "${ctest_args[@]}" "$@"
