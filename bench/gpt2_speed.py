#!/usr/bin/env python3
"""GPT-2 training speed: Anvil against the PyTorch reference (torch.compile and eager), same GPU, bf16.

For GPT-2 d12, d24 and d36 (124M, 350M, 774M; vocabulary 50257, sequence 1024, random tokens), three systems:

  anvil    `anvil train --bf16` on a random-token shard (fused AdamW, clipping at 1.0, CUDA graphs: defaults)
  compile  the shared reference (bench/benchlib/torch_reference.py): transformers GPT2LMHeadModel, vocabulary
           padded to 50304, SDPA attention, bf16 autocast, torch.compile(model) called with the labels so the
           loss is inside the compiled graph, torch.optim.AdamW(fused=True), clipping at 1.0, every batch
           made on the device before the first step, one synchronisation before and one after the timed steps
  eager    the same reference without torch.compile

Each system runs each micro-batch it tries in a fresh process (--batches, largest first: the per-model
defaults bracket the earlier best batches). `--search largest` (default) keeps the largest that fits, which
was the fastest (or within 0.2% of it) for every system and model in earlier runs; `--search best` also goes
on down the list while each smaller batch is faster and keeps the fastest (about 1.7x the run time: a
torch.compile process takes 1-1.7 minutes on an H100, most of it compiling). Every system gets --warmup untimed steps (Anvil records its CUDA graphs there,
torch.compile compiles) and --steps timed ones.

Measured and printed per model and system: tokens/s and ms/step over the timed steps, MFU (6N + 12LCT FLOPs
per token, N counted with the 50257-token vocabulary as Anvil counts it, the same for every system, against
--peak_flops: by default the H100/H200 SXM bf16 dense data-sheet figure), the NVML peak of the GPU memory
the process used (polled by this script for every system alike, bench/benchlib/child.py) next to each side's
own figure (Anvil's summary peak; torch.cuda.max_memory_reserved), and the ratios Anvil/compile and
Anvil/eager.

What is not symmetric, to Anvil's cost: Anvil's training loop synchronises with the device once per step
(it reads the loss), while the reference never synchronises inside the timed steps; Anvil reads its batches
from the shard on the host each step (copied on a second stream), while the reference's data sits on the
device. Anvil's time is the wall time from the end of its last warm-up step to the end of its last step
(metrics.jsonl `elapsed`), the reference's the time between its two synchronisations.

Results: every attempt is added to the --parts JSON as soon as it finishes (a run cut short by a time limit
keeps what finished), and at the end the run writes bench/results/gpt2_speed_<device>_<date>_<commit>.json
and .txt (--out; the .txt ends with a Markdown table for docs/performance.md). Parts of several runs (one
model per device call, say) are joined without running anything with --report. On the GPU machine, from the
repository root (after scripts/pack_for_gpu.sh on the build machine), the whole run takes about 7.5 minutes
on an H100 (d12 2, d24 2.5, d36 3; measured for the reference side, estimated for Anvil's):

    source scripts/gpu_env.sh
    python3 bench/gpt2_speed.py --anvil build-cuda/anvil --parts $OUT/parts.json --out $OUT --time_budget 480

or in pieces, joined afterwards anywhere (no GPU needed):

    python3 bench/gpt2_speed.py --anvil build-cuda/anvil --models d12,d24 --parts $OUT/parts_a.json --out $OUT
    python3 bench/gpt2_speed.py --anvil build-cuda/anvil --models d36 --parts $OUT/parts_b.json --out $OUT
    python3 bench/gpt2_speed.py --report parts_a.json parts_b.json
"""
import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib import anvil_train, torch_reference  # noqa: E402
from benchlib.child import Meter  # noqa: E402
from benchlib.nvml import GpuMemory  # noqa: E402
from benchlib.results import RESULTS, git_commit, result_path, utc_now  # noqa: E402
from benchlib.shards import write_random_shard  # noqa: E402

VOCAB = 50257
MODELS = {"d12": "124M", "d24": "350M", "d36": "774M"}
# Micro-batches tried, largest first. On an H100 (80 GB): Anvil's best were 32, 32, 16 (d12, d24, d36;
# bench/results/history/gpt2_speed_2026-11-22.txt, 64 within 0.2% on d12); the shared reference's largest that fit
# (2026-11-26) torch.compile 64, 32, 16 (41 GB or less each), eager 32, 16, 8.
BATCHES = {"d12": [64, 32, 16], "d24": [32, 16, 8], "d36": [16, 8, 4]}
SYSTEMS = ("anvil", "compile", "eager")
H100_BF16_PEAK = 989.4e12  # H100 SXM / H200 dense bf16, NVIDIA data sheet
GIB = 1 << 30


