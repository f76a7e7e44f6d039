#!/usr/bin/env python3
"""Multi-GPU training speed (issue 29): Anvil's data parallelism and ZeRO stages against PyTorch DDP and FSDP2,
each with torch.compile, on 2 GPUs (and 4 where the machine has them), bf16, random tokens, same machine,
same run.

Models (--models): the decoder benchmark's shapes (bench/decoder_speed.py), by default GPT-2 d24 (350M,
sequence 1024) and Llama-3.2-1B's shape (1.24B, sequence 2048). Systems (--systems, run in the order given;
default anvil,anvil_1gpu,fsdp2,fsdp2_noreshard,ddp,compile_1gpu), each on --nproc GPUs (2 by default;
"2,4" runs both):

  anvil            `anvil launch --nproc_per_node N --master_port P train <decoder_speed.py's flags>
                   --deepspeed ds.json` with {"zero_optimization": {"stage": S}} for each stage of
                   --anvil_stages (0,1,2,3), and "communication_data_type" for each type of --anvil_comm
                   other than "" (the gradients' own, fp32: the default; "bf16" halves the bytes reduced;
                   its rows read "anvil zero S, bf16 comm"), and `--backward_grad_dtype` for each type of
                   --anvil_grads other than "" (stages 2-3: "bf16" writes the unit gradients in bf16 and
                   accumulates in fp32, as FSDP2 with bf16 parameters; rows "anvil zero S, bf16 grads"). A
                   stage the build refuses is recorded as "not
                   supported by this build" with Anvil's error, not as a failure.
  ddp              bench/benchlib/torch_distributed_reference.py under torchrun: the shared reference's model
                   and step (transformers model, padded vocabulary, SDPA, loss inside the compiled code,
                   AdamW(fused=True), clipping at 1.0, data on the device, no host synchronisation in the timed
                   steps), `model.compile()` then DistributedDataParallel (PyTorch's recommended order; dynamo's
                   DDPOptimizer splits the graph at the gradient buckets), gradient_as_bucket_view, 100 MB
                   buckets (--ddp_bucket_mb; torchtitan's choice), bf16 autocast
  fsdp2            FSDP2 (`fully_shard`) as torchtitan applies it: each decoder block torch.compile'd, then
                   sharded, then the root; MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32);
                   reshard_after_forward=True (ZeRO-3-like); the LM head and loss compiled as one function
  fsdp2_noreshard  the same with reshard_after_forward=False (ZeRO-2-like): FSDP2's best where its hooks,
                   not the GPU, set the pace (GPT-2 d24 at batch 8 on 2 H200s: 63K tok/s per GPU against
                   30K with resharding; Llama-1B's larger blocks hide them)

and the one-GPU baselines of the scaling efficiency, on GPU 0 of the same machine:

  anvil_1gpu       plain `anvil train` (no launch, no DeepSpeed config), same flags and per-GPU batch
  compile_1gpu     the single-GPU reference of decoder_speed.py (torch.compile(model), autocast), the
                   baseline of both DDP and FSDP2

Each attempt is a fresh process (a fresh torchrun or `anvil launch` job) at one per-GPU micro-batch; the
batch lists (--batches; by default llama-1b 8,4 and d24 16,8) are searched as decoder_speed.py does:
`--search largest` (default) keeps the largest that fits, `best` goes on down while faster, `all` runs every
batch that fits (PyTorch at several memory levels). Only an out-of-memory failure moves on to a smaller batch.

Measured per attempt: tokens/s per GPU (the world's tokens over the timed steps' time, divided by the number
of GPUs; Anvil: rank 0's metrics.jsonl, whose tokens_per_second counts the world; PyTorch: the slowest rank's
time between its two synchronisations), ms/step, MFU per GPU (decoder_speed.py's 6N + 12LCT against
--peak_flops), the NVML peak memory per GPU (the parent polls every GPU of the machine, bench/benchlib/child.py
MultiMeter, the same for every system; the figure is the largest over the GPUs, each GPU's is kept) next to
each side's own figure (Anvil's summary peak of rank 0; PyTorch's largest torch.cuda.max_memory_reserved over
the ranks). Derived in the report:

  scaling          tokens/s per GPU on N GPUs / tokens/s of the same side's one-GPU baseline at the same
                   per-GPU batch (Anvil: anvil_1gpu; DDP and FSDP2: compile_1gpu). Targets: >= 95% for Anvil
                   stages 0-2, >= 90% for stage 3.
  memory levels    on an Anvil row, its tokens/s per GPU over the fastest PyTorch run (DDP or FSDP2, same N)
                   that uses no more memory per GPU; on a PyTorch row, the fastest Anvil run (any stage) that
                   uses no more memory per GPU than it, over it. Target: Anvil >= 1.25x PyTorch's best at each
                   memory level, with memory <= theirs (every PyTorch row's ratio >= 1.25).

What is not symmetric: as in decoder_speed.py, to Anvil's cost, Anvil synchronises with the device once per
step and reads its batches from a shard on the host, the reference never synchronises in the timed steps and
its data sits on the device. FSDP2 computes with bf16 parameters (its MixedPrecisionPolicy, autocast off, as
torchtitan runs it), DDP and the one-GPU reference with bf16 autocast over fp32 weights. FSDP2's scaling is
taken against the one-GPU torch.compile(model) run (whole model compiled), not against FSDP2 on one GPU.
Every child gets NCCL_NVLS_ENABLE=0 (the machines require NVLink multicast off); the one-GPU baselines run
where CUDA puts device 0.

Results: every attempt goes into the --parts JSON as soon as it finishes; the run ends by writing
bench/results/multi_gpu_speed_<device>_<date>_<commit>.json and .txt (--out; the .txt ends with a Markdown
table). --time_budget stops it from starting a process that would not finish in that many seconds (its
expected time: the same kind of process's wall time earlier in this run, else a rough H100 figure) and caps
each process's timeout at what is left, so that one device call (600 s at most) comes back with its parts
and results. Parts of several calls (one model, or some systems, per call) are joined with --report, which
runs nothing and needs no GPU; --dry_run prints the command lines it would run. On a 2-GPU machine, from
the repository root (after scripts/pack_for_gpu.sh on the build machine), Llama-1B in one call:

    source scripts/gpu_env.sh
    python3 bench/multi_gpu_speed.py --anvil build-cuda/anvil --models llama-1b --batches 8 \\
        --parts $OUT/parts_llama.json --out $OUT --time_budget 520

then d24 (--models d24 --parts $OUT/parts_d24.json), PyTorch at its lower memory levels (--systems
fsdp2,ddp --search all), 4 GPUs where lent (--nproc 4, or --nproc 2,4), and anywhere:

    python3 bench/multi_gpu_speed.py --report parts_llama.json parts_d24.json ... --out bench/results
"""
import argparse
import json
import os
import re
import shlex
import socket
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib import anvil_train, torch_reference  # noqa: E402
from benchlib import torch_distributed_reference as tdr  # noqa: E402
from benchlib.child import MultiMeter  # noqa: E402
from benchlib.nvml import GpuMemory, gpu_count  # noqa: E402
from benchlib.results import RESULTS, git_commit, result_path, utc_now  # noqa: E402
from decoder_speed import H100_BF16_PEAK, MODELS, anvil_flags  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20

