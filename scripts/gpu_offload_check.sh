#!/usr/bin/env bash
# On a GPU machine: optimizer offload (offload_optimizer cpu, docs/memory.md) on CUDA. Prints one PASS/FAIL line
# per check and exits non-zero on any failure:
#   equal: a bf16 llama-tiny run with CUDA graphs, offloaded, gives the losses of the same run without offload
#     within 1e-3 relative over 20 steps (the CPU's AdamW against the GPU's: rounding apart, the same update)
#   resume: the offloaded run resumed from its step-10 checkpoint gives steps 11-20 exactly
#   big: the Llama-3.1-8B shape, full training with adamw_8bit, bf16, batch 1 x 2048 with checkpointing, which
#     does not fit an 80 GB GPU without offload (`anvil estimate` says so first), trains 4 steps offloaded:
#     its progress lines (step time, peak device memory) are the log
#   zero (2 GPUs): llama-tiny with ZeRO stage 2 and stage 3 on 2 GPUs (anvil launch), offloaded (each rank its
#     shard) and not: the losses within 1e-3 relative over 20 steps
#   speed: the Llama-3.2-1B shape, bf16, AdamW, batch 4 x 2048, 8 steps: without offload, offloaded on one GPU,
#     and (2 GPUs) ZeRO-2 offloaded on two; the summaries (tokens/s, offload seconds by phase) are the log
#   param: offload_param cpu (ZeRO-3 weight shard on the host) with offload_optimizer, on one GPU and on 2
#     (anvil launch): the losses of the run without offload within 1e-3 relative over 20 steps
#   big3: the Llama-3.1-8B shape, full training with fp32 AdamW, on one GPU with zero_stage 3, offload_param
#     and offload_optimizer cpu (DeepSpeed's ZeRO-Infinity CPU configuration), 3 steps
#   big3x2 (2 GPUs): big3 on two GPUs (anvil launch), each rank offloading its shard
#   bandwidth: bench/probes/host_memory_bandwidth.cpp (the host's copy / triad / AdamW-shaped GB/s)
#   big8: the big run again with the faster 8-bit requantisation, 3 steps
#   grads: gradient offload (zero_stage 2 + offload_optimizer on one GPU: the shard's gradients in host memory),
#     batch 8 and batch 4 x 2 accumulated: the losses of the run without offload within 1e-3 relative over 20
#     steps; resumed from its step-10 checkpoint, steps 11-20 exactly; with block 0 frozen, the losses of the
#     frozen run without offload within 1e-3
#   speedg: the Llama-3.2-1B shape as in speed, one GPU: no offload, offload_optimizer, zero_stage 2 +
#     offload_optimizer (gradients offloaded), ZeRO-3 with both offloads; tokens/s and peak memory
#   big2: the Llama-3.1-8B shape, fp32 AdamW, batch 1 x 2048 with checkpointing, zero_stage 2 + offload_optimizer
#     on one GPU (the weights on the GPU, gradients and optimizer on the host), 3 steps
#   nvme: NVMe offload (offload_optimizer nvme, the state in a swap file in $w/swap, sub-groups of 100000
#     parameters): the losses of the offload_optimizer cpu run exactly, alone and with zero_stage 2 (gradients
#     on the host); resumed from its step-10 checkpoint, steps 11-20 exactly; the disk's filesystem and device
#   nvmespeed: the Llama-3.2-1B shape as in speedg, zero_stage 2 + offload_optimizer cpu against nvme
#     (2e8-parameter sub-groups): tokens/s, the swap file's GiB/s, the process's peak host memory (RSS)
#   bignvme: the Llama-3.1-8B shape, fp32 AdamW, batch 1 x 2048 with checkpointing, ZeRO-3 with offload_param
#     cpu and offload_optimizer nvme (sub-groups of 2e8), 3 steps: step time and peak host memory (RSS)
#   paramnvme: offload_param nvme (the ZeRO-3 weight shard in a swap file in $w/swap, 3 buffers) with
#     offload_optimizer cpu: the losses of offload_param cpu exactly, on one GPU and (2 GPUs) on two; resumed
#     from its step-10 checkpoint, steps 11-20 exactly; the swap directory empty after the runs
#   paramnvmespeed: the Llama-3.2-1B shape, bf16, batch 4 x 2048, ZeRO-3 with offload_optimizer cpu, the
#     weights on the host (offload_param cpu) against on NVMe: tokens/s, the weights' GiB/s, the pieces not
#     read ahead, peak host memory (RSS)
#   bigparamnvme: the Llama-3.1-8B shape as in bignvme with the weights on NVMe too (offload_param nvme: the HF
#     guide's ZeRO-3 NVMe configuration), 3 steps: step time, the files' traffic, peak host memory (RSS)
# CHECKS="equal resume" runs those only (resume needs equal's run). Uses .devcarry/ when present (scripts/pack_for_gpu.sh), else the build in $ANVIL_BUILD_DIR (or build/).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-runs/gpu_offload_check}
source scripts/gpu_check_lib.sh  # build, check, failures
w=$out/work
mkdir -p "$w"
"$build/anvil" prepare-data --input data/shakespeare/shakespeare.txt --output "$w/data" --tokenizer bytes > /dev/null
common=(--model llama-tiny --train_data "$w/data/train.bin" --device cuda --bf16 --per_device_train_batch_size 8
  --max_seq_length 64 --max_steps 20 --learning_rate 1e-3 --weight_decay 0.1 --logging_steps 1 --sample_prompt ""
  --save_steps 10)
