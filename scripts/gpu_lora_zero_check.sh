#!/usr/bin/env bash
# On a machine with 2 GPUs: LoRA under ZeRO stages 1-3 (docs/lora.md: the frozen base without master weights,
# gradients or optimizer state; stage 3 shards its weights). Prints one PASS/FAIL line per check and exits
# non-zero on any failure:
#   equal: llama-tiny, LoRA r 8 on every block Linear, bf16, CUDA graphs, 2 GPUs x micro-batch 4, 20 steps:
#     stages 1-3 give stage 0's loss curve (stage 1 bit for bit, 2-3 within 1e-4 relative) and its base model
#     bytes; with gradient accumulation 2 (micro-batch 2) stage 3 gives stage 0's first two losses exactly and
#     the rest within 1e-2 (each micro-batch's reduced pieces are added into the shard as they come: fp32 sums
#     in another order, which AdamW at lr 1e-2 turns into 4e-3 relative over 20 steps on 2 H200s); stage 3
#     resumed from its step-10 checkpoint gives steps 11-20 exactly
#   size: the Llama-3.1-8B shape, LoRA r 16 on every block Linear, bf16, batch BATCH (default 8) x 2048 per GPU,
#     on 2 GPUs with stage 0 and stage 3, 12 steps each: the progress lines (tok/s, peak memory) are the log
#   qlora: the equal check's llama-tiny as QLoRA with nf4-dq, stages 0 and 2 on 2 GPUs: stage 2 gives stage 0's
#     losses exactly; resumed from its step-10 checkpoint (which holds quantized_base.safetensors) exactly
#   big70 (4 GPUs): a Llama-3-70B shape (80 layers, hidden 8192, 64 heads, 8 KV heads, MLP 28672, vocabulary
#     128256), LoRA r 16 on every block Linear, bf16, batch 1 x 2048 per GPU, ZeRO-3 on 4 GPUs, 8 steps: its
#     bf16 weights (141 GB) fit no single GPU; `anvil estimate` for one GPU and the run's progress lines
# CHECKS="equal" runs those only (default: equal size). Uses .devcarry/ when present (scripts/pack_for_gpu.sh), else the build in
# $ANVIL_BUILD_DIR (or build/).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-runs/gpu_lora_zero_check}
source scripts/gpu_check_lib.sh  # build, check, failures
A=$PWD/$build/anvil
w=$out/work
rm -rf "$w" && mkdir -p "$w"
want() { [[ " ${CHECKS:-equal size} " == *" $1 "* ]]; }
launch2() { "$A" launch --nproc_per_node 2 --master_port 0 "$@"; }

losses_check() {  # python assertion over runs' losses: REF RUN TOLERANCE [SKIP [HEAD]]: REF's steps past
  # SKIP against RUN's, the first HEAD of them (default all)
  python3 - "$w" "$@" <<'PY'
import json, sys
w, ref, run, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
skip = int(sys.argv[5]) if len(sys.argv) > 5 else 0
head = int(sys.argv[6]) if len(sys.argv) > 6 else None
def losses(r):
    return [j["loss"] for j in map(json.loads, open(f"{w}/{r}/metrics.jsonl")) if "loss" in j and "eval_loss" not in j]
a, b = losses(ref)[skip:][:head], losses(run)[:head]
assert len(a) == len(b) and a, (ref, run, len(a), len(b))
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"{run} against {ref}: worst relative difference {worst:.3g} (tolerance {tol:g})")
assert worst <= tol, (a, b)
PY
}

equal() {
  "$A" prepare-data --input data/shakespeare/shakespeare.txt --output "$w/data" --tokenizer bytes > /dev/null || return 1
  local common=(--model llama-tiny --train_data "$w/data/train.bin" --device cuda --bf16 --lora_r 8
    --lora_alpha 16 --lora_target_modules all-linear --max_seq_length 64 --max_steps 20 --learning_rate 1e-2
    --logging_steps 1 --save_steps 10 --sample_prompt "")
  for s in 0 1 2 3; do
    launch2 train "${common[@]}" --per_device_train_batch_size 4 --zero_stage $s --output_dir "$w/stage$s" || return 1
  done
  for s in 0 3; do
    launch2 train "${common[@]}" --per_device_train_batch_size 2 --gradient_accumulation_steps 2 --zero_stage $s \
      --output_dir "$w/stage${s}acc" || return 1
  done
  launch2 train "${common[@]}" --per_device_train_batch_size 4 --zero_stage 3 \
    --resume_from_checkpoint "$w/stage3/checkpoint-10" --output_dir "$w/stage3res" || return 1
  losses_check stage0 stage1 0 || return 1
  losses_check stage0 stage2 1e-4 || return 1
  losses_check stage0 stage3 1e-4 || return 1
  losses_check stage0acc stage3acc 0 0 2 || return 1
  losses_check stage0acc stage3acc 1e-2 || return 1
  losses_check stage3 stage3res 0 10 || return 1
  for s in 1 2 3; do
    cmp "$w/stage0/checkpoint-20/model.safetensors" "$w/stage$s/checkpoint-20/model.safetensors" || return 1
  done
}

size() {
  python3 -c "
import sys; sys.path.insert(0, 'bench')
from benchlib.shards import write_random_shard
write_random_shard('$w/tokens.bin', 4_000_000, 128256)" || return 1
  for s in 0 3; do
    echo "== stage $s"
    launch2 train --model llama-8b --train_data "$w/tokens.bin" --device cuda --bf16 --lora_r 16 --lora_alpha 32 \
      --lora_target_modules all-linear --per_device_train_batch_size "${BATCH:-8}" --max_seq_length 2048 \
      --max_steps 12 --logging_steps 4 --save_strategy no --sample_prompt "" --zero_stage $s \
      --output_dir "$w/size$s" 2>&1 | grep -E "ZeRO stage|frozen base|LoRA:|plan|step +[0-9]+/|tok/s|peak|error|Error" || return 1
  done
}

