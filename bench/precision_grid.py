#!/usr/bin/env python3
"""The precision x accumulation x checkpointing grid on GPT-2 d12 (issue 4), with the HF reference.

Anvil trains GPT-2 d12 (124M shape, the tokenizer's vocabulary) for --steps steps in every combination of
{fp32, tf32, bf16, fp16} x {gradient accumulation 1, 4} x {checkpointing off, full, selective}, with the
same effective batch (--batch sequences of --seq tokens per step: GA 4 uses micro-batches of batch/4).
For each run it records the loss at the last step (and the mean of the last 10), whether any loss was
NaN, tokens/s after --warmup steps, skipped fp16 steps, and memory: the driver's peak in use against the
plan's prediction (the arena plus the measured CUDA context overhead, what `anvil estimate` prints as the
total) and the allocator's peak against the arena.

The reference: Hugging Face transformers GPT2LMHeadModel (eager attention), same shape, batch and data, in
fp32, TF32, bf16 autocast and fp16 autocast with torch.cuda.amp.GradScaler, with gradient checkpointing off
and on, --ref_steps steps each: tokens/s and peak memory, printed next to Anvil's as ratios.

The grid takes longer than one device call allows, so it runs in parts that write partial JSON files into
--workdir, and --report merges them into bench/results/precision_grid_d12_<date>.json:

    python3 bench/precision_grid.py --anvil build/anvil --data data/shakespeare_bpe/train.bin --part fp32
    python3 bench/precision_grid.py ... --part tf32,bf16,fp16
    python3 bench/precision_grid.py ... --part hf
    python3 bench/precision_grid.py --report
"""
import argparse
import datetime
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpt2_train_bench import read_shard  # noqa: E402  (the Anvil token-shard reader)

PRECISIONS = ["fp32", "tf32", "bf16", "fp16"]
ACCUMS = [1, 4]
CHECKPOINTING = ["none", "full", "selective"]


def precision_flags(p):
    return {"fp32": [], "tf32": ["--tf32", "true"], "bf16": ["--bf16", "true"], "fp16": ["--fp16", "true"]}[p]


def run_anvil(args, precision, accum, ckpt, outdir):
    micro = args.batch // accum
    cmd = [args.anvil, "train", "--device", "cuda", "--model", "d12", "--tokenizer", args.tokenizer,
           "--train_data", args.data, "--per_device_train_batch_size", str(micro),
           "--gradient_accumulation_steps", str(accum), "--max_seq_length", str(args.seq),
           "--max_steps", str(args.steps), "--learning_rate", str(args.lr), "--weight_decay", "0.1",
           "--warmup_steps", str(args.steps // 10), "--lr_scheduler_type", "cosine", "--max_grad_norm", "1.0",
           "--logging_steps", "1", "--output_dir", str(outdir), "--save_steps", "0", "--seed", "1",
           "--sample_prompt", ""] + precision_flags(precision)
    if ckpt != "none":
        cmd += ["--gradient_checkpointing", "true", "--gradient_checkpointing_mode", ckpt]
    print("+", " ".join(cmd), flush=True)
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout[-2000:])
        sys.stderr.write(proc.stderr[-2000:])
        return {"error": (proc.stderr or proc.stdout)[-500:], "exit_code": proc.returncode}
    rows = [json.loads(l) for l in (outdir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    losses = [r["loss"] for r in rows]
    timed = [r for r in rows if r["step"] > args.warmup]
    s = json.loads((outdir / "summary.json").read_text())
    predicted = s["planned_memory_bytes"] + s["context_overhead_bytes"]
    finite = [x for x in losses if x is not None and math.isfinite(x)]
    out = {
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "loss_last10_mean": sum(finite[-10:]) / max(1, len(finite[-10:])),
        "any_nan": len(finite) != len(losses),
        "tokens_per_second": args.batch * args.seq * len(timed) / sum(r["step_time"] for r in timed),
        "skipped_steps": s.get("skipped_steps", 0),
        "planned_arena_bytes": s["planned_memory_bytes"],
        "context_overhead_bytes": s["context_overhead_bytes"],
        "predicted_total_bytes": predicted,
        "driver_peak_bytes": s["driver_peak_bytes"],
        "driver_peak_vs_prediction": s["driver_peak_bytes"] / predicted,
        "allocator_peak_bytes": s["allocator_peak_bytes"],
        "wall_seconds": time.time() - t0,
    }
    shutil.rmtree(outdir, ignore_errors=True)  # the final checkpoint is 1.5 GB
    return out


def run_hf(args, tokens, vocab, precision, ckpt):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    cfg = GPT2Config(vocab_size=vocab, n_positions=1024, n_embd=768, n_layer=12, n_head=12, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(1)
    model = GPT2LMHeadModel._from_config(cfg, attn_implementation="eager").cuda().float().train()
    if ckpt:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or ".ln_" in n]
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or ".ln_" in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.999), eps=1e-8)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
    B, T = args.batch, args.seq
    rng = np.random.default_rng(1)
    nwin = (len(tokens) - 1) // T
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    losses, times, peak_driver = [], [], 0
    for step in range(args.ref_steps):
        idx = rng.choice(nwin, B, replace=False)
        x = torch.from_numpy(np.stack([tokens[i * T:(i + 1) * T] for i in idx])).cuda()
        y = torch.from_numpy(np.stack([tokens[i * T + 1:(i + 1) * T + 1] for i in idx])).cuda()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = model(input_ids=x).logits
            loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.view(-1))
        if scaler:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
        else:
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
    out = {
        "tokens_per_second": B * T * len(timed) / sum(timed),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "driver_peak_bytes": peak_driver,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
    }
    del model, opt
    torch.cuda.empty_cache()
    return out


