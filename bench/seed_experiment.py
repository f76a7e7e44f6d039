#!/usr/bin/env python3
"""The seed experiment: HF Trainer and Anvil side by side, row by row (docs/seed_experiment.md).

The seed guide (shared/seeds/000_08c4f1cb5a69cf12.txt, "efficient training on a single GPU") trains
bert-large-uncased for sequence classification on 512 random sequences of 512 token ids, one epoch, once per
technique, and prints Time, Samples/second and GPU memory occupied. This script runs every row of that table
with Hugging Face Trainer (bench/seed_experiment/hf_child.py, the seed's code) and with `anvil train`, each
row of each system in a fresh process, measures GPU memory for both the same way (NVML, polled by this
process), and prints the table with the ratios and each row's verdict against its target:

    samples/second  Anvil >= 2.0 x HF on rows computing in 16 bits, >= 1.3 x HF on rows in strict fp32
    GPU memory      Anvil <= HF on every row

On the GPU machine (from the repository root, after scripts/pack_for_gpu.sh on the build machine):

    source scripts/gpu_env.sh
    python3 bench/seed_experiment.py --anvil build-cuda/anvil

(or a few rows per invocation, gathered into one file with --out FILE --merge; --time_budget keeps a call
under a time limit). Quick CPU smoke test (no NVML: the memory columns read n/a):

    python3 bench/seed_experiment.py --anvil build/anvil --model bert-tiny --samples 16 --seq_len 64
"""
import argparse
import datetime
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from benchlib.child import Meter  # noqa: E402
from benchlib.nvml import MIB, GpuMemory  # noqa: E402
from benchlib.results import git_commit, result_path  # noqa: E402

# --- the experiment ------------------------------------------------------------------------------------

# Rows in the seed's order (plus bf16 + tf32, which the seed describes but does not time). `precision`:
# fp32 = strict fp32 (TF32 off, torch's default), fp16 = mixed precision with loss scaling, bf16_tf32 = bf16
# mixed precision with TF32 allowed for what stays fp32. `optim`: adamw = HF Trainer's default AdamW
# (adamw_torch_fused in current transformers), adafactor = optim="adafactor", adam8bit = the seed's
# bitsandbytes Adam8bit with two parameter groups.
ROWS = {
    "vanilla": dict(label="Vanilla (bs 4)", batch=4, accum=1, checkpointing=False, precision="fp32", optim="adamw"),
    "ga": dict(label="bs 1 + GA 4", batch=1, accum=4, checkpointing=False, precision="fp32", optim="adamw"),
    "ga_ckpt": dict(label="bs 1 + GA 4 + ckpt", batch=1, accum=4, checkpointing=True, precision="fp32",
                    optim="adamw"),
    "fp16": dict(label="fp16 (bs 4)", batch=4, accum=1, checkpointing=False, precision="fp16", optim="adamw"),
    "ga_ckpt_fp16": dict(label="bs 1 + GA 4 + ckpt + fp16", batch=1, accum=4, checkpointing=True,
                         precision="fp16", optim="adamw"),
    "adafactor": dict(label="Adafactor (bs 4)", batch=4, accum=1, checkpointing=False, precision="fp32",
                      optim="adafactor"),
    "ga_ckpt_fp16_adafactor": dict(label="bs 1 + GA 4 + ckpt + fp16 + Adafactor", batch=1, accum=4,
                                   checkpointing=True, precision="fp16", optim="adafactor"),
    "adam8bit": dict(label="8-bit AdamW (bs 4)", batch=4, accum=1, checkpointing=False, precision="fp32",
                     optim="adam8bit"),
    "ga_ckpt_fp16_adam8bit": dict(label="bs 1 + GA 4 + ckpt + fp16 + 8-bit", batch=1, accum=4,
                                  checkpointing=True, precision="fp16", optim="adam8bit"),
    "bf16_tf32": dict(label="bf16 + tf32 (bs 4)", batch=4, accum=1, checkpointing=False, precision="bf16_tf32",
                      optim="adamw"),
    # Not a seed row: vanilla with Anvil's fp32 GEMMs as 3xTF32 (fp32_matmul 3xtf32: fp32-accurate on the TF32
    # tensor cores). HF has no such mode (torch's "high" matmul precision is single-pass TF32), so its side
    # is HF's strict-fp32 vanilla run (reused from the vanilla row when that ran in the same run).
    "vanilla_3xtf32": dict(label="Vanilla, Anvil 3xTF32 (bs 4)", batch=4, accum=1, checkpointing=False,
                           precision="fp32", optim="adamw", fp32_matmul="3xtf32", hf_as="vanilla"),
}

# What the seed printed for each row (Tesla V100-SXM2 16 GB, 2022): Time (s), Samples/second, GPU memory
# occupied (MB, absolute). Kept in the results for reference only; they are not compared with.
SEED_V100 = {
    "vanilla": (57.82, 8.86, 14949), "ga": (66.03, 7.75, 8681), "ga_ckpt": (85.47, 5.99, 6775),
    "fp16": (27.46, 18.64, 13939), "ga_ckpt_fp16": (50.76, 10.09, 7275), "adafactor": (64.31, 7.96, 12295),
    "ga_ckpt_fp16_adafactor": (56.54, 9.06, 4847), "adam8bit": (55.95, 9.15, 13085),
    "ga_ckpt_fp16_adam8bit": (49.46, 10.35, 5363),
}

SPEED_TARGET = {"fp32": 1.3, "fp16": 2.0, "bf16_tf32": 2.0}

