#!/usr/bin/env bash
# On a GPU machine: the CUDA-vs-CPU parity suite, a short CUDA training run of the default model, and
# (where transformers is installed) the check that transformers reproduces Anvil's eval loss from the
# checkpoint. Uses .devcarry/ when present (scripts/pack_for_gpu.sh, for machines without package
# access), else builds with scripts/build.sh. Logs go to $OUT (or runs/gpu_check); the parity suite's log is
# parity_<device>_<date>_<commit>.txt in $OUT (or tests/parity/results/, where the latest logs are kept).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-runs/gpu_check}
parity_dir=${OUT:-tests/parity/results}
mkdir -p "$out" "$parity_dir"
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
# The log's name as bench/benchlib/results.py names results: device (h100, h200, ...), UTC date, commit.
gpu=$( (nvidia-smi --query-gpu=name --format=csv,noheader || echo unknown) | head -1 | tr 'A-Z' 'a-z')
device=$(grep -oE 'h200|h100|a100|l40s|l4' <<<"$gpu" | head -1 || true)
[ -n "$device" ] || device=$(tr -cs 'a-z0-9' '_' <<<"$gpu" | sed 's/^_*//; s/_*$//')
commit=${ANVIL_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
parity_log="$parity_dir/parity_${device}_$(date -u +%F)_${commit:0:7}.txt"
"$build/anvil_parity_tests" --gtest_color=no 2>&1 | tee "$parity_log"
bash scripts/prepare_default_data.sh "$build/anvil"
"$build/anvil" train --config examples/tiny.json --device cuda --output_dir /tmp/anvil_gpu_check --overwrite_output_dir | tee "$out/tiny_cuda.log"
if python3 -c "import torch, transformers" 2>/dev/null; then
  step=$(python3 -c "import json; print(json.load(open('/tmp/anvil_gpu_check/summary.json'))['global_step'])")
  python3 tests/golden/check_hf_export.py /tmp/anvil_gpu_check/checkpoint-"$step" --anvil "$build/anvil" --device cuda | tee "$out/hf_export_check.txt"
fi
