#!/usr/bin/env bash
# On a GPU machine: freeze_parameters on CUDA, the GPU side of tests/unit/freeze_test.cpp. Prints one
# PASS/FAIL line per check and exits non-zero on any failure:
#   llama-tiny, bf16 (CUDA graphs), each optimizer: the frozen tensors (the embedding, block 0, block 1's
#   q_proj, a part of a fused q/k/v) bit for bit the same at steps 10 and 20, every other tensor trained
#   AdamW, fp32, no clipping: after one step the trainable tensors equal an unfrozen run's bit for bit
#   bert-tiny with "bert.*" frozen: the encoder bit for bit the same at steps 10 and 20, the classifier trained
#   with NPROC=2 (2 GPUs): ZeRO-2 and ZeRO-3 with frozen tensors: their loss curves within 1e-4 of stage 0's,
#   the frozen tensors unchanged between steps 10 and 20
# Also prints (information, not a check) the tokens/s of Llama-1B, bf16, batch 4 x 2048, with nothing and
# with its first 8 blocks and the embedding frozen (their weight-gradient matmuls are skipped).
# Uses .devcarry/ when present (scripts/pack_for_gpu.sh), else the build in $ANVIL_BUILD_DIR (or build/).
# Logs in $OUT (or runs/gpu_freeze_check). DEVICE=cpu runs the checks on the CPU (without the Llama-1B line).
set -uo pipefail
cd "$(dirname "$0")/.."
np=${NPROC:-1}
out=${OUT:-runs/gpu_freeze_check}
mkdir -p "$out"
source scripts/gpu_env.sh
build=${ANVIL_BUILD_DIR:-build}
[ -d .devcarry/bin ] && build=build-cuda
A=$PWD/$build/anvil
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
dev=${DEVICE:-cuda}
[ -s data/shakespeare/shakespeare.txt ] || bash scripts/prepare_default_data.sh "$A" > /dev/null
"$A" prepare-data --input data/shakespeare/shakespeare.txt --output "$W/data" --tokenizer bytes > /dev/null
freeze="model.embed_tokens.weight,model.layers.0.*,model.layers.1.self_attn.q_proj.weight"
cat > "$W/base.json" <<J
{"model": "llama-tiny", "train_data": "$W/data/train.bin", "max_steps": 20, "save_steps": 10, "logging_steps": 1,
 "device": "$dev", "seed": 5, "warmup_steps": 2, "per_device_train_batch_size": 8, "max_seq_length": 128,
 "weight_decay": 0.1, "optim_8bit_min_size": 256, "sample_prompt": ""}
J
failures=0
run() {  # name, then the command's arguments
  local name=$1; shift
  if ! "$@" > "$out/$name.log" 2>&1; then
    echo "FAIL $name: exited non-zero (log: $out/$name.log)"; tail -5 "$out/$name.log"; failures=$((failures + 1))
  fi
}
for o in adamw_torch_fused adamw_8bit adafactor sgd; do
  lr=(); [ $o = sgd ] && lr=(--learning_rate 0.3)  # 5e-5 moves no norm weight by a ulp in 20 plain SGD steps
  run "bf16_$o" "$A" train --config "$W/base.json" --bf16 true --optim "$o" "${lr[@]}" --freeze_parameters "$freeze" \
    --output_dir "$W/bf16_$o"
done
for f in frozen open; do
  pat=$freeze; [ $f = open ] && pat=""
  run "one_$f" "$A" train --config "$W/base.json" --max_steps 1 --save_steps 0 --max_grad_norm 0 --warmup_steps 0 \
    --freeze_parameters "$pat" --output_dir "$W/one_$f"
done
# BERT (bert-tiny) with its encoder and pooler frozen ("bert.*"): only the classifier trains, the encoder's
# backward is skipped. A WordPiece vocabulary and a labelled CSV made here.
python3 - "$W" <<'P'
import random, sys
W = sys.argv[1]
words = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "green", "swift", "quiet", "north", "lamp"]
open(f"{W}/vocab.txt", "w").write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "zebra"] + words) + "\n")
r = random.Random(3)
rows = ["text,label"]
for i in range(2000):
    z = r.random() < 0.5
    t = [r.choice(words) for _ in range(r.randint(4, 20))]
    if z:
        t[r.randrange(len(t))] = "zebra"
    rows.append(" ".join(t) + "," + ("yes" if z else "no"))
open(f"{W}/bert.csv", "w").write("\n".join(rows) + "\n")
P
"$A" prepare-data --input "$W/bert.csv" --tokenizer "$W/vocab.txt" --output "$W/bert_data" > /dev/null
run bert "$A" train --model bert-tiny --tokenizer "$W/vocab.txt" --train_data "$W/bert_data/train.cls" --device "$dev" \
  --per_device_train_batch_size 16 --max_steps 20 --save_steps 10 --learning_rate 1e-3 --logging_steps 10 \
  --freeze_parameters "bert.*" --output_dir "$W/bert"