# Shapes of Anvil's BERT presets (src/model/transformer_config.cpp) for the HF side. bert-large is
# bert-large-uncased's config.json; bert-tiny is for smoke tests.
MODELS = {
    "bert-large": dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, intermediate_size=4096,
                       vocab_size=30522, max_position_embeddings=512),
    "bert-base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                      vocab_size=30522, max_position_embeddings=512),
    "bert-tiny": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=256,
                      vocab_size=1024, max_position_embeddings=128),
}

# HF Trainer's defaults, written explicitly into Anvil's config so both sides do the same work.
HF_DEFAULTS = dict(learning_rate=5e-5, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
                   lr_scheduler_type="linear", warmup_steps=0, max_grad_norm=1.0, seed=42)


def flops_per_token(shape, seq_len):
    """Model FLOPs per token of a training step (forward + backward) of the encoder: 6 x the block Linears'
    parameters + attention (12 L C T); embeddings are lookups, the pooler and classifier run once a sequence.
    The same count Anvil's MFU uses, so both systems are measured against the same work."""
    L, C, F = shape["num_hidden_layers"], shape["hidden_size"], shape["intermediate_size"]
    block = 4 * C * C + 4 * C + 2 * C * F + F + C
    return 6.0 * L * block + 12.0 * L * C * seq_len


# --- data ----------------------------------------------------------------------------------------------

def seed_data(samples, seq_len, seed, low, high):
    """The seed's dummy data, drawn with the same calls, in the same order, from numpy's global RNG as the
    HF child draws them: ids in [low, high) and labels np.random.randint(0, 1) -- all zero, as in the seed."""
    np.random.seed(seed)
    ids = np.random.randint(low, high, (samples, seq_len))
    labels = np.random.randint(0, 1, (samples))
    return ids, labels


def pad8(n):
    return (n + 7) // 8 * 8


def write_cls(path, ids, labels, vocab_size, label_names):
    """A classification shard (docs/formats.md, "Classification shard"): 64-byte header, label names as a
    JSON array, uint64 offsets, the tokens, int32 labels; every section padded to 8 bytes."""
    n, t = ids.shape
    assert ids.min() >= 0 and ids.max() < vocab_size and labels.min() >= 0 and labels.max() < len(label_names)
    wide = vocab_size > 65536
    names = json.dumps(label_names, separators=(",", ":")).encode("utf-8")
    header = bytearray(64)
    header[0:8] = b"ANVILCLS"
    struct.pack_into("<II", header, 8, 1, 2 if wide else 1)  # format version, token type
    struct.pack_into("<QQ", header, 16, n, vocab_size)  # examples, vocabulary size
    struct.pack_into("<II", header, 32, t, len(label_names))  # max_length, number of labels
    struct.pack_into("<QQ", header, 40, len(names), n * t)  # label-name bytes, total tokens (56..64: zero)
    tokens = ids.astype("<u4" if wide else "<u2").tobytes()
    sections = [bytes(header), names, (np.arange(n + 1, dtype="<u8") * t).tobytes(), tokens,
                labels.astype("<i4").tobytes()]
    with open(path, "wb") as f:
        for s in sections:
            f.write(s + b"\0" * (pad8(len(s)) - len(s)))


# --- the two systems -----------------------------------------------------------------------------------

def hf_row(name, row, args, env, meter, tag=""):
    work = Path(args.workdir) / f"hf_{name}{tag}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    shape = MODELS[args.model]
    spec = {"row": row, "shape": shape, "samples": args.samples, "seq_len": args.seq_len,
            "data_seed": args.data_seed, "init_seed": HF_DEFAULTS["seed"], "id_low": args.id_low,
            "id_high": args.id_high, "dropout": args.dropout, "output_dir": str(work / "tmp"),
            "gpu_index": args.gpu_index}
    (work / "spec.json").write_text(json.dumps(spec, indent=2))
    result_path = work / "result.json"
    cmd = [args.python, "-u", str(HERE / "seed_experiment" / "hf_child.py"), "--spec", str(work / "spec.json"),
           "--result", str(result_path)]
    run = meter.run(cmd, work / "log.txt", args.row_timeout, env=env, cwd=str(REPO),
                    end_marker=lambda line: line.startswith("SEED_EXPERIMENT_TRAIN_END"))
    res = json.loads(result_path.read_text()) if result_path.exists() else {}
    out = {"spec": spec, "process": run, **res}
    if run["timed_out"]:
        out["error"] = f"timed out after {args.row_timeout} s"
    elif "error" not in res and run["returncode"] != 0:
        out["error"] = f"exit code {run['returncode']}: " + " | ".join(run["log_tail"][-3:])
    if "error" not in out:
        out["time"] = res["train_runtime"]
        out["samples_per_second"] = res["train_samples_per_second"]
    return out


