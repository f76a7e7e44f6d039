#!/usr/bin/env bash
# Configures and builds Anvil into build/ (CUDA backend too when nvcc is found). Incremental.
# Usage: scripts/build.sh [--target NAME] [CMAKE_CONFIGURE_ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
target=()
if [ "${1:-}" = "--target" ]; then
  target=(--target "$2")
  shift 2
fi
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
elif [ $# -gt 0 ]; then
  cmake -S . -B build "$@"
fi
cmake --build build -j"$(nproc)" "${target[@]}"