if [ "$np" -ge 2 ]; then
  for s in 0 2 3; do
    run "zero$s" "$A" launch --nproc_per_node 2 --master_port 0 train --config "$W/base.json" --bf16 true \
      --per_device_train_batch_size 4 --zero_stage "$s" --freeze_parameters "$freeze" --output_dir "$W/zero$s"
  done
fi
python3 - "$W" "$np" "$freeze" <<'P' || failures=$((failures + 1))
import fnmatch, json, sys
import numpy as np
from safetensors.numpy import load_file
W, N, patterns = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
bad = 0
def check(name, ok, detail):
    global bad
    print(("PASS" if ok else "FAIL"), name, detail)
    bad += not ok
def load(d, step):
    try:
        return load_file(f"{W}/{d}/checkpoint-{step}/model.safetensors")
    except FileNotFoundError:
        return None
frozen = lambda k: any(fnmatch.fnmatchcase(k, p) for p in patterns)
def frozen_kept(d):
    a, b = load(d, 10), load(d, 20)
    if a is None or b is None:
        return False, "no checkpoints"
    moved = [k for k in a if frozen(k) and not np.array_equal(a[k], b[k])]
    still = [k for k in a if not frozen(k) and np.array_equal(a[k], b[k])]
    n = sum(frozen(k) for k in a)
    return n == 11 and not moved and not still, f"{n} frozen tensors, moved {moved[:3]}, untrained {still[:3]}"
for o in ("adamw_torch_fused", "adamw_8bit", "adafactor", "sgd"):
    ok, detail = frozen_kept(f"bf16_{o}")
    check(f"bf16 {o}: frozen tensors kept, the others trained", ok, detail)
a, b = load("one_frozen", 1), load("one_open", 1)
if a is None or b is None:
    check("fp32 AdamW step 1: trainable tensors equal the unfrozen run's", False, "no checkpoints")
else:
    diff = [k for k in a if not frozen(k) and not np.array_equal(a[k], b[k])]
    same = [k for k in a if frozen(k) and np.array_equal(a[k], b[k])]
    check("fp32 AdamW step 1: trainable tensors equal the unfrozen run's", not diff and not same,
          f"differing trainable {diff[:3]}, frozen equal to the unfrozen run's {same[:3]}")
def losses(d):
    try:
        return [json.loads(l)["loss"] for l in open(f"{W}/{d}/metrics.jsonl") if '"loss"' in l]
    except FileNotFoundError:
        return []
a, b = load("bert", 10), load("bert", 20)
if a is None or b is None:
    check("bert-tiny, encoder frozen: encoder kept, classifier trained", False, "no checkpoints")
else:
    moved = [k for k in a if k.startswith("bert.") and not np.array_equal(a[k], b[k])]
    still = [k for k in a if not k.startswith("bert.") and np.array_equal(a[k], b[k])]
    check("bert-tiny, encoder frozen: encoder kept, classifier trained", not moved and not still,
          f"moved {moved[:3]}, untrained {still[:3]}")
if N >= 2:
    ref = losses("zero0")
    for s in (2, 3):
        got = losses(f"zero{s}")
        worst = max(abs(x - y) / abs(x) for x, y in zip(ref, got)) if len(ref) == len(got) == 20 else float("inf")
        ok, detail = frozen_kept(f"zero{s}")
        check(f"ZeRO-{s} on 2 GPUs with frozen tensors", worst < 1e-4 and ok,
              f"loss curve vs stage 0 within {worst:.2e}; {detail}")
sys.exit(1 if bad else 0)
P
if [ "$dev" = cuda ]; then
  # Information: Llama-1B with nothing frozen and with the embedding and blocks 0-7 frozen.
  for f in none half; do
    pat=""; [ $f = half ] && pat="model.embed_tokens.weight,model.layers.[0-7].*"
    "$A" train --model llama-1b --train_data "$W/data/train.bin" --bf16 true --per_device_train_batch_size 4 \
      --max_seq_length 2048 --max_steps 12 --logging_steps 4 --save_strategy no --sample_prompt "" \
      --freeze_parameters "$pat" --output_dir "$W/speed_$f" > "$out/speed_$f.log" 2>&1 ||
      { echo "FAIL speed_$f (log: $out/speed_$f.log)"; failures=$((failures + 1)); }
    python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print('INFO llama-1b bf16 b4x2048 frozen=$f:', round(s['train_tokens_per_second']), 'tok/s, peak', round(s['peak_memory_bytes']/2**30, 2), 'GiB')" "$W/speed_$f/summary.json" 2>/dev/null
  done
fi
echo "$failures failure(s)"
exit $((failures > 0))
