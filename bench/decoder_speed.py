#!/usr/bin/env python3
"""Decoder training speed: Anvil against the PyTorch reference (torch.compile and eager), same GPU, bf16.

Models (--models), random tokens, each at its sequence length (--seq overrides):

  d12, d24, d36     GPT-2 124M, 350M, 774M (vocabulary 50257, sequence 1024)
  llama-1b          Llama-3.2-1B's shape (16 layers, hidden 2048, 32 heads, 8 KV heads, intermediate 8192,
                    vocabulary 128256, tied, rope_theta 500000, llama3 RoPE scaling; sequence 2048)
  qwen2.5-0.5b      Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads, 2 KV heads, q/k/v bias,
                    vocabulary 151936, tied; sequence 2048)

Three systems:

  anvil    `anvil train --bf16` on a random-token shard (fused AdamW, clipping at 1.0, CUDA graphs: defaults)
  compile  the shared reference (bench/benchlib/torch_reference.py): transformers GPT2LMHeadModel /
           LlamaForCausalLM / Qwen2ForCausalLM, vocabulary padded to a multiple of 64 (GPT-2: 50304), SDPA
           attention, bf16 autocast, torch.compile(model) called with the labels so the loss is inside the
           compiled graph, torch.optim.AdamW(fused=True), clipping at 1.0, every batch made on the device
           before the first step, one synchronisation before and one after the timed steps
  eager    the same reference without torch.compile

With --lora R, the same as LoRA fine-tuning: Anvil `--lora_r R --lora_alpha 2R --lora_target_modules
all-linear` against PEFT's LoraConfig(r=R, lora_alpha=2R, target_modules="all-linear") on the reference model
loaded in bf16 (as PEFT users load a base), adapters in fp32 (PEFT's autocast_adapter_dtype), bf16 autocast,
fused AdamW over the adapters; results go to decoder_speed_lora<R>_*. With --quantization nf4 too, QLoRA: Anvil
`--quantization nf4` against the same PEFT model whose decoder-layer Linears are bitsandbytes' Linear4bit
(nf4, double quantization, bf16 compute: what from_pretrained with that BitsAndBytesConfig builds; the base
made in bf16 on the GPU and quantized there); results go to decoder_speed_qlora<R>_nf4_*. --quantization nf4-dq
runs Anvil with double quantization too (`--quantization nf4-dq`), the reference unchanged (it always double
quantizes): the same storage on both sides; results go to decoder_speed_qlora<R>_nf4-dq_*.

Each system runs each micro-batch it tries in a fresh process (--batches, largest first: the per-model
defaults bracket the earlier best batches). `--search largest` (default) keeps the largest that fits, which
was the fastest (or within 0.2% of it) for every system and GPT-2 model in earlier runs; `--search best` also
goes on down the list while each smaller batch is faster and keeps the fastest (about 1.7x the run time: a
torch.compile process takes 1-1.7 minutes on an H100, most of it compiling). Every system gets --warmup
untimed steps (Anvil records its CUDA graphs there, torch.compile compiles) and --steps timed ones.

Measured and printed per model and system: tokens/s and ms/step over the timed steps, MFU (6N + 12LCT FLOPs
per token, N counted with the unpadded vocabulary as Anvil counts it, the same for every system, against
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
keeps what finished), and at the end the run writes bench/results/decoder_speed_<device>_<date>_<commit>.json
and .txt (--out; the .txt ends with a Markdown table for docs/performance.md). Parts of several runs (one
model per device call, say) are joined without running anything with --report. On the GPU machine, from the
repository root (after scripts/pack_for_gpu.sh on the build machine); the GPT-2 models take about 7.5
minutes on an H100 (d12 2, d24 2.5, d36 3):

    source scripts/gpu_env.sh
    python3 bench/decoder_speed.py --anvil build-cuda/anvil --models d12,d24,d36 --parts $OUT/parts.json --out $OUT --time_budget 480

or in pieces, joined afterwards anywhere (no GPU needed):

    python3 bench/decoder_speed.py --anvil build-cuda/anvil --models llama-1b --parts $OUT/parts_a.json --out $OUT
    python3 bench/decoder_speed.py --anvil build-cuda/anvil --models qwen2.5-0.5b --parts $OUT/parts_b.json --out $OUT
    python3 bench/decoder_speed.py --report parts_a.json parts_b.json
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


class Model:
    """A benchmarked shape: its family, label, Anvil preset (or GPT-2 dims), the reference's config
    arguments, its default sequence length and micro-batches (largest first), and its FLOPs per token."""

    def __init__(self, family, label, anvil_preset, ref_config, seq, batches):
        self.family, self.label, self.anvil_preset = family, label, anvil_preset
        self.ref_config, self.seq, self.batches = ref_config, seq, batches

    @property
    def vocab(self):
        return self.ref_config["vocab_size"]

    def parameters(self):
        """N as Anvil counts it (src/model/transformer_config.cpp num_parameters): unpadded vocabulary, a
        tied head counted once."""
        c = self.ref_config
        if self.family == "gpt2":
            L, C, V, P = c["n_layer"], c["n_embd"], c["vocab_size"], c["n_positions"]
            return V * C + P * C + L * (12 * C * C + 13 * C) + 2 * C
        L, C, F, V = c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"], c["vocab_size"]
        H, KV = c["num_attention_heads"], c["num_key_value_heads"]
        D = C // H
        qkv_bias = (H + 2 * KV) * D if self.family == "qwen2" else 0
        block = C * H * D + 2 * C * KV * D + H * D * C + qkv_bias + 3 * C * F + 2 * C
        return V * C * (1 if c.get("tie_word_embeddings") else 2) + L * block + C

    def flops_per_token(self, seq, lora=False):
        """6N + 12LCT, the same for every system (Anvil's MFU convention, src/train/mfu.cpp); LoRA: 4N + 12LCT
        (a frozen base needs no weight gradients; the adapters' own work is left out, under 1% at these
        ranks)."""
        c = self.ref_config
        L = c.get("n_layer", c.get("num_hidden_layers"))
        C = c.get("n_embd", c.get("hidden_size"))
        return (4 if lora else 6) * self.parameters() + 12 * L * C * seq


def _llama_like(layers, heads, kv_heads, hidden, inter, vocab, theta, tied, positions, **extra):
    return dict(num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                hidden_size=hidden, intermediate_size=inter, vocab_size=vocab, rope_theta=theta,
                tie_word_embeddings=tied, max_position_embeddings=positions, hidden_act="silu",
                attention_dropout=0.0, use_cache=False, **extra)


# Micro-batches tried, largest first. GPT-2 on an H100 (80 GB): Anvil's best were 32, 32, 16 (d12, d24, d36;
# bench/results/history/gpt2_speed_2026-11-22.txt, 64 within 0.2% on d12); the shared reference's largest that
# fit (2026-11-26) torch.compile 64, 32, 16 (41 GB or less each), eager 32, 16, 8. Llama-1B (issue 28): the
# reference's best on an H200 was batch 8 (51.1 GiB), batch 4 at 33.7 GiB.
MODELS = {
    "d12": Model("gpt2", "GPT-2 d12 (124M)", "d12", torch_reference.gpt2_config("d12"), 1024, [64, 32, 16]),
    "d24": Model("gpt2", "GPT-2 d24 (350M)", "d24", torch_reference.gpt2_config("d24"), 1024, [32, 16, 8]),
    "d36": Model("gpt2", "GPT-2 d36 (774M)", "d36", torch_reference.gpt2_config("d36"), 1024, [16, 8, 4]),
    "llama-1b": Model("llama", "Llama-3.2-1B shape (1.24B)", "llama-1b",
                      _llama_like(16, 32, 8, 2048, 8192, 128256, 500000.0, True, 131072, rms_norm_eps=1e-5,
                                  rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0,
                                                "original_max_position_embeddings": 8192}),
                      2048, [8, 4, 2]),
    # Trains on one GPU only with ZeRO-3 over several (bench/multi_gpu_speed.py --models llama-8b).
    "llama-8b": Model("llama", "Llama-3.1-8B shape (8.03B)", "llama-8b",
                      _llama_like(32, 32, 8, 4096, 14336, 128256, 500000.0, False, 131072, rms_norm_eps=1e-5,
                                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0,
                                                "original_max_position_embeddings": 8192}),
                      2048, [4, 2, 1]),
    "qwen2.5-0.5b": Model("qwen2", "Qwen2.5-0.5B shape (494M)", "qwen2.5-0.5b",
                          _llama_like(24, 14, 2, 896, 4864, 151936, 1000000.0, True, 32768, rms_norm_eps=1e-6),
                          2048, [16, 8, 4]),
}
SYSTEMS = ("anvil", "compile", "eager")
H100_BF16_PEAK = 989.4e12  # H100 SXM / H200 dense bf16, NVIDIA data sheet
GIB = 1 << 30


# --- running -------------------------------------------------------------------------------------------

def anvil_flags(m, batch, seq, steps, peak_flops, workdir, lora=0, quantization=""):
    """`anvil train`'s flags for Model `m` at micro-batch `batch` (per GPU) on a random-token shard (written
    into `workdir` once): bf16, constant learning rate, no checkpoints, Anvil's defaults otherwise; with
    `lora` > 0, LoRA of that rank on every block Linear (lora_alpha 2 r)."""
    shard = write_random_shard(Path(workdir) / f"random_tokens_{m.vocab}.bin", 8_000_000, m.vocab)
    extra = ["--lora_r", lora, "--lora_alpha", 2 * lora, "--lora_target_modules", "all-linear"] if lora else []
    extra += ["--quantization", quantization] if quantization else []
    return extra + ["--model", m.anvil_preset, "--device", "cuda", "--train_data", shard,
            "--per_device_train_batch_size", batch, "--max_seq_length", seq, "--max_steps", steps,
            "--learning_rate", "3e-4", "--warmup_steps", 0, "--lr_scheduler_type", "constant",
            "--save_strategy", "no", "--bf16", "true", "--sample_prompt", "", "--peak_flops", peak_flops,
            "--seed", 1]


def run_one(args, meter, model, system, batch):
    """One attempt: a fresh process of `system` at `batch`. Returns its record (or error, oom)."""
    m, seq = MODELS[model], args.seq_of(model)
    work = Path(args.workdir) / f"{model}_{system}_{batch}"
    steps = args.warmup + args.steps
    if system == "anvil":
        flags = anvil_flags(m, batch, seq, steps, args.peak_flops, args.workdir, args.lora, args.quantization)
        r = anvil_train.run(args.anvil, flags, work, meter, warmup=args.warmup, timeout=args.timeout)
        r["own_peak_bytes"] = r.get("self_reported_peak_bytes")
        r.pop("losses", None)
        r.pop("summary", None)
    else:
        spec = torch_reference.make_spec(m.family, m.ref_config, batch, seq, compile=system == "compile",
                                         precision="bf16", steps=args.steps, warmup=args.warmup,
                                         lora={"r": args.lora, "alpha": 2 * args.lora,
                                               "target_modules": "all-linear",
                                               "quantization": args.quantization} if args.lora else None)
        r = torch_reference.run(spec, work, meter, timeout=args.timeout)
        r["own_peak_bytes"] = r.get("torch_max_memory_reserved")
    r["batch"], r["seq"] = batch, seq
    r["nvml_peak_bytes"] = (r["process"]["memory"].get("peak_mib") or 0) * (1 << 20) or None
    return r


def search(args, meter, model, system, record, save):
    """Tries the model's batches for one system, largest first (see --search); every attempt is saved."""
    key = f"{model}/{system}"
    attempts = record["runs"].setdefault(key, [])
    fits = []
    for batch in args.batch_list(model):
        if args.time_budget and time.time() - args.t_start > args.time_budget:
            record["not_run"].append(f"{key} batch {batch}")
            save()
            return
        r = run_one(args, meter, model, system, batch)
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
        for k in ("steps", "warmup", "peak_flops", "lora", "quantization"):
            if p["settings"].get(k) != first["settings"].get(k):
                sys.exit(f"parts with different settings: {k} {first['settings'].get(k)} and "
                         f"{p['settings'].get(k)}")
    commits = sorted({p["meta"]["commit"] for p in parts})
    runs, done, not_run = {}, set(), []
    for p in parts:
        runs.update(p["runs"])
        done.update(p["done"])
        not_run += p["not_run"]
    st, meta = first["settings"], first["meta"]
    what = (f"LoRA fine-tuning (r {st['lora']}, lora_alpha {2 * st['lora']}, every block Linear; Anvil --lora_r "
            f"against PEFT on a bf16 base)" if st.get("lora") else "Decoder training")
    if st.get("quantization"):
        what = (f"QLoRA fine-tuning (r {st['lora']}, lora_alpha {2 * st['lora']}, every block Linear, the base's "
                f"block matrices in {st['quantization']}; Anvil --quantization against PEFT on bitsandbytes' "
                f"Linear4bit, double quantization, bf16 compute)")
    lines = [f"{what} speed, bf16, random tokens; {meta['device']}, commit(s) "
             f"{', '.join(c[:7] for c in commits)}, {meta['date'][:10]}; {st['warmup']} warm-up + {st['steps']} "
             f"timed steps; MFU against {st['peak_flops'] / 1e12:.1f} TFLOP/s; memory: NVML peak of the "
             f"process (own figure: Anvil's summary peak, torch max_memory_reserved)"]
    results, ratios, md = {}, {}, []
    for model in MODELS:
        rows = {s: best(runs.get(f"{model}/{s}", [])) for s in SYSTEMS}
        if not any(f"{model}/{s}" in runs for s in SYSTEMS):
            continue
        seq = next(r["seq"] for r in rows.values() if r) if any(rows.values()) else MODELS[model].seq
        lines.append(f"\n{MODELS[model].label}, sequence {seq}:")
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
            r["mfu"] = (r["tokens_per_second"] * MODELS[model].flops_per_token(r["seq"], bool(st.get("lora"))) /
                        st["peak_flops"])
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

        md.append(f"| {MODELS[model].label}, seq {seq} | {cell(rows['anvil'])} | {cell(rows['compile'])} | "
                  f"{cell(rows['eager'])} | {ratio_cell('compile')} | {ratio_cell('eager')} |")
    if md:
        lines += ["", "Markdown (docs/performance.md):", "",
                  "| model | Anvil | torch.compile | eager | Anvil / compile | Anvil / eager |",
                  "|---|---|---|---|---|---|", *md]
    if not_run:
        lines.append(f"\nnot run (time budget): {', '.join(not_run)}")
    text = "\n".join(lines)
    print(text)
    record = {"benchmark": "decoder_speed", "lora_r": st.get("lora", 0), "device": meta["device"], "driver": meta.get("driver"),
              "commit": commits[0] if len(commits) == 1 else commits, "date": meta["date"], "settings": st,
              "memory_method": meta["memory_method"], "torch": meta.get("torch"),
              "results": results, "ratios": ratios, "runs": runs, "search_done": sorted(done), "not_run": not_run}
    name = f"decoder_speed_lora{st['lora']}" if st.get("lora") else "decoder_speed"
    if st.get("quantization"):
        name = f"decoder_speed_qlora{st['lora']}_{st['quantization']}"
    path = result_path(name, meta["device"], meta["date"], commits[0], directory=args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    path.with_suffix(".txt").write_text(text + "\n")
    print(f"saved {path} and {path.with_suffix('.txt')}")


# --- main ----------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anvil", default="build-cuda/anvil", help="the anvil binary (CUDA build)")
    ap.add_argument("--models", default=",".join(m for m in MODELS if m != "llama-8b"),
                    help=f"comma-separated, from {','.join(MODELS)} (llama-8b: not by default; it needs ZeRO-3)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, from {','.join(SYSTEMS)}")
    ap.add_argument("--batches", default="",
                    help="micro-batches to try for every model, largest first (default per model: "
                         + "; ".join(f"{m} {','.join(map(str, v.batches))}" for m, v in MODELS.items()) + ")")
    ap.add_argument("--search", choices=("largest", "best"), default="largest")
    ap.add_argument("--seq", type=int, default=0, help="sequence length of every model (default: the model's)")
    ap.add_argument("--lora", type=int, default=0,
                    help="LoRA fine-tuning of this rank on every block Linear (lora_alpha 2 r): Anvil's --lora_r "
                         "against PEFT's LoraConfig on a bf16 base; 0: full training")
    ap.add_argument("--quantization", default="", choices=("", "nf4", "nf4-dq"),
                    help="with --lora: QLoRA, the base's block matrices in nf4 or nf4-dq (Anvil --quantization; "
                         "the reference: bitsandbytes' Linear4bit with double quantization, as transformers "
                         "loads a load_in_4bit model; the bitsandbytes package must be importable); results go "
                         "to decoder_speed_qlora<R>_<quantization>_*")
    ap.add_argument("--steps", type=int, default=15, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    ap.add_argument("--peak_flops", type=float, default=H100_BF16_PEAK)
    ap.add_argument("--timeout", type=float, default=420, help="per-process limit (s)")
    ap.add_argument("--time_budget", type=float, default=0,
                    help="start no new process after this many seconds (0: no limit)")
    ap.add_argument("--gpu_index", type=int, default=0, help="NVML index of the GPU to watch")
    ap.add_argument("--parts", default="/tmp/anvil_decoder_speed/parts.json",
                    help="JSON that collects every attempt of this run as it finishes")
    ap.add_argument("--workdir", default="/tmp/anvil_decoder_speed")
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
    args.batch_list = lambda m: sorted(override or MODELS[m].batches, reverse=True)
    args.seq_of = lambda m: args.seq or MODELS[m].seq
    args.t_start = time.time()
    meter = Meter(GpuMemory(args.gpu_index))
    if not meter.gpu.available:
        sys.exit(f"no GPU visible to NVML ({meter.gpu.error}): this benchmark runs on the GPU machine")
    commit, commit_source = git_commit()
    record = {"meta": {"device": meter.gpu.name(), "driver": meter.gpu.driver_version(), "commit": commit,
                       "commit_source": commit_source, "date": utc_now().isoformat(timespec="seconds"),
                       "memory_method": meter.describe()},
              "settings": {"seq": {m: args.seq_of(m) for m in models}, "steps": args.steps, "warmup": args.warmup,
                           "peak_flops": args.peak_flops, "search": args.search, "anvil": args.anvil,
                           "batches": {m: args.batch_list(m) for m in models}, "lora": args.lora,
                           "quantization": args.quantization},
              "runs": {}, "done": [], "not_run": []}
    parts = Path(args.parts)
    parts.parent.mkdir(parents=True, exist_ok=True)

    def save():
        torch_run = next((r for rs in record["runs"].values() for r in rs if r.get("torch")), None)
        if torch_run:
            record["meta"]["torch"] = {k: torch_run[k] for k in ("torch", "transformers")}
        parts.write_text(json.dumps(record, indent=2) + "\n")

    print(f"{record['meta']['device']}, commit {commit[:7]} ({commit_source}); parts -> {parts}", flush=True)
    for model in models:
        for system in systems:
            search(args, meter, model, system, record, save)
    report([record], args)


if __name__ == "__main__":
    main()
