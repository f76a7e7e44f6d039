#!/usr/bin/env python3
"""The PyTorch / Hugging Face reference side of Anvil's benchmarks, written once (docs/testing.md, DESIGN.md
"Testing and benchmarks": the reference runs at its best, as its users run it).

A run is described by a spec (a JSON-able dict, `make_spec`) and runs in a fresh child process
(`run(spec, work, meter)` from a benchmark; this file is the child's program), so that each batch size gets
a clean process and the parent measures its GPU memory through NVML exactly as it measures Anvil's
(bench/benchlib/child.py). What the reference does, whatever the benchmark:

- The model is a transformers model class built from its config class with random initialisation
  (`FAMILIES`: GPT-2, BERT, Llama, Qwen2; adding one is a line), SDPA attention, and the vocabulary padded to a multiple of 64 (GPT-2:
  50257 -> 50304) as users pad it for the tensor cores.
- The loss is computed inside the model (`model(input_ids=..., labels=...)`), so under `compile` it is
  inside the compiled graph: `torch.compile(model)` (default mode), called with the labels.
- Precision: fp32 (TF32 off), tf32, bf16 or fp16 autocast over fp32 weights (fp16 with GradScaler), as
  HF Trainer's `bf16` / `fp16` and Anvil's `--bf16` / `--fp16` run.
- Optimizer: `torch.optim.AdamW(fused=True)` (or bitsandbytes' AdamW8bit); weight decay, when set, only on
  matrices and embeddings; gradient clipping (1.0 by default, as HF Trainer and Anvil).
- The data is made once on the device before the first step: every step's batch (random tokens, or random
  windows of an Anvil token shard) sits in one device tensor.
- Timing: `warmup` steps first (the first one compiles), then one `torch.cuda.synchronize()` before and one
  after the `steps` timed steps. No host synchronisation inside the timed loop: the step losses go into a
  device tensor read after the clock stops (fp16's GradScaler is the exception users also pay: it reads the
  overflow flag on the host each step).

Imports of torch and transformers are inside the child's functions, so benchmarks import this module (to
build specs, start children and report) where torch is not installed.

Child usage (started by `run`): python3 bench/benchlib/torch_reference.py --spec spec.json --result out.json
"""
import argparse
import json
import math
import os
import sys
import time
import traceback
from collections import namedtuple
from pathlib import Path

if __package__:  # imported by a benchmark
    from .shards import read_shard
else:  # run as the child's program: this file's folder is on sys.path
    from shards import read_shard

# A model family: the transformers config class, the model class built from it, and the task, which says
# what the labels are (causal_lm: the input ids, shifted inside the model; classification: one class per
# sequence).
Family = namedtuple("Family", "config_class model_class task")
FAMILIES = {
    "gpt2": Family("GPT2Config", "GPT2LMHeadModel", "causal_lm"),
    "bert": Family("BertConfig", "BertForSequenceClassification", "classification"),
    "llama": Family("LlamaConfig", "LlamaForCausalLM", "causal_lm"),
    "qwen2": Family("Qwen2Config", "Qwen2ForCausalLM", "causal_lm"),
}

# GPT-2 shapes by Anvil's preset names (n_layer, n_head, n_embd): 124M, 350M, 774M, 1.5B.
GPT2_SHAPES = {"d12": (12, 12, 768), "d24": (24, 16, 1024), "d36": (36, 20, 1280), "d48": (48, 25, 1600)}

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


def gpt2_config(shape, vocab_size=50257, n_positions=1024):
    """GPT2Config arguments of an Anvil GPT-2 preset, without dropout (as Anvil's GPT-2), no KV cache."""
    n_layer, n_head, n_embd = GPT2_SHAPES[shape]
    return dict(vocab_size=vocab_size, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)


def padded(vocab_size, multiple):
    return (vocab_size + multiple - 1) // multiple * multiple