# Per-GPU micro-batches tried, largest first. Llama-1B on one H200 (issue 28): torch.compile's best was 8
# (51.1 GiB), 4 at 33.7 GiB; FSDP2 on 2 H200s (issue 29) 8 at 53.8 GiB, 4 at 30.7 GiB; Anvil 8 at 43 GiB on an
# H100 (decoder_speed). Other models of decoder_speed.py keep its lists.
DEFAULT_BATCHES = {"llama-1b": [8, 4], "d24": [16, 8], "llama-8b": [4, 2]}
DEFAULT_MODELS = ("llama-1b", "d24")

# The PyTorch systems on N GPUs and their wrapping (torch_distributed_reference.make_spec).
TORCH_SYSTEMS = {"ddp": dict(parallel="ddp"),
                 "fsdp2": dict(parallel="fsdp2", reshard_after_forward=True),
                 "fsdp2_noreshard": dict(parallel="fsdp2", reshard_after_forward=False)}
BASELINES = {"anvil_1gpu": "anvil", "compile_1gpu": "compile"}  # system -> its row label on one GPU
SYSTEMS = ("anvil", *TORCH_SYSTEMS, *BASELINES)
DEFAULT_SYSTEMS = ("anvil", "anvil_1gpu", "fsdp2", "fsdp2_noreshard", "ddp", "compile_1gpu")  # run in this order
SPEED_TARGET = 1.25
SCALING_TARGET = {0: 0.95, 1: 0.95, 2: 0.95, 3: 0.90}

# Rough wall time (s) of one process, Llama-1B at batch 8 (process start, model build, compile, 20 steps,
# exit), for --time_budget until this run has timed its own: Anvil 71 s and torch.compile 86 s on one H100
# (decoder_speed, 2026-11-27); on 2 H200s (13 steps, warm compile caches) FSDP2 39 s and DDP 61 s, and DDP on
# GPT-2 d24 with cold caches 82 s: those two are taken at about 1.5x.
EXPECTED_WALL = {"anvil": 75, "compile": 95, "ddp": 100, "fsdp2": 60}
BUDGET_SLACK = 15  # s a process may run past --time_budget before it is stopped


# --- what runs --------------------------------------------------------------------------------------------

