#!/usr/bin/env python3
"""GPT-2 training speed (issue 6): Anvil against HF transformers eager and torch.compile, same GPU, bf16.

For each model (d12, d24, d36; vocabulary 50257, sequence length 1024, random tokens), each system runs
with its own best micro-batch from --batches (the largest that fits, tried from the top; a system's best
tokens/s over them is kept):
  anvil  : `anvil train --bf16 --optim adamw_torch_fused` on a random-token shard
  eager  : transformers GPT2LMHeadModel (attn_implementation="sdpa"), bf16 autocast, fused AdamW
  compile: the same under torch.compile (default mode)
Reported after --warmup steps: tokens/s, ms/step, MFU (6N + 12LCT FLOPs per token against --peak_flops,
default the H100 SXM bf16 dense data-sheet figure) and peak device memory in use, with Anvil/compile and
Anvil/eager ratios. Parts write JSON into --parts_dir (one per model and system, so a run that hits the
device time limit keeps what finished); --report merges them into bench/results/gpt2_speed_<date>.json.

    python3 bench/gpt2_speed.py --anvil build/anvil --part d12:anvil,d12:eager,d12:compile
    python3 bench/gpt2_speed.py --report
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

PRESETS = {"d12": (12, 12, 768), "d24": (24, 16, 1024), "d36": (36, 20, 1280)}
VOCAB = 50257


def flops_per_token(model, seq):
    L, H, C = PRESETS[model]
    params = VOCAB * C + 1024 * C + L * (12 * C * C + 13 * C) + 2 * C
    return 6 * params + 12 * L * C * seq


def random_shard(path, n_tokens, seed=1):
    """An Anvil token shard (docs/data.md) of uniform random GPT-2 token ids."""
    if path.exists():
        return
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, size=n_tokens, dtype=np.uint16)
    header = bytearray(64)
    header[0:8] = b"ANVILTOK"
    header[8:16] = np.array([1, 1], dtype=np.uint32).tobytes()  # version 1, dtype uint16
    header[16:32] = np.array([n_tokens, VOCAB], dtype=np.uint64).tobytes()
    path.write_bytes(bytes(header) + tokens.tobytes())


def run_anvil(args, model, batch, shard):
    out = Path(args.workdir) / f"anvil_{model}_{batch}"
    L, H, C = PRESETS[model]
    cfg = Path(args.workdir) / f"{model}.json"  # the GPT-2 shape with its 50257-token vocabulary
    cfg.write_text(json.dumps({"model": {"n_layer": L, "n_head": H, "n_embd": C, "vocab_size": VOCAB,
                                         "block_size": 1024}}))
    cmd = [args.anvil, "train", "--config", str(cfg), "--device", "cuda", "--train_data", str(shard),
           "--per_device_train_batch_size", str(batch), "--max_seq_length", str(args.seq), "--max_steps",
           str(args.steps), "--learning_rate", "3e-4", "--warmup_steps", "0", "--lr_scheduler_type", "constant",
           "--logging_steps", "1", "--output_dir", str(out), "--save_steps", "0", "--bf16", "true",
           "--sample_prompt", "", "--peak_flops", str(args.peak_flops)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout)[-600:]}
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r and r["step"] > args.warmup]
    s = json.loads((out / "summary.json").read_text())
    import shutil
    shutil.rmtree(out, ignore_errors=True)
    step_s = sum(r["step_time"] for r in rows) / len(rows)
    return {"batch": batch, "tokens_per_second": batch * args.seq / step_s, "ms_per_step": step_s * 1000,
            "peak_bytes": s["peak_memory_bytes"]}


def run_torch(args, model, batch, compiled):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    L, H, C = PRESETS[model]
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=1024, n_embd=C, n_layer=L, n_head=H, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(1)
    m = GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa").cuda().train()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, fused=True)
    fwd = torch.compile(m) if compiled else m
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    times, peak = [], 0
    try:
        for _ in range(args.steps):
            x = torch.randint(0, VOCAB, (batch, args.seq), device="cuda")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = fwd(input_ids=x).logits
                loss = torch.nn.functional.cross_entropy(logits.view(-1, VOCAB).float(), x.view(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            free, total = torch.cuda.mem_get_info()
            peak = max(peak, total - free)
    except torch.OutOfMemoryError as e:
        return {"error": f"out of memory at batch {batch}: {str(e)[:200]}"}
    finally:
        del opt, fwd, m
        torch.cuda.empty_cache()
    step_s = float(np.mean(times[args.warmup:]))
    return {"batch": batch, "tokens_per_second": batch * args.seq / step_s, "ms_per_step": step_s * 1000,
            "peak_bytes": peak, "torch": torch.__version__, "device": torch.cuda.get_device_name()}


def best_of(results):
    ok = [r for r in results if "error" not in r]
    return max(ok, key=lambda r: r["tokens_per_second"]) if ok else {"error": results[-1]["error"]}


def report(args):
    parts = {}
    for f in sorted(Path(args.parts_dir).glob("speed_*.json")):
        parts.update(json.loads(f.read_text()))
    gib = 1 << 30
    ratios = {}
    for model in PRESETS:
        rows = {s: parts.get(f"{model}/{s}") for s in ("anvil", "eager", "compile")}
        if not any(rows.values()):
            continue
        print(f"GPT-2 {model} (bf16, seq {args.seq}):")
        for s, r in rows.items():
            if not r or "error" in r:
                print(f"  {s:8} {r['error'][:100] if r else 'not run'}")
                continue
            mfu = r["tokens_per_second"] * flops_per_token(model, args.seq) / args.peak_flops
            r["mfu"] = mfu
            print(f"  {s:8} batch {r['batch']:3d}  {r['tokens_per_second']:9.0f} tok/s  {r['ms_per_step']:8.1f} "
                  f"ms/step  MFU {100 * mfu:5.1f}%  peak {r['peak_bytes'] / gib:6.2f} GiB")
        a, c, e = rows["anvil"], rows["compile"], rows["eager"]
        if a and "error" not in a:
            for name, ref in (("compile", c), ("eager", e)):
                if ref and "error" not in ref:
                    ratios[f"{model}/anvil_over_{name}"] = {
                        "tokens_per_second": a["tokens_per_second"] / ref["tokens_per_second"],
                        "peak_memory": a["peak_bytes"] / ref["peak_bytes"]}
                    print(f"  anvil / {name}: {ratios[f'{model}/anvil_over_{name}']['tokens_per_second']:.2f}x "
                          f"tokens/s, {ratios[f'{model}/anvil_over_{name}']['peak_memory']:.2f}x memory")
    record = {"benchmark": "gpt2_speed", "seq": args.seq, "peak_flops": args.peak_flops, "results": parts,
              "ratios": ratios, "commit": os.environ.get("ANVIL_COMMIT", "unknown"),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = out / f"gpt2_speed_{datetime.date.today().isoformat()}.json"
    name.write_text(json.dumps(record, indent=2) + "\n")
    print(f"saved {name}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anvil", default="build/anvil")
    ap.add_argument("--part", default="", help="comma-separated MODEL:SYSTEM (systems: anvil, eager, compile)")
    ap.add_argument("--batches", default="32,16,8", help="micro-batches to try, largest first")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--peak_flops", type=float, default=989.4e12)
    ap.add_argument("--parts_dir", default="/tmp/anvil_speed")
    ap.add_argument("--workdir", default="/tmp/anvil_speed_runs")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    Path(args.parts_dir).mkdir(parents=True, exist_ok=True)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    if args.report:
        report(args)
        return
    shard = Path(args.workdir) / "random_tokens.bin"
    random_shard(shard, 8_000_000)
    batches = [int(b) for b in args.batches.split(",")]
    for item in [p for p in args.part.split(",") if p]:
        model, system = item.split(":")
        if model not in PRESETS or system not in ("anvil", "eager", "compile"):
            sys.exit(f"bad part {item}")
        results = []
        for b in batches:
            r = run_anvil(args, model, b, shard) if system == "anvil" else run_torch(args, model, b, system == "compile")
            results.append(r)
            print(item, b, r, flush=True)
        best = best_of(results)
        (Path(args.parts_dir) / f"speed_{model}_{system}.json").write_text(json.dumps({item.replace(":", "/"): best}))


if __name__ == "__main__":
    main()