qlora() {
  [ -d "$w/data" ] || "$A" prepare-data --input data/shakespeare/shakespeare.txt --output "$w/data" --tokenizer bytes > /dev/null || return 1
  local common=(--model llama-tiny --train_data "$w/data/train.bin" --device cuda --bf16 --lora_r 8
    --lora_alpha 16 --lora_target_modules all-linear --quantization nf4-dq --max_seq_length 64 --max_steps 20
    --learning_rate 1e-2 --logging_steps 1 --save_steps 10 --sample_prompt "" --per_device_train_batch_size 4)
  for s in 0 2; do launch2 train "${common[@]}" --zero_stage $s --output_dir "$w/q$s" || return 1; done
  launch2 train "${common[@]}" --zero_stage 2 --resume_from_checkpoint "$w/q2/checkpoint-10" --output_dir "$w/q2res" || return 1
  ls "$w/q2/checkpoint-10/quantized_base.safetensors" || return 1
  losses_check q0 q2 0 || return 1
  losses_check q2 q2res 0 10 || return 1
}

big70() {
  python3 -c "
import sys; sys.path.insert(0, 'bench')
from benchlib.shards import write_random_shard
write_random_shard('$w/tokens.bin', 4_000_000, 128256)" || return 1
  mkdir -p "$w/llama70"
  cat > "$w/llama70/config.json" <<J
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
 "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
 "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": false,
 "hidden_act": "silu"}
J
  cat > "$w/big70.json" <<J
{"model": "$w/llama70/config.json",
 "train_data": "$w/tokens.bin", "device": "cuda", "bf16": true, "lora_r": 16, "lora_alpha": 32,
 "lora_target_modules": "all-linear", "per_device_train_batch_size": ${BATCH70:-1}, "max_seq_length": 2048,
 "max_steps": 8, "logging_steps": 2, "save_strategy": "no", "sample_prompt": "", "output_dir": "$w/big70"}
J
  echo "== anvil estimate, one GPU"
  "$A" estimate --config "$w/big70.json" --gpu h200 2>&1 | tail -25
  echo "== ZeRO-3 on 4 GPUs"
  /usr/bin/time -v "$A" launch --nproc_per_node 4 --master_port 0 train --config "$w/big70.json" --zero_stage 3 2>&1 \
    | grep -E "ZeRO stage|frozen base|LoRA:|plan|step +[0-9]+/|tok/s|peak|Maximum resident|Elapsed|rror" || return 1
}

# load8: a Llama-3.1-8B-shape base directory (random, bf16, made by transformers on the GPU), LoRA r 16 with ZeRO-3
# on 2 GPUs from it, 4 steps, a checkpoint at step 2 and a resume from it: each process's peak host memory
# (each rank reads its window of the base: about 15 GiB of fp32 values, not 30), the checkpoint's size (the
# adapter and a reference to the base); the resumed run's first step equals the run's step 3 exactly, the
# next within 1e-3; the same run again (l8b) against the first, to show how far two runs of this shape differ.
load8() {
  python3 -c "
import sys; sys.path.insert(0, 'bench')
from benchlib.shards import write_random_shard
write_random_shard('$w/tokens.bin', 400_000, 128256)" || return 1
  python3 - "$w/base8" <<'PY' || return 1
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
                  tie_word_embeddings=False)
with torch.device("cuda"):
    m = LlamaForCausalLM(cfg).to(torch.bfloat16)
m.save_pretrained(sys.argv[1])
PY
  du -sh "$w/base8"
  local common=(--model_name_or_path "$w/base8" --train_data "$w/tokens.bin" --device cuda --bf16 --lora_r 16
    --lora_alpha 32 --lora_target_modules all-linear --per_device_train_batch_size 2 --max_seq_length 2048
    --max_steps 4 --logging_steps 1 --save_steps 2 --sample_prompt "" --zero_stage 3)
  /usr/bin/time -v "$A" launch --nproc_per_node 2 --master_port 0 train "${common[@]}" --output_dir "$w/l8" 2>&1 \
    | grep -E "step +[0-9]+/|saved checkpoint|Maximum resident|Elapsed|rror" || return 1
  du -sh "$w/l8/checkpoint-2"; ls "$w/l8/checkpoint-2"
  /usr/bin/time -v "$A" launch --nproc_per_node 2 --master_port 0 train "${common[@]}" \
    --resume_from_checkpoint "$w/l8/checkpoint-2" --output_dir "$w/l8res" 2>&1 \
    | grep -E "step +[0-9]+/|saved checkpoint|Maximum resident|Elapsed|rror" || return 1
  "$A" launch --nproc_per_node 2 --master_port 0 train "${common[@]}" --save_strategy no --output_dir "$w/l8b" \
    > /dev/null 2>&1 || return 1
  losses_check l8 l8b 1 || return 1
  losses_check l8 l8res 0 2 1 || return 1
  losses_check l8 l8res 1e-3 2 || return 1
}

want equal && check equal equal
want size && check size size
want qlora && check qlora qlora
want big70 && check big70 big70
want load8 && check load8 load8
[ -f "$out/size.log" ] && cat "$out/size.log"
[ -f "$out/big70.log" ] && cat "$out/big70.log"
echo "$failures failure(s)"
exit $((failures > 0))
