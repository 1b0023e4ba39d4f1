#!/usr/bin/env bash
# Coverage-guided fuzzing of the parsers of untrusted input (tests/fuzz/README.md) with libFuzzer.
#
#   scripts/fuzz.sh                    # every target, 60 s each
#   scripts/fuzz.sh --time 600 gguf    # one target, 10 minutes
#   scripts/fuzz.sh --list             # the target names
#
# The libFuzzer targets live in the sanitizer tree, build-asan/ (clang, ASan + UBSan + fuzzer
# instrumentation, assertions on, no CUDA; scripts/sanitizer/env.sh), the one
# `scripts/test.sh --sanitize address,undefined` builds and tests: this script configures it if
# missing and builds only the targets it runs. It then runs each target for SECONDS on a scratch
# copy of its seed corpus (build-asan/fuzz-corpus/NAME; tests/fuzz/corpus is never written) and
# prints one row per target: executions, corpus size, crashes. A crash, sanitizer report, leak,
# hang (10 s per input) or allocation over 2 GiB stops that target and leaves the reproducer in
# build-asan/crashes/NAME/ (run `build-asan/tests/fuzz/NAME_fuzz FILE` to replay it); the script
# then exits 1 after the other targets have run.
#
# Installs what it needs (scripts/setup.sh's packages and clang, which ships libclang_rt.fuzzer).
# BUILD_DIR overrides build-asan.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGETS=(gguf safetensors llama2c llama2c_tokenizer tokenizer_json chat_template openai_request
         spec_grammar cluster_yaml worker_proto)

seconds=60
selected=()
while [ $# -gt 0 ]; do
  case "$1" in
    --time) seconds="${2:?--time needs a number of seconds}"; shift 2 ;;
    --list) printf '%s\n' "${TARGETS[@]}"; exit 0 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *)
      if [[ ! " ${TARGETS[*]} " == *" $1 "* ]]; then
        echo "fuzz.sh: no fuzz target '$1' (targets: ${TARGETS[*]})" >&2
        exit 2
      fi
      selected+=("$1"); shift ;;
  esac
done
if [[ ! "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -eq 0 ]; then
  echo "fuzz.sh: --time takes a positive number of seconds" >&2
  exit 2
fi
[ ${#selected[@]} -gt 0 ] || selected=("${TARGETS[@]}")

# shellcheck source=sanitizer/env.sh
. "$ROOT/scripts/sanitizer/env.sh"
sanitizer_env address,undefined
build_targets=()
for t in "${selected[@]}"; do build_targets+=("${t}_fuzz"); done
SPECINFER_BUILD_TARGETS="${build_targets[*]}" "$ROOT/scripts/setup.sh"

fuzz_start=$SECONDS
status=0
rows=()
for t in "${selected[@]}"; do
  corpus="$BUILD_DIR/fuzz-corpus/$t"
  crashes="$BUILD_DIR/crashes/$t"
  log="$BUILD_DIR/fuzz-logs/$t.log"
  rm -rf "$corpus"
  mkdir -p "$corpus" "$crashes" "$(dirname "$log")"
  cp "$ROOT/tests/fuzz/corpus/$t/"* "$corpus/"
  before=$(find "$crashes" -type f | wc -l)
  echo "fuzz.sh: $t for ${seconds} s (log: $log)"
  rc=0
  start=$SECONDS
  "$BUILD_DIR/tests/fuzz/${t}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=2048 -max_len=65536 -print_final_stats=1 -artifact_prefix="$crashes/" \
    "$corpus" >"$log" 2>&1 || rc=$?
  took=$((SECONDS - start))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  new_crashes=$(( $(find "$crashes" -type f | wc -l) - before ))
  if [ "$rc" -ne 0 ]; then
    status=1
    [ "$new_crashes" -gt 0 ] || new_crashes="?"
    echo "fuzz.sh: $t FAILED (exit $rc); reproducer(s) in $crashes, report:" >&2
    grep -m1 -A4 -E "ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error|==ERROR" \
      "$log" >&2 || tail -20 "$log" >&2
  fi
  files=$(find "$corpus" -type f | wc -l)
  kib=$(( $(du -sb "$corpus" | cut -f1) / 1024 ))
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  rows+=("$(printf '%-18s %6s %12s %10s %8s %6s %8s' "$t" "$took" "${execs:-?}" "$files" \
    "$kib" "${cov:-?}" "$new_crashes")")
done

echo
printf '%-18s %6s %12s %10s %8s %6s %8s\n' target secs executions corpus_files KiB cov crashes
printf '%s\n' "${rows[@]}"
[ -z "${SPECINFER_STAGE_LOG:-}" ] || echo "fuzz $((SECONDS - fuzz_start))" >>"$SPECINFER_STAGE_LOG"
exit "$status"
