#!/usr/bin/env bash
# usage: prof_cmd.sh OUT_DIR BATCH STEPS [extra args]
W=/tmp/anvil_speed_runs
python3 -c "
import sys; sys.path.insert(0,'bench'); from pathlib import Path; import gpt2_speed as g; Path('$W').mkdir(parents=True, exist_ok=True); g.random_shard(Path('$W/random_tokens.bin'), 8_000_000)"
echo '{"model": {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50257, "block_size": 1024}}' > /tmp/d12.json
out=$1 b=$2 steps=$3; shift 3
exec ${PREFIX:-} build-cuda/anvil train --config /tmp/d12.json --device cuda --train_data $W/random_tokens.bin --max_seq_length 1024 --learning_rate 3e-4 --warmup_steps 0 --logging_steps 1 --save_steps 0 --bf16 true --per_device_train_batch_size $b --max_steps $steps --output_dir $out "$@" --sample_prompt ""