class Job:
    """One system of one model on `nproc` GPUs (an Anvil ZeRO stage, a PyTorch wrapping or a one-GPU
    baseline), whose batches are searched. `label` names its rows: anvil_zero<S>, ddp, fsdp2...; the
    baselines anvil and compile."""

    def __init__(self, model, system, nproc, stage=None, comm="", grads=""):
        self.model, self.system, self.nproc, self.stage, self.comm = model, system, nproc, stage, comm
        self.grads = grads
        if system == "anvil":
            self.label = f"anvil_zero{stage}" + (f"_{comm}comm" if comm else "") + (f"_{grads}grads" if grads else "")
            self.kind = "anvil"
        elif system in BASELINES:
            self.label = BASELINES[system]
            self.kind = "anvil" if system == "anvil_1gpu" else "compile"
        else:
            self.label, self.kind = system, TORCH_SYSTEMS[system]["parallel"]

    @property
    def key(self):
        return f"{self.model}/{self.label}/{self.nproc}gpu"


def jobs_of(args):
    out = []
    for model in args.model_list:
        for system in args.system_list:
            if system in BASELINES:
                out.append(Job(model, system, 1))
                continue
            for n in args.nproc_list:
                if system == "anvil":
                    out += [Job(model, system, n, s, c, g) for s in args.stage_list for c in args.comm_list
                            for g in args.grads_list if not g or s >= 2]
                else:
                    out.append(Job(model, system, n))
    return out


