#!/usr/bin/env python3
"""GPT-2 training throughput and memory: Anvil vs Hugging Face transformers (PyTorch eager), same GPU, one run.

Both sides train the same GPT-2 shape (default: d12 = 124M, vocab 50257) on the same token shard with
the same batch, sequence length, AdamW hyper-parameters and number of steps, in fp32 (optionally TF32
matmuls on both sides). Prints tokens/s and peak memory of each and their ratios, and saves a JSON
record under bench/results/ with device, date and commit.

    python3 bench/gpt2_train_bench.py --anvil build/anvil --data data/shakespeare/train.bin \
        --model d12 --batch 8 --seq 1024 --steps 30

Tokens/s are measured over the steps after --warmup (first steps include cuBLAS heuristics and
allocator growth). Memory: Anvil's planned arena vs torch.cuda.max_memory_reserved (what each framework
holds for tensors), and each side's device memory in use as the driver reports it (includes the CUDA
context and library workspaces).
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

PRESETS = {"d12": (12, 12, 768), "d24": (24, 16, 1024), "d36": (36, 20, 1280), "d48": (48, 25, 1600)}


def read_shard(path):
    raw = Path(path).read_bytes()
    assert raw[:8] == b"ANVILTOK", f"{path}: not an Anvil token shard"
    version, dtype = np.frombuffer(raw[8:16], dtype=np.uint32)
    count, vocab = np.frombuffer(raw[16:32], dtype=np.uint64)
    tokens = np.frombuffer(raw[64:], dtype=np.uint16 if dtype == 1 else np.uint32)
    assert len(tokens) == count
    return tokens.astype(np.int64), int(vocab)


def run_anvil(args, outdir):
    cmd = [args.anvil, "train", "--device", "cuda", "--model", args.model, "--train_data", args.data,
           "--per_device_train_batch_size", str(args.batch), "--max_seq_length", str(args.seq),
           "--max_steps", str(args.steps), "--learning_rate", str(args.lr), "--weight_decay", "0.1",
           "--warmup_steps", "0", "--lr_scheduler_type", "constant", "--max_grad_norm", "1.0",
           "--logging_steps", "1", "--output_dir", str(outdir), "--save_steps", "0",
           "--tf32", "true" if args.tf32 else "false", "--seed", "1"]
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(proc.stdout[-3000:])
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"anvil failed with exit code {proc.returncode}")
    rows = [json.loads(l) for l in (outdir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    timed = [r for r in rows if r["step"] > args.warmup]
    tokens = args.batch * args.seq * len(timed)
    summary = json.loads((outdir / "summary.json").read_text())
    return {
        "tokens_per_second": tokens / sum(r["step_time"] for r in timed),
        "losses": [r["loss"] for r in rows],
        "peak_memory_bytes_driver": summary["peak_memory_bytes"],
        "planned_arena_bytes": summary["planned_memory_bytes"],
        "data_wait_seconds": summary["data_wait_seconds"],
        "data_wait_fraction": summary["data_wait_fraction"],
    }


def run_hf(args, tokens, vocab):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    L, H, C = PRESETS[args.model]
    cfg = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=C, n_layer=L, n_head=H, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(1)
    model = GPT2LMHeadModel._from_config(cfg, attn_implementation="eager").cuda().float().train()
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or ".ln_" in n]
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or ".ln_" in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.999), eps=1e-8)
    B, T = args.batch, args.seq
    rng = np.random.default_rng(1)
    nwin = (len(tokens) - 1) // T
    torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    peak_driver = 0
    for step in range(args.steps):
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
        losses.append(loss.item())
        free, total = torch.cuda.mem_get_info()
        peak_driver = max(peak_driver, total - free)
    timed = times[args.warmup:]
    return {
        "tokens_per_second": B * T * len(timed) / sum(timed),
        "losses": losses,
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "peak_memory_bytes_driver": peak_driver,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anvil", default="build/anvil")
    ap.add_argument("--data", default="data/shakespeare/train.bin")
    ap.add_argument("--model", default="d12", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--workdir", default="/tmp/anvil_bench")
    args = ap.parse_args()

    tokens, vocab = read_shard(args.data)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    anvil = run_anvil(args, work / f"anvil_{args.model}")
    hf = run_hf(args, tokens, vocab)

    ratio_speed = anvil["tokens_per_second"] / hf["tokens_per_second"]
    ratio_mem = anvil["planned_arena_bytes"] / hf["max_memory_reserved"]
    ratio_driver = anvil["peak_memory_bytes_driver"] / hf["peak_memory_bytes_driver"]
    gib = 1 << 30
    print(f"\nGPT-2 {args.model}, batch {args.batch} x {args.seq}, fp32{' (TF32 matmuls)' if args.tf32 else ''}, "
          f"{args.steps} steps (timed after {args.warmup}) on {hf['device']}")
    print(f"  {'':28} {'anvil':>12} {'HF eager':>12} {'anvil/HF':>9}")
    print(f"  {'tokens/s':28} {anvil['tokens_per_second']:12.0f} {hf['tokens_per_second']:12.0f} {ratio_speed:9.2f}")
    print(f"  {'tensor memory (GiB)':28} {anvil['planned_arena_bytes'] / gib:12.2f} "
          f"{hf['max_memory_reserved'] / gib:12.2f} {ratio_mem:9.2f}")
    print(f"  {'device memory in use (GiB)':28} {anvil['peak_memory_bytes_driver'] / gib:12.2f} "
          f"{hf['peak_memory_bytes_driver'] / gib:12.2f} {ratio_driver:9.2f}")
    print(f"  anvil data wait: {anvil['data_wait_seconds']:.4f}s = {100 * anvil['data_wait_fraction']:.3f}% of the run")
    print(f"  loss first -> last: anvil {anvil['losses'][0]:.3f} -> {anvil['losses'][-1]:.3f}, "
          f"HF {hf['losses'][0]:.3f} -> {hf['losses'][-1]:.3f}")

    commit = os.environ.get("ANVIL_COMMIT", "")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        except OSError:
            pass
    if len(commit) != 40:  # e.g. a copy of the tree without history
        commit = "unknown"
    record = {
        "benchmark": "gpt2_train", "model": args.model, "batch": args.batch, "seq": args.seq, "steps": args.steps,
        "warmup": args.warmup, "precision": "tf32" if args.tf32 else "fp32", "device": hf["device"],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit, "torch": hf["torch"],
        "anvil": anvil, "hf_eager": hf,
        "ratios": {"tokens_per_second": ratio_speed, "tensor_memory": ratio_mem, "device_memory": ratio_driver},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"gpt2_{args.model}_{record['precision']}_{datetime.date.today().isoformat()}.json"
    (out / name).write_text(json.dumps(record, indent=2) + "\n")
    print(f"saved {out / name}")


if __name__ == "__main__":
    main()
