#!/usr/bin/env python3
"""The precision x accumulation x checkpointing grid on GPT-2 d12 (issue 4), with the PyTorch reference.

Anvil trains GPT-2 d12 (124M shape, the tokenizer's vocabulary) for --steps steps in every combination of
{fp32, tf32, bf16, fp16} x {gradient accumulation 1, 4} x {checkpointing off, full, selective}, with the
same effective batch (--batch sequences of --seq tokens per step: GA 4 uses micro-batches of batch/4).
For each run it records the loss at the last step (and the mean of the last 10), whether any loss was
NaN, tokens/s after --warmup steps, skipped fp16 steps, and memory: the driver's peak in use against the
plan's prediction (the arena plus the measured CUDA context overhead, what `anvil estimate` prints as the
total) and the allocator's peak against the arena.

The reference (bench/benchlib/torch_reference.py, shared by every benchmark): transformers GPT2LMHeadModel of
the same shape, SDPA attention, the loss inside the model, fused AdamW, on random windows of the same shard,
in fp32, TF32, bf16 autocast and fp16 autocast with GradScaler, with gradient checkpointing off and on, under
torch.compile and eager (--ref_systems), at the same batch as Anvil's GA 1 runs (the grid compares modes at
one batch; bench/decoder_speed.py searches each side's best batch): tokens/s over --ref_steps timed steps after
--warmup. Memory of both sides is the NVML peak of the process (bench/benchlib/child.py).

The grid takes longer than one device call allows, so it runs in parts that write partial JSON files into
--parts_dir, and --report merges them into bench/results/precision_grid_<device>_<date>_<commit>.{json,txt}:

    python3 bench/precision_grid.py --anvil build-cuda/anvil --part fp32,tf32
    python3 bench/precision_grid.py --anvil build-cuda/anvil --part bf16,fp16
    python3 bench/precision_grid.py --part hf --ref_systems compile
    python3 bench/precision_grid.py --part hf --ref_systems eager
    python3 bench/precision_grid.py --report
"""
import argparse
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib import anvil_train, torch_reference  # noqa: E402
from benchlib.child import Meter  # noqa: E402
from benchlib.nvml import GpuMemory  # noqa: E402
from benchlib.results import RESULTS, git_commit, result_path, utc_now  # noqa: E402
from benchlib.shards import read_shard  # noqa: E402

PRECISIONS = list(torch_reference.PRECISIONS)  # fp32, tf32, bf16, fp16
ACCUMS = [1, 4]
CHECKPOINTING = ["none", "full", "selective"]
GIB = 1 << 30


def precision_flags(p):
    return {"fp32": [], "tf32": ["--tf32", "true"], "bf16": ["--bf16", "true"], "fp16": ["--fp16", "true"]}[p]


def run_anvil(args, meter, precision, accum, ckpt):
    micro = args.batch // accum
    flags = ["--device", "cuda", "--model", "d12", "--tokenizer", args.tokenizer, "--train_data", args.data,
             "--per_device_train_batch_size", micro, "--gradient_accumulation_steps", accum,
             "--max_seq_length", args.seq, "--max_steps", args.steps, "--learning_rate", args.lr,
             "--weight_decay", "0.1", "--warmup_steps", args.steps // 10, "--lr_scheduler_type", "cosine",
             "--max_grad_norm", "1.0", "--save_strategy", "no", "--seed", "1", "--sample_prompt", ""]
    flags += precision_flags(precision)
    if ckpt != "none":
        flags += ["--gradient_checkpointing", "true", "--gradient_checkpointing_mode", ckpt]
    r = anvil_train.run(args.anvil, flags, Path(args.workdir) / f"anvil_{precision}_ga{accum}_{ckpt}", meter,
                        warmup=args.warmup)
    if "error" in r:
        return {"error": r["error"]}
    losses, s = r["losses"], r["summary"]
    finite = [x for x in losses if x is not None and math.isfinite(x)]
    predicted = s["planned_memory_bytes"] + s["context_overhead_bytes"]
    return {
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "loss_last10_mean": sum(finite[-10:]) / max(1, len(finite[-10:])),
        "any_nan": len(finite) != len(losses),
        "tokens_per_second": r["tokens_per_second"],
        "skipped_steps": s.get("skipped_steps", 0),
        "planned_arena_bytes": s["planned_memory_bytes"],
        "context_overhead_bytes": s["context_overhead_bytes"],
        "predicted_total_bytes": predicted,
        "driver_peak_bytes": s["driver_peak_bytes"],
        "driver_peak_vs_prediction": s["driver_peak_bytes"] / predicted,
        "allocator_peak_bytes": s["allocator_peak_bytes"],
        "nvml_peak_bytes": r["process"]["memory"].get("peak_mib", 0) * (1 << 20) or None,
        "wall_seconds": r["process"]["wall_seconds"],
    }


