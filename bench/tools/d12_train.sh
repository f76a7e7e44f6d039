#!/usr/bin/env bash
# GPT-2 d12 (vocabulary 50257), bf16, on random tokens, as bench/decoder_speed.py trains it: for profiling one
# configuration by hand (PREFIX="nsys profile -o /tmp/d12" or "ncu ...", extra `anvil train` flags at the end).
# usage: bench/tools/d12_train.sh OUT_DIR BATCH STEPS [extra args]
W=/tmp/anvil_decoder_speed
python3 -c "
import sys; sys.path.insert(0, 'bench'); from benchlib.shards import write_random_shard
write_random_shard('$W/random_tokens.bin', 8_000_000, 50257)"
echo '{"model": {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50257, "block_size": 1024}}' > /tmp/d12.json
out=$1 b=$2 steps=$3; shift 3
exec ${PREFIX:-} build-cuda/anvil train --config /tmp/d12.json --device cuda --train_data $W/random_tokens.bin --max_seq_length 1024 --learning_rate 3e-4 --warmup_steps 0 --logging_steps 1 --save_steps 0 --bf16 true --per_device_train_batch_size $b --max_steps $steps --output_dir $out --overwrite_output_dir "$@" --sample_prompt ""
