#!/usr/bin/env bash
# On a machine with 2 or more GPUs: data parallelism on CUDA (NCCL) against one GPU, the GPU side of the
# CPU tests in tests/unit/data_parallel_test.cpp. NPROC=4 runs every multi-GPU check on 4 GPUs (2 by
# default; the global batch is 8 sequences on any world size). Prints one PASS/FAIL line per check and
# exits non-zero on any failure:
#   fp32, SGD, 20 steps: N GPUs x micro-batch 8/N vs 1 GPU x 8: weights within 1e-6 relative
#   bf16, AdamW, CUDA graphs (the whole step one graph): loss curves within 1e-4 relative
#   bf16, AdamW, gradient accumulation 2 (a graph per micro-batch): loss curves within 1e-4 relative
#   two "nodes" of N/2 GPUs each (anvil launch --nnodes 2, twice): the same weights as N GPUs of one node
#   ZeRO stages 1-3 on N GPUs, bf16 with stochastic rounding and bf16 AdamW moments, whole-step graphs
#   and accumulation (8-bit AdamW): the loss curve and checkpoint weights of stage 0 (stage 1 bit for bit);
#   ZeRO-2 and ZeRO-3 checkpoints resumed on N GPUs bit for bit, ZeRO-2's on 1 GPU (stage 0) within 1e-4,
#   with N > 2 ZeRO-3's on 2 GPUs within 1e-4;
#   ZeRO-3 evaluations between graph-replayed steps equal to those between eager steps
#   communication_data_type bf16 (fp32 gradients reduced in bf16), stages 0, 2, 3: within 1e-3 of the fp32
#   reduction's loss curve, the stages within 1e-4 of one another
#   --profile_steps on N GPUs: one joined trace with every rank's tracks, collectives and waits
#   backward_grad_dtype bf16 (unit gradients in bf16, accumulated in fp32), ZeRO-2 and ZeRO-3 with
#   accumulation: within 1e-2 of the fp32-gradient loss curve, ZeRO-3 within 1e-4 of ZeRO-2
# Uses .devcarry/ when present (scripts/pack_for_gpu.sh), else the build in $ANVIL_BUILD_DIR (or build/).
# Keeps NCCL_NVLS_ENABLE as the environment sets it. Logs in $OUT (or runs/gpu_dist_check). DEVICE=cpu runs
# the same checks on CPU processes (Gloo), to try the script without GPUs.
set -uo pipefail
cd "$(dirname "$0")/.."
np=${NPROC:-2}
case $np in 2 | 4) ;; *) echo "NPROC must be 2 or 4 (the global batch of 8 sequences splits evenly)"; exit 2 ;; esac
mb=$((8 / np))           # micro-batch per GPU without accumulation
mba=$((4 / np))          # with gradient accumulation 2
out=${OUT:-runs/gpu_dist_check}
mkdir -p "$out"
source scripts/gpu_env.sh
build=${ANVIL_BUILD_DIR:-build}
[ -d .devcarry/bin ] && build=build-cuda
A=$PWD/$build/anvil
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
[ -s data/shakespeare/shakespeare.txt ] || bash scripts/prepare_default_data.sh "$A" > /dev/null
"$A" prepare-data --input data/shakespeare/shakespeare.txt --output "$W/data" --tokenizer bytes > /dev/null
cat > "$W/base.json" <<J
{"model": {"n_layer": 4, "n_head": 4, "n_embd": 128, "vocab_size": 256, "block_size": 128},
 "train_data": "$W/data/train.bin", "max_steps": 20, "logging_steps": 1, "device": "${DEVICE:-cuda}", "seed": 5,
 "warmup_steps": 2, "save_steps": 10, "sample_prompt": ""}
