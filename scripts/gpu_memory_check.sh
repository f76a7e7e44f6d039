#!/usr/bin/env bash
# On a GPU machine: the memory plan against what the GPU really uses (docs/memory.md). For GPT-2 124M
# in four configurations it prints the plan, the allocator's peak, the overhead measured when the device
# is made, the estimate's total (plan + overhead) and the driver's peak in use (cudaMemGetInfo), then the
# start-up out-of-memory error for a batch that does not fit. Uses .devcarry/ like scripts/gpu_check.sh
# (build with CUDA, then scripts/pack_for_gpu.sh). Results go to $OUT (or runs/gpu_memory_check).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-runs/gpu_memory_check}
mkdir -p "$out"
if [ -d .devcarry/bin ]; then
  build=build-cuda
  source scripts/gpu_env.sh  # unpacks .devcarry/ into build-cuda/, sets LD_LIBRARY_PATH, the corpus
else
  build=${ANVIL_BUILD_DIR:-build}
fi
anvil=$build/anvil
[ -s data/shakespeare/train.bin ] ||
  "$anvil" prepare-data --input data/shakespeare/shakespeare.txt --output data/shakespeare > /dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader | tee "$out/gpu.txt"
common="--config examples/gpt2-124m.json --sample_max_new_tokens 0 --save_steps 0 --logging_steps 100"
"$anvil" estimate $common | tee "$out/estimate_gpt2.txt"
"$anvil" estimate $common --sweep | tee "$out/sweep_gpt2.txt"
run_dir=$(mktemp -d)
for args in "--max_steps 30" \
            "--max_steps 10 --per_device_train_batch_size 16 --gradient_checkpointing true" \
            "--max_steps 5 --per_device_train_batch_size 64 --auto_find_batch_size true"; do
  rm -rf "$run_dir/r"
  echo "== anvil train $common $args"
  "$anvil" train $common $args --output_dir "$run_dir/r" > "$run_dir/log" 2>&1 || { tail -20 "$run_dir/log"; exit 1; }
  grep -E "auto_find_batch_size|allocator peak" "$run_dir/log" || true
  python3 - "$run_dir/r/summary.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
plan, alloc = d["planned_memory_bytes"], d["allocator_peak_bytes"]
over, drv = d["context_overhead_bytes"], d["driver_peak_bytes"]
print(f"plan {plan} | allocator peak {alloc} (plan + {alloc - plan}) | overhead {over} | "
      f"estimate total {plan + over} | driver peak {drv} (allocator peak + {drv - alloc}) | "
      f"estimate / driver {(plan + over) / drv:.4f}")
PY
done 2>&1 | tee "$out/runs.txt"
echo "== a batch that does not fit fails at start-up"
("$anvil" train $common --max_steps 2 --per_device_train_batch_size 64 --output_dir "$run_dir/oom" || true) 2>&1 |
  tee "$out/oom.txt"
rm -rf "$run_dir"