def make_spec(family, config, batch, seq, *, compile, precision, steps=10, warmup=3, data=None, lr=3e-4,
              weight_decay=0.0, optimizer="adamw", schedule=None, max_grad_norm=1.0,
              gradient_checkpointing=False, record_losses=False, pad_vocab_to=64, seed=1, lora=None):
    """A reference run. `config`: keyword arguments of the family's config class (vocab_size unpadded);
    `data`: {"kind": "random", "seed": S} (default) or {"kind": "shard", "path": P, "seed": S};
    `schedule`: None (constant learning rate) or {"kind": "cosine", "warmup_steps": W, "total_steps": N}
    (linear warm-up, then cosine to 0 at N); `optimizer`: "adamw" (fused) or "adamw_8bit" (bitsandbytes);
    `lora`: None, or {"r": R, "alpha": A, "target_modules": ...}: PEFT's LoRA on a base held in the 16-bit
    type of `precision` (as PEFT users load it: torch_dtype=bfloat16), adapters in fp32 (PEFT's
    autocast_adapter_dtype), only they train; with "quantization": "nf4" too, QLoRA: the base as
    transformers loads it with BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
    bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=the 16-bit type) (quantize_linears)."""
    assert family in FAMILIES, f"unknown family {family}; known: {sorted(FAMILIES)}"
    assert precision in PRECISIONS, f"precision must be one of {PRECISIONS}"
    assert optimizer in ("adamw", "adamw_8bit")
    assert warmup >= 1 and steps >= 1
    return {"family": family, "config": dict(config), "pad_vocab_to": pad_vocab_to, "batch": batch, "seq": seq,
            "compile": bool(compile), "precision": precision, "steps": steps, "warmup": warmup,
            "data": data or {"kind": "random", "seed": seed}, "optimizer": optimizer, "lr": lr,
            "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": weight_decay, "schedule": schedule,
            "max_grad_norm": max_grad_norm, "gradient_checkpointing": gradient_checkpointing,
            "record_losses": record_losses, "attn_implementation": "sdpa", "seed": seed, "lora": lora}


def system_name(spec):
    """"compile" or "eager": how the reference rows are labelled."""
    return "compile" if spec["compile"] else "eager"


def run(spec, work, meter, timeout=600, python=sys.executable, env=None):
    """Runs one reference spec in a fresh child process, its GPU memory watched by `meter`
    (bench/benchlib/child.py). Returns the child's result (tokens_per_second, ms_per_step, losses, torch's
    own memory figures, versions; or `error`, with `oom` when it ran out of memory) and `process` (wall time
    and the NVML memory: process.memory.peak_mib)."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    spec_path, result_path = work / "spec.json", work / "result.json"
    spec_path.write_text(json.dumps(spec, indent=2))
    result_path.unlink(missing_ok=True)
    cmd = [python, "-u", str(Path(__file__).resolve()), "--spec", str(spec_path), "--result", str(result_path)]
    proc = meter.run(cmd, work / "log.txt", timeout, env=env)
    res = json.loads(result_path.read_text()) if result_path.exists() else {}
    out = {**res, "process": proc}
    if proc["timed_out"]:
        out["error"] = f"timed out after {timeout} s"
    elif "error" not in res and proc["returncode"] != 0:
        out["error"] = f"exit code {proc['returncode']}: " + " | ".join(proc["log_tail"][-3:])
    return out


# --- the child --------------------------------------------------------------------------------------------

def build_model(family, config, pad_vocab_to=64, attn_implementation="sdpa", dtype=None):
    """The family's model from its config class and `config` (vocabulary padded), randomly initialised on the
    CUDA device (in `dtype`, default fp32), in training mode."""
    import torch
    import transformers

    f = FAMILIES[family]
    kwargs = dict(config, vocab_size=padded(config["vocab_size"], pad_vocab_to))
    cfg = getattr(transformers, f.config_class)(**kwargs)
    default = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        with torch.device("cuda"):  # initialised on the device: not timed, but a shorter start-up
            model = getattr(transformers, f.model_class)._from_config(cfg, attn_implementation=attn_implementation)
    finally:
        torch.set_default_dtype(default)
    return model.train()


def quantize_linears(model, kind, compute_dtype):
    """QLoRA's base as transformers loads it with BitsAndBytesConfig(load_in_4bit=True,
    bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute_dtype): every
    Linear of the decoder layers becomes bitsandbytes' Linear4bit holding the weight's NF4 codes (the
    embeddings, norms and LM head stay in the 16-bit type, as transformers keeps lm_head). Returns
    bitsandbytes' version."""
    import bitsandbytes as bnb
    import torch

    # (It always double quantizes, as QLoRA recipes do: Anvil's nf4-dq is the same storage, its nf4 keeps the
    # fp32 absmax.)
    assert kind in ("nf4", "nf4-dq"), f"quantization {kind}: the reference quantizes nf4 only"
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, lin in list(parent.named_children()):
                if not isinstance(lin, torch.nn.Linear):
                    continue
                q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=lin.bias is not None,
                                      compute_dtype=compute_dtype, compress_statistics=True, quant_type="nf4",
                                      device="meta")
                q.weight = bnb.nn.Params4bit(lin.weight.data, requires_grad=False, compress_statistics=True,
                                             quant_type="nf4").to(lin.weight.device)
                if lin.bias is not None:
                    q.bias = torch.nn.Parameter(lin.bias.data, requires_grad=False)
                setattr(parent, name, q)
    torch.cuda.empty_cache()  # the 16-bit matrices are gone: as if loaded quantized
    return bnb.__version__


