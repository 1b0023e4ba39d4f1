#!/usr/bin/env bash
# Packs the GPU test and benchmark programs of a CUDA build, with the shared libraries they need
# beyond the CUDA toolkit and the C library, into one tarball that runs on a GPU machine where the
# project cannot be built (no network for the build dependencies, say):
#
#   scripts/gpu_bundle.sh [OUT.tgz]          # default: gpu-bundle.tgz; BUILD_DIR (default build)
#   # on the GPU machine, in a checkout of the same commit (the tests read tests/data):
#   mkdir -p /tmp/b && tar xzf gpu-bundle.tgz -C /tmp/b && /tmp/b/run.sh [all|tests|attention|step]
#
# run.sh runs the one-GPU tests (cuda_tests; the multi-GPU ones skip themselves), the attention
# benchmark beside PyTorch SDPA (scripts/bench_cuda_vs_torch.py, when torch is there) and the
# 7B-shaped step and decode benchmarks, as scripts/gpu_check.sh does for a local build. The
# binaries look for test data under the source folder they were built from (SPECINFER_SOURCE_DIR):
# run.sh links that path to the checkout it is started from when it does not exist.
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
mkdir -p "$stage/lib"
for p in "${progs[@]}"; do
  cp "$p" "$stage/"
  strip "$stage/$(basename "$p")" 2>/dev/null || true
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
# Runs the bundled GPU checks (see scripts/gpu_bundle.sh); start it from a checkout of the bundle's
# commit. Steps: tests, attention, step, or all (default).
set -uo pipefail
B="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CHECKOUT="$PWD"
src="$(sed -n 's/^source_dir=//p' "$B/BUNDLE_INFO")"
if [[ ! -e "$src" ]]; then
  mkdir -p "$(dirname "$src")" && ln -s "$CHECKOUT" "$src"
fi
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
if ! nvidia-smi -L; then
  echo "error: no NVIDIA GPU found (nvidia-smi -L): these checks need one" >&2
  exit 2
fi
missing="$(ldd "$B/cuda_tests" | grep 'not found' || true)"
if [[ -n "$missing" ]]; then
  echo "error: libraries not found: $missing" >&2
  exit 2
fi
step="${1:-all}"
rc=0
if [[ "$step" == all || "$step" == tests ]]; then
  echo "== tests"
  "$B/cuda_tests" || rc=1
fi
if [[ "$step" == all || "$step" == attention ]]; then
  echo "== attention"
  if python3 -c "import torch" 2>/dev/null && [[ -f "$CHECKOUT/scripts/bench_cuda_vs_torch.py" ]]; then
    python3 "$CHECKOUT/scripts/bench_cuda_vs_torch.py" --build "$B" --batch 1,8,32 \
      --tree 1,8,64,128 --context 2048,8192 --skip-decode || rc=1
  else
    "$B/bench_cuda_attention" || rc=1
    "$B/bench_cuda_attention" --kernel cuda-cores || rc=1
  fi
fi
if [[ "$step" == all || "$step" == step ]]; then
  echo "== step"
  "$B/bench_cuda_step" --context 2048 || rc=1
  "$B/bench_cuda_step" --context 512 --decode 128 || rc=1
fi
exit $rc
EOF
chmod +x "$stage/run.sh"
tar czf "$OUT" -C "$stage" .
echo "wrote $OUT ($(du -h "$OUT" | cut -f1)): $(ls "$stage" | tr '\n' ' ')"