def anvil_config(row, args, data_path, out_dir):
    shape = MODELS[args.model]
    model = {"family": "bert", "n_layer": shape["num_hidden_layers"], "n_embd": shape["hidden_size"],
             "n_head": shape["num_attention_heads"], "intermediate_size": shape["intermediate_size"],
             "vocab_size": shape["vocab_size"], "block_size": shape["max_position_embeddings"],
             "hidden_dropout_prob": args.dropout, "attention_probs_dropout_prob": args.dropout}
    cfg = {"model": model, "train_data": str(data_path), "output_dir": str(out_dir), "device": args.device,
           "num_train_epochs": 1, "per_device_train_batch_size": row["batch"],
           "gradient_accumulation_steps": row["accum"], "gradient_checkpointing": row["checkpointing"],
           **HF_DEFAULTS, "logging_steps": args.anvil_logging_steps, "save_strategy": "no", "eval_steps": 0}
    if row["precision"] == "fp32":
        cfg["tf32"] = False  # strict fp32, as torch's default (allow_tf32 False)
        cfg["fp32_matmul"] = row.get("fp32_matmul", "fp32")
    elif row["precision"] == "fp16":
        # HF's fp16 is torch autocast + GradScaler: initial scale 2^16, halves on every overflow, doubles
        # after 2000 clean steps. Anvil's DeepSpeed-style scaler set to the same behaviour.
        cfg.update(fp16=True, tf32=False, initial_scale_power=16, loss_scale_window=2000, hysteresis=1)
    elif row["precision"] == "bf16_tf32":
        cfg.update(bf16=True, tf32=True)
    if row["optim"] == "adamw":
        cfg["optim"] = "adamw_torch_fused"
    elif row["optim"] == "adafactor":
        cfg["optim"] = "adafactor"  # Anvil's defaults are HF Trainer's optim="adafactor" settings
    elif row["optim"] == "adam8bit":
        # The seed's bnb.optim.Adam8bit has no embedding override: every tensor of >= 4096 elements,
        # embeddings included, keeps 8-bit states (weight decay is 0, so Adam8bit == AdamW8bit here).
        cfg.update(optim="adamw_8bit", optim_8bit_min_size=4096, optim_8bit_embedding_fp32=False)
    return cfg


