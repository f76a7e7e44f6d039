#!/usr/bin/env python3
"""Optimizers (issue 5): step time and state memory next to PyTorch, and convergence, on one GPU.

Part `step`: for GPT-2 d12 and d24 (vocabulary 50257, padded to 50304 on both sides), the time of one
optimizer step over all parameters (random gradients, after warm-up) and the optimizer state's bytes:
  Anvil (`anvil bench-optimizer`): adamw_torch_fused, adafactor, adamw_8bit, sgd (momentum 0.9)
  PyTorch on the same GPU, same parameter shapes (transformers GPT2LMHeadModel's parameters, built by the
  shared reference, bench/benchlib/torch_reference.py):
    torch.optim.AdamW(fused=True), transformers.optimization.Adafactor (as HF Trainer configures it:
    scale_parameter=False, relative_step=False), bitsandbytes AdamW8bit (when importable),
    torch.optim.SGD(momentum=0.9, foreach=True)
Part `converge`: GPT-2 d12 on the Shakespeare BPE shard, bf16, batch 8 x 1024, --steps (1000) steps with
each Anvil optimizer (loss at the end = mean of the last 20 steps), and bitsandbytes AdamW8bit in the shared
PyTorch reference (transformers d12, bf16 autocast, eager, same shard, schedule and hyper-parameters, its own
random batches) for --bnb_steps (500) steps next to Anvil's 8-bit run at that step.

Parts write JSON into --parts_dir; --report merges them into
bench/results/optimizers_<device>_<date>_<commit>.json.
"""
import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import torch_reference  # noqa: E402
from benchlib.child import Meter  # noqa: E402
from benchlib.nvml import GpuMemory  # noqa: E402
from benchlib.results import RESULTS, git_commit, result_path, utc_now  # noqa: E402
from benchlib.shards import read_shard  # noqa: E402

ANVIL_OPTIMS = ["adamw_torch_fused", "adafactor", "adamw_8bit", "sgd"]
MODELS = ["d12", "d24"]
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

    model = torch_reference.build_model("gpt2", torch_reference.gpt2_config(model_name))
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
    shutil.rmtree(outdir, ignore_errors=True)  # anvil refuses an output_dir holding an earlier run's files
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
    shutil.rmtree(outdir, ignore_errors=True)
    return {"loss_first": losses[0], "loss_end_mean20": float(np.mean(losses[-20:])),
            "loss_at_bnb_steps_mean20": float(np.mean(losses[args.bnb_steps - 20:args.bnb_steps])),
            "tokens_per_second": s["train_tokens_per_second"], "peak_bytes": s["peak_memory_bytes"],
            "lr": LR[optim]}


def bnb_train(args):
    """bitsandbytes AdamW8bit in the shared reference: d12 on the same shard, bf16 autocast, eager, weight decay
    0.1 on matrices and embeddings, clipping 1.0, Anvil's cosine schedule over --steps, for --bnb_steps steps."""
    _, vocab = read_shard(args.data)
    spec = torch_reference.make_spec(
        "gpt2", torch_reference.gpt2_config("d12", vocab), 8, 1024, compile=False, precision="bf16",
        steps=args.bnb_steps - 1, warmup=1, data={"kind": "shard", "path": str(Path(args.data).resolve()), "seed": 1},
        lr=LR["adamw_8bit"], weight_decay=0.1, optimizer="adamw_8bit", record_losses=True,
        schedule={"kind": "cosine", "warmup_steps": args.steps // 20, "total_steps": args.steps})
    r = torch_reference.run(spec, Path(args.workdir) / "bnb", Meter(GpuMemory()), timeout=3600)
    if "error" in r:
        return {"error": r["error"]}
    return {"impl": f"{r['optimizer']} (transformers d12, bf16 autocast, SDPA, eager)", "loss_first": r["loss_first"],
            "loss_at_bnb_steps_mean20": float(np.mean(r["losses"][-20:])), "seconds": r["process"]["wall_seconds"],
            "steps": args.bnb_steps, "note": "same shapes, data and schedule as Anvil's run; random batches of its "
                                             "own and its own initialisation"}


def report(args):
    parts = {}
    for f in sorted(Path(args.parts_dir).glob("optim_part_*.json")):
        for k, v in json.loads(f.read_text()).items():
            parts.setdefault(k, {}).update(v)
    print("Optimizer step time and state memory (same GPU):")
    for model in MODELS:
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
    device = next((v["device"] for v in parts.get("step", {}).values() if "device" in v), None)
    commit, _ = git_commit()
    date = utc_now()
    record = {"benchmark": "optimizers", **parts, "device": device, "date": date.isoformat(timespec="seconds"),
              "commit": commit}
    name = result_path("optimizers", device, date, commit, directory=args.out)
    name.parent.mkdir(parents=True, exist_ok=True)
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
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    Path(args.parts_dir).mkdir(parents=True, exist_ok=True)
    if args.report:
        report(args)
        return
    result = {}
    if args.part == "step":
        result["step"] = {}
        for model in MODELS:
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