def _batches(spec, task, vocab, num_labels):
    """Every step's input ids and labels, made on the device before the first step: [steps, B, T] ids."""
    import numpy as np
    import torch

    n, B, T = spec["warmup"] + spec["steps"], spec["batch"], spec["seq"]
    data = spec["data"]
    if data["kind"] == "random":
        g = torch.Generator(device="cuda").manual_seed(data["seed"])
        ids = torch.randint(0, vocab, (n, B, T), device="cuda", generator=g)
    elif data["kind"] == "shard":
        tokens, shard_vocab = read_shard(data["path"])
        assert shard_vocab <= vocab, f"{data['path']}: vocabulary {shard_vocab} > the model's {vocab}"
        rng = np.random.default_rng(data["seed"])
        windows = (len(tokens) - 1) // T
        starts = np.stack([rng.choice(windows, B, replace=False) for _ in range(n)]) * T
        ids = torch.from_numpy(tokens[starts[..., None] + np.arange(T)]).to("cuda")
    else:
        raise ValueError(f"unknown data kind {data['kind']}")
    if task == "causal_lm":
        labels = ids  # the model shifts them: position t predicts token t + 1
    else:
        g = torch.Generator(device="cuda").manual_seed(data["seed"] + 1)
        labels = torch.randint(0, num_labels, (n, B), device="cuda", generator=g)
    return ids, labels


