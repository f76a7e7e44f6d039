#!/usr/bin/env bash
# Installs dependencies, builds everything (the CUDA backend compiles and links when nvcc is found) and
# runs the CPU test suite. The GPU parity suite is separate: scripts/gpu_check.sh on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
bash scripts/build.sh
ctest --test-dir build --output-on-failure -L unit -j"$(nproc)" --timeout 600
# libFuzzer targets of the parsers and tokenizers (tests/fuzz/), 15 s each; skips without clang/libFuzzer.
bash scripts/fuzz.sh 15