J
failures=0
run() {  # name, then the command's arguments
  local name=$1; shift
  if ! "$@" > "$out/$name.log" 2>&1; then
    echo "FAIL $name: exited non-zero (log: $out/$name.log)"; tail -5 "$out/$name.log"; failures=$((failures + 1))
  fi
}
launchN() { "$A" launch --nproc_per_node "$np" --master_port 0 "$@"; }
launch2() { "$A" launch --nproc_per_node 2 --master_port 0 "$@"; }
run one_sgd "$A" train --config "$W/base.json" --optim sgd --learning_rate 0.3 --per_device_train_batch_size 8 --output_dir "$W/one_sgd"
run two_sgd launchN train --config "$W/base.json" --optim sgd --learning_rate 0.3 --per_device_train_batch_size $mb --output_dir "$W/two_sgd"
run one_bf16 "$A" train --config "$W/base.json" --bf16 true --per_device_train_batch_size 8 --output_dir "$W/one_bf16"
run two_bf16 launchN train --config "$W/base.json" --bf16 true --per_device_train_batch_size $mb --output_dir "$W/two_bf16"
run one_acc "$A" train --config "$W/base.json" --bf16 true --per_device_train_batch_size 4 --gradient_accumulation_steps 2 --output_dir "$W/one_acc"
run two_acc launchN train --config "$W/base.json" --bf16 true --per_device_train_batch_size $mba --gradient_accumulation_steps 2 --output_dir "$W/two_acc"
zb=(--bf16 true --stochastic_rounding true --adamw_bf16_moments true)
for s in 0 1 2 3; do
  run "zero$s" launchN train --config "$W/base.json" "${zb[@]}" --per_device_train_batch_size $mb --zero_stage "$s" --output_dir "$W/zero$s"
  run "zero_acc$s" launchN train --config "$W/base.json" --bf16 true --stochastic_rounding true \
    --per_device_train_batch_size $mba --gradient_accumulation_steps 2 --zero_stage "$s" --optim adamw_8bit \
    --output_dir "$W/zero_acc$s"
done
run zero_res2 launchN train --config "$W/base.json" "${zb[@]}" --per_device_train_batch_size $mb --zero_stage 2 --output_dir "$W/zero_res2" \
  --resume_from_checkpoint "$W/zero2/checkpoint-10"
run zero_res3 launchN train --config "$W/base.json" "${zb[@]}" --per_device_train_batch_size $mb --zero_stage 3 --output_dir "$W/zero_res3" \
  --resume_from_checkpoint "$W/zero3/checkpoint-10"
run zero_res1 "$A" train --config "$W/base.json" "${zb[@]}" --per_device_train_batch_size 8 --zero_stage 0 \
  --output_dir "$W/zero_res1" --resume_from_checkpoint "$W/zero2/checkpoint-10"
[ "$np" -gt 2 ] && run zero_res3_2 launch2 train --config "$W/base.json" "${zb[@]}" --per_device_train_batch_size 4 \
  --zero_stage 3 --output_dir "$W/zero_res3_2" --resume_from_checkpoint "$W/zero3/checkpoint-10"
# Two nodes of N/2 GPUs each, as two process groups of this machine (the same output_dir: ranks must agree).
# ZeRO-3 evaluations between steps replayed from CUDA graphs equal those between eager steps (the gathered
# weights must be forgotten after each update, also when no host code of the step ran).
for g in true false; do
  run "zero3_eval_$g" launchN train --config "$W/base.json" --bf16 true --per_device_train_batch_size $mb --zero_stage 3 \
    --val_data "$W/data/val.bin" --eval_steps 5 --max_eval_batches 4 --cuda_graphs "$g" --output_dir "$W/zero3_eval_$g"
done
for s in 0 2 3; do
  run "comm$s" launchN train --config "$W/base.json" "${zb[@]}" --per_device_train_batch_size $mb --zero_stage "$s" \
    --communication_data_type bf16 --output_dir "$W/comm$s"
done
for s in 2 3; do
  run "grads$s" launchN train --config "$W/base.json" --bf16 true --per_device_train_batch_size $mba \
    --gradient_accumulation_steps 2 --zero_stage "$s" --backward_grad_dtype bf16 --output_dir "$W/grads$s"
done
run grads_ref launchN train --config "$W/base.json" --bf16 true --per_device_train_batch_size $mba \
  --gradient_accumulation_steps 2 --zero_stage 2 --output_dir "$W/grads_ref"