def flops_per_token(model, seq):
    """6N + 12LCT: N the parameters with the unpadded 50257-token vocabulary (Anvil's MFU convention,
    src/train/mfu.cpp), the same for every system."""
    L, _, C = torch_reference.GPT2_SHAPES[model]
    params = VOCAB * C + 1024 * C + L * (12 * C * C + 13 * C) + 2 * C
    return 6 * params + 12 * L * C * seq


# --- running -------------------------------------------------------------------------------------------

def run_one(args, meter, shard, model, system, batch):
    """One attempt: a fresh process of `system` at `batch`. Returns its record (or error, oom)."""
    work = Path(args.workdir) / f"{model}_{system}_{batch}"
    steps = args.warmup + args.steps
    if system == "anvil":
        L, H, C = torch_reference.GPT2_SHAPES[model]
        cfg = Path(args.workdir) / f"{model}.json"
        cfg.write_text(json.dumps({"model": {"n_layer": L, "n_head": H, "n_embd": C, "vocab_size": VOCAB,
                                             "block_size": 1024}}))
        flags = ["--config", cfg, "--device", "cuda", "--train_data", shard, "--per_device_train_batch_size",
                 batch, "--max_seq_length", args.seq, "--max_steps", steps, "--learning_rate", "3e-4",
                 "--warmup_steps", 0, "--lr_scheduler_type", "constant", "--save_strategy", "no", "--bf16",
                 "true", "--sample_prompt", "", "--peak_flops", args.peak_flops, "--seed", 1]
        r = anvil_train.run(args.anvil, flags, work, meter, warmup=args.warmup, timeout=args.timeout)
        r["own_peak_bytes"] = r.get("self_reported_peak_bytes")
        r.pop("losses", None)
        r.pop("summary", None)
    else:
        spec = torch_reference.make_spec("gpt2", torch_reference.gpt2_config(model, VOCAB), batch, args.seq,
                                         compile=system == "compile", precision="bf16", steps=args.steps,
                                         warmup=args.warmup)
        r = torch_reference.run(spec, work, meter, timeout=args.timeout)
        r["own_peak_bytes"] = r.get("torch_max_memory_reserved")
    r["batch"] = batch
    r["nvml_peak_bytes"] = (r["process"]["memory"].get("peak_mib") or 0) * (1 << 20) or None
    return r


def search(args, meter, shard, model, system, record, save):
    """Tries the model's batches for one system, largest first (see --search); every attempt is saved."""
    key = f"{model}/{system}"
    attempts = record["runs"].setdefault(key, [])
    fits = []
    for batch in args.batch_list(model):
        if args.time_budget and time.time() - args.t_start > args.time_budget:
            record["not_run"].append(f"{key} batch {batch}")
            save()
            return
        r = run_one(args, meter, shard, model, system, batch)
        attempts.append(r)
        save()
        print(f"[{time.time() - args.t_start:5.0f}s] {key} batch {batch}: " +
              (r["error"][:160] if "error" in r else
               f"{r['tokens_per_second']:.0f} tok/s, {r['ms_per_step']:.1f} ms/step, NVML peak "
               f"{(r['nvml_peak_bytes'] or 0) / GIB:.2f} GiB"), flush=True)
        if "error" in r:
            continue
        fits.append(r)
        if args.search == "largest":
            break
        if len(fits) >= 2 and fits[-1]["tokens_per_second"] <= fits[-2]["tokens_per_second"]:
            break
    record["done"].append(key)
    save()


# --- reporting -----------------------------------------------------------------------------------------

def best(attempts):
    ok = [r for r in attempts if "error" not in r]
    return max(ok, key=lambda r: r["tokens_per_second"]) if ok else None


def fmt_k(x):
    return f"{x / 1000:.1f}K"


