#!/usr/bin/env bash
# On a GPU machine: builds (unless ANVIL_BUILD_DIR points at an existing build) and runs the CUDA-vs-CPU
# parity suite, then a short CUDA training run of the default model. Prints the device it ran on.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${ANVIL_BUILD_DIR:-build}
if [ ! -x "$build/anvil_parity_tests" ]; then
  bash scripts/setup.sh
  bash scripts/build.sh
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$build/anvil_parity_tests" --gtest_color=no
if [ ! -s data/shakespeare/train.bin ]; then
  "$build/anvil" prepare-data --input data/shakespeare/shakespeare.txt --output data/shakespeare --val_fraction 0.05
fi
"$build/anvil" train --config examples/tiny.json --device cuda --max_steps 100 --output_dir runs/gpu_check
