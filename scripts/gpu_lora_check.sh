#!/usr/bin/env bash
# On a GPU machine: LoRA (docs/lora.md) on CUDA and against PEFT. Prints one PASS/FAIL line per check and exits
# non-zero on any failure:
#   parity: Ops::gemm on cuBLASLt equals the CPU reference (transposes, strides, alpha/beta; fp32/bf16/fp16),
#     and a Llama-shaped model with adapters on every Linear trains two steps on CUDA as on the CPU (loss,
#     every factor's gradient, the factors after AdamW; the frozen base bit for bit)
#   golden: PEFT makes the LoRA fixtures (tests/golden/make_lora_golden.py) into $OUT/golden; the CPU unit test
#     lora_golden_test then compares Anvil with them (run it where the fixtures are copied into tests/golden)
#   dropout_resume: a bf16 LoRA run with lora_dropout and CUDA graphs (the masks' micro-batch counter in the
#     graph) resumed from its step-5 checkpoint gives the uninterrupted run's losses for steps 6-8 exactly
#   qlora_resume: the same with --quantization nf4 (QLoRA; no dropout): the resumed run quantizes the
#     checkpoint's dequantized base into the same codes
#   qlora_dq_resume: the same with --quantization nf4-dq (double quantization): the resumed run reads the
#     checkpoint's codes and scales (quantized_base.safetensors)
#   peft_loads_anvil: an Anvil LoRA checkpoint trained on CUDA (bf16, a random transformers Llama as its base) loads with
#     PEFT, whose logits equal `anvil logits` on the checkpoint (the adapter merged): the checkpoint that refers to
#     its base with AutoPeftModelForCausalLM (the base from base_model_name_or_path), and the same run with
#     --save_base_model true with PeftModel.from_pretrained on the base it holds
# CHECKS="parity qlora_dq_resume" runs those only. Uses .devcarry/ when present (scripts/pack_for_gpu.sh), else
# the build in $ANVIL_BUILD_DIR (or build/).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-runs/gpu_lora_check}
source scripts/gpu_check_lib.sh  # build, check, failures
want() { [[ -z "${CHECKS:-}" || " $CHECKS " == *" $1 "* ]]; }
want parity && check parity "$build/anvil_parity_tests" --gtest_filter='*GemmParity*:*LoraModelParity*'
mkdir -p "$out/golden"
cp -r tests/golden/llama_tiny tests/golden/gpt2_tiny "$out/golden/"
want golden && check golden python3 tests/golden/make_lora_golden.py "$out/golden"
peft_loads_anvil() {
  local w=$out/peft_check
  rm -rf "$w" && mkdir -p "$w"
  python3 - "$w" <<'PY' || return 1
import sys, numpy as np, torch
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
sys.path.insert(0, "bench")
from benchlib.shards import write_random_shard
from safetensors.numpy import save_file
w = Path(sys.argv[1])
# A random base with a byte-sized vocabulary (the byte tokenizer's 256), grouped-query attention.
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)
LlamaForCausalLM(cfg).save_pretrained(w / "base")
write_random_shard(w / "tokens.bin", 200_000, 256)
save_file({"input_ids": np.random.default_rng(3).integers(0, 256, (2, 24)).astype(np.int32)}, str(w / "ids.safetensors"))
PY
  "$build/anvil" train --init_from "$w/base" --train_data "$w/tokens.bin" --device cuda --bf16 \
    --lora_r 8 --lora_alpha 16 --lora_target_modules all-linear --per_device_train_batch_size 8 \
    --max_seq_length 32 --max_steps 40 --learning_rate 1e-2 --save_steps 40 --sample_prompt "" \
    --output_dir "$w/run" || return 1
  "$build/anvil" logits --checkpoint "$w/run/checkpoint-40" --input_ids "$w/ids.safetensors" \
    --output "$w/logits.safetensors" || return 1
  [ -f "$w/run/checkpoint-40/base_model.json" ] && [ ! -f "$w/run/checkpoint-40/model.safetensors" ] || return 1
  python3 tests/golden/make_lora_golden.py --check "$w/run/checkpoint-40" "$w/logits.safetensors" "$w/ids.safetensors" || return 1
  "$build/anvil" train --init_from "$w/base" --train_data "$w/tokens.bin" --device cuda --bf16 \
    --lora_r 8 --lora_alpha 16 --lora_target_modules all-linear --per_device_train_batch_size 8 \
    --max_seq_length 32 --max_steps 40 --learning_rate 1e-2 --save_steps 40 --sample_prompt "" \
    --save_base_model true --output_dir "$w/copy" > /dev/null || return 1
  "$build/anvil" logits --checkpoint "$w/copy/checkpoint-40" --input_ids "$w/ids.safetensors" \
    --output "$w/logits_copy.safetensors" || return 1
  python3 tests/golden/make_lora_golden.py --check "$w/copy/checkpoint-40" "$w/logits_copy.safetensors" "$w/ids.safetensors"
}
resume_check() {  # NAME FLAGS...: a run of 8 steps against one resumed from its step-5 checkpoint
  local w=$out/$1
  shift
  rm -rf "$w" && mkdir -p "$w"
  "$build/anvil" prepare-data --input data/shakespeare/shakespeare.txt --output "$w/data" --tokenizer bytes \
    > /dev/null || return 1
  local common=(--model llama-tiny --train_data "$w/data/train.bin" --device cuda --bf16 --lora_r 8
    --lora_alpha 16 "$@" --lora_target_modules all-linear --per_device_train_batch_size 8
    --gradient_accumulation_steps 2 --max_seq_length 64 --max_steps 8 --learning_rate 1e-2 --logging_steps 1
    --sample_prompt "")
  "$build/anvil" train "${common[@]}" --save_steps 5 --output_dir "$w/full" || return 1
  "$build/anvil" train "${common[@]}" --resume_from_checkpoint "$w/full/checkpoint-5" --output_dir "$w/resumed" || return 1
  python3 - "$w" <<'PY'
import json, sys
w = sys.argv[1]
def losses(run):
    return [j["loss"] for j in map(json.loads, open(f"{w}/{run}/metrics.jsonl")) if "loss" in j and "eval_loss" not in j]
full, resumed = losses("full"), losses("resumed")
print("full", full, "resumed", resumed)
assert len(full) == 8 and resumed == full[5:], (full, resumed)
PY
}
want dropout_resume && check dropout_resume resume_check dropout_resume --lora_dropout 0.1
want qlora_resume && check qlora_resume resume_check qlora_resume --quantization nf4
want qlora_dq_resume && check qlora_dq_resume resume_check qlora_dq_resume --quantization nf4-dq
want peft_loads_anvil && check peft_loads_anvil peft_loads_anvil && grep '"check"' "$out/peft_loads_anvil.log"
echo "$failures failure(s)"
exit $((failures > 0))