run profile launchN train --config "$W/base.json" --bf16 true --per_device_train_batch_size $mb --zero_stage 3 \
  --max_steps 5 --profile_steps 3:4 --output_dir "$W/profile"
port=$((29600 + RANDOM % 1000))
node() {  # node rank; its GPUs are the node's half of the machine's first N
  local half=$((np / 2)) gpus
  gpus=$(seq -s, $(($1 * half)) $(($1 * half + half - 1)))
  CUDA_VISIBLE_DEVICES=$gpus "$A" launch --nnodes 2 --node_rank "$1" --nproc_per_node "$half" --master_port "$port" \
    train --config "$W/base.json" --optim sgd --learning_rate 0.3 --per_device_train_batch_size $mb --output_dir "$W/nodes"
}
node 1 > "$out/node1.log" 2>&1 &
n1=$!
run node0 node 0
wait "$n1" || { echo "FAIL node1: exited non-zero (log: $out/node1.log)"; failures=$((failures + 1)); }
python3 - "$W" "$np" "${DEVICE:-cuda}" <<'P' || failures=$((failures + 1))
import json, sys
import numpy as np
from safetensors.numpy import load_file
W, N, device = sys.argv[1], int(sys.argv[2]), sys.argv[3]
bad = 0
def weights_rel(a, b):  # inf when a run failed (already reported above)
    try:
        x, y = load_file(f"{W}/{a}/checkpoint-20/model.safetensors"), load_file(f"{W}/{b}/checkpoint-20/model.safetensors")
    except FileNotFoundError:
        return float("inf")
    return max(float(np.abs(x[k] - y[k]).max() / max(np.abs(x[k]).max(), 1e-30)) for k in x)
def losses(d):  # [] when the run failed (already reported above)
    try:
        return [json.loads(l)["loss"] for l in open(f"{W}/{d}/metrics.jsonl") if '"loss"' in l]
    except FileNotFoundError:
        return []
def check(name, ok, detail):
    global bad
    print(("PASS" if ok else "FAIL"), name, detail)
    bad += not ok
r = weights_rel("one_sgd", "two_sgd")
check(f"fp32 SGD weights, {N} GPUs vs 1", r < 1e-6, f"max relative difference {r:.2e}")
for one, two, what in [("one_bf16", "two_bf16", "bf16 whole-step graphs"), ("one_acc", "two_acc", "bf16 accumulation")]:
    a, b = losses(one), losses(two)
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b)) if len(a) == len(b) == 20 else float("inf")
    try:
        s = json.load(open(f"{W}/{two}/summary.json"))
    except FileNotFoundError:
        s = {}
    check(f"{what} loss curve, {N} GPUs vs 1", worst < 1e-4 and s.get("world_size") == N,
          f"max relative difference {worst:.2e}, graphs {s.get('cuda_graphs')}")
r = weights_rel("two_sgd", "nodes")
check("two nodes vs one node (fp32 SGD weights)", r < 1e-6, f"max relative difference {r:.2e}")
for prefix, what in [("zero", "bf16 graphs"), ("zero_acc", "8-bit AdamW, accumulation")]:
    ref = losses(f"{prefix}0")
    for s in (1, 2, 3):
        got = losses(f"{prefix}{s}")
        worst = max(abs(x - y) / abs(x) for x, y in zip(ref, got)) if len(ref) == len(got) == 20 else float("inf")
        r = weights_rel(f"{prefix}0", f"{prefix}{s}")
        limit = 0.0 if s == 1 else 1e-4
        # Weights: stage 1's loss is stage 0's bit for bit, its weights within an ulp or so (the GPU's
        # AdamW kernel may contract an element's arithmetic differently on a shard's range). Stages 2-3
        # reduce each unit per micro-batch: with accumulation the sums round in another order, and AdamW
        # turns that noise on gradients that are zero in exact arithmetic (the attention key bias) into
        # lr-sized steps, so the accumulation runs are compared by their loss curve, as the issue says.
        # The same holds on more than 2 GPUs without accumulation: NCCL's reduce-scatter and all-reduce
        # sum 4 ranks in different orders (measured on 4 H200s: the key bias 0.14 relative, the rest
        # within 2.3e-3, loss curves within 1.7e-5).
        wlimit = 1e-6 if s == 1 else float("inf") if prefix == "zero_acc" or N > 2 else 1e-3
        check(f"ZeRO-{s} vs stage 0 ({what})", worst <= limit and r <= wlimit,
              f"loss max relative difference {worst:.2e}, weights {r:.2e}")
