#!/usr/bin/env bash
# On a GPU machine: the CUDA-vs-CPU parity suite, a short CUDA training run of the default model, and
# (where transformers is installed) the check that transformers reproduces Anvil's eval loss from the
# checkpoint. Uses .devcarry/ when present (scripts/pack_for_gpu.sh, for machines without package
# access), else builds with scripts/build.sh. Results go to $OUT (or runs/gpu_check).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-runs/gpu_check}
mkdir -p "$out"
if [ -d .devcarry/bin ]; then
  build=build-cuda
  source scripts/gpu_env.sh
else
  build=${ANVIL_BUILD_DIR:-build}
  bash scripts/setup.sh
  bash scripts/build.sh
  source scripts/gpu_env.sh
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$build/anvil_parity_tests" --gtest_color=no 2>&1 | tee "$out/parity.log"
bash scripts/prepare_default_data.sh "$build/anvil"
"$build/anvil" train --config examples/tiny.json --device cuda --output_dir /tmp/anvil_gpu_check | tee "$out/tiny_cuda.log"
if python3 -c "import torch, transformers" 2>/dev/null; then
  step=$(python3 -c "import json; print(json.load(open('/tmp/anvil_gpu_check/summary.json'))['global_step'])")
  python3 tests/golden/check_hf_export.py /tmp/anvil_gpu_check/checkpoint-"$step" --anvil "$build/anvil" --device cuda | tee "$out/hf_export_check.txt"
fi