def run_reference(args, meter, vocab, precision, ckpt, system):
    spec = torch_reference.make_spec(
        "gpt2", torch_reference.gpt2_config("d12", vocab, args.seq), args.batch, args.seq,
        compile=system == "compile", precision=precision, steps=args.ref_steps, warmup=args.warmup,
        data={"kind": "shard", "path": str(Path(args.data).resolve()), "seed": 1}, lr=args.lr, weight_decay=0.1,
        gradient_checkpointing=ckpt == "full")
    r = torch_reference.run(spec, Path(args.workdir) / f"ref_{system}_{precision}_{ckpt}", meter)
    if "error" in r:
        return {"error": r["error"]}
    return {k: r[k] for k in ("tokens_per_second", "ms_per_step", "loss_first", "loss_last", "torch",
                              "transformers", "device", "torch_max_memory_reserved", "first_step_seconds")} | {
        "nvml_peak_bytes": r["process"]["memory"].get("peak_mib", 0) * (1 << 20) or None}


def key(p, a, c):
    return f"{p}/ga{a}/{c}"


def report(args):
    grid, ref, meta = {}, {}, {}
    for f in sorted(Path(args.parts_dir).glob("part_*.json")):
        part = json.loads(f.read_text())
        grid.update(part.get("anvil", {}))
        ref.update(part.get("reference", {}))
        meta.update(part.get("meta", {}))
    lines = [f"GPT-2 d12, {meta.get('batch')} x {meta.get('seq')} tokens per step, {meta.get('steps')} steps, on "
             f"{meta.get('device', '?')}, commit {meta.get('commit', 'unknown')[:7]}",
             f"  {'precision/GA/ckpt':22} {'loss@last':>9} {'last10':>7} {'NaN':>4} {'skip':>4} {'tok/s':>9} "
             f"{'peak GiB':>9} {'plan GiB':>9} {'peak/plan':>9}"]
    for p in PRECISIONS:
        for a in ACCUMS:
            for c in CHECKPOINTING:
                r = grid.get(key(p, a, c))
                if r is None:
                    lines.append(f"  {key(p, a, c):22} (not run)")
                elif "error" in r:
                    lines.append(f"  {key(p, a, c):22} ERROR {r['error'][:80]}")
                else:
                    lines.append(f"  {key(p, a, c):22} {r['loss_last']:9.4f} {r['loss_last10_mean']:7.3f} "
                                 f"{'yes' if r['any_nan'] else 'no':>4} {r['skipped_steps']:4d} "
                                 f"{r['tokens_per_second']:9.0f} {r['driver_peak_bytes'] / GIB:9.2f} "
                                 f"{r['predicted_total_bytes'] / GIB:9.2f} {r['driver_peak_vs_prediction']:9.4f}")
    ratios = {}
    if ref:
        lines += ["", "  vs the PyTorch reference (GA 1, same batch), same GPU: tokens/s and NVML peak memory",
                  f"  {'precision/ckpt/ref':26} {'anvil tok/s':>11} {'ref tok/s':>9} {'ratio':>6} {'anvil GiB':>9} "
                  f"{'ref GiB':>7} {'ratio':>6}"]
        for p in PRECISIONS:
            for c in ["none", "full"]:
                for system in ("compile", "eager"):
                    r, h = grid.get(key(p, 1, c)), ref.get(f"{p}/{c}/{system}")
                    if not r or not h or "error" in r:
                        continue
                    if "error" in h:
                        lines.append(f"  {p + '/' + c + '/' + system:26} reference: {h['error'][:80]}")
                        continue
                    sr = r["tokens_per_second"] / h["tokens_per_second"]
                    an, hn = r.get("nvml_peak_bytes"), h.get("nvml_peak_bytes")
                    mr = an / hn if an and hn else None
                    ratios[f"{p}/{c}/{system}"] = {"tokens_per_second": sr, "nvml_peak_memory": mr}
                    lines.append(f"  {p + '/' + c + '/' + system:26} {r['tokens_per_second']:11.0f} "
                                 f"{h['tokens_per_second']:9.0f} {sr:6.2f} {(an or 0) / GIB:9.2f} "
                                 f"{(hn or 0) / GIB:7.2f} " + (f"{mr:6.2f}" if mr else "   n/a"))
    text = "\n".join(lines)
    print(text)
    commit = meta.get("commit", "unknown")
    record = {"benchmark": "precision_grid", "model": "d12", **meta, "anvil": grid, "reference": ref,
              "ratios": ratios}
    path = result_path("precision_grid", meta.get("device"), meta.get("date", utc_now()), commit,
                       directory=args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    path.with_suffix(".txt").write_text(text + "\n")
    print(f"saved {path} and {path.with_suffix('.txt')}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anvil", default="build-cuda/anvil")
    ap.add_argument("--data", default="data/shakespeare_bpe/train.bin")
    ap.add_argument("--tokenizer", default="data/shakespeare_bpe/tokenizer.json")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--ref_steps", type=int, default=20, help="the reference's timed steps (after --warmup)")
    ap.add_argument("--ref_systems", default="compile,eager", help="compile, eager or both")
    ap.add_argument("--ref_precisions", default=",".join(PRECISIONS))
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--part", default="", help="comma-separated precisions (Anvil's runs) and/or 'hf' (reference)")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--workdir", default="/tmp/anvil_precision_grid")
    ap.add_argument("--parts_dir", default="/tmp/anvil_precision_grid/parts")
    ap.add_argument("--gpu_index", type=int, default=0)
    args = ap.parse_args()
    if args.report:
        return report(args)
    assert args.batch % 4 == 0, "--batch must be a multiple of 4 (GA 4 splits it into micro-batches)"
    parts = [p for p in args.part.split(",") if p]
    meter = Meter(GpuMemory(args.gpu_index))
    commit, _ = git_commit()
    result = {"anvil": {}, "reference": {},
              "meta": {"batch": args.batch, "seq": args.seq, "steps": args.steps, "ref_steps": args.ref_steps,
                       "warmup": args.warmup, "lr": args.lr, "commit": commit, "device": meter.gpu.name(),
                       "date": utc_now().isoformat(timespec="seconds"), "memory_method": meter.describe()}}
    for p in parts:
        if p == "hf":
            _, vocab = read_shard(args.data)
            for prec in [x for x in args.ref_precisions.split(",") if x]:
                for c in ["none", "full"]:
                    for system in [x for x in args.ref_systems.split(",") if x]:
                        h = run_reference(args, meter, vocab, prec, c, system)
                        result["reference"][f"{prec}/{c}/{system}"] = h
                        print(f"reference {system} {prec} checkpointing {c}: " +
                              (h["error"][:120] if "error" in h else
                               f"{h['tokens_per_second']:.0f} tok/s, {(h['nvml_peak_bytes'] or 0) / GIB:.2f} GiB"),
                              flush=True)
            continue
        assert p in PRECISIONS, f"unknown part {p}"
        for a in ACCUMS:
            for c in CHECKPOINTING:
                r = run_anvil(args, meter, p, a, c)
                result["anvil"][key(p, a, c)] = r
                print(f"anvil {key(p, a, c)}: " + (r["error"][:120] if "error" in r else
                      f"loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}, {r['tokens_per_second']:.0f} tok/s, "
                      f"peak {r['driver_peak_bytes'] / GIB:.2f} GiB vs plan {r['predicted_total_bytes'] / GIB:.2f} GiB"),
                      flush=True)
    parts_dir = Path(args.parts_dir)
    parts_dir.mkdir(parents=True, exist_ok=True)
    name = "_".join(parts + ([args.ref_systems.replace(",", "_")] if "hf" in parts else []))
    (parts_dir / f"part_{name}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
