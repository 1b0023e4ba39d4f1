# Sourced by scripts/test.sh and scripts/fuzz.sh: the build of one sanitizer kind.
#   sanitizer_env KIND   sets BUILD_DIR (unless set), the compiler, CMAKE_ARGS and the sanitizers'
#                        run-time options for KIND (address,undefined | address | undefined | thread)
# address,undefined is one clang tree, build-asan/: the test suite instrumented with ASan + UBSan
# and the libFuzzer targets of tests/fuzz (SPECINFER_FUZZ=ON: every library also carries
# libFuzzer's coverage counters, but for the CPU kernels), so that CI compiles the project once
# for both. RelWithDebInfo at -O1 with assertions on (no NDEBUG). thread is gcc, build-tsan/.
# Sanitizer builds have no CUDA backend: the emulated kernels switch stacks with Boost.Context,
# which the sanitizers cannot follow without fiber annotations; the normal build runs them.
sanitizer_env() {
  local root
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  case "$1" in
    address,undefined|address|undefined)
      BUILD_DIR="${BUILD_DIR:-$root/build-asan}"
      export CC=clang CXX=clang++
      export SPECINFER_EXTRA_PACKAGES="clang ${SPECINFER_EXTRA_PACKAGES:-}"
      export CMAKE_ARGS="${CMAKE_ARGS:-} -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPECINFER_CUDA=OFF"
      CMAKE_ARGS+=" -DCMAKE_C_FLAGS_RELWITHDEBINFO=-g -DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-g"
      if [ "$1" = "address,undefined" ]; then
        CMAKE_ARGS+=" -DSPECINFER_FUZZ=ON"
        # A build-asan/ configured before it was clang's (gcc, no fuzz targets) is not reconfigured
        # by setup.sh: say so instead of failing later on a missing target.
        if [ -f "$BUILD_DIR/CMakeCache.txt" ] &&
          ! grep -q '^SPECINFER_FUZZ:BOOL=ON$' "$BUILD_DIR/CMakeCache.txt"; then
          echo "sanitizer_env: $BUILD_DIR was configured without SPECINFER_FUZZ (an older gcc" \
            "ASan tree): remove it and run again" >&2
          return 2
        fi
      else
        CMAKE_ARGS+=" -DSPECINFER_SANITIZE=$1"
      fi
      # Leaks are checked too (LeakSanitizer); reports name source lines.
      export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:strict_string_checks=1}"
      export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
      ;;
    thread)
      BUILD_DIR="${BUILD_DIR:-$root/build-tsan}"
      export CMAKE_ARGS="${CMAKE_ARGS:-} -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPECINFER_SANITIZE=thread -DSPECINFER_CUDA=OFF"
      # Debian's gRPC, abseil, spdlog and OpenBLAS are not instrumented: see the suppressions file.
      export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$root/scripts/sanitizer/tsan.supp}"
      ;;
    *)
      echo "sanitizer_env: takes address,undefined, address, undefined or thread" >&2
      return 2
      ;;
  esac
  export BUILD_DIR
}
