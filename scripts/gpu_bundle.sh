#!/usr/bin/env bash
# Packs the GPU test and benchmark programs of a CUDA build, with the shared libraries they need
# beyond the CUDA toolkit and the C library, into one tarball that runs on a GPU machine where the
# project cannot be built (no network for the build dependencies, say):
#
#   scripts/gpu_bundle.sh [OUT.tgz]          # default: gpu-bundle.tgz; BUILD_DIR (default build)
#   # on the GPU machine, in a checkout of the same commit (the tests read tests/data):
#   mkdir -p /tmp/b && tar xzf gpu-bundle.tgz -C /tmp/b && /tmp/b/run.sh [all|tests|attention|step]
#
# run.sh runs scripts/gpu_check.sh's steps tests (cuda_tests: the one-GPU tests; the multi-GPU
# ones skip themselves), attention, step and torch (the default) or those named, with the bundle as
# its BUILD_DIR and the bundled libraries on the library path. The binaries look for test data
# under the source folder they were built from (SPECINFER_SOURCE_DIR): run.sh links that path to
# the checkout it is started from when it does not exist.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
OUT="$(realpath -m "${1:-gpu-bundle.tgz}")"
progs=("$BUILD_DIR/tests/cuda_tests" "$BUILD_DIR/bench_cuda_attention" "$BUILD_DIR/bench_cuda_step")
for p in "${progs[@]}"; do
  if [[ ! -x "$p" ]]; then
    echo "error: $p not built (a build with CUDA: scripts/setup.sh, then cmake --build build)" >&2
    exit 2
  fi
done

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib" "$stage/tests"
for p in "${progs[@]}"; do  # the build's layout, which gpu_check.sh expects
  rel="${p#"$BUILD_DIR"/}"
  cp "$p" "$stage/$rel"
  strip "$stage/$rel" 2>/dev/null || true
done
# Shared libraries other than the driver's, the CUDA toolkit's (the GPU machine has its own) and
# the C runtime's.
for p in "${progs[@]}"; do
  ldd "$p" | awk '$3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | libgcc_s.so* | libstdc++.so* | \
      ld-linux* | libcuda.so* | libcudart.so* | libcublas* | libnccl.so*) ;;
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
{
  echo "source_dir=$ROOT"
  echo "commit=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
} >"$stage/BUNDLE_INFO"

cat >"$stage/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs scripts/gpu_check.sh on the bundled programs (see scripts/gpu_bundle.sh); start it from a
# checkout of the bundle's commit. Steps: tests, attention, step, torch (default: all four).
set -uo pipefail
B="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CHECKOUT="$PWD"
src="$(sed -n 's/^source_dir=//p' "$B/BUNDLE_INFO")"
if [[ ! -e "$src" ]]; then
  mkdir -p "$(dirname "$src")" && ln -s "$CHECKOUT" "$src"
fi
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
missing="$(ldd "$B/tests/cuda_tests" | grep 'not found' || true)"
if [[ -n "$missing" ]]; then
  echo "error: libraries not found: $missing" >&2
  exit 2
fi
steps=("$@")
[[ ${#steps[@]} -gt 0 ]] || steps=(tests attention step torch)
rc=0
for s in "${steps[@]}"; do
  echo "== $s"
  BUILD_DIR="$B" "$CHECKOUT/scripts/gpu_check.sh" "$s"
  r=$?
  [[ $r -eq 2 ]] && exit 2  # no GPU, or an unknown step: nothing else can run
  [[ $r -eq 0 ]] || rc=1
done
exit $rc
EOF
chmod +x "$stage/run.sh"
tar czf "$OUT" -C "$stage" .
echo "wrote $OUT ($(du -h "$OUT" | cut -f1)): $(ls "$stage" | tr '\n' ' ')"
