#!/usr/bin/env bash
# ZeRO-3's purpose on 2 GPUs: a model whose training does not fit one GPU trains on two. The model is
# Llama-3.1-8B's shape (8.03B parameters, random weights; its config.json is written here), bf16 with fp32
# master weights and AdamW, micro-batch 1 x 2048 tokens: `anvil estimate` shows that stage 0 does not fit
# one GPU, then two GPUs train it with ZeRO-3 for a few steps and print their peak memory. Cards of 80 GB
# use full gradient checkpointing (stage 3 then plans 77.8 GiB per GPU); larger cards train without it
# (stage 0 on one of them would need more than 140 GiB). NPROC=4 trains on 4 GPUs, BATCH=N at micro-batch N
# (defaults 2 and 1); STEPS steps (6).
# Uses .devcarry/ when present (scripts/pack_for_gpu.sh), else the build in $ANVIL_BUILD_DIR (or build/).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
build=${ANVIL_BUILD_DIR:-build}
[ -d .devcarry/bin ] && build=build-cuda
A=$PWD/$build/anvil
W=${WORKDIR:-$(mktemp -d)}
mkdir -p "$W"
cat > "$W/config.json" <<J
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
 "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256,
 "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": false,
 "hidden_act": "silu", "torch_dtype": "bfloat16"}
J
[ -s data/shakespeare/shakespeare.txt ] || bash scripts/prepare_default_data.sh "$A" > /dev/null
"$A" prepare-data --input data/shakespeare/shakespeare.txt --output "$W/data" --tokenizer bytes > /dev/null
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
checkpointing=true
[ "$mib" -gt 100000 ] && checkpointing=false
np=${NPROC:-2}
shape=(--model "$W/config.json" --bf16 true --per_device_train_batch_size "${BATCH:-1}" --max_seq_length 2048
       --gradient_checkpointing "$checkpointing")
echo "== one GPU, stage 0 (gradient_checkpointing $checkpointing):"
"$A" estimate "${shape[@]}" --device cuda | grep -E 'total  |fits|does NOT fit' | head -4
echo "== $np GPUs, ZeRO-3, micro-batch ${BATCH:-1}:"
"$A" launch --nproc_per_node "$np" --master_port 0 train "${shape[@]}" --zero_stage 3 --train_data "$W/data/train.bin" \
  --max_steps ${STEPS:-6} --logging_steps 1 --warmup_steps 2 --learning_rate 1e-5 --save_strategy no \
  --sample_prompt "" --output_dir "$W/run" 2>&1 | grep -vE '^\s*$' | tail -${TAIL:-40}
