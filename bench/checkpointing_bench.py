#!/usr/bin/env python3
"""Activation checkpointing: speed and memory of Anvil (none / full / selective) next to Hugging Face
transformers eager (without and with gradient_checkpointing_enable), GPT-2 on one GPU, one run.

Records per configuration tokens/s (after --warmup steps), Anvil's planned arena and the device memory
in use (driver view), HF's max_memory_reserved and device memory in use, and the loss at the last step.

    python3 bench/checkpointing_bench.py --anvil build/anvil --data data/shakespeare/train.bin --tf32
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpt2_train_bench import PRESETS, read_shard  # noqa: E402


def run_anvil(args, mode):
    out = Path(args.workdir) / f"ckpt_{mode}"
    cmd = [args.anvil, "train", "--device", "cuda", "--model", args.model, "--train_data", args.data,
           "--per_device_train_batch_size", str(args.batch), "--max_seq_length", str(args.seq),
           "--max_steps", str(args.steps), "--learning_rate", "3e-4", "--lr_scheduler_type", "constant",
           "--logging_steps", "1", "--output_dir", str(out), "--tf32", "true" if args.tf32 else "false", "--seed", "1"]
    if mode != "none":
        cmd += ["--gradient_checkpointing", "true", "--gradient_checkpointing_mode", mode]
    print("+", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-2000:] + p.stderr)
        raise SystemExit(f"anvil ({mode}) failed")
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    timed = [r for r in rows if r["step"] > args.warmup]
    s = json.loads((out / "summary.json").read_text())
    return {"tokens_per_second": args.batch * args.seq * len(timed) / sum(r["step_time"] for r in timed),
            "planned_arena_bytes": s["planned_memory_bytes"], "device_memory_in_use_bytes": s["peak_memory_bytes"],
            "allocator_peak_bytes": s.get("allocator_peak_bytes"), "last_loss": rows[-1]["loss"]}


def run_hf(args, tokens, checkpointing):
    import numpy as np
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    L, H, C = PRESETS[args.model]
    cfg = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=C, n_layer=L, n_head=H, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    torch.manual_seed(1)
    model = GPT2LMHeadModel._from_config(cfg, attn_implementation="eager").cuda().float().train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    B, T = args.batch, args.seq
    rng = np.random.default_rng(1)
    nwin = (len(tokens) - 1) // T
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    import time
    times, peak, loss = [], 0, None
    for _ in range(args.steps):
        idx = rng.choice(nwin, B, replace=False)
        x = torch.from_numpy(np.stack([tokens[i * T:(i + 1) * T] for i in idx])).cuda()
        y = torch.from_numpy(np.stack([tokens[i * T + 1:(i + 1) * T + 1] for i in idx])).cuda()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        free, total = torch.cuda.mem_get_info()
        peak = max(peak, total - free)
    timed = times[args.warmup:]
    res = {"tokens_per_second": B * T * len(timed) / sum(timed), "max_memory_reserved": torch.cuda.max_memory_reserved(),
           "device_memory_in_use_bytes": peak, "last_loss": loss.item(), "device": torch.cuda.get_device_name(),
           "torch": torch.__version__}
    del model, opt
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--anvil", default="build/anvil")
    ap.add_argument("--data", default="data/shakespeare/train.bin")
    ap.add_argument("--model", default="d12", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--workdir", default="/tmp/anvil_ckpt_bench")
    args = ap.parse_args()
    tokens, _ = read_shard(args.data)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    anvil = {m: run_anvil(args, m) for m in ("none", "selective", "full")}
    hf = {"none": run_hf(args, tokens, False), "full": run_hf(args, tokens, True)}
    gib = 1 << 30
    print(f"\nGPT-2 {args.model}, batch {args.batch} x {args.seq}, {'TF32' if args.tf32 else 'fp32'}, on {hf['none']['device']}")
    print(f"  {'':26} {'tokens/s':>10} {'planned GiB':>12} {'in use GiB':>11} {'last loss':>10}")
    for m, r in anvil.items():
        print(f"  {'anvil ' + m:26} {r['tokens_per_second']:10.0f} {r['planned_arena_bytes'] / gib:12.2f} "
              f"{r['device_memory_in_use_bytes'] / gib:11.2f} {r['last_loss']:10.3f}")
    for m, r in hf.items():
        print(f"  {'HF eager ' + m:26} {r['tokens_per_second']:10.0f} {r['max_memory_reserved'] / gib:12.2f} "
              f"{r['device_memory_in_use_bytes'] / gib:11.2f} {r['last_loss']:10.3f}")
    print(f"  full checkpointing, anvil/HF: speed {anvil['full']['tokens_per_second'] / hf['full']['tokens_per_second']:.2f}, "
          f"memory in use {anvil['full']['device_memory_in_use_bytes'] / hf['full']['device_memory_in_use_bytes']:.2f}")
    commit = os.environ.get("ANVIL_COMMIT", "unknown")
    record = {"benchmark": "activation_checkpointing", "model": args.model, "batch": args.batch, "seq": args.seq,
              "steps": args.steps, "warmup": args.warmup, "precision": "tf32" if args.tf32 else "fp32",
              "device": hf["none"]["device"], "commit": commit,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "anvil": anvil, "hf_eager": hf}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"checkpointing_{args.model}_{record['precision']}_{datetime.date.today().isoformat()}.json"
    (out / name).write_text(json.dumps(record, indent=2) + "\n")
    print(f"saved {out / name}")


if __name__ == "__main__":
    main()