def child_env():
    """Every child's environment: this one's, with NVLink multicast off (the machines require it)."""
    env = dict(os.environ)
    env["NCCL_NVLS_ENABLE"] = "0"
    return env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def deepspeed_config(workdir, stage, comm=""):
    path = Path(workdir) / (f"ds_zero{stage}" + (f"_{comm}comm" if comm else "") + ".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    ds = {"zero_optimization": {"stage": stage}}
    if comm:
        ds["communication_data_type"] = comm
    path.write_text(json.dumps(ds) + "\n")
    return path


def prepare(args, job, batch):
    """What an attempt runs: (work folder, command line, a description for --dry_run, a function that runs
    it under a meter with a timeout)."""
    m, seq = MODELS[job.model], args.seq_of(job.model)
    work = Path(args.workdir) / f"{job.model}_{job.label}_{job.nproc}gpu_b{batch}"
    steps = args.warmup + args.steps
    env = child_env()
    if job.kind == "anvil":
        flags = anvil_flags(m, batch, seq, steps, args.peak_flops, args.workdir)
        launch, note = None, "plain anvil train on one GPU"
        if job.system == "anvil":
            ds = deepspeed_config(args.workdir, job.stage, job.comm)
            flags += ["--deepspeed", ds] + (["--backward_grad_dtype", job.grads] if job.grads else [])
            launch = ["--nproc_per_node", job.nproc, "--master_port", args.master_port or free_port()]
            note = f"{ds}: {ds.read_text().strip()}".replace("\n", " ")
        cmd = anvil_train.command(args.anvil, flags, work, launch)
        return work, cmd, note, lambda meter, timeout: anvil_train.run(
            args.anvil, flags, work, meter, warmup=args.warmup, timeout=timeout, env=env, launch=launch)
    if job.kind == "compile":
        spec = torch_reference.make_spec(m.family, m.ref_config, batch, seq, compile=True, precision="bf16",
                                         steps=args.steps, warmup=args.warmup)
        cmd = [sys.executable, "-u", str(Path(torch_reference.__file__).resolve()), "--spec",
               str(work / "spec.json"), "--result", str(work / "result.json")]
        note = (f"single-GPU reference: torch.compile(model), {spec['precision']} autocast, batch {batch}, seq "
                f"{seq}, {args.warmup} + {args.steps} steps")
        return work, cmd, note, lambda meter, timeout: torch_reference.run(spec, work, meter, timeout=timeout,
                                                                           env=env)
    spec = tdr.make_spec(m.family, m.ref_config, batch, seq, steps=args.steps, warmup=args.warmup,
                         bucket_cap_mb=args.ddp_bucket_mb, static_graph=args.ddp_static_graph,
                         autocast=True if args.fsdp2_autocast and job.kind == "fsdp2" else None,
                         **TORCH_SYSTEMS[job.system])
    cmd = tdr.command(work / "spec.json", work / "result.json", job.nproc)
    note = (f"{tdr.system_name(spec)}: compile {spec['compile']}, autocast {spec['autocast']}"
            + (f", bucket_cap_mb {spec['bucket_cap_mb']}, static_graph {spec['static_graph']}"
               if spec["parallel"] == "ddp" else f", reshard_after_forward {spec['reshard_after_forward']}")
            + f", batch {batch} per GPU, seq {seq}, {args.warmup} + {args.steps} steps")
    return work, cmd, note, lambda meter, timeout: tdr.run(spec, job.nproc, work, meter, timeout=timeout, env=env)


REFUSAL = re.compile(r"(zero|stage)[^|]*(not supported|unsupported)|(not supported|unsupported)[^|]*(zero|stage)",
                     re.IGNORECASE)


def run_one(args, meter, job, batch, timeout):
    _, _, _, go = prepare(args, job, batch)
    r = go(meter, timeout)
    r["system"], r["label"], r["nproc"], r["batch"], r["seq"] = job.system, job.label, job.nproc, batch, \
        args.seq_of(job.model)
    if job.stage is not None:
        r["zero_stage"] = job.stage
        if job.comm:
            r["communication_data_type"] = job.comm
        if job.grads:
            r["backward_grad_dtype"] = job.grads
    r["machine"] = args.machine
    if job.kind == "anvil":
        summary = r.pop("summary", None) or {}
        r.pop("losses", None)
        r["own_peak_bytes"] = r.get("self_reported_peak_bytes")
        r["anvil_world_size"] = summary.get("world_size")
        if "error" not in r and summary.get("world_size") not in (None, job.nproc):
            r["warning"] = f"summary.json says world_size {summary.get('world_size')}, launched {job.nproc}"
        if "error" in r and not r.get("oom") and not r["process"]["timed_out"] and REFUSAL.search(r["error"]):
            r["unsupported"] = True
            r["error"] = "not supported by this build: " + r["error"]
    else:
        r["own_peak_bytes"] = r.get("torch_max_memory_reserved")
    mem = r["process"]["memory"]
    r["nvml_peak_bytes"] = int((mem.get("peak_mib") or 0) * MIB) or None  # the largest over the GPUs
    if mem.get("per_gpu"):
        r["nvml_peak_bytes_per_gpu"] = {str(e["index"]): int((e.get("peak_mib") or 0) * MIB)
                                        for e in mem["per_gpu"]}
    if "tokens_per_second" in r and "error" not in r:
        r["tokens_per_second_per_gpu"] = r["tokens_per_second"] / job.nproc
    return r


def budget(args, job):
    """(may it start, its timeout) under --time_budget."""
    if not args.time_budget:
        return True, args.timeout
    elapsed = time.time() - args.t_start
    expected = args.walls.get((job.model, job.kind), EXPECTED_WALL[job.kind])
    left = args.time_budget - elapsed
    if expected > left:
        return False, 0
    return True, min(args.timeout, left + BUDGET_SLACK)


def search(args, meter, job, record, save):
    attempts = record["runs"].setdefault(job.key, [])
    fits = []
    for batch in args.batch_list(job.model):
        ok, timeout = budget(args, job)
        if not ok:
            record["not_run"].append(f"{job.key} batch {batch} (time budget)")
            save()
            return
        r = run_one(args, meter, job, batch, timeout)
        attempts.append(r)
        if "error" not in r:
            key = (job.model, job.kind)
            args.walls[key] = max(args.walls.get(key, 0), r["process"]["wall_seconds"])
        save()
        print(f"[{time.time() - args.t_start:5.0f}s] {job.key} batch {batch}: " +
              (r["error"][:200] if "error" in r else
               f"{r['tokens_per_second_per_gpu']:.0f} tok/s per GPU, {r['ms_per_step']:.1f} ms/step, NVML peak "
               f"{(r['nvml_peak_bytes'] or 0) / GIB:.2f} GiB per GPU ({r['process']['wall_seconds']:.0f} s)"),
              flush=True)
        if "error" in r:
            if r.get("oom"):
                continue  # a smaller batch may fit
            break  # refused, crashed or timed out: a smaller batch would not change that
        fits.append(r)
        if args.search == "largest":
            break
        if args.search == "best" and len(fits) >= 2 and \
                fits[-1]["tokens_per_second"] <= fits[-2]["tokens_per_second"]:
            break
    record["done"].append(job.key)
    save()


def dry_run(args):
    jobs = jobs_of(args)
    print(f"dry run: {len(jobs)} systems x their batches; every child's environment has NCCL_NVLS_ENABLE=0")
    for job in jobs:
        for batch in args.batch_list(job.model):
            work, cmd, note, _ = prepare(args, job, batch)
            print(f"\n# {job.key} batch {batch} (work {work})\n#   {note}")
            print(shlex.join(map(str, cmd)))


# --- reporting -------------------------------------------------------------------------------------------

def fmt_k(x):
    return f"{x / 1000:.1f}K"


def gib(b):
    return (b or 0) / GIB


def row_name(r):
    if r["label"].startswith("anvil_zero"):
        comm, grads = r.get("communication_data_type"), r.get("backward_grad_dtype")
        return f"anvil zero {r['zero_stage']}" + (f", {comm} comm" if comm else "") + (f", {grads} grads" if grads else "")
    return r["label"]


def join_parts(parts):
    first = parts[0]
    for p in parts[1:]:
        if p["meta"]["device"] != first["meta"]["device"]:
            sys.exit(f"parts from different devices: {first['meta']['device']} and {p['meta']['device']}")
        for k in ("steps", "warmup", "peak_flops"):
            if p["settings"][k] != first["settings"][k]:
                sys.exit(f"parts with different settings: {k} {first['settings'][k]} and {p['settings'][k]}")
    runs, done, not_run = {}, set(), []
    for p in parts:
        for k, v in p["runs"].items():
            runs.setdefault(k, []).extend(v)
        done.update(p["done"])
        not_run += p["not_run"]
    ran = {f"{k} batch {r['batch']}" for k, v in runs.items() for r in v}  # skipped in one part, run in another
    not_run = [x for x in dict.fromkeys(not_run) if x.split(" (")[0] not in ran]
    return runs, done, not_run


def report(parts, args):
    """Joins parts, prints the tables and the targets, writes the results JSON and .txt."""
    runs, done, not_run = join_parts(parts)
    first = parts[0]
    st, meta = first["settings"], first["meta"]
    commits = sorted({p["meta"]["commit"] for p in parts})
    machines = sorted({f"{p['meta'].get('machine')}" for p in parts})
    peak_flops = st["peak_flops"]
    lines = [f"Multi-GPU training speed, bf16, random tokens; {meta['device']} ({', '.join(machines)}), commit(s) "
             f"{', '.join(c[:7] for c in commits)}, {meta['date'][:10]}; {st['warmup']} warm-up + {st['steps']} "
             f"timed steps; tokens/s and MFU per GPU (MFU against {peak_flops / 1e12:.1f} TFLOP/s); memory: NVML "
             f"peak per GPU, the largest over the GPUs (own figure: Anvil's summary peak of rank 0, torch "
             f"max_memory_reserved of the ranks); scaling: against the same side's one-GPU run at the same batch"]
    results, targets, md = [], [], []

    def ok_runs(key):
        return [r for r in runs.get(key, []) if "error" not in r]

    models = [m for m in MODELS if any(k.startswith(f"{m}/") for k in runs)]
    for model in models:
        mdl = MODELS[model]
        keys = [k for k in runs if k.startswith(f"{model}/")]
        worlds = sorted({int(k.split("/")[-1][:-3]) for k in keys} - {1})
        base = {lab: ok_runs(f"{model}/{lab}/1gpu") for lab in BASELINES.values()}
        for r in [*base["anvil"], *base["compile"]]:
            r["tokens_per_second_per_gpu"] = r["tokens_per_second"]
            r["mfu"] = r["tokens_per_second"] * mdl.flops_per_token(r["seq"]) / peak_flops

        def baseline(r):
            cands = [b for b in base["anvil" if r["label"].startswith("anvil") else "compile"]
                     if b["batch"] == r["batch"]]
            same = [b for b in cands if b.get("machine") == r.get("machine")]
            pick = same or cands
            return max(pick, key=lambda b: b["tokens_per_second"]) if pick else None

        for n in worlds:
            keys_n = sorted((k for k in keys if k.endswith(f"/{n}gpu")),
                            key=lambda k: (0 if "/anvil_zero" in k else 1, k))
            rows = [r for k in keys_n for r in ok_runs(k)]
            seq = rows[0]["seq"] if rows else args_seq(st, model)
            lines.append(f"\n{mdl.label}, sequence {seq}, {n} GPUs:")
            lines.append(f"  {'system':24} {'batch':>5} {'tok/s/GPU':>10} {'ms/step':>8} {'MFU':>6} "
                         f"{'peak/GPU':>9} {'own':>8} {'scaling':>8}  memory levels")
            anvil_rows = [r for r in rows if r["label"].startswith("anvil_zero")]
            torch_rows = [r for r in rows if not r["label"].startswith("anvil_zero")]
            for r in rows:
                r["mfu"] = r["tokens_per_second_per_gpu"] * mdl.flops_per_token(r["seq"]) / peak_flops
                b = baseline(r)
                r["scaling"] = r["tokens_per_second_per_gpu"] / b["tokens_per_second"] if b else None
                r["scaling_baseline"] = (f"{b['label']} 1 GPU batch {b['batch']}"
                                         + ("" if b.get("machine") == r.get("machine") else " (another machine)")
                                         if b else None)
                mem = r.get("nvml_peak_bytes")
                if r["label"].startswith("anvil_zero"):
                    c = [t for t in torch_rows if mem and t.get("nvml_peak_bytes") and t["nvml_peak_bytes"] <= mem]
                    best = max(c, key=lambda t: t["tokens_per_second_per_gpu"]) if c else None
                    r["vs_best_pytorch_at_or_below_memory"] = (
                        {"ratio": r["tokens_per_second_per_gpu"] / best["tokens_per_second_per_gpu"],
                         "against": f"{row_name(best)} batch {best['batch']}"} if best else None)
                    r["memory_note"] = (f"{r['vs_best_pytorch_at_or_below_memory']['ratio']:.2f}x "
                                        f"{row_name(best)} B{best['batch']}" if best else
                                        (f"no PyTorch run at <= {gib(mem):.1f} GiB" if torch_rows else ""))
                else:
                    c = [a for a in anvil_rows if mem and a.get("nvml_peak_bytes") and a["nvml_peak_bytes"] <= mem]
                    best = max(c, key=lambda a: a["tokens_per_second_per_gpu"]) if c else None
                    ratio = best["tokens_per_second_per_gpu"] / r["tokens_per_second_per_gpu"] if best else None
                    r["best_anvil_at_or_below_memory"] = (
                        {"ratio": ratio, "anvil": f"{row_name(best)} batch {best['batch']}"} if best else None)
                    r["memory_note"] = (f"Anvil {ratio:.2f}x ({row_name(best)} B{best['batch']})" if best else
                                        (f"no Anvil run at <= {gib(mem):.1f} GiB" if anvil_rows else ""))
                    if anvil_rows:  # (no target line when this part has no Anvil run to judge)
                        targets.append({"model": model, "nproc": n, "target": f"Anvil >= {SPEED_TARGET}x "
                                        f"{row_name(r)} batch {r['batch']} at <= {gib(mem):.1f} GiB per GPU",
                                        "value": ratio, "met": bool(ratio and ratio >= SPEED_TARGET),
                                        "anvil": r["best_anvil_at_or_below_memory"]})
                sc = f"{100 * r['scaling']:.1f}%" if r["scaling"] else "-"
                lines.append(f"  {row_name(r):24} {r['batch']:5d} {r['tokens_per_second_per_gpu']:10.0f} "
                             f"{r['ms_per_step']:8.1f} {100 * r['mfu']:5.1f}% {gib(mem):7.2f} G "
                             f"{gib(r.get('own_peak_bytes')):6.2f} G {sc:>8}  {r['memory_note']}"
                             + (f"  [{r['warning']}]" if r.get("warning") else ""))
                results.append({"model": model, "nproc": n, **{k: v for k, v in r.items() if k != "process"},
                                "nvml_peak_bytes_per_gpu": r.get("nvml_peak_bytes_per_gpu")})
                md.append(f"| {mdl.label}, seq {r['seq']} | {n} | {row_name(r)} | {r['batch']} | "
                          f"{fmt_k(r['tokens_per_second_per_gpu'])} | {gib(mem):.1f} | "
                          f"{sc if r['scaling'] else '-'} | {r['memory_note'] or '-'} |")
            for k in keys_n:  # systems with no run that finished: why
                if not ok_runs(k) and runs.get(k):
                    errs = "; ".join(f"B{a['batch']}: {a['error'][:150]}" for a in runs[k])
                    name = k.split("/")[1].replace("anvil_zero", "anvil zero ")
                    lines.append(f"  {name:24} no batch ran: {errs}")
                    if all(a.get("unsupported") for a in runs[k]):
                        md.append(f"| {mdl.label} | {n} | {name} | - | not supported by this build | - | - | - |")
            for r in anvil_rows:
                stage = r.get("zero_stage")
                if stage in SCALING_TARGET and r["scaling"]:
                    targets.append({"model": model, "nproc": n, "target": f"anvil zero {stage} batch {r['batch']} "
                                    f"scaling >= {100 * SCALING_TARGET[stage]:.0f}%", "value": r["scaling"],
                                    "met": r["scaling"] >= SCALING_TARGET[stage]})
        one = [r for lab in ("anvil", "compile") for r in base[lab]]
        if one:
            lines.append(f"\n{mdl.label}, one GPU of the same machine (the scaling baselines):")
            for r in one:
                lines.append(f"  {r['label']:24} {r['batch']:5d} {r['tokens_per_second']:10.0f} {r['ms_per_step']:8.1f} "
                             f"{100 * r['mfu']:5.1f}% {gib(r.get('nvml_peak_bytes')):7.2f} G "
                             f"{gib(r.get('own_peak_bytes')):6.2f} G")
                results.append({"model": model, "nproc": 1, **{k: v for k, v in r.items() if k != "process"}})
                md.append(f"| {mdl.label}, seq {r['seq']} | 1 | {r['label']} (baseline) | {r['batch']} | "
                          f"{fmt_k(r['tokens_per_second'])} | {gib(r.get('nvml_peak_bytes')):.1f} | - | - |")
        for lab in ("anvil", "compile"):
            k = f"{model}/{lab}/1gpu"
            if runs.get(k) and not ok_runs(k):
                lines.append(f"  {lab:24} (1 GPU) no batch ran: "
                             + "; ".join(f"B{a['batch']}: {a['error'][:150]}" for a in runs[k]))
    if targets:
        lines.append("\nTargets (issue 29):")
        for t in targets:
            v = t["value"]
            val = "-" if v is None else (f"{100 * v:.1f}%" if "scaling" in t["target"] else f"{v:.2f}x")
            lines.append(f"  {'met    ' if t['met'] else 'NOT met'}  {t['model']}, {t['nproc']} GPUs: "
                         f"{t['target']}: {val}")
    if md:
        lines += ["", "Markdown:", "",
                  "| model | GPUs | system | batch per GPU | tok/s per GPU | peak GiB per GPU | scaling | memory "
                  "levels: Anvil / fastest PyTorch at <= this memory; on PyTorch rows, fastest Anvil at <= "
                  "its memory / it |",
                  "|---|---|---|---|---|---|---|---|", *md]
    if not_run:
        lines.append(f"\nnot run: {', '.join(not_run)}")
    text = "\n".join(lines)
    print(text)
    record = {"benchmark": "multi_gpu_speed", "device": meta["device"], "driver": meta.get("driver"),
              "machines": machines, "commit": commits[0] if len(commits) == 1 else commits, "date": meta["date"],
              "settings": st, "memory_method": meta["memory_method"], "torch": meta.get("torch"),
              "targets": {"speed_at_memory_level": SPEED_TARGET,
                          "scaling": {f"zero{s}": v for s, v in SCALING_TARGET.items()}, "checked": targets},
              "results": results, "runs": runs, "search_done": sorted(done), "not_run": not_run}
    path = result_path("multi_gpu_speed", meta["device"], meta["date"], commits[0], directory=args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    path.with_suffix(".txt").write_text(text + "\n")
    print(f"saved {path} and {path.with_suffix('.txt')}")


def args_seq(settings, model):
    return settings.get("seq", {}).get(model, MODELS[model].seq)


# --- main ------------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anvil", default="build-cuda/anvil", help="the anvil binary (CUDA build)")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"comma-separated, from {','.join(MODELS)}")
    ap.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                    help=f"comma-separated, run in this order, from {','.join(SYSTEMS)}")
    ap.add_argument("--anvil_stages", default="0,1,2,3", help="ZeRO stages of the anvil system")
    ap.add_argument("--anvil_comm", default="",
                    help="communication_data_type of the anvil runs, comma-separated (e.g. ',bf16': the "
                         "gradients' own type and bf16); empty: the gradients' own")
    ap.add_argument("--anvil_grads", default="",
                    help="backward_grad_dtype of the anvil runs of stages 2-3, comma-separated (e.g. ',bf16'); "
                         "empty: the gradients' own type")
    ap.add_argument("--nproc", default="2", help="GPUs per multi-GPU run, comma-separated (e.g. 2,4); 'all': "
                                                "every GPU of the machine")
    ap.add_argument("--batches", default="",
                    help="per-GPU micro-batches for every model, largest first (default per model: "
                         + "; ".join(f"{m} {','.join(map(str, DEFAULT_BATCHES.get(m, v.batches)))}"
                                     for m, v in MODELS.items()) + ")")
    ap.add_argument("--search", choices=("largest", "best", "all"), default="largest")
    ap.add_argument("--seq", type=int, default=0, help="sequence length of every model (default: the model's)")
    ap.add_argument("--steps", type=int, default=15, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    ap.add_argument("--peak_flops", type=float, default=H100_BF16_PEAK, help="per GPU, for MFU")
    ap.add_argument("--ddp_bucket_mb", type=float, default=100, help="DDP bucket_cap_mb")
    ap.add_argument("--ddp_static_graph", action="store_true", help="DDP static_graph=True")
    ap.add_argument("--fsdp2_autocast", action="store_true",
                    help="bf16 autocast under FSDP2 too (default: its MixedPrecisionPolicy alone)")
    ap.add_argument("--master_port", type=int, default=0, help="anvil launch's port (0: a free one each run)")
    ap.add_argument("--timeout", type=float, default=420, help="per-process limit (s)")
    ap.add_argument("--time_budget", type=float, default=0,
                    help="start no process that is not expected to finish within this many seconds of the "
                         "start, and stop any at it (+15 s) (0: no limit)")
    ap.add_argument("--parts", default="/tmp/anvil_multi_gpu_speed/parts.json",
                    help="JSON that collects every attempt of this run as it finishes")
    ap.add_argument("--workdir", default="/tmp/anvil_multi_gpu_speed")
    ap.add_argument("--out", default=str(RESULTS), help="where the results JSON and .txt go")
    ap.add_argument("--report", nargs="+", metavar="PARTS",
                    help="join these parts files into one results file; runs nothing")
    ap.add_argument("--dry_run", action="store_true", help="print the command lines; run nothing")
    args = ap.parse_args()
    if args.report:
        return report([json.loads(Path(p).read_text()) for p in args.report], args)

    args.model_list = [m for m in args.models.split(",") if m]
    args.system_list = [s for s in args.systems.split(",") if s]
    if set(args.model_list) - set(MODELS) or set(args.system_list) - set(SYSTEMS):
        ap.error(f"--models from {list(MODELS)}, --systems from {list(SYSTEMS)}")
    try:
        args.stage_list = [int(s) for s in args.anvil_stages.split(",") if s]
    except ValueError:
        ap.error("--anvil_stages: comma-separated integers 0..3")
    if set(args.stage_list) - {0, 1, 2, 3}:
        ap.error("--anvil_stages: stages 0..3")
    args.comm_list = [c for c in args.anvil_comm.split(",")] if args.anvil_comm else [""]
    args.grads_list = [g for g in args.anvil_grads.split(",")] if args.anvil_grads else [""]
    if set(args.grads_list) - {"", "bf16", "fp16"}:
        ap.error("--anvil_grads: comma-separated bf16, fp16 (or empty for the gradients' own type)")
    if set(args.comm_list) - {"", "fp32", "bf16", "fp16"}:
        ap.error("--anvil_comm: comma-separated fp32, bf16, fp16 (or empty for the gradients' own type)")
    override = [int(b) for b in args.batches.split(",") if b]
    args.batch_list = lambda m: sorted(override or DEFAULT_BATCHES.get(m, MODELS[m].batches), reverse=True)
    args.seq_of = lambda m: args.seq or MODELS[m].seq
    args.t_start, args.walls = time.time(), {}
    n_gpus = gpu_count()
    if args.nproc == "all":
        args.nproc_list = [max(2, n_gpus)]
    else:
        try:
            args.nproc_list = [int(n) for n in args.nproc.split(",") if n]
        except ValueError:
            ap.error("--nproc: comma-separated GPU counts, or 'all'")
    if any(n < 2 for n in args.nproc_list):
        ap.error("--nproc: 2 or more (the one-GPU runs are the systems anvil_1gpu and compile_1gpu)")
    args.machine = f"{socket.gethostname()}/{n_gpus}gpu"
    if args.dry_run:
        return dry_run(args)

    uses_anvil = any(s in ("anvil", "anvil_1gpu") for s in args.system_list)
    if uses_anvil and not Path(args.anvil).is_file():
        ap.error(f"{args.anvil}: no anvil binary (give --anvil)")
    if n_gpus == 0:
        sys.exit("no GPU visible to NVML: this benchmark runs on the GPU machine")
    meter = MultiMeter([GpuMemory(i) for i in range(n_gpus)])
    if not meter.gpu.available:
        sys.exit(f"no GPU visible to NVML ({meter.gpu.error}): this benchmark runs on the GPU machine")
    commit, commit_source = git_commit()
    record = {"meta": {"device": meter.gpu.name(), "driver": meter.gpu.driver_version(), "commit": commit,
                       "commit_source": commit_source, "date": utc_now().isoformat(timespec="seconds"),
                       "memory_method": meter.describe(), "gpu_count": n_gpus, "machine": args.machine},
              "settings": {"seq": {m: args.seq_of(m) for m in args.model_list}, "steps": args.steps,
                           "warmup": args.warmup, "peak_flops": args.peak_flops, "search": args.search,
                           "anvil": args.anvil, "batches": {m: args.batch_list(m) for m in args.model_list},
                           "nproc": args.nproc_list, "anvil_stages": args.stage_list, "anvil_comm": args.comm_list, "anvil_grads": args.grads_list,
                           "ddp_bucket_mb": args.ddp_bucket_mb, "ddp_static_graph": args.ddp_static_graph,
                           "fsdp2_autocast": args.fsdp2_autocast, "nccl_nvls_enable": "0"},
              "runs": {}, "done": [], "not_run": []}
    parts = Path(args.parts)
    parts.parent.mkdir(parents=True, exist_ok=True)

    def save():
        torch_run = next((r for rs in record["runs"].values() for r in rs if r.get("torch")), None)
        if torch_run:
            record["meta"]["torch"] = {k: torch_run.get(k) for k in ("torch", "transformers", "nccl_version")}
        parts.write_text(json.dumps(record, indent=2) + "\n")

    save()
    print(f"{record['meta']['device']} x {n_gpus}, commit {commit[:7]} ({commit_source}); parts -> {parts}",
          flush=True)
    for job in jobs_of(args):
        if job.nproc > n_gpus:
            record["not_run"].append(f"{job.key} (needs {job.nproc} GPUs, the machine has {n_gpus})")
            save()
            continue
        search(args, meter, job, record, save)
    report([record], args)


if __name__ == "__main__":
    main()