full = losses("zero2")
same, one = losses("zero_res2"), losses("zero_res1")
check(f"ZeRO-2 resume on {N} GPUs", same == full[10:] and len(same) == 10, f"{len(same)} steps")
full3, same3 = losses("zero3"), losses("zero_res3")
check(f"ZeRO-3 resume on {N} GPUs", same3 == full3[10:] and len(same3) == 10, f"{len(same3)} steps")
worst = max(abs(x - y) / abs(x) for x, y in zip(full[10:], one)) if len(one) == 10 else float("inf")
check("ZeRO-2 resume on 1 GPU (stage 0)", worst < 1e-4, f"loss max relative difference {worst:.2e}")
if N > 2:
    two3 = losses("zero_res3_2")
    worst = max(abs(x - y) / abs(x) for x, y in zip(full3[10:], two3)) if len(two3) == 10 else float("inf")
    check(f"ZeRO-3 resume of {N} GPUs on 2", worst < 1e-4, f"loss max relative difference {worst:.2e}")
def evals(d):
    try:
        return [json.loads(l)["eval_loss"] for l in open(f"{W}/{d}/metrics.jsonl") if '"eval_loss"' in l]
    except FileNotFoundError:
        return []
a, b = evals("zero3_eval_true"), evals("zero3_eval_false")
check("ZeRO-3 evaluations, graphs vs eager", len(a) == 4 and a == b, f"{a} vs {b}")
def rel_curve(x, y):
    return max(abs(p - q) / abs(p) for p, q in zip(x, y)) if len(x) == len(y) == 20 else float("inf")
ref, c0 = losses("zero0"), losses("comm0")
check("bf16 communication vs fp32 (stage 0)", 0 < rel_curve(ref, c0) < 1e-3, f"loss max relative difference {rel_curve(ref, c0):.2e}")
for s in (2, 3):
    r = rel_curve(c0, losses(f"comm{s}"))
    check(f"bf16 communication, ZeRO-{s} vs stage 0", r < 1e-4, f"loss max relative difference {r:.2e}")
g_ref, g2, g3 = losses("grads_ref"), losses("grads2"), losses("grads3")
r = rel_curve(g_ref, g2)
check("bf16 unit gradients vs fp32 (ZeRO-2, accumulation)", 0 < r < 1e-2, f"loss max relative difference {r:.2e}")
r = rel_curve(g2, g3)
check("bf16 unit gradients, ZeRO-3 vs ZeRO-2", r < 1e-4, f"loss max relative difference {r:.2e}")
try:
    trace = json.load(open(f"{W}/profile/profile_steps_3-4.json"))
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("ph") == "M" and e["name"] == "process_name"}
    per_rank = [sum(1 for e in trace["traceEvents"] if e.get("ph") == "X" and e["pid"] == 2 * r and e["cat"] == "communication")
                for r in range(N)]
    waits = [sum(1 for e in trace["traceEvents"] if e.get("ph") == "X" and e["pid"] == 2 * r and e["cat"] == "exposed communication")
             for r in range(N)]
    # (The kernel tracks are CUDA's: CPU processes have none.)
    ok = all(f"rank {r}: steps" in names and (device == "cpu" or f"rank {r}: kernels" in names) for r in range(N))
    ok = ok and min(per_rank) > 0
    check(f"profile of {N} GPUs: one trace, every rank's tracks", ok, f"collectives per rank {per_rank}, waits {waits}")
except (FileNotFoundError, ValueError, KeyError) as e:
    check(f"profile of {N} GPUs: one trace, every rank's tracks", False, repr(e))
sys.exit(1 if bad else 0)
P
[ "$failures" -eq 0 ] && echo "gpu_dist_check: all checks passed" || echo "gpu_dist_check: $failures failure(s)"
exit "$failures"
