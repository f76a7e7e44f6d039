#!/usr/bin/env python3
"""The PyTorch reference on several GPUs: the shared reference's model and training step
(bench/benchlib/torch_reference.py) under DistributedDataParallel or FSDP2, each with torch.compile, in
the processes of one `torchrun --standalone --nproc_per_node N` job (bench/multi_gpu_speed.py).

What it keeps from the single-GPU reference: the transformers model built from its config class with random
initialisation (the same seed on every rank), SDPA attention, the vocabulary padded to a multiple of 64, the
loss computed inside the compiled code, torch.optim.AdamW(fused=True), clipping at 1.0
(torch.nn.utils.clip_grad_norm_, which FSDP2's DTensor parameters support), every step's batch made on the
device before the first step (different random tokens on each rank), warm-up steps, then the timed steps
between two synchronisations with no host synchronisation inside.

The two wrappings, as their users run them at their best:

  ddp     PyTorch's recommended order (docs "Where to apply torch.compile?"): `model.compile()`, then
          `DistributedDataParallel(model, gradient_as_bucket_view=True, bucket_cap_mb=...)`; dynamo's
          DDPOptimizer (torch._dynamo.config.optimize_ddp, on by default) splits the compiled graph at the
          gradient buckets so that their all-reduces overlap the backward. bf16 autocast over fp32 weights,
          as the single-GPU reference. `bucket_cap_mb` 100 by default (torchtitan's; PyTorch's default is 25,
          which splits the graph four times as often); `static_graph` optional.
  fsdp2   `torch.distributed.fsdp.fully_shard` (FSDP2) as torchtitan applies it: each decoder block wrapped
          in torch.compile (per-block compilation, the issue's "blocks compiled") and then sharded, then the
          root; MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), which computes with bf16
          parameters instead of autocast (torchtitan turns autocast off under FSDP; `autocast` in the spec
          turns it on as well); reshard_after_forward True (ZeRO-3-like) or False (parameters kept gathered
          between forward and backward: ZeRO-2-like). The root is a small module around the transformers
          model that runs its base model (embeddings, blocks, final norm) and then the LM head and the
          transformers loss (the model's own `loss_function`) as one torch.compile'd function, so that the
          loss is compiled as in the single-GPU reference.

Every rank measures its own time; the result's time is the slowest rank's. Rank 0 writes the result JSON
(tokens_per_second: the whole world's), with every rank's torch.cuda.max_memory_reserved; a rank that fails
writes `<result>.rank<R>.json` with its error. Each rank writes its PID into `<work>/pids/` so that the
parent can stop workers that outlive torchrun.

Imports of torch and transformers are inside the child's functions, so benchmarks import this module where
torch is not installed.

Child usage (started by `run`): python3 -m torch.distributed.run --standalone --nproc_per_node N
bench/benchlib/torch_distributed_reference.py --spec spec.json --result out.json
"""
import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

if __package__:  # imported by a benchmark
    from . import torch_reference
else:  # run as the child's program: this file's folder is on sys.path
    import torch_reference

PARALLEL = ("ddp", "fsdp2")

# Where each family's decoder blocks are: (base model attribute, blocks attribute of the base model).
BLOCKS = {"gpt2": ("transformer", "h"), "llama": ("model", "layers"), "qwen2": ("model", "layers")}


def make_spec(family, config, batch, seq, *, parallel, steps=15, warmup=5, compile=True, bucket_cap_mb=100,
              static_graph=False, reshard_after_forward=True, autocast=None, seed=1):
    """A distributed reference run: the single-GPU reference's spec (bf16; torch_reference.make_spec) and how
    it is wrapped. `batch` is per GPU. `autocast` None: DDP with autocast, FSDP2 without (its
    MixedPrecisionPolicy casts the parameters)."""
    assert parallel in PARALLEL, f"parallel must be one of {PARALLEL}"
    assert family in BLOCKS, f"no decoder blocks known for family {family}"
    spec = torch_reference.make_spec(family, config, batch, seq, compile=compile, precision="bf16", steps=steps,
                                     warmup=warmup, seed=seed)
    spec.update(parallel=parallel, bucket_cap_mb=bucket_cap_mb, static_graph=bool(static_graph),
                reshard_after_forward=bool(reshard_after_forward),
                autocast=(parallel == "ddp") if autocast is None else bool(autocast))
    return spec


def system_name(spec):
    """ddp, fsdp2 (reshard after forward) or fsdp2_noreshard; "_eager" appended without torch.compile."""
    name = spec["parallel"]
    if name == "fsdp2" and not spec["reshard_after_forward"]:
        name += "_noreshard"
    return name + ("" if spec["compile"] else "_eager")


def command(spec_path, result_path, nproc, python=sys.executable):
    """torchrun (as `python -m torch.distributed.run`, the same program) with this file as each worker."""
    return [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            str(Path(__file__).resolve()), "--spec", str(spec_path), "--result", str(result_path)]


