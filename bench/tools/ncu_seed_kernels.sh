#!/usr/bin/env bash
# Nsight Compute on the strict-fp32 seed row's attention kernels and one cuBLAS GEMM, for what limits them
# (pipe utilisation, shared-memory traffic, warp stalls, occupancy). Run on the GPU machine from the
# repository root, after bench/seed_experiment.py has written the row's config (any run of the vanilla row):
#   bash bench/tools/ncu_seed_kernels.sh [OUT_FILE] [REGEX]
# OUT_FILE: the report (default /tmp/ncu_seed_kernels.txt). REGEX: the kernels (default: the fused attention
# forward and backward-scores kernels and the forward's tn GEMMs). Skips the first 60 matching launches
# (tuning and the first steps), profiles the next 4; the training run stops after 3 steps. Written in session 16
# after an ncu attempt failed on a relative binary path; not yet run on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/tmp/ncu_seed_kernels.txt}
regex=${2:-'attention_(fwd_tiled|bwd_scores_tiled)|sm80_xmma_gemm_f32f32_f32f32_f32_tn'}
anvil=$(realpath "${ANVIL:-build-cuda/anvil}")
config=/tmp/anvil_seed_experiment/anvil_vanilla/config.json
[ -f "$config" ] || { echo "no $config: run bench/seed_experiment.py --rows vanilla first" >&2; exit 1; }
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)
[ -n "$ncu" ] || { echo "ncu not found" >&2; exit 1; }
sections=()
for s in SpeedOfLight ComputeWorkloadAnalysis MemoryWorkloadAnalysis Occupancy WarpStateStats SchedulerStats \
  LaunchStats; do
  sections+=(--section "$s")
done
"$ncu" --kernel-name "regex:$regex" --launch-skip 60 --launch-count 4 "${sections[@]}" \
  "$anvil" train --config "$config" --max_steps 3 --cuda_graphs false --output_dir /tmp/ncu_seed_out --overwrite_output_dir \
  >"$out" 2>&1
echo "ncu report: $out ($(grep -c 'Section: GPU Speed Of Light' "$out" || true) kernels)"