def report(parts, args):
    """Joins parts (one or more --parts files), prints the tables and writes the results JSON and .txt."""
    first = parts[0]
    for p in parts[1:]:
        if p["meta"]["device"] != first["meta"]["device"]:
            sys.exit(f"parts from different devices: {first['meta']['device']} and {p['meta']['device']}")
        for k in ("seq", "steps", "warmup", "peak_flops"):
            if p["settings"][k] != first["settings"][k]:
                sys.exit(f"parts with different settings: {k} {first['settings'][k]} and {p['settings'][k]}")
    commits = sorted({p["meta"]["commit"] for p in parts})
    runs, done, not_run = {}, set(), []
    for p in parts:
        runs.update(p["runs"])
        done.update(p["done"])
        not_run += p["not_run"]
    st, meta = first["settings"], first["meta"]
    lines = [f"GPT-2 training speed, bf16, sequence {st['seq']}, random tokens; {meta['device']}, commit(s) "
             f"{', '.join(c[:7] for c in commits)}, {meta['date'][:10]}; {st['warmup']} warm-up + {st['steps']} "
             f"timed steps; MFU against {st['peak_flops'] / 1e12:.1f} TFLOP/s; memory: NVML peak of the "
             f"process (own figure: Anvil's summary peak, torch max_memory_reserved)"]
    results, ratios, md = {}, {}, []
    for model in MODELS:
        rows = {s: best(runs.get(f"{model}/{s}", [])) for s in SYSTEMS}
        if not any(f"{model}/{s}" in runs for s in SYSTEMS):
            continue
        lines.append(f"\nGPT-2 {model} ({MODELS[model]}):")
        lines.append(f"  {'system':8} {'batch':>5} {'tok/s':>9} {'ms/step':>8} {'MFU':>6} {'NVML peak':>10} "
                     f"{'own figure':>10}")
        for s, r in rows.items():
            key = f"{model}/{s}"
            if key not in runs:
                continue
            if r is None:
                errs = "; ".join(f"b{a['batch']}: {a['error'][:60]}" for a in runs[key])
                lines.append(f"  {s:8} no batch ran: {errs}")
                continue
            r["mfu"] = r["tokens_per_second"] * flops_per_token(model, st["seq"]) / st["peak_flops"]
            results[key] = r
            nv, own = r.get("nvml_peak_bytes"), r.get("own_peak_bytes")
            lines.append(f"  {s:8} {r['batch']:5d} {r['tokens_per_second']:9.0f} {r['ms_per_step']:8.1f} "
                         f"{100 * r['mfu']:5.1f}% {(nv or 0) / GIB:8.2f} G {(own or 0) / GIB:8.2f} G"
                         + ("" if key in done else "  (search not finished)"))
        a = results.get(f"{model}/anvil")
        for name in ("compile", "eager"):
            ref = results.get(f"{model}/{name}")
            if a and ref:
                rat = {"tokens_per_second": a["tokens_per_second"] / ref["tokens_per_second"]}
                if a.get("nvml_peak_bytes") and ref.get("nvml_peak_bytes"):
                    rat["nvml_peak_memory"] = a["nvml_peak_bytes"] / ref["nvml_peak_bytes"]
                ratios[f"{model}/anvil_over_{name}"] = rat
                mem = f", {rat['nvml_peak_memory']:.2f}x NVML peak memory" if "nvml_peak_memory" in rat else ""
                lines.append(f"  anvil / {name}: {rat['tokens_per_second']:.2f}x tokens/s{mem}")

        def cell(r, with_mfu=True):
            if not r:
                return "-"
            mfu = f", MFU {100 * r['mfu']:.1f}%" if with_mfu else ""
            return f"{fmt_k(r['tokens_per_second'])} tok/s{mfu}, {(r.get('nvml_peak_bytes') or 0) / GIB:.1f} GiB (B {r['batch']})"

        def ratio_cell(name):
            rat = ratios.get(f"{model}/anvil_over_{name}")
            if not rat:
                return "-"
            mem = f", {rat['nvml_peak_memory']:.2f}x memory" if "nvml_peak_memory" in rat else ""
            return f"**{rat['tokens_per_second']:.2f}x** speed{mem}"

        md.append(f"| {model} ({MODELS[model]}) | {cell(rows['anvil'])} | {cell(rows['compile'])} | "
                  f"{cell(rows['eager'])} | {ratio_cell('compile')} | {ratio_cell('eager')} |")
    if md:
        lines += ["", "Markdown (docs/performance.md):", "",
                  "| model | Anvil | torch.compile | eager | Anvil / compile | Anvil / eager |",
                  "|---|---|---|---|---|---|", *md]
    if not_run:
        lines.append(f"\nnot run (time budget): {', '.join(not_run)}")
    text = "\n".join(lines)
    print(text)
    record = {"benchmark": "gpt2_speed", "device": meta["device"], "driver": meta.get("driver"),
              "commit": commits[0] if len(commits) == 1 else commits, "date": meta["date"], "settings": st,
              "memory_method": meta["memory_method"], "torch": meta.get("torch"),
              "results": results, "ratios": ratios, "runs": runs, "search_done": sorted(done), "not_run": not_run}
    path = result_path("gpt2_speed", meta["device"], meta["date"], commits[0], directory=args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    path.with_suffix(".txt").write_text(text + "\n")
    print(f"saved {path} and {path.with_suffix('.txt')}")


# --- main ----------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anvil", default="build-cuda/anvil", help="the anvil binary (CUDA build)")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {','.join(MODELS)}")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, from {','.join(SYSTEMS)}")
    ap.add_argument("--batches", default="",
                    help="micro-batches to try for every model, largest first (default per model: "
                         + "; ".join(f"{m} {','.join(map(str, b))}" for m, b in BATCHES.items()) + ")")
    ap.add_argument("--search", choices=("largest", "best"), default="largest")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=15, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    ap.add_argument("--peak_flops", type=float, default=H100_BF16_PEAK)
    ap.add_argument("--timeout", type=float, default=420, help="per-process limit (s)")
    ap.add_argument("--time_budget", type=float, default=0,
                    help="start no new process after this many seconds (0: no limit)")
    ap.add_argument("--gpu_index", type=int, default=0, help="NVML index of the GPU to watch")
    ap.add_argument("--parts", default="/tmp/anvil_gpt2_speed/parts.json",
                    help="JSON that collects every attempt of this run as it finishes")
    ap.add_argument("--workdir", default="/tmp/anvil_gpt2_speed")
    ap.add_argument("--out", default=str(RESULTS), help="where the results JSON and .txt go")
    ap.add_argument("--report", nargs="+", metavar="PARTS",
                    help="join these parts files into one results file; runs nothing")
    args = ap.parse_args()
    if args.report:
        return report([json.loads(Path(p).read_text()) for p in args.report], args)

    models = [m for m in args.models.split(",") if m]
    systems = [s for s in args.systems.split(",") if s]
    if set(models) - set(MODELS) or set(systems) - set(SYSTEMS):
        ap.error(f"--models from {list(MODELS)}, --systems from {list(SYSTEMS)}")
    if "anvil" in systems and not Path(args.anvil).is_file():
        ap.error(f"{args.anvil}: no anvil binary (give --anvil)")
    override = [int(b) for b in args.batches.split(",") if b]
    args.batch_list = lambda m: sorted(override or BATCHES[m], reverse=True)
    args.t_start = time.time()
    meter = Meter(GpuMemory(args.gpu_index))
    if not meter.gpu.available:
        sys.exit(f"no GPU visible to NVML ({meter.gpu.error}): this benchmark runs on the GPU machine")
    commit, commit_source = git_commit()
    record = {"meta": {"device": meter.gpu.name(), "driver": meter.gpu.driver_version(), "commit": commit,
                       "commit_source": commit_source, "date": utc_now().isoformat(timespec="seconds"),
                       "memory_method": meter.describe()},
              "settings": {"seq": args.seq, "steps": args.steps, "warmup": args.warmup, "vocab": VOCAB,
                           "peak_flops": args.peak_flops, "search": args.search, "anvil": args.anvil,
                           "batches": {m: args.batch_list(m) for m in models}},
              "runs": {}, "done": [], "not_run": []}
    parts = Path(args.parts)
    parts.parent.mkdir(parents=True, exist_ok=True)

    def save():
        torch_run = next((r for rs in record["runs"].values() for r in rs if r.get("torch")), None)
        if torch_run:
            record["meta"]["torch"] = {k: torch_run[k] for k in ("torch", "transformers")}
        parts.write_text(json.dumps(record, indent=2) + "\n")

    print(f"{record['meta']['device']}, commit {commit[:7]} ({commit_source}); parts -> {parts}", flush=True)
    shard = write_random_shard(Path(args.workdir) / "random_tokens.bin", 8_000_000, VOCAB)
    for model in models:
        for system in systems:
            search(args, meter, shard, model, system, record, save)
    report([record], args)


if __name__ == "__main__":
    main()