def key(p, a, c):
    return f"{p}/ga{a}/{c}"


def report(args):
    work = Path(args.parts_dir or args.workdir)
    grid, hf = {}, {}
    meta = {}
    for f in sorted(work.glob("part_*.json")):
        part = json.loads(f.read_text())
        grid.update(part.get("anvil", {}))
        hf.update(part.get("hf", {}))
        meta.update(part.get("meta", {}))
    gib = 1 << 30
    print(f"GPT-2 d12, {meta.get('batch')} x {meta.get('seq')} tokens per step, {meta.get('steps')} steps, "
          f"on {meta.get('device', '?')}")
    print(f"  {'precision/GA/ckpt':22} {'loss@last':>9} {'last10':>7} {'NaN':>4} {'skip':>4} {'tok/s':>9} "
          f"{'peak GiB':>9} {'plan GiB':>9} {'peak/plan':>9}")
    for p in PRECISIONS:
        for a in ACCUMS:
            for c in CHECKPOINTING:
                r = grid.get(key(p, a, c))
                if r is None:
                    print(f"  {key(p, a, c):22} (not run)")
                    continue
                if "error" in r:
                    print(f"  {key(p, a, c):22} ERROR {r['error'][:80]}")
                    continue
                print(f"  {key(p, a, c):22} {r['loss_last']:9.4f} {r['loss_last10_mean']:7.3f} "
                      f"{'yes' if r['any_nan'] else 'no':>4} {r['skipped_steps']:4d} {r['tokens_per_second']:9.0f} "
                      f"{r['driver_peak_bytes'] / gib:9.2f} {r['predicted_total_bytes'] / gib:9.2f} "
                      f"{r['driver_peak_vs_prediction']:9.4f}")
    ratios = {}
    if hf:
        print(f"\n  vs HF transformers eager (GA 1), same GPU: tokens/s and device memory in use")
        print(f"  {'precision/ckpt':18} {'anvil tok/s':>11} {'HF tok/s':>9} {'ratio':>6} {'anvil GiB':>9} "
              f"{'HF GiB':>7} {'ratio':>6}")
        for p in PRECISIONS:
            for c in ["none", "full"]:
                r, h = grid.get(key(p, 1, c)), hf.get(f"{p}/{c}")
                if not r or not h or "error" in r:
                    continue
                sr = r["tokens_per_second"] / h["tokens_per_second"]
                mr = r["driver_peak_bytes"] / h["driver_peak_bytes"]
                ratios[f"{p}/{c}"] = {"tokens_per_second": sr, "device_memory": mr}
                print(f"  {p + '/' + c:18} {r['tokens_per_second']:11.0f} {h['tokens_per_second']:9.0f} {sr:6.2f} "
                      f"{r['driver_peak_bytes'] / gib:9.2f} {h['driver_peak_bytes'] / gib:7.2f} {mr:6.2f}")
    commit = os.environ.get("ANVIL_COMMIT", "") or meta.get("commit", "")
    record = {"benchmark": "precision_grid", "model": "d12", **meta, "commit": commit or "unknown",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "anvil": grid, "hf_eager": hf, "ratios": ratios}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = out / f"precision_grid_d12_{datetime.date.today().isoformat()}.json"
    name.write_text(json.dumps(record, indent=2) + "\n")
    print(f"saved {name}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anvil", default="build/anvil")
    ap.add_argument("--data", default="data/shakespeare_bpe/train.bin")
    ap.add_argument("--tokenizer", default="data/shakespeare_bpe/tokenizer.json")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--ref_steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--part", default="", help="comma-separated precisions and/or 'hf'")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--workdir", default="/tmp/anvil_precision_grid")
    ap.add_argument("--parts_dir", default="", help="where the partial results go (default: --workdir)")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    if args.report:
        report(args)
        return
    assert args.batch % 4 == 0, "--batch must be a multiple of 4 (GA 4 splits it into micro-batches)"
    parts = [p for p in args.part.split(",") if p]
    result = {"anvil": {}, "hf": {}, "meta": {"batch": args.batch, "seq": args.seq, "steps": args.steps,
                                             "ref_steps": args.ref_steps, "warmup": args.warmup, "lr": args.lr,
                                             "commit": os.environ.get("ANVIL_COMMIT", "")}}
    for p in parts:
        if p == "hf":
            tokens, vocab = read_shard(args.data)
            for prec in PRECISIONS:
                for c in ["none", "full"]:
                    print(f"+ HF {prec} checkpointing {c}", flush=True)
                    h = run_hf(args, tokens, vocab, prec, c == "full")
                    result["hf"][f"{prec}/{c}"] = h
                    result["meta"]["device"] = h["device"]
                    print(f"  {h['tokens_per_second']:.0f} tok/s, {h['driver_peak_bytes'] / (1 << 30):.2f} GiB", flush=True)
            continue
        assert p in PRECISIONS, f"unknown part {p}"
        for a in ACCUMS:
            for c in CHECKPOINTING:
                r = run_anvil(args, p, a, c, work / f"anvil_{p}_ga{a}_{c}")
                result["anvil"][key(p, a, c)] = r
                if "error" not in r:
                    print(f"  loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}, {r['tokens_per_second']:.0f} tok/s, "
                          f"peak {r['driver_peak_bytes'] / (1 << 30):.2f} GiB vs plan "
                          f"{r['predicted_total_bytes'] / (1 << 30):.2f} GiB", flush=True)
    parts_dir = Path(args.parts_dir or args.workdir)
    parts_dir.mkdir(parents=True, exist_ok=True)
    (parts_dir / f"part_{'_'.join(parts)}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