def _optimizer(spec, model):
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    if spec["weight_decay"] > 0:  # decay matrices and embeddings only (biases and norm weights never)
        groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": spec["weight_decay"]},
                  {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    else:
        groups = [{"params": params, "weight_decay": 0.0}]
    kw = dict(lr=spec["lr"], betas=tuple(spec["betas"]), eps=spec["eps"])
    if spec["optimizer"] == "adamw_8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(groups, **kw), f"bitsandbytes {bnb.__version__} AdamW8bit"
    return torch.optim.AdamW(groups, fused=True, **kw), "torch.optim.AdamW(fused=True)"


def _schedule(spec, opt):
    import torch

    s = spec["schedule"]
    if not s:
        return None
    assert s["kind"] == "cosine", f"unknown schedule {s['kind']}"
    warm, total = s["warmup_steps"], s["total_steps"]

    def factor(step):
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def train(spec, result):
    """Builds the model, the data and the optimizer, runs warm-up and timed steps; fills `result`."""
    import torch
    import transformers

    family = FAMILIES[spec["family"]]
    torch.manual_seed(spec["seed"])
    precision = spec["precision"]
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    quantized = (spec.get("lora") or {}).get("quantization")
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    # A quantized base is built in its 16-bit type (its fp32 copy would be most of the process's peak).
    model = build_model(spec["family"], spec["config"], spec["pad_vocab_to"], spec["attn_implementation"],
                        dtype=half if quantized else None)
    if spec["gradient_checkpointing"]:
        model.gradient_checkpointing_enable()
    if spec.get("lora"):
        import peft

        if half is not None:
            model = model.to(half)
        lc = spec["lora"]
        if quantized:
            result["bitsandbytes"] = quantize_linears(model, quantized, half)
        model = peft.get_peft_model(model, peft.LoraConfig(r=lc["r"], lora_alpha=lc["alpha"], lora_dropout=0.0,
                                                           target_modules=lc["target_modules"], bias="none",
                                                           task_type="CAUSAL_LM"))
        result["peft"] = peft.__version__
    ids, labels = _batches(spec, family.task, spec["config"]["vocab_size"], model.config.num_labels)
    opt, opt_name = _optimizer(spec, model)
    sched = _schedule(spec, opt)
    params = [p for p in model.parameters() if p.requires_grad]
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
    forward = torch.compile(model) if spec["compile"] else model
    result.update(torch=torch.__version__, transformers=transformers.__version__,
                  device=torch.cuda.get_device_name(), model_class=family.model_class,
                  padded_vocab_size=model.config.vocab_size, parameters=sum(p.numel() for p in params),
                  attn_implementation=getattr(model.config, "_attn_implementation", None), optimizer=opt_name,
                  float32_matmul_precision=torch.get_float32_matmul_precision())

    n = spec["warmup"] + spec["steps"]
    losses = torch.zeros(n, device="cuda")

    def step(i):
        with torch.autocast("cuda", dtype=amp, enabled=amp is not None):
            loss = forward(input_ids=ids[i], labels=labels[i]).loss
        if scaler:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
        else:
            loss.backward()
        if spec["max_grad_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(params, spec["max_grad_norm"])
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if sched:
            sched.step()
        losses[i] = loss.detach()

    t0 = time.perf_counter()
    step(0)  # under compile: tracing and compiling the forward and backward
    torch.cuda.synchronize()
    result["first_step_seconds"] = time.perf_counter() - t0
    for i in range(1, spec["warmup"]):
        step(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(spec["warmup"], n):
        step(i)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0

    values = losses.tolist()
    tokens = spec["batch"] * spec["seq"] * spec["steps"]
    result.update(tokens_per_second=tokens / seconds, ms_per_step=1000 * seconds / spec["steps"],
                  samples_per_second=spec["batch"] * spec["steps"] / seconds, timed_seconds=seconds,
                  loss_first=values[0], loss_last=values[-1], losses_finite=all(map(math.isfinite, values)),
                  torch_max_memory_allocated=torch.cuda.max_memory_allocated(),
                  torch_max_memory_reserved=torch.cuda.max_memory_reserved())
    if spec["record_losses"]:
        result["losses"] = values
    if scaler:
        result["loss_scale"] = scaler.get_scale()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, help="JSON written by run() (make_spec)")
    ap.add_argument("--result", required=True, help="where to write the result JSON")
    a = ap.parse_args()
    spec = json.loads(Path(a.spec).read_text())
    result = {"system": system_name(spec), "batch": spec["batch"], "seq": spec["seq"], "pid": os.getpid()}
    status = 0
    try:
        train(spec, result)
    except Exception as e:  # reported in the result, not hidden: the parent prints it
        traceback.print_exc()
        result["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        # torch.OutOfMemoryError, or the same wrapped by torch.compile's machinery
        result["oom"] = "out of memory" in str(e).lower() or type(e).__name__ == "OutOfMemoryError"
        status = 1
    Path(a.result).write_text(json.dumps(result, indent=2) + "\n")
    sys.exit(status)


if __name__ == "__main__":
    main()
