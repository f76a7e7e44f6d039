#!/usr/bin/env python3
"""Issue 5 investigation: Anvil's bf16 GPT-2 d12 loss at step 500 against transformers + torch.optim.AdamW
(bf16 autocast) on the same shard, schedule and hyper-parameters (the optimizer benchmark's converge setup:
batch 8 x 1024, lr 6e-4, cosine over 1000 steps with 50 warm-up, weight decay 0.1, clip 1.0).

Runs: Anvil bf16, Anvil fp32 storage with TF32 matmuls, and the PyTorch reference with two batch samplers
(independent random batches, and Anvil's: a permutation of the windows per epoch), each with two seeds;
prints the mean loss of steps 481..500 of each. Usage (GPU machine, repository root):
    python3 bench/probes/loss_gap.py --anvil build-cuda/anvil [--out FILE.json]
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchlib.shards import read_shard  # noqa: E402

STEPS, TOTAL, WARM, LR, B, T = 500, 1000, 50, 6e-4, 8, 1024


def anvil(args, seed, precision):
    with tempfile.TemporaryDirectory() as out:
        cmd = [args.anvil, "train", "--device", "cuda", "--model", "d12", "--tokenizer", args.tokenizer,
               "--train_data", args.data, "--per_device_train_batch_size", str(B), "--max_seq_length", str(T),
               "--max_steps", str(TOTAL), "--learning_rate", str(LR), "--weight_decay", "0.1", "--warmup_steps",
               str(WARM), "--lr_scheduler_type", "cosine", "--max_grad_norm", "1.0", "--logging_steps", "1",
               "--output_dir", out, "--save_steps", "0", "--seed", str(seed), "--sample_prompt", "",
               "--optim", "adamw_torch_fused"] + precision
        # Only the first STEPS steps are needed: stop the run there (the schedule still spans TOTAL steps).
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        losses = []
        for line in p.stdout:
            if line.startswith("step") and "| loss" in line:
                losses.append(float(line.split("| loss")[1].split("|")[0]))
                if len(losses) >= STEPS:
                    p.kill()
                    break
        p.wait()
    return losses


def torch_ref(args, seed, epochs=False):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    tokens, vocab = read_shard(args.data)
    cfg = GPT2Config(vocab_size=vocab, n_positions=1024, n_embd=768, n_layer=12, n_head=12, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa").cuda().train()
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or ".ln_" in n)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or ".ln_" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: s / WARM if s < WARM else 0.5 * (1 + np.cos(np.pi * (s - WARM) / (TOTAL - WARM))))
    rng = np.random.default_rng(seed)
    nwin = (len(tokens) - 1) // T
    losses = []
    order = []
    for _ in range(STEPS):
        if epochs:  # as Anvil's loader: a fresh permutation of the windows each epoch, batches in its order
            if len(order) < B:
                order = list(rng.permutation(nwin))
            idx, order = order[:B], order[B:]
        else:  # independent batches (a window may recur before others are seen)
            idx = rng.choice(nwin, B, replace=False)
        x = torch.from_numpy(np.stack([tokens[i * T:(i + 1) * T] for i in idx]).astype(np.int64)).cuda()
        y = torch.from_numpy(np.stack([tokens[i * T + 1:(i + 1) * T + 1] for i in idx]).astype(np.int64)).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--anvil", default="build-cuda/anvil")
    ap.add_argument("--data", default="data/shakespeare_bpe/train.bin")
    ap.add_argument("--tokenizer", default="data/shakespeare_bpe/tokenizer.json")
    ap.add_argument("--out", default="")
    ap.add_argument("--torch_only", action="store_true")
    args = ap.parse_args()
    runs = {}
    for seed in (1, 2):
        if not args.torch_only:
            runs[f"anvil_bf16_seed{seed}"] = anvil(args, seed, ["--bf16", "true"])
            runs[f"anvil_tf32_seed{seed}"] = anvil(args, seed, ["--tf32", "true"])
        runs[f"torch_bf16_autocast_seed{seed}"] = torch_ref(args, seed)
        runs[f"torch_bf16_autocast_epochs_seed{seed}"] = torch_ref(args, seed, epochs=True)
    summary = {}
    for name, losses in runs.items():
        summary[name] = {m: float(np.mean(losses[m - 20:m])) for m in (50, 100, 200, 300, 500) if len(losses) >= m}
        print(f"{name:32s} " + "  ".join(f"@{m}: {v:.3f}" for m, v in summary[name].items()), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "losses": runs}) + "\n")


if __name__ == "__main__":
    main()
