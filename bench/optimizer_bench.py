#!/usr/bin/env python3
"""Optimizers (issue 5): step time and state memory next to PyTorch, and convergence, on one GPU.

Part `step`: for GPT-2 d12 and d24 (vocabulary 50257), the time of one optimizer step over all parameters
(random gradients, after warm-up) and the optimizer state's bytes:
  Anvil (`anvil bench-optimizer`): adamw_torch_fused, adafactor, adamw_8bit, sgd (momentum 0.9)
  PyTorch on the same GPU, same parameter shapes (transformers GPT2LMHeadModel's parameters):
    torch.optim.AdamW(fused=True), transformers.optimization.Adafactor (as HF Trainer configures it:
    scale_parameter=False, relative_step=False), bitsandbytes AdamW8bit (when importable),
    torch.optim.SGD(momentum=0.9, foreach=True)
Part `converge`: GPT-2 d12 on the Shakespeare BPE shard, bf16, batch 8 x 1024, --steps (1000) steps with
each Anvil optimizer (loss at the end = mean of the last 20 steps), and bitsandbytes AdamW8bit in a PyTorch
loop (transformers d12, bf16 autocast) for --bnb_steps (500) steps next to Anvil's 8-bit run at that step.

Parts write JSON into --parts_dir; --report merges them into bench/results/optimizers_<date>.json.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpt2_train_bench import read_shard  # noqa: E402  (the Anvil token-shard reader)

ANVIL_OPTIMS = ["adamw_torch_fused", "adafactor", "adamw_8bit", "sgd"]
PRESETS = {"d12": (12, 12, 768), "d24": (24, 16, 1024)}
LR = {"adamw_torch_fused": 6e-4, "adafactor": 1e-3, "adamw_8bit": 6e-4, "sgd": 0.1}


def anvil_step(args, model, optim):
    cmd = [args.anvil, "bench-optimizer", "--model", model, "--optim", optim, "--device", "cuda", "--steps",
           str(args.steps_timed), "--warmup", "5", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": out.stderr[-500:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def torch_step(model_name, optim):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    L, H, C = PRESETS[model_name]
    cfg = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=C, n_layer=L, n_head=H)
    model = GPT2LMHeadModel(cfg).cuda()
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or ".ln_" in n)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or ".ln_" in n]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    if optim == "adamw_torch_fused":
        opt = torch.optim.AdamW(groups, lr=1e-4, fused=True)
        name = "torch.optim.AdamW(fused=True)"
    elif optim == "adafactor":
        from transformers.optimization import Adafactor
        opt = Adafactor(groups, lr=1e-4, scale_parameter=False, relative_step=False)
        name = "transformers Adafactor"
    elif optim == "adamw_8bit":
        try:
            import bitsandbytes as bnb
        except Exception as e:  # noqa: BLE001 - report why
            return {"error": f"bitsandbytes not importable: {e}"}
        opt = bnb.optim.AdamW8bit(groups, lr=1e-4)
        name = f"bitsandbytes AdamW8bit {bnb.__version__}"
    else:
        opt = torch.optim.SGD(groups, lr=1e-4, momentum=0.9, foreach=True)
        name = "torch.optim.SGD(momentum=0.9, foreach=True)"
    for _ in range(5):
        opt.step()
    torch.cuda.synchronize()
    n = 50
    t0 = time.perf_counter()
    for _ in range(n):
        opt.step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1000 / n
    state = 0
    for st in opt.state.values():
        for v in st.values():
            if torch.is_tensor(v):
                state += v.numel() * v.element_size()
    out = {"impl": name, "step_ms": ms, "state_bytes": state, "parameters": sum(p.numel() for p in params),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    del opt, model, params
    torch.cuda.empty_cache()
    return out


def anvil_train(args, optim, outdir):
    cmd = [args.anvil, "train", "--device", "cuda", "--model", "d12", "--tokenizer", args.tokenizer,
           "--train_data", args.data, "--per_device_train_batch_size", "8", "--max_seq_length", "1024",
           "--max_steps", str(args.steps), "--learning_rate", str(LR[optim]), "--weight_decay", "0.1",
           "--warmup_steps", str(args.steps // 20), "--lr_scheduler_type", "cosine", "--max_grad_norm", "1.0",
           "--logging_steps", "1", "--output_dir", str(outdir), "--save_steps", "0", "--seed", "1", "--bf16",
           "true", "--optim", optim, "--sample_prompt", ""]
    if optim == "sgd":
        cmd += ["--momentum", "0.9"]
    print("+", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout)[-800:]}
    rows = [json.loads(l) for l in (outdir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    losses = [r["loss"] for r in rows]
    s = json.loads((outdir / "summary.json").read_text())
    import shutil
    shutil.rmtree(outdir, ignore_errors=True)
    return {"loss_first": losses[0], "loss_end_mean20": float(np.mean(losses[-20:])),
            "loss_at_bnb_steps_mean20": float(np.mean(losses[args.bnb_steps - 20:args.bnb_steps])),
            "tokens_per_second": s["train_tokens_per_second"], "peak_bytes": s["peak_memory_bytes"],
            "lr": LR[optim]}


def bnb_train(args):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    try:
        import bitsandbytes as bnb
    except Exception as e:  # noqa: BLE001
        return {"error": f"bitsandbytes not importable: {e}"}
    tokens, vocab = read_shard(args.data)
    cfg = GPT2Config(vocab_size=vocab, n_positions=1024, n_embd=768, n_layer=12, n_head=12, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(1)
    model = GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa").cuda().train()
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or ".ln_" in n)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or ".ln_" in n]
    opt = bnb.optim.AdamW8bit([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                              lr=LR["adamw_8bit"])
    warm = args.steps // 20
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + np.cos(np.pi * (s - warm) / (args.steps - warm))))
    B, T = 8, 1024
    rng = np.random.default_rng(1)
    nwin = (len(tokens) - 1) // T
    losses, t0 = [], time.perf_counter()
    for step in range(args.bnb_steps):
        idx = rng.choice(nwin, B, replace=False)
        x = torch.from_numpy(np.stack([tokens[i * T:(i + 1) * T] for i in idx])).cuda()
        y = torch.from_numpy(np.stack([tokens[i * T + 1:(i + 1) * T + 1] for i in idx])).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
            loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    torch.cuda.synchronize()
    return {"impl": f"bitsandbytes AdamW8bit {bnb.__version__} (transformers d12, bf16 autocast, SDPA)",
            "loss_first": losses[0], "loss_at_bnb_steps_mean20": float(np.mean(losses[-20:])),
            "seconds": time.perf_counter() - t0, "steps": args.bnb_steps,
            "note": "same shapes, data and schedule as Anvil's run but its own cosine over --steps; "
                    "data order differs"}


def report(args):
    parts = {}
    for f in sorted(Path(args.parts_dir).glob("optim_part_*.json")):
        for k, v in json.loads(f.read_text()).items():
            parts.setdefault(k, {}).update(v)
    print("Optimizer step time and state memory (same GPU):")
    for model in PRESETS:
        for o in ANVIL_OPTIMS:
            a, t = parts.get("step", {}).get(f"{model}/{o}/anvil"), parts.get("step", {}).get(f"{model}/{o}/torch")
            if not a or "error" in a:
                print(f"  {model} {o}: anvil {a}")
                continue
            line = f"  {model} {o:18} anvil {a['step_ms']:7.3f} ms {a['state_bytes'] / 2**20:8.1f} MiB"
            if t and "error" not in t:
                line += (f" | {t['impl']}: {t['step_ms']:7.3f} ms {t['state_bytes'] / 2**20:8.1f} MiB"
                         f" | time ratio {a['step_ms'] / t['step_ms']:.2f}, speed-up {t['step_ms'] / a['step_ms']:.2f}x")
            elif t:
                line += f" | reference: {t['error'][:60]}"
            print(line)
    conv = parts.get("converge", {})
    if conv:
        print("\nGPT-2 d12 bf16, 8 x 1024 tokens/step, loss (mean of 20 steps):")
        for o in ANVIL_OPTIMS:
            r = conv.get(o)
            if r and "error" not in r:
                print(f"  {o:18} lr {r['lr']:<7} start {r['loss_first']:.3f} -> step {args.bnb_steps}: "
                      f"{r['loss_at_bnb_steps_mean20']:.3f} -> end: {r['loss_end_mean20']:.3f}  "
                      f"({r['tokens_per_second']:.0f} tok/s)")
            else:
                print(f"  {o}: {r}")
        b = conv.get("bnb")
        if b and "error" not in b:
            print(f"  {b['impl']}: step {b['steps']} loss {b['loss_at_bnb_steps_mean20']:.3f}")
        elif b:
            print(f"  bitsandbytes: {b['error'][:200]}")
    record = {"benchmark": "optimizers", **parts,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": os.environ.get("ANVIL_COMMIT", "unknown")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = out / f"optimizers_{datetime.date.today().isoformat()}.json"
    name.write_text(json.dumps(record, indent=2) + "\n")
    print(f"saved {name}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anvil", default="build/anvil")
    ap.add_argument("--data", default="data/shakespeare_bpe/train.bin")
    ap.add_argument("--tokenizer", default="data/shakespeare_bpe/tokenizer.json")
    ap.add_argument("--part", default="", help="step | converge | converge_bnb")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--bnb_steps", type=int, default=500)
    ap.add_argument("--steps_timed", type=int, default=50)
    ap.add_argument("--parts_dir", default="/tmp/anvil_optim_bench")
    ap.add_argument("--workdir", default="/tmp/anvil_optim_runs")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    Path(args.parts_dir).mkdir(parents=True, exist_ok=True)
    if args.report:
        report(args)
        return
    result = {}
    if args.part == "step":
        result["step"] = {}
        for model in PRESETS:
            for o in ANVIL_OPTIMS:
                result["step"][f"{model}/{o}/anvil"] = anvil_step(args, model, o)
                result["step"][f"{model}/{o}/torch"] = torch_step(model, o)
                print(model, o, result["step"][f"{model}/{o}/anvil"], result["step"][f"{model}/{o}/torch"],
                      flush=True)
    elif args.part == "converge":
        result["converge"] = {}
        for o in ANVIL_OPTIMS:
            result["converge"][o] = anvil_train(args, o, Path(args.workdir) / o)
            print(o, result["converge"][o], flush=True)
    elif args.part == "converge_bnb":
        result["converge"] = {"bnb": bnb_train(args)}
        print(result, flush=True)
    else:
        sys.exit("--part must be step, converge or converge_bnb (or --report)")
    (Path(args.parts_dir) / f"optim_part_{args.part}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