losses() {  # RUN: the training losses of metrics.jsonl, one per line
  python3 -c "import json,sys; [print(j['loss']) for j in map(json.loads, open(sys.argv[1])) if 'loss' in j and 'eval_loss' not in j]" "$1/metrics.jsonl"
}
close() {  # RUN_A RUN_B LABEL: the two runs' 20 losses within 1e-3 relative
  paste <(losses "$1") <(losses "$2") | python3 -c "
import sys
rows = [tuple(map(float, l.split())) for l in sys.stdin]
worst = max(abs(a - b) / a for a, b in rows)
print('$3' + ('' if '$3' == '' else ': ') + 'steps', len(rows), 'worst relative loss difference', worst)
assert len(rows) == 20 and worst < 1e-3"
}
random_tokens() {  # the 128256-token shard of the big runs, once
  [ -s "$w/tokens_128256.bin" ] || python3 -c "
import sys; sys.path.insert(0, 'bench')
from benchlib.shards import write_random_shard
write_random_shard('$w/tokens_128256.bin', 400_000, 128256)"
}
equal() {
  "$build/anvil" train "${common[@]}" --output_dir "$w/device" || return 1
  "$build/anvil" train "${common[@]}" --offload_optimizer cpu --output_dir "$w/host" || return 1
  close "$w/device" "$w/host" ""
}
resume() {
  "$build/anvil" train "${common[@]}" --offload_optimizer cpu --resume_from_checkpoint "$w/host/checkpoint-10" \
    --output_dir "$w/resumed" || return 1
  diff <(losses "$w/host" | tail -10) <(losses "$w/resumed") && echo "steps 11-20 equal"
}
big() {
  local flags=(--model llama-8b --bf16 --optim adamw_8bit --per_device_train_batch_size 1 --max_seq_length 2048
    --gradient_checkpointing true)
  "$build/anvil" estimate "${flags[@]}" --gpu h100 | grep -E "^  total|fit"
  "$build/anvil" estimate "${flags[@]}" --gpu h100 --offload_optimizer cpu | grep -E "^  total|fit|host|total "
  random_tokens
  "$build/anvil" train "${flags[@]}" --offload_optimizer cpu --device cuda --train_data "$w/tokens_128256.bin" \
    --max_steps 4 --logging_steps 1 --learning_rate 1e-5 --save_strategy no --sample_prompt "" \
    --output_dir "$w/big"
}
zero() {
  for stage in 2 3; do
    "$build/anvil" launch --nproc_per_node 2 train "${common[@]}" --zero_stage $stage --output_dir "$w/z$stage" || return 1
    "$build/anvil" launch --nproc_per_node 2 train "${common[@]}" --zero_stage $stage --offload_optimizer cpu \
      --output_dir "$w/z${stage}off" || return 1
    close "$w/z$stage" "$w/z${stage}off" "stage $stage" || return 1
  done
}
speed() {
  random_tokens
  local flags=(--model llama-1b --bf16 --per_device_train_batch_size 4 --max_seq_length 2048 --device cuda
    --train_data "$w/tokens_128256.bin" --max_steps 8 --logging_steps 1 --learning_rate 1e-5 --save_strategy no
    --sample_prompt "")
  echo "== one GPU, no offload"; "$build/anvil" train "${flags[@]}" --output_dir "$w/s0" | grep -E "step +8/|Tokens|offload|memory occupied" || return 1
  echo "== one GPU, offload"; "$build/anvil" train "${flags[@]}" --offload_optimizer cpu --output_dir "$w/s1" | grep -E "step +8/|Tokens|offload|memory occupied" || return 1
  echo "== two GPUs, ZeRO-2"; "$build/anvil" launch --nproc_per_node 2 train "${flags[@]}" --zero_stage 2 --output_dir "$w/s2" | grep -E "step +8/|Tokens|offload|memory occupied" || return 1
  echo "== one GPU, ZeRO-3 offload_param + offload_optimizer"; "$build/anvil" train "${flags[@]}" --zero_stage 3 --offload_optimizer cpu --offload_param cpu --output_dir "$w/s4" | grep -E "step +8/|Tokens|offload|memory occupied" || return 1
  echo "== two GPUs, ZeRO-2 offload"; "$build/anvil" launch --nproc_per_node 2 train "${flags[@]}" --zero_stage 2 --offload_optimizer cpu --output_dir "$w/s3" | grep -E "step +8/|Tokens|offload|memory occupied" || return 1
  nproc; grep -m1 "model name" /proc/cpuinfo
}
param() {
  local off=(--zero_stage 3 --offload_optimizer cpu --offload_param cpu)
  "$build/anvil" train "${common[@]}" --output_dir "$w/p0" || return 1
  "$build/anvil" train "${common[@]}" "${off[@]}" --output_dir "$w/p1" || return 1
  local half=("${common[@]}")  # 2 GPUs x 4 sequences: the global batch of one GPU's 8
  for i in "${!half[@]}"; do [ "${half[$i]}" = --per_device_train_batch_size ] && half[$((i + 1))]=4; done
  "$build/anvil" launch --nproc_per_node 2 train "${half[@]}" "${off[@]}" --output_dir "$w/p2" || return 1
  for run in p1 p2; do
    close "$w/p0" "$w/$run" "$run" || return 1
  done
}
big3() {
  local flags=(--model llama-8b --bf16 --per_device_train_batch_size 1 --max_seq_length 2048
    --gradient_checkpointing true --zero_stage 3 --offload_optimizer cpu --offload_param cpu)
  "$build/anvil" estimate "${flags[@]}" --gpu h100 | grep -E "^  total|fit|host|offload"
  "$build/anvil" train "${flags[@]}" --device cuda --train_data "$w/tokens_128256.bin" --max_steps 3 \
    --logging_steps 1 --learning_rate 1e-5 --save_strategy no --sample_prompt "" --output_dir "$w/big3"
}
big3x2() {
  random_tokens
  "$build/anvil" launch --nproc_per_node 2 train --model llama-8b --bf16 --per_device_train_batch_size 1 \
    --max_seq_length 2048 --gradient_checkpointing true --zero_stage 3 --offload_optimizer cpu --offload_param cpu \
    --device cuda --train_data "$w/tokens_128256.bin" --max_steps 3 --logging_steps 1 --learning_rate 1e-5 \
    --save_strategy no --sample_prompt "" --output_dir "$w/big3x2"
}
bandwidth() {
  g++ -O3 -march=native -fopenmp bench/probes/host_memory_bandwidth.cpp -o "$w/hmb" && "$w/hmb"
}
big8() {
  "$build/anvil" train --model llama-8b --bf16 --optim adamw_8bit --per_device_train_batch_size 1 --max_seq_length 2048 \
    --gradient_checkpointing true --offload_optimizer cpu --device cuda --train_data "$w/tokens_128256.bin" \
    --max_steps 3 --logging_steps 1 --learning_rate 1e-5 --save_strategy no --sample_prompt "" --output_dir "$w/big8"
}
grads() {
  local g=(--zero_stage 2 --offload_optimizer cpu)
  [ -s "$w/device/metrics.jsonl" ] || "$build/anvil" train "${common[@]}" --output_dir "$w/device" || return 1
  "$build/anvil" train "${common[@]}" "${g[@]}" --output_dir "$w/g1" | grep -E "ZeRO|step +20/|memory occupied" || return 1
  local accum=("${common[@]}")  # batch 4 x 2 accumulated: the same global batch
  for i in "${!accum[@]}"; do [ "${accum[$i]}" = --per_device_train_batch_size ] && accum[$((i + 1))]=4; done
  "$build/anvil" train "${accum[@]}" --gradient_accumulation_steps 2 "${g[@]}" --output_dir "$w/g2" > /dev/null || return 1
  close "$w/device" "$w/g1" "batch 8" || return 1
  close "$w/device" "$w/g2" "batch 4 x 2" || return 1
  "$build/anvil" train "${common[@]}" "${g[@]}" --resume_from_checkpoint "$w/g1/checkpoint-10" \
    --output_dir "$w/g1resumed" > /dev/null || return 1
  diff <(losses "$w/g1" | tail -10) <(losses "$w/g1resumed") && echo "resumed: steps 11-20 equal" || return 1
  local freeze=(--freeze_parameters model.layers.0.*)  # frozen tensors: left out of the norm as it is summed
  "$build/anvil" train "${common[@]}" "${freeze[@]}" --output_dir "$w/f0" > /dev/null || return 1
  "$build/anvil" train "${common[@]}" "${freeze[@]}" "${g[@]}" --output_dir "$w/f1" > /dev/null || return 1
  close "$w/f0" "$w/f1" "frozen block 0"
}
speedg() {
  random_tokens
  local flags=(--model llama-1b --bf16 --per_device_train_batch_size 4 --max_seq_length 2048 --device cuda
    --train_data "$w/tokens_128256.bin" --max_steps 8 --logging_steps 1 --learning_rate 1e-5 --save_strategy no
    --sample_prompt "")
  local show="step +8/|Tokens|offload|memory occupied|peak"
  echo "== no offload"; "$build/anvil" train "${flags[@]}" --output_dir "$w/sg0" | grep -E "$show" || return 1
  echo "== offload_optimizer"; "$build/anvil" train "${flags[@]}" --offload_optimizer cpu --output_dir "$w/sg1" | grep -E "$show" || return 1
  echo "== zero_stage 2 + offload_optimizer (gradients on the host)"; "$build/anvil" train "${flags[@]}" --zero_stage 2 --offload_optimizer cpu --output_dir "$w/sg2" | grep -E "$show" || return 1
  echo "== zero_stage 3 + both offloads"; "$build/anvil" train "${flags[@]}" --zero_stage 3 --offload_optimizer cpu --offload_param cpu --output_dir "$w/sg3" | grep -E "$show" || return 1
}
big2() {
  random_tokens
  local flags=(--model llama-8b --bf16 --per_device_train_batch_size 1 --max_seq_length 2048
    --gradient_checkpointing true --zero_stage 2 --offload_optimizer cpu)
  "$build/anvil" estimate "${flags[@]}" --gpu h100 | grep -E "^  total|fit|host|offload"
  "$build/anvil" train "${flags[@]}" --device cuda --train_data "$w/tokens_128256.bin" --max_steps 3 \
    --logging_steps 1 --learning_rate 1e-5 --save_strategy no --sample_prompt "" --output_dir "$w/big2"
}
peak_rss() {  # COMMAND...: runs it, then prints its peak resident host memory (GiB)
  python3 -c "
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:]).returncode
print('peak host memory (RSS): %.2f GiB' % (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20))
sys.exit(rc)" "$@"
}
nvme() {
  mkdir -p "$w/swap"; df -hT "$w/swap" | tail -1; lsblk -d -o NAME,ROTA,MODEL,SIZE 2>/dev/null | head -5
  local n=(--offload_optimizer nvme --offload_nvme_path "$w/swap" --sub_group_size 100000)
  [ -s "$w/host/metrics.jsonl" ] || "$build/anvil" train "${common[@]}" --offload_optimizer cpu --output_dir "$w/host" > /dev/null || return 1
  "$build/anvil" train "${common[@]}" "${n[@]}" --output_dir "$w/n1" | grep -E "offloaded|NVMe|step +20/" || return 1
  diff <(losses "$w/host") <(losses "$w/n1") && echo "nvme: the 20 losses of offload_optimizer cpu exactly" || return 1
  "$build/anvil" train "${common[@]}" --zero_stage 2 --offload_optimizer cpu --output_dir "$w/n2cpu" > /dev/null || return 1
  "$build/anvil" train "${common[@]}" --zero_stage 2 "${n[@]}" --output_dir "$w/n2" > /dev/null || return 1
  diff <(losses "$w/n2cpu") <(losses "$w/n2") && echo "zero_stage 2 + nvme: the losses of zero_stage 2 + cpu exactly" || return 1
  "$build/anvil" train "${common[@]}" "${n[@]}" --resume_from_checkpoint "$w/n1/checkpoint-10" \
    --output_dir "$w/n1resumed" > /dev/null || return 1
  diff <(losses "$w/n1" | tail -10) <(losses "$w/n1resumed") && echo "resumed: steps 11-20 equal" || return 1
  [ -z "$(ls -A "$w/swap")" ] && echo "swap directory empty after the runs"
}
nvmespeed() {
  random_tokens; mkdir -p "$w/swap"
  local flags=(--model llama-1b --bf16 --per_device_train_batch_size 4 --max_seq_length 2048 --device cuda
    --train_data "$w/tokens_128256.bin" --max_steps 8 --logging_steps 1 --learning_rate 1e-5 --save_strategy no
    --sample_prompt "" --zero_stage 2)
  local show="step +8/|Tokens|offload|NVMe|memory occupied|peak host"
  echo "== zero_stage 2 + offload_optimizer cpu"; peak_rss "$build/anvil" train "${flags[@]}" --offload_optimizer cpu --output_dir "$w/ns0" | grep -E "$show" || return 1
  echo "== zero_stage 2 + offload_optimizer nvme, sub_group_size 2e8"; peak_rss "$build/anvil" train "${flags[@]}" --offload_optimizer nvme --offload_nvme_path "$w/swap" --sub_group_size 200000000 --output_dir "$w/ns2" | grep -E "$show" || return 1
}
bignvme() {
  random_tokens; mkdir -p "$w/swap"
  local flags=(--model llama-8b --bf16 --per_device_train_batch_size 1 --max_seq_length 2048
    --gradient_checkpointing true --zero_stage 3 --offload_param cpu --offload_optimizer nvme
    --offload_nvme_path "$w/swap" --sub_group_size 200000000)
  "$build/anvil" estimate "${flags[@]}" --gpu h100 | grep -E "^  total|fit|host|offload|swap"
  df -h "$w/swap" | tail -1
  peak_rss "$build/anvil" train "${flags[@]}" --device cuda --train_data "$w/tokens_128256.bin" --max_steps 3 \
    --logging_steps 1 --learning_rate 1e-5 --save_strategy no --sample_prompt "" --output_dir "$w/bignvme"
}
paramnvme() {
  mkdir -p "$w/swap"
  local z=(--zero_stage 3 --offload_optimizer cpu)
  local n=(--offload_param nvme --offload_nvme_path "$w/swap" --offload_param_buffer_count 3)
  "$build/anvil" train "${common[@]}" "${z[@]}" --offload_param cpu --output_dir "$w/pc1" > /dev/null || return 1
  "$build/anvil" train "${common[@]}" "${z[@]}" "${n[@]}" --output_dir "$w/pn1" | grep -E "weights: offloaded|cuda graphs|NVMe weights|step +20/" || return 1
  diff <(losses "$w/pc1") <(losses "$w/pn1") && echo "offload_param nvme: the 20 losses of offload_param cpu exactly" || return 1
  "$build/anvil" train "${common[@]}" "${z[@]}" "${n[@]}" --resume_from_checkpoint "$w/pn1/checkpoint-10" \
    --output_dir "$w/pn1resumed" > /dev/null || return 1
  diff <(losses "$w/pn1" | tail -10) <(losses "$w/pn1resumed") && echo "resumed: steps 11-20 equal" || return 1
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    "$build/anvil" launch --nproc_per_node 2 train "${common[@]}" "${z[@]}" --offload_param cpu --output_dir "$w/pc2" > /dev/null || return 1
    "$build/anvil" launch --nproc_per_node 2 train "${common[@]}" "${z[@]}" "${n[@]}" --output_dir "$w/pn2" | grep -E "NVMe weights" || return 1
    diff <(losses "$w/pc2") <(losses "$w/pn2") && echo "2 GPUs: the 20 losses of offload_param cpu exactly" || return 1
  fi
  [ -z "$(ls -A "$w/swap")" ] && echo "swap directory empty after the runs"
}
paramnvmespeed() {
  random_tokens; mkdir -p "$w/swap"
  local flags=(--model llama-1b --bf16 --per_device_train_batch_size 4 --max_seq_length 2048 --device cuda
    --train_data "$w/tokens_128256.bin" --max_steps 6 --logging_steps 1 --learning_rate 1e-5 --save_strategy no
    --sample_prompt "" --zero_stage 3 --offload_optimizer cpu)
  local show="step +[56]/|Tokens|offload|NVMe|weights: offloaded|memory occupied|peak host"
  echo "== ZeRO-3, offload_optimizer cpu, offload_param cpu"; peak_rss "$build/anvil" train "${flags[@]}" --offload_param cpu --output_dir "$w/ps0" | grep -E "$show" || return 1
  echo "== ZeRO-3, offload_optimizer cpu, offload_param nvme"; peak_rss "$build/anvil" train "${flags[@]}" --offload_param nvme --offload_nvme_path "$w/swap" --output_dir "$w/ps1" | grep -E "$show" || return 1
}
bigparamnvme() {
  random_tokens; mkdir -p "$w/swap"
  local flags=(--model llama-8b --bf16 --per_device_train_batch_size 1 --max_seq_length 2048
    --gradient_checkpointing true --zero_stage 3 --offload_param nvme --offload_optimizer nvme
    --offload_nvme_path "$w/swap" --sub_group_size 200000000)
  "$build/anvil" estimate "${flags[@]}" --gpu h100 | grep -E "^  total|fit|host|offload|swap|NVMe"
  df -h "$w/swap" | tail -1
  peak_rss "$build/anvil" train "${flags[@]}" --device cuda --train_data "$w/tokens_128256.bin" --max_steps 3 \
    --logging_steps 1 --learning_rate 1e-5 --save_strategy no --sample_prompt "" --output_dir "$w/bigparamnvme"
}
for c in ${CHECKS:-equal resume big}; do check "$c" "$c"; done  # CHECKS="big": some of them
[ -f "$out/big.log" ] && tail -25 "$out/big.log"
echo "$failures failure(s)"
exit $((failures > 0))