def _worker_pids(work):
    """PIDs the workers wrote that are still this job's workers (their command line names this file)."""
    pids = []
    for f in (Path(work) / "pids").glob("rank*.pid"):
        try:
            pid = int(f.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError):
            continue
        if Path(__file__).name in cmdline:
            pids.append(pid)
    return pids


def run(spec, nproc, work, meter, timeout=600, python=sys.executable, env=None):
    """Runs one distributed spec on `nproc` GPUs as a torchrun job, its GPUs' memory watched by `meter`
    (bench/benchlib/child.py MultiMeter). Returns rank 0's result (tokens_per_second of the world,
    ms_per_step, per-rank torch memory figures, versions; or `error`, with `oom` when a rank ran out of
    memory) and `process` (wall time, NVML memory per GPU)."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    spec_path, result_path = work / "spec.json", work / "result.json"
    spec_path.write_text(json.dumps(spec, indent=2))
    for stale in [result_path, *work.glob("result.json.rank*.json"), *(work / "pids").glob("rank*.pid")]:
        stale.unlink(missing_ok=True)
    cmd = command(spec_path, result_path, nproc, python)
    proc = meter.run(cmd, work / "log.txt", timeout, env=env, kill_also=lambda: _worker_pids(work))
    res = json.loads(result_path.read_text()) if result_path.exists() else {}
    rank_errors = [json.loads(p.read_text()) for p in sorted(work.glob("result.json.rank*.json"))]
    if rank_errors:
        res.setdefault("rank_errors", rank_errors)
        if "error" not in res:
            first = next((e for e in rank_errors if e.get("oom")), rank_errors[0])
            res["error"] = f"rank {first.get('rank')}: {first.get('error')}"
            res["oom"] = any(e.get("oom") for e in rank_errors)
    out = {**res, "process": proc, "command": cmd}
    if proc["timed_out"]:
        out["error"] = f"timed out after {timeout} s"
    elif "error" not in out and proc["returncode"] != 0:
        out["error"] = f"exit code {proc['returncode']}: " + " | ".join(proc["log_tail"][-3:])
        out["oom"] = any("out of memory" in line.lower() for line in proc["log_tail"])
    return out


# --- the child (one per rank) -----------------------------------------------------------------------------

def _root_module(model, family, compile_loss):
    """The FSDP2 root: runs the base model (embeddings, blocks, final norm), then the LM head and the loss
    (the model's own loss_function, as its forward computes it) in one function, compiled when
    `compile_loss`."""
    import torch

    base_attr, _ = BLOCKS[family]
    loss_fn, vocab = model.loss_function, model.config.vocab_size  # looked up once, outside the graph

    def head_loss(head, hidden, labels):
        return loss_fn(logits=head(hidden), labels=labels, vocab_size=vocab)

    head_loss_c = torch.compile(head_loss) if compile_loss else head_loss

    class CausalLMRoot(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids, labels):
            hidden = getattr(self.lm, base_attr)(input_ids=input_ids).last_hidden_state
            return head_loss_c(self.lm.lm_head, hidden, labels)

    return CausalLMRoot(model)


def _nccl_version(torch):
    try:
        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)
    except Exception:  # informative only
        return None


def _dynamo_counters():
    try:
        from torch._dynamo.utils import counters

        return {"unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
                "graph_breaks": int(sum(counters["graph_break"].values()))}
    except Exception:  # private API: informative only
        return {}


def train(spec, result, rank, world, local_rank):
    import torch
    import torch.distributed as dist
    import transformers

    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    family = torch_reference.FAMILIES[spec["family"]]
    assert family.task == "causal_lm", "the distributed reference runs causal LMs"
    torch.manual_seed(spec["seed"])  # the same initial weights on every rank
    torch.set_float32_matmul_precision("highest")
    if spec["compile"]:
        # Each block is compiled on its own (FSDP2): room for one graph per block should dynamo specialise
        # on a block's attributes, instead of falling back to eager after the default 8.
        import torch._dynamo

        n_layers = spec["config"].get("n_layer", spec["config"].get("num_hidden_layers", 0))
        for k in ("recompile_limit", "cache_size_limit", "accumulated_cache_size_limit"):
            if hasattr(torch._dynamo.config, k):
                setattr(torch._dynamo.config, k, max(getattr(torch._dynamo.config, k), 4 * n_layers + 16))
    model = torch_reference.build_model(spec["family"], spec["config"], spec["pad_vocab_to"],
                                        spec["attn_implementation"])
    rank_spec = dict(spec, data=dict(spec["data"], seed=spec["data"]["seed"] + 1000 * rank))
    ids, labels = torch_reference._batches(rank_spec, family.task, spec["config"]["vocab_size"], None)
    parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    padded_vocab = model.config.vocab_size
    attn = getattr(model.config, "_attn_implementation", None)

    if spec["parallel"] == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        if spec["compile"]:
            model.compile()  # before wrapping; DDPOptimizer splits the graph at the buckets
        wrapped = DDP(model, device_ids=[local_rank], gradient_as_bucket_view=True,
                      bucket_cap_mb=spec["bucket_cap_mb"], static_graph=spec["static_graph"])

        def forward(i):
            return wrapped(input_ids=ids[i], labels=labels[i]).loss

        how = (f"DistributedDataParallel(gradient_as_bucket_view=True, bucket_cap_mb={spec['bucket_cap_mb']}, "
               f"static_graph={spec['static_graph']})" + (" around model.compile()" if spec["compile"] else ""))
    else:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        raf = spec["reshard_after_forward"]
        base_attr, blocks_attr = BLOCKS[spec["family"]]
        blocks = getattr(getattr(model, base_attr), blocks_attr)
        for i in range(len(blocks)):
            if spec["compile"]:
                blocks[i] = torch.compile(blocks[i])  # torchtitan's apply_compile, before sharding
            fully_shard(blocks[i], mp_policy=mp, reshard_after_forward=raf)
        wrapped = _root_module(model, spec["family"], spec["compile"])
        fully_shard(wrapped, mp_policy=mp, reshard_after_forward=raf)

        def forward(i):
            return wrapped(ids[i], labels[i])

        how = (f"fully_shard per block{' (each compiled)' if spec['compile'] else ''} and root, "
               f"MixedPrecisionPolicy(bf16 params, fp32 reduce), reshard_after_forward={raf}"
               + (", head + loss compiled" if spec["compile"] else ""))
    torch.cuda.empty_cache()  # the full fp32 model FSDP2 sharded (and nothing else) leaves the cache

    opt, opt_name = torch_reference._optimizer(spec, wrapped)
    params = [p for p in wrapped.parameters() if p.requires_grad]
    amp = torch.bfloat16 if spec["autocast"] else None
    result.update(torch=torch.__version__, transformers=transformers.__version__,
                  device=torch.cuda.get_device_name(), model_class=family.model_class, world_size=world,
                  padded_vocab_size=padded_vocab, parameters=parameters, attn_implementation=attn,
                  optimizer=opt_name, wrapping=how, autocast=spec["autocast"],
                  nccl_nvls_enable=os.environ.get("NCCL_NVLS_ENABLE"),
                  nccl_version=_nccl_version(torch))

    n = spec["warmup"] + spec["steps"]
    losses = torch.zeros(n, device="cuda")

    def step(i):
        with torch.autocast("cuda", dtype=amp, enabled=amp is not None):
            loss = forward(i)
        loss.backward()
        if spec["max_grad_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(params, spec["max_grad_norm"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses[i] = loss.detach()

    t0 = time.perf_counter()
    step(0)  # under compile: tracing and compiling
    torch.cuda.synchronize()
    result["first_step_seconds"] = time.perf_counter() - t0
    for i in range(1, spec["warmup"]):
        step(i)
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(spec["warmup"], n):
        step(i)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0

    mine = torch.tensor([seconds, torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()],
                        dtype=torch.float64, device="cuda")
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    every = [t.tolist() for t in every]
    slowest = max(e[0] for e in every)
    values = losses.tolist()
    tokens = spec["batch"] * spec["seq"] * spec["steps"] * world
    result.update(tokens_per_second=tokens / slowest, ms_per_step=1000 * slowest / spec["steps"],
                  timed_seconds=slowest, rank_timed_seconds=[e[0] for e in every],
                  loss_first=values[0], loss_last=values[-1], losses_finite=all(map(math.isfinite, values)),
                  torch_max_memory_reserved=max(e[1] for e in every),
                  rank_torch_max_memory_reserved=[e[1] for e in every],
                  torch_max_memory_allocated=max(e[2] for e in every), dynamo=_dynamo_counters())
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, help="JSON written by run() (make_spec)")
    ap.add_argument("--result", required=True, help="where rank 0 writes the result JSON")
    a = ap.parse_args()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    spec = json.loads(Path(a.spec).read_text())
    pids = Path(a.spec).parent / "pids"
    pids.mkdir(parents=True, exist_ok=True)
    (pids / f"rank{rank}.pid").write_text(f"{os.getpid()}\n")
    result = {"system": system_name(spec), "batch": spec["batch"], "seq": spec["seq"], "rank": rank,
              "pid": os.getpid()}
    status = 0
    try:
        train(spec, result, rank, world, local_rank)
    except Exception as e:  # reported in the result, not hidden: the parent prints it
        traceback.print_exc()
        result["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        result["oom"] = "out of memory" in str(e).lower() or type(e).__name__ == "OutOfMemoryError"
        status = 1
    if status or rank == 0:
        path = Path(a.result) if status == 0 else Path(f"{a.result}.rank{rank}.json")
        path.write_text(json.dumps(result, indent=2) + "\n")
    sys.exit(status)


if __name__ == "__main__":
    main()
