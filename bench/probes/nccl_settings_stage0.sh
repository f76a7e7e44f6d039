#!/usr/bin/env bash
# Does an NCCL setting close data parallelism's scaling gap? Llama-1B shape, stage 0, 2 GPUs, batch 8, seq 2048:
# tokens/s per GPU over steps 6-20, with the step's communication time and its exposed part (metrics.jsonl),
# under each setting. On the GPU machine, from the repository root, after scripts/pack_for_gpu.sh:
#   bash bench/probes/nccl_settings_stage0.sh
set -u
source scripts/gpu_env.sh
export NCCL_NVLS_ENABLE=0
D=/tmp/anvil_multi_gpu_speed/random_tokens_128256.bin
[ -s $D ] || python3 -c "
import sys; sys.path.insert(0,'bench'); from benchlib.shards import write_random_shard; write_random_shard('$D', 8_000_000, 128256)"
for envs in "X=1" "NCCL_PROTO=Simple" "NCCL_MIN_NCHANNELS=4 NCCL_MAX_NCHANNELS=4" "NCCL_MAX_NCHANNELS=8" "NCCL_MIN_NCHANNELS=32" "CUDA_DEVICE_MAX_CONNECTIONS=1"; do
  rm -rf /tmp/p13
  env $envs build-cuda/anvil launch --nproc_per_node 2 --master_port 0 train --model llama-1b --device cuda --train_data $D \
    --per_device_train_batch_size 8 --max_seq_length 2048 --max_steps 20 --learning_rate 3e-4 --warmup_steps 0 \
    --lr_scheduler_type constant --save_strategy no --bf16 true --sample_prompt '' --seed 1 --logging_steps 1 --output_dir /tmp/p13 > /tmp/p13.log 2>&1 || tail -3 /tmp/p13.log
  python3 - "$envs" <<'P'
import json, sys
rows = [json.loads(l) for l in open('/tmp/p13/metrics.jsonl') if '"tokens_per_second"' in l][5:]
tps = sum(r['tokens_per_second'] for r in rows) / len(rows) / 2
comm = sum(r.get('comm_seconds', 0) for r in rows) / len(rows) * 1e3
exp = sum(r.get('comm_exposed_seconds', 0) for r in rows) / len(rows) * 1e3
print(f"{sys.argv[1]:45s} {tps:8.0f} tok/s/GPU  comm {comm:5.1f} ms  exposed {exp:4.1f} ms")
P
done