def anvil_row(name, row, args, env, meter, data_path, tag=""):
    work = Path(args.workdir) / f"anvil_{name}{tag}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    out_dir = work / "out"
    cfg = anvil_config(row, args, data_path, out_dir)
    (work / "config.json").write_text(json.dumps(cfg, indent=2))
    cmd = [args.anvil, "train", "--config", str(work / "config.json")] + args.anvil_args.split()
    tuning = None
    if args.gemm_tuning:
        # Tune the row's GEMMs once, untimed (a two-step run: the first, eager step times the candidates),
        # then run the timed row on the cached choices, as a second run on this machine would.
        cache = Path(args.workdir) / "gemm_tuning.txt"
        flags = ["--gemm_tuning", "--gemm_tuning_cache", str(cache)]
        tune_cmd = cmd + flags + ["--max_steps", "2", "--output_dir", str(work / "tune_out"), "--logging_steps", "1"]
        t0 = time.time()
        with open(work / "tune_log.txt", "w") as log:
            r = subprocess.run(tune_cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO),
                               timeout=args.row_timeout)
        tuned = sum(1 for l in (work / "tune_log.txt").read_text().splitlines() if l.startswith("gemm tuning:"))
        tuning = {"command": tune_cmd, "wall_s": time.time() - t0, "returncode": r.returncode,
                  "gemms_tuned": tuned, "cache": str(cache)}
        shutil.rmtree(work / "tune_out", ignore_errors=True)
        if r.returncode != 0:
            return {"config": cfg, "gemm_tuning": tuning, "error": f"GEMM tuning run failed (exit {r.returncode})"}
        cmd = cmd + flags
    steps = args.samples // (row["batch"] * row["accum"])
    last = re.compile(rf"^step\s+{steps}/{steps}\b")  # the last step's line: the arena is still held
    run = meter.run(cmd, work / "log.txt", args.row_timeout, env=env, cwd=str(REPO),
                    end_marker=lambda line: bool(last.match(line)))
    out = {"config": cfg, "command": cmd, "process": run}
    if tuning:
        out["gemm_tuning"] = tuning
    if run["timed_out"]:
        out["error"] = f"timed out after {args.row_timeout} s"
        return out
    if run["returncode"] != 0:
        errs = [l for l in run["log_tail"] if l.startswith("error")] or run["log_tail"][-3:]
        out["error"] = f"exit code {run['returncode']}: " + " | ".join(errs)
        return out
    summary = json.loads((out_dir / "summary.json").read_text())
    lines = [json.loads(l) for l in (out_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]
    steps_logged = [l for l in lines if "loss" in l and "step" in l]
    final = max(steps_logged, key=lambda l: l["step"])
    log = Path(run["log"]).read_text()
    m = re.search(r"([\d.]+)M parameters", log)
    p = re.search(r"^\s*precision: (.*)$", log, re.M)
    # Time: summary.json's train_runtime, the training loop as HF's train_runtime (both runs use
    # save_strategy "no": no checkpoint write inside the timed part). metrics.jsonl's `elapsed` at the last
    # step is kept as a cross-check.
    if final["step"] != summary["global_step"]:
        out["error"] = f"metrics.jsonl ends at step {final['step']}, the run at {summary['global_step']}"
        return out
    loop = summary["train_runtime"]
    nsamples = summary["global_step"] * row["batch"] * row["accum"]
    out.update(time=loop, samples_per_second=nsamples / loop,
               last_step_elapsed=final["elapsed"],
               summary_samples_per_second=summary["train_samples_per_second"],
               global_step=summary["global_step"], train_loss=summary["train_loss"],
               precision=summary["precision"], precision_line=p.group(1) if p else None,
               skipped_steps=summary["skipped_steps"], loss_scale=summary["loss_scale"],
               device=summary["device"], planned_memory_mib=summary["planned_memory_bytes"] / MIB,
               driver_peak_mib=summary["driver_peak_bytes"] / MIB, mfu=summary["mfu"],
               peak_flops=summary["peak_flops"], peak_flops_source=summary["peak_flops_source"],
               flops_per_token=summary["flops_per_token"],
               parameters_millions=float(m.group(1)) if m else None)
    out["summary"] = summary  # everything Anvil reported (plan by category, CUDA graph counts, ...)
    # Anvil's own seed-style line ("GPU memory occupied: N MB." = max(plan, driver's peak in use)).
    s = re.search(r"memory occupied: (\d+) MB", log)
    out["self_reported_occupied_mib"] = int(s.group(1)) if s else None
    if not args.keep_checkpoints:
        for ck in out_dir.glob("checkpoint-*"):
            shutil.rmtree(ck, ignore_errors=True)
    return out


# --- repeated runs -------------------------------------------------------------------------------------

def run_summary(d):
    """What one run of a repeated row keeps beside the chosen run: time, speed, memory, wall time, error."""
    if "error" in d:
        return {"error": d["error"]}
    return {"time": d["time"], "samples_per_second": d["samples_per_second"],
            "peak_mib": d["process"]["memory"].get("peak_mib"), "wall_seconds": d["process"]["wall_seconds"]}


def median_run(runs):
    """The run of median time (the lower middle one of an even count) among the runs without an error,
    with every run's summary under "repeats": the row reports one real run, not a blend of several."""
    ok = sorted((d for d in runs if "error" not in d), key=lambda d: d["time"])
    chosen = dict(ok[(len(ok) - 1) // 2]) if ok else dict(runs[-1])
    chosen["repeats"] = [run_summary(d) for d in runs]
    return chosen


def spread(d, key):
    """(min, max) of `key` over a result's repeats, or None when it ran once or none had the value."""
    vals = [r[key] for r in (d or {}).get("repeats", []) if r.get(key) is not None]
    return (min(vals), max(vals)) if len(vals) > 1 else None


# --- environment helpers -------------------------------------------------------------------------------

def bnb_env(args, env):
    """Makes bitsandbytes importable for the HF child when it is carried as .devcarry/bnb.tgz (the
    scripts/pack_for_gpu.sh convention). Returns (env, note)."""
    probe = [args.python, "-c", "import bitsandbytes, sys; sys.stdout.write(bitsandbytes.__version__)"]

    def importable(e):
        r = subprocess.run(probe, env=e, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    v = importable(env)
    if v:
        return env, f"bitsandbytes {v} (installed)"
    carried = REPO / ".devcarry" / "bnb.tgz"
    if carried.exists():
        target = Path("/tmp/bnb")
        if not (target / "bitsandbytes").exists():
            target.mkdir(parents=True, exist_ok=True)
            subprocess.run(["tar", "xzf", str(carried), "-C", str(target)], check=True)
        e = dict(env)
        e["PYTHONPATH"] = str(target) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        v = importable(e)
        if v:
            return e, f"bitsandbytes {v} (carried wheel unpacked into {target})"
        return env, f"bitsandbytes not available: {carried} unpacked into {target} but does not import"
    return env, "bitsandbytes not available (not installed, no .devcarry/bnb.tgz)"


# --- report --------------------------------------------------------------------------------------------

def fmt(v, spec, na="n/a"):
    return na if v is None else format(v, spec)


def judge(name, row, hf, anvil, args, peak_fp32):
    """Ratios and verdicts of one row, plus the fp32 peak bound for the strict-fp32 rows."""
    target = SPEED_TARGET[row["precision"]]
    r = {"speed_target": target}
    ok_h, ok_a = hf and "error" not in hf, anvil and "error" not in anvil
    if ok_h and ok_a:
        r["speed"] = anvil["samples_per_second"] / hf["samples_per_second"]
        r["speed_pass"] = r["speed"] >= target
        sh, sa = spread(hf, "samples_per_second"), spread(anvil, "samples_per_second")
        if sh or sa:
            # The speed verdict is the median runs' ratio; the extremes pair each side's slowest with the
            # other's fastest run.
            sh, sa = sh or (hf["samples_per_second"],) * 2, sa or (anvil["samples_per_second"],) * 2
            r["speed_range"] = [sa[0] / sh[1], sa[1] / sh[0]]
        mh, ma = hf["process"]["memory"].get("peak_mib"), anvil["process"]["memory"].get("peak_mib")
        # Repeated rows: Anvil's highest peak against HF's lowest, so no repeat of Anvil exceeds any of HF's.
        mh = (spread(hf, "peak_mib") or (mh, mh))[0]
        ma = (spread(anvil, "peak_mib") or (ma, ma))[1]
        if mh and ma is not None:
            r["memory"] = ma / mh
            r["memory_pass"] = r["memory"] <= 1.0
        eh, ea = hf["process"]["memory"].get("at_end_mib"), anvil["process"]["memory"].get("at_end_mib")
        if eh and ea is not None:
            r["memory_at_end"] = ea / eh
        r["wall"] = anvil["process"]["wall_seconds"] / hf["process"]["wall_seconds"]
        # Same model on both sides: HF's parameter count against the one Anvil prints (in millions, 2 decimals).
        if hf.get("parameters") and anvil.get("parameters_millions") is not None:
            r["same_parameter_count"] = abs(hf["parameters"] / 1e6 - anvil["parameters_millions"]) < 0.006
    if row["precision"] == "fp32":
        # Strict fp32 on both sides: Anvil's summary says fp32 (not tf32), torch kept allow_tf32 off.
        r["strict_fp32"] = (not ok_a or anvil.get("precision") == row.get("fp32_matmul", "fp32")) and \
            (not ok_h or not hf.get("matmul_allow_tf32"))
        # Hardware FLOPs of a sample (full checkpointing re-runs every block's forward: +1/3), against the
        # fp32 peak: how fast a sample can be at best, so the largest speed-up over HF the peak allows.
        per_sample = flops_per_token(MODELS[args.model], args.seq_len) * args.seq_len
        hw = per_sample * (4.0 / 3.0 if row["checkpointing"] else 1.0)
        r["hardware_flops_per_sample"] = hw
        if peak_fp32:
            r["fp32_peak_flops"] = peak_fp32
            if ok_h:
                r["hf_fraction_of_fp32_peak"] = hf["samples_per_second"] * hw / peak_fp32
                r["max_speedup_at_fp32_peak"] = 1.0 / r["hf_fraction_of_fp32_peak"]
            if ok_a:
                r["anvil_fraction_of_fp32_peak"] = anvil["samples_per_second"] * hw / peak_fp32
    verdict = []
    if "speed_pass" in r:
        verdict.append("speed " + ("PASS" if r["speed_pass"] else "FAIL"))
        if not r["speed_pass"] and r.get("max_speedup_at_fp32_peak", 1e9) < target:
            verdict[-1] += " (fp32 peak-bound)"
    if "memory_pass" in r:
        verdict.append("mem " + ("PASS" if r["memory_pass"] else "FAIL"))
    elif ok_h and ok_a:
        verdict.append("mem n/a")
    r["verdict"] = ", ".join(verdict) if verdict else "n/a"
    return r


def table(record):
    rows = record["rows"]
    mem_ok = record["memory_method"]["available"]
    w = max(len(ROWS[n]["label"]) for n in rows) + 2
    head = (f"{'':{w}}| {'Time (s)':^15} | {'Samples/second':^24} | {'GPU memory occupied (MiB)':^26} |\n"
            f"{'row':{w}}| {'HF':>7} {'Anvil':>7} | {'HF':>7} {'Anvil':>7} {'ratio':>8} | "
            f"{'HF':>8} {'Anvil':>8} {'ratio':>8} | target  verdict")
    lines = [head, "-" * (len(head.splitlines()[1]) + 24)]
    notes = []
    for name, r in rows.items():
        hf, an, j = r.get("hf") or {}, r.get("anvil") or {}, r["ratios"]
        def cell(d, key, spec):
            if not d:
                return "-"
            if "error" in d:
                return "ERR"
            return fmt(d.get(key), spec)
        def memcell(d):
            if not d or "error" in d:
                return "-" if not d else "ERR"
            return fmt(d["process"]["memory"].get("peak_mib"), ".0f")
        speed = fmt(j.get("speed"), ".2f", "-") + ("x" if "speed" in j else "")
        memr = fmt(j.get("memory"), ".2f", "n/a" if hf and an and mem_ok is False else "-")
        lines.append(f"{ROWS[name]['label']:{w}}| {cell(hf, 'time', '7.2f'):>7} {cell(an, 'time', '7.2f'):>7} | "
                     f"{cell(hf, 'samples_per_second', '7.2f'):>7} {cell(an, 'samples_per_second', '7.2f'):>7} "
                     f"{speed:>8} | {memcell(hf):>8} {memcell(an):>8} {memr:>8} | "
                     f">={j['speed_target']:.1f}x  {j['verdict']}")
        if j.get("strict_fp32") is False:
            notes.append(f"  {ROWS[name]['label']}: NOT strict fp32: Anvil precision {an.get('precision')}, "
                         f"HF matmul allow_tf32 {hf.get('matmul_allow_tf32')}")
        if ROWS[name].get("fp32_matmul") == "3xtf32":
            notes.append(f"  {ROWS[name]['label']}: Anvil's fp32 GEMMs run as 3xTF32 (fp32-accurate, on the TF32 "
                         f"tensor cores; docs/config.md), HF's in native fp32; the fp32-peak fractions below "
                         f"count the same model FLOPs, so Anvil's may pass 100%")
        if j.get("same_parameter_count") is False:
            notes.append(f"  {ROWS[name]['label']}: the two models differ in size: HF {hf['parameters']:,} "
                         f"parameters, Anvil {an['parameters_millions']}M")
        if an and an.get("gemm_tuning"):
            t = an["gemm_tuning"]
            notes.append(f"  {ROWS[name]['label']}: Anvil ran with gemm_tuning on: {t['gemms_tuned']} GEMMs timed in an "
                         f"untimed two-step run before the row ({t['wall_s']:.1f} s wall, process start to exit), "
                         f"the rest taken from the cache")
        if "speed_range" in j:
            th, ta = spread(hf, "time"), spread(an, "time")
            runs = max(len(hf.get("repeats", [])), len(an.get("repeats", [])))
            notes.append(f"  {ROWS[name]['label']}: {runs} runs of each system, alternating; the table gives each "
                         f"side's median run. Time HF {fmt(th and th[0], '.2f')}-{fmt(th and th[1], '.2f')} s, "
                         f"Anvil {fmt(ta and ta[0], '.2f')}-{fmt(ta and ta[1], '.2f')} s; speed ratio "
                         f"{j['speed_range'][0]:.2f}x (slowest Anvil, fastest HF) to {j['speed_range'][1]:.2f}x; "
                         f"memory ratio from Anvil's highest and HF's lowest peak")
        for sysname, d in (("HF", hf), ("Anvil", an)):
            if d and "error" in d:
                notes.append(f"  {ROWS[name]['label']}: {sysname}: {d['error']}")
        if "max_speedup_at_fp32_peak" in j and "speed" in j:
            kind = "3xTF32" if ROWS[name].get("fp32_matmul") == "3xtf32" else "strict fp32"
            notes.append(f"  {ROWS[name]['label']}: {kind}: HF at {100 * j['hf_fraction_of_fp32_peak']:.1f}% and "
                         f"Anvil at {100 * j.get('anvil_fraction_of_fp32_peak', 0):.1f}% of the fp32 peak "
                         f"({j['fp32_peak_flops'] / 1e12:.1f} TFLOP/s); the peak allows at most "
                         f"{j['max_speedup_at_fp32_peak']:.2f}x over HF")
    if not mem_ok:
        notes.insert(0, f"  GPU memory: n/a ({record['memory_method']['source']}: "
                        f"{record['memory_method'].get('error') or 'no GPU'})")
    return "\n".join(lines + (["notes:"] + notes if notes else []))


def details(record):
    out = [f"{'row':28} {'HF wall':>8} {'Anvil wall':>10} {'HF at end':>10} {'Anvil at end':>12} "
           f"{'Anvil last':>10} {'Anvil self':>10} {'HF loss':>8} {'Anvil loss':>10}"]
    for name, r in record["rows"].items():
        hf, an = r.get("hf") or {}, r.get("anvil") or {}
        def g(d, *path):
            for p in path:
                if not isinstance(d, dict) or p not in d:
                    return None
                d = d[p]
            return d
        out.append(f"{name:28} {fmt(g(hf, 'process', 'wall_seconds'), '8.1f'):>8} "
                   f"{fmt(g(an, 'process', 'wall_seconds'), '10.1f'):>10} "
                   f"{fmt(g(hf, 'process', 'memory', 'at_end_mib'), '10.0f'):>10} "
                   f"{fmt(g(an, 'process', 'memory', 'at_end_mib'), '12.0f'):>12} "
                   f"{fmt(g(an, 'last_step_elapsed'), '10.2f'):>10} "
                   f"{fmt(g(an, 'self_reported_occupied_mib'), '10.0f'):>10} "
                   f"{fmt(g(hf, 'train_loss'), '8.4f'):>8} {fmt(g(an, 'train_loss'), '10.4f'):>10}")
    return "\n".join(out)


# --- main ----------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anvil", default=str(REPO / "build-cuda" / "anvil"), help="the anvil binary")
    ap.add_argument("--python", default=sys.executable, help="Python with torch + transformers for the HF side")
    ap.add_argument("--rows", default="all", help=f"comma-separated, from: {','.join(ROWS)} (default all)")
    ap.add_argument("--systems", default="hf,anvil", help="hf,anvil (default both)")
    ap.add_argument("--model", default="bert-large", choices=sorted(MODELS))
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--seq_len", type=int, default=512)
    ap.add_argument("--data_seed", type=int, default=0, help="np.random.seed before the seed's randint calls")
    ap.add_argument("--dropout", "--hf_dropout", dest="dropout", type=float, default=0.1,
                    help="hidden and attention-probability dropout of both systems: 0.1 is bert-large-uncased's "
                         "(the seed); 0 trains both without dropout")
    ap.add_argument("--device", default="",
                    help="Anvil's --device (default: cuda when NVML sees a GPU, else auto)")
    ap.add_argument("--anvil_args", default="", help="extra flags for anvil train, e.g. '--cuda_graphs false'")
    ap.add_argument("--anvil_logging_steps", type=int, default=10)
    ap.add_argument("--gemm_tuning", action="store_true",
                    help="Anvil runs with gemm_tuning on: before each row, an untimed two-step run times the row's "
                         "GEMM algorithms into <workdir>/gemm_tuning.txt (its wall time is recorded per row)")
    ap.add_argument("--fp32_peak_tflops", type=float, default=0.0,
                    help="the GPU's dense fp32 peak for the strict-fp32 bound (0: the figure Anvil's summary gives)")
    ap.add_argument("--gpu_index", type=int, default=0, help="NVML index of the GPU to watch")
    ap.add_argument("--poll", type=float, default=0.05, help="NVML polling interval (s)")
    ap.add_argument("--settle", type=float, default=15.0,
                    help="wait up to this long for the previous child's memory to be returned")
    ap.add_argument("--row_timeout", type=float, default=400.0, help="per-process limit (s)")
    ap.add_argument("--time_budget", type=float, default=0.0,
                    help="stop starting new processes after this many seconds (0: no limit); rows not run "
                         "are listed and kept from --merge")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run each row this many times per system, HF and Anvil alternating, each in a fresh "
                         "process; the table gives each side's median run and the notes the spread")
    ap.add_argument("--workdir", default="/tmp/anvil_seed_experiment")
    ap.add_argument("--keep_checkpoints", action="store_true", help="keep Anvil's final checkpoints")
    ap.add_argument("--out", default="",
                    help="results JSON (default bench/results/seed_experiment_<device>_<date>_<commit>.json)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows of an existing --out that this run does not re-run (split the table over "
                         "several invocations)")
    ap.add_argument("--combine", nargs="+", metavar="FILE",
                    help="print and save (--out) one table from the rows of these result files instead of running")
    args = ap.parse_args()
    if args.combine:
        if not args.out:
            ap.error("--combine needs --out")
        return combine(args.combine, args)

    names = list(ROWS) if args.rows == "all" else [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        ap.error(f"unknown rows {unknown}; choose from {list(ROWS)}")
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1 (got {args.repeats})")
    systems = {s.strip() for s in args.systems.split(",") if s.strip()}
    if not systems or systems - {"hf", "anvil"}:
        ap.error("--systems takes hf, anvil or both")
    if "anvil" in systems and not os.access(args.anvil, os.X_OK):
        ap.error(f"{args.anvil}: no anvil binary (build it, or give --anvil)")
    shape = MODELS[args.model]
    if args.seq_len > shape["max_position_embeddings"]:
        ap.error(f"--seq_len {args.seq_len} exceeds {args.model}'s {shape['max_position_embeddings']} positions")
    if args.seq_len % 8:
        print(f"warning: Anvil pads batches to a multiple of 8 tokens ({args.seq_len} -> {pad8(args.seq_len)}, "
              f"masked); HF runs {args.seq_len}: use a multiple of 8 for the same work")
    # The seed draws ids in [100, 30000); a smaller vocabulary (bert-tiny) keeps the low end and caps the top.
    args.id_low, args.id_high = 100, min(30000, shape["vocab_size"])

    meter = Meter(GpuMemory(args.gpu_index), poll=args.poll, settle=args.settle)
    gpu = meter.gpu
    if not args.device:  # never fall back to a CPU run silently on the GPU machine
        args.device = "cuda" if gpu.available else "auto"
    device_name = gpu.name() if gpu.available else None
    print(f"GPU memory reader: {gpu.source}" + (f"; {device_name}, {meter.reference / MIB:.0f} MiB in use "
                                                  f"before the benchmark" if gpu.available else
                                                  f" ({gpu.error or 'no GPU'}): memory columns n/a"))

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    ids, labels = seed_data(args.samples, args.seq_len, args.data_seed, args.id_low, args.id_high)
    data_path = work / f"seed_{args.model}_{args.samples}x{args.seq_len}.cls"
    write_cls(data_path, ids, labels, shape["vocab_size"], ["0", "1"])
    digest = hashlib.sha256(ids.astype("<i8").tobytes()).hexdigest()
    print(f"data: {args.samples} x {args.seq_len} ids in [{args.id_low}, {args.id_high}), labels all "
          f"{int(labels[0])} (np.random.randint(0, 1) as in the seed) -> {data_path}")

    env = dict(os.environ)
    bnb_note = "not needed"
    if "hf" in systems and any(ROWS[n]["optim"] == "adam8bit" for n in names):
        env, bnb_note = bnb_env(args, env)
        print(bnb_note)

    commit, commit_source = git_commit()
    date = datetime.datetime.now(datetime.timezone.utc)
    record = {
        "benchmark": "seed_experiment",
        "date": date.isoformat(timespec="seconds"), "commit": commit, "commit_source": commit_source,
        "device": device_name, "nvml_device": device_name, "driver": gpu.driver_version() if gpu.available else None,
        "gpu_total_mib": gpu.total_bytes() / MIB if gpu.available else None,
        "settings": {"model": args.model, "shape": shape, "samples": args.samples, "seq_len": args.seq_len,
                     "epochs": 1, "data_seed": args.data_seed, "id_range": [args.id_low, args.id_high],
                     "labels": "all 0 (np.random.randint(0, 1), as the seed)", "data_sha256": digest,
                     "hf_dropout": args.dropout, "anvil_dropout": args.dropout, "hf_trainer_defaults": HF_DEFAULTS,
                     "anvil_binary": args.anvil, "anvil_extra_args": args.anvil_args, "python": args.python,
                     "repeats": args.repeats,
                     "bitsandbytes": bnb_note, "argv": sys.argv[1:]},
        "memory_method": {"available": gpu.available, "source": gpu.source, "error": gpu.error,
                          "poll_seconds": args.poll,
                          "main": "peak of NVML 'used' polled by the parent while the child runs, minus 'used' "
                                  "just before the child starts",
                          "at_end": "NVML 'used' sampled by the parent when the child reports the end of training "
                                    "(HF: trainer.train() returned; Anvil: its last step's line), minus the same "
                                    "baseline"},
        "targets": {"speed_16bit": 2.0, "speed_fp32": 1.3, "memory": 1.0},
        "rows": {},
    }

    out_path = Path(args.out) if args.out else None
    previous = {}
    if args.merge and out_path and out_path.exists():
        earlier = json.loads(out_path.read_text())
        same = ("model", "samples", "seq_len", "data_seed", "hf_dropout")
        diff = [k for k in same if earlier["settings"].get(k) != record["settings"][k]]
        if diff or earlier.get("nvml_device") != device_name:
            sys.exit(f"--merge: {out_path} was made with other settings ({diff or 'device'}): use another --out")
        previous = earlier.get("rows", {})
    elif args.merge:
        sys.exit("--merge needs an existing --out file")

    t_start = time.time()
    not_run = []
    for name in names:
        row = ROWS[name]
        if args.samples % (row["batch"] * row["accum"]):
            print(f"warning: {args.samples} samples do not divide into steps of {row['batch'] * row['accum']}: "
                  f"HF trains the last partial step, Anvil drops the partial batch")
        entry = {"label": row["label"], "flags": row, "seed_v100": SEED_V100.get(name)}
        runs = {"hf": [], "anvil": []}
        for rep in range(args.repeats):
            tag = f"_run{rep + 1}" if args.repeats > 1 else ""
            for system in ("hf", "anvil"):
                if system not in systems:
                    continue
                if args.time_budget and time.time() - t_start > args.time_budget:
                    not_run.append(f"{name}/{system}{tag}")
                    continue
                print(f"[{time.time() - t_start:6.0f}s] {row['label']}: {system}"
                      f"{f' (run {rep + 1}/{args.repeats})' if tag else ''} ...", flush=True)
                reuse = row.get("hf_as")
                done = (record["rows"].get(reuse) or {}).get("hf") if reuse else None
                if system == "hf" and done and "error" not in done:
                    if not runs["hf"]:
                        runs["hf"].append(dict(done, reused_from_row=reuse))
                    print(f"         HF: the {reuse} row's run (the same HF configuration)", flush=True)
                    continue
                if system == "hf":
                    d = hf_row(name, row, args, env, meter, tag)
                    if d.get("data_sha256") not in (None, digest):
                        d["error"] = "the HF child drew different data"  # never expected
                else:
                    d = anvil_row(name, row, args, env, meter, data_path, tag)
                runs[system].append(d)
                msg = d.get("error") or (f"{d['time']:.2f} s, {d['samples_per_second']:.2f} samples/s, "
                                         f"peak {fmt(d['process']['memory'].get('peak_mib'), '.0f')} MiB")
                print(f"         {msg}", flush=True)
        for system, rs in runs.items():
            if len(rs) == 1:
                entry[system] = rs[0]
            elif rs:
                entry[system] = median_run(rs)
        if "hf" not in entry and "anvil" not in entry:
            continue
        # A row re-run for one system keeps the other system's earlier result (--merge).
        for system in ("hf", "anvil"):
            if system not in entry and system in previous.get(name, {}):
                entry[system] = previous[name][system]
                entry[system]["merged_from_earlier_run"] = True
        record["rows"][name] = entry

    for name, e in previous.items():  # rows of the earlier run not re-run now (--merge)
        if name not in record["rows"]:
            record["rows"][name] = e
    finish(record, args, not_run, Path(args.out) if args.out else None)


def finish(record, args, not_run, out_path):
    """Orders the rows, judges them, prints the table and writes the results (JSON and text)."""
    record["rows"] = {n: record["rows"][n] for n in ROWS if n in record["rows"]}  # the seed's order
    # The fp32 peak for the strict-fp32 rows' bound: given, or the nominal figure Anvil's summary reports for
    # this GPU when it ran in fp32 (src/train/mfu.cpp; data-sheet numbers).
    peak_fp32, peak_source = None, "unknown"
    if args.fp32_peak_tflops > 0:
        peak_fp32, peak_source = args.fp32_peak_tflops * 1e12, "--fp32_peak_tflops"
    else:
        for e in record["rows"].values():
            a = e.get("anvil") or {}
            if a.get("precision") == "fp32" and a.get("peak_flops"):
                peak_fp32, peak_source = a["peak_flops"], a.get("peak_flops_source")
    record["fp32_peak"] = {"flops": peak_fp32, "source": peak_source}
    for name, e in record["rows"].items():
        e["ratios"] = judge(name, ROWS[name], e.get("hf"), e.get("anvil"), args, peak_fp32)
    record["not_run"] = not_run
    hf_any = next((e["hf"] for e in record["rows"].values() if e.get("hf") and "torch" in e["hf"]), None)
    if hf_any:
        record["hf_versions"] = {k: hf_any.get(k) for k in ("torch", "transformers", "accelerate", "device",
                                                            "attn_implementation", "dataset")}
        record["device"] = record["device"] or hf_any.get("device")

    st = record["settings"]
    text = table(record)
    title = (f"Seed experiment: {st['model']}, {st['samples']} samples x {st['seq_len']} tokens, 1 epoch, on "
             f"{record['device'] or 'cpu'} (commit {record['commit'][:12]}, {record['date'][:10]})\n"
             f"dropout {st['hf_dropout']} on both sides; Time = training loop (train_runtime of both, no "
             f"checkpoint saving); memory = NVML peak minus the idle baseline")
    print("\n" + title + "\n" + text + "\n\n" + details(record))
    if not_run:
        print(f"not run (time budget): {', '.join(not_run)}")

    if out_path is None:
        out_path = result_path("seed_experiment", record["device"], record["date"], record["commit"])
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(record, indent=2) + "\n")
    out_path.with_suffix(".txt").write_text(title + "\n" + text + "\n\n" + details(record) + "\n")
    print(f"saved {out_path} and {out_path.with_suffix('.txt')}")


def combine(files, args):
    """--combine: the rows of several result files of one GPU model and the same settings, as one table
    (later files win for a row in several); the first file's header is kept, with every file's commit and
    date listed."""
    records = [json.loads(Path(f).read_text()) for f in files]
    first = records[0]
    same = ("model", "samples", "seq_len", "data_seed", "hf_dropout")
    for f, r in zip(files[1:], records[1:]):
        diff = [k for k in same if r["settings"].get(k) != first["settings"].get(k)]
        if diff or r.get("nvml_device") != first.get("nvml_device"):
            sys.exit(f"--combine: {f} was made with other settings than {files[0]} ({diff or 'device'})")
    record = dict(first, rows={}, combined_from=[{"file": str(f), "commit": r["commit"], "date": r["date"],
                                                   "rows": list(r["rows"])} for f, r in zip(files, records)])
    not_run = []
    for r in records:
        record["rows"].update(r["rows"])
        not_run += r.get("not_run", [])
    args.model, args.seq_len = first["settings"]["model"], first["settings"]["seq_len"]
    finish(record, args, [n for n in not_run if n.split("/")[0] not in record["rows"]], Path(args.out))


if __name__ == "__main__":
    main()
