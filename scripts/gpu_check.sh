#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: everything the CUDA backend must show, in steps that can be run
# one at a time (where a command has a time limit) or all in order (`all`):
#   scripts/gpu_check.sh build       set up and build (scripts/setup.sh)
#   scripts/gpu_check.sh tests       the GPU tests (ctest -L gpu: cuda_tests on GPU 0, and
#                                    dist_cuda_tests; the multi-GPU ones skip below their GPU count;
#                                    cuda_tests alone in a scripts/gpu_bundle.sh bundle)
#   scripts/gpu_check.sh attention   tree-attention kernel, trees 8-128, contexts 512-8192, batch 1-32,
#                                    then again without spread window items (--no-spread)
#   scripts/gpu_check.sh step        one step of a random fp16 Llama-2-7B shape by tree size 1-128,
#                                    then decode tokens/s, each launched kernel by kernel and
#                                    replayed from a CUDA graph; trees of 32 and 64 also without the
#                                    partition blocks (--no-partition-blocks)
#   scripts/gpu_check.sh torch       the same beside PyTorch SDPA and HF transformers (needs torch,
#                                    transformers)
#   scripts/gpu_check.sh cluster     configs/single-gpu.yaml (an LLM worker process on GPU 0) serving
#                                    the default model if fetched, else stories260K: greedy
#                                    completions with and without speculation must be equal; with
#                                    2+ GPUs also a TP 2 group of worker processes over NCCL, with
#                                    CUDA graphs and eager (their timings side by side), with 4+
#                                    also TP 2 x PP 2
# Exits non-zero when there is no GPU (nvidia-smi finds none) or a step fails.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
step="${1:-all}"

if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "error: no NVIDIA GPU found (nvidia-smi -L): these checks need one" >&2
  exit 2
fi

run_step() {
  case "$1" in
    build) "$ROOT/scripts/setup.sh" ;;
    tests)
      if [[ -f "$BUILD_DIR/CTestTestfile.cmake" ]]; then
        ctest --test-dir "$BUILD_DIR" -L gpu --output-on-failure
      else  # a bundle of prebuilt programs (scripts/gpu_bundle.sh): no CTest there
        "$BUILD_DIR/tests/cuda_tests"
      fi
      ;;
    attention)
      "$BUILD_DIR/bench_cuda_attention"
      # The same shapes with every tree window in 64-row items (the layout before spread items).
      "$BUILD_DIR/bench_cuda_attention" --no-spread
      ;;
    step)
      "$BUILD_DIR/bench_cuda_step"
      # 32- and 64-token trees with their products on the shape before the partition blocks.
      "$BUILD_DIR/bench_cuda_step" --trees 1,32,64 --no-partition-blocks
      "$BUILD_DIR/bench_cuda_step" --decode 128
      ;;
    torch) python3 "$ROOT/scripts/bench_cuda_vs_torch.py" --build "$BUILD_DIR" ;;
    cluster)
      local check=(python3 "$ROOT/scripts/gpu_cluster_check.py" --specinfer "$BUILD_DIR/specinfer")
      "${check[@]}"
      local gpus
      gpus=$(nvidia-smi -L | grep -c '^GPU')
      if ((gpus >= 2)); then
        "${check[@]}" --tp 2
        "${check[@]}" --tp 2 --eager
      fi
      if ((gpus >= 4)); then "${check[@]}" --tp 2 --pp 2; fi
      ;;
    *)
      echo "error: unknown step '$1' (build, tests, attention, step, torch, cluster or all)" >&2
      exit 2
      ;;
  esac
}

if [[ "$step" == all ]]; then
  for s in build tests attention step torch cluster; do
    echo "== $s"
    run_step "$s"
  done
else
  run_step "$step"
fi
