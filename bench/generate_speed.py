#!/usr/bin/env python3
"""Generation speed: `anvil generate` against transformers' generate(), same GPU, bf16, greedy.

The model is a randomly initialised LlamaForCausalLM of a real shape (--shape: llama-1b is Llama-3.2-1B's,
llama-8b Llama-3.1-8B's, qwen-0.5b Qwen2.5-0.5B's), saved once by transformers as a bf16 safetensors directory that both sides load.
Each batch size (--batches) gets the same random prompts of --prompt_len tokens on both sides, and every
sequence generates exactly --new_tokens tokens (greedy; transformers with min_new_tokens so that eos cannot
stop it early, Anvil's eos set outside the vocabulary in the saved config for the same reason).

Systems, each in a fresh process with its GPU memory watched by the same NVML meter (bench/benchlib/child.py):

  anvil        `anvil generate --precision bf16 --temperature 0 --prompt_ids ...` (KV cache); its own stderr
               line gives the time from the first prefill to the last token
  hf           model.generate(do_sample=False) with the default dynamic cache, SDPA attention, bf16
  hf_compile   transformers' fast path: cache_implementation="static", with which generate() compiles the
               decoding forward itself (torch.compile, CUDA graphs); two untimed generate() calls compile it

With --quantization int8 / nf4 both sides keep the block Linear weights quantized: Anvil with
`--quantization`, transformers with bitsandbytes (BitsAndBytesConfig load_in_8bit, or load_in_4bit with
bnb_4bit_quant_type "nf4", bnb_4bit_compute_dtype bf16 and no double quantization: the same storage as
Anvil's); the bitsandbytes package must be importable (it travels as a wheel, see the device README).

Time: prefill + decode of the batch, after warm-up, not counting the model load; the reference synchronises
once before and once after. Printed and written (bench/results/generate_speed_<device>_<date>_<commit>.json):
new tokens/s of the batch and per sequence, and the ratio Anvil / best transformers system.

    source scripts/gpu_env.sh
    python3 bench/generate_speed.py --anvil build-cuda/anvil --out $OUT
"""
import argparse
import json
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib.child import Meter  # noqa: E402
from benchlib.nvml import GpuMemory  # noqa: E402
from benchlib.results import RESULTS, git_commit, result_path, utc_now  # noqa: E402

SHAPES = {
    # Llama-3.2-1B: tied head, GQA 32/8, llama3 RoPE scaling, vocabulary 128256.
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072,
                     rope_theta=500000.0, tie_word_embeddings=True,
                     rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    # Llama-3.1-8B: untied head, GQA 32/8, llama3 RoPE scaling (factor 8).
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072,
                     rope_theta=500000.0, tie_word_embeddings=False,
                     rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    # Qwen2.5-0.5B's shape as a Llama (no q/k/v bias): GQA 14/2, vocabulary 151936.
    "qwen-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                      num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                      rope_theta=1000000.0, tie_word_embeddings=True),
}


def make_model(shape, path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    if (path / "config.json").exists():
        return
    cfg = LlamaConfig(**SHAPES[shape], bos_token_id=0, eos_token_id=None, torch_dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(str(path), safe_serialization=True)
    # No eos in the saved config either, so that neither side stops early.
    c = json.loads((path / "config.json").read_text())
    c["eos_token_id"] = None
    (path / "config.json").write_text(json.dumps(c, indent=2))
    gen = path / "generation_config.json"
    if gen.exists():
        g = json.loads(gen.read_text())
        g.pop("eos_token_id", None)
        gen.write_text(json.dumps(g, indent=2))


def prompts(batch, length, vocab, seed=1):
    import random
    rng = random.Random(seed + batch)
    return [[rng.randrange(1, vocab) for _ in range(length)] for _ in range(batch)]


def hf_child(args):
    """Runs in its own process: loads the model, generates, prints one JSON line with the timing."""
    import torch
    from transformers import AutoModelForCausalLM
    kw = {}
    if args.quantization == "nf4":
        from transformers import BitsAndBytesConfig
        kw["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                       bnb_4bit_compute_dtype=torch.bfloat16,
                                                       bnb_4bit_use_double_quant=False)
    elif args.quantization == "int8":
        from transformers import BitsAndBytesConfig
        kw["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.bfloat16, attn_implementation="sdpa",
                                                 device_map="cuda", **kw).eval()
    ids = torch.tensor(prompts(args.batch, args.prompt_len, model.config.vocab_size), device="cuda")
    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
              max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, pad_token_id=0)
    warm = 1
    if args.system == "hf_compile":
        # generate() compiles the decoding forward itself when the cache is static (its compile_config:
        # fullgraph, CUDA graphs); compiling model.forward by hand on top breaks its cache updates.
        kw["cache_implementation"] = "static"
        warm = 2
    with torch.inference_mode():
        for _ in range(warm):
            model.generate(**kw)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(**kw)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    new = (out.shape[1] - ids.shape[1]) * out.shape[0]
    print("RESULT " + json.dumps({"seconds": dt, "new_tokens": int(new)}), flush=True)


def run_anvil(args, meter, batch, work):
    cfg = json.loads((Path(args.model_dir) / "config.json").read_text())
    cmd = [args.anvil, "generate", "--checkpoint", args.model_dir, "--device", "cuda", "--precision", "bf16",
           "--temperature", "0", "--max_new_tokens", str(args.new_tokens), "--quantization", args.quantization]
    for p in prompts(batch, args.prompt_len, cfg["vocab_size"]):
        cmd += ["--prompt_ids", " ".join(map(str, p))]
    log = work / f"anvil_{args.quantization}_b{batch}.log"
    proc = meter.run(cmd, log, args.timeout)
    text = log.read_text()
    m = re.search(r"generated (\d+) tokens in ([0-9.]+) s", text)
    if proc["returncode"] != 0 or not m:
        return {"error": " | ".join(proc["log_tail"][-3:]), "process": proc}
    return {"seconds": float(m.group(2)), "new_tokens": int(m.group(1)), "process": proc,
            "line": next(l for l in text.splitlines() if "generated" in l)}


def run_hf(args, meter, batch, system, work):
    cmd = [sys.executable, __file__, "--child", "--system", system, "--batch", str(batch),
           "--model_dir", args.model_dir, "--prompt_len", str(args.prompt_len), "--new_tokens",
           str(args.new_tokens), "--quantization", args.quantization]
    log = work / f"{system}_{args.quantization}_b{batch}.log"
    proc = meter.run(cmd, log, args.timeout)
    m = re.search(r"^RESULT (.*)$", log.read_text(), re.M)
    if proc["returncode"] != 0 or not m:
        return {"error": " | ".join(proc["log_tail"][-3:]), "process": proc}
    return {**json.loads(m.group(1)), "process": proc}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anvil", default="build-cuda/anvil")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-1b")
    ap.add_argument("--systems", default="anvil,hf,hf_compile")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--prompt_len", type=int, default=128)
    ap.add_argument("--new_tokens", type=int, default=256)
    ap.add_argument("--quantization", choices=["none", "int8", "nf4"], default="none",
                    help="block Linear weights in int8 / NF4 on both sides (bitsandbytes for transformers)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--workdir", default="/tmp/anvil_generate_speed")
    ap.add_argument("--model_dir", default="")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--system", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return hf_child(args)

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    args.model_dir = args.model_dir or str(work / args.shape)
    make_model(args.shape, Path(args.model_dir))
    gpu = GpuMemory(0)
    meter = Meter(gpu)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        for system in args.systems.split(","):
            r = run_anvil(args, meter, batch, work) if system == "anvil" else run_hf(args, meter, batch, system,
                                                                                    work)
            r.update(system=system, batch=batch)
            if "seconds" in r:
                r["tokens_per_second"] = r["new_tokens"] / r["seconds"]
                r["tokens_per_second_per_sequence"] = r["tokens_per_second"] / batch
                r["peak_mib"] = r["process"]["memory"].get("peak_mib")
            rows.append(r)
            print(f"{system:11s} batch {batch:3d}: " + (f"{r['tokens_per_second']:9.1f} tok/s "
                  f"({r['tokens_per_second_per_sequence']:.1f} per sequence), peak {r['peak_mib']} MiB"
                  if "seconds" in r else "error: " + r["error"]), flush=True)
    ratios = {}
    for batch in sorted({r["batch"] for r in rows}):
        got = {r["system"]: r.get("tokens_per_second") for r in rows if r["batch"] == batch}
        refs = [v for k, v in got.items() if k != "anvil" and v]
        if got.get("anvil") and refs:
            ratios[batch] = got["anvil"] / max(refs)
            print(f"batch {batch}: anvil / best transformers = {ratios[batch]:.2f}x")
    commit, commit_source = git_commit()
    now = utc_now()
    name = "generate_speed" if args.quantization == "none" else f"generate_speed_{args.quantization}"
    out = result_path(name, gpu.name(), now, commit, directory=args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for r in rows:
        r.get("process", {}).pop("log_tail", None)
    out.write_text(json.dumps({"benchmark": "generate_speed", "device": gpu.name(), "date": now.isoformat(),
                               "commit": commit, "commit_source": commit_source, "shape": args.shape,
                               "shape_config": SHAPES[args.shape], "quantization": args.quantization,
                               "prompt_len": args.prompt_len,
                               "new_tokens": args.new_tokens, "meter": meter.describe(), "rows": rows,
                               "anvil_over_best_transformers": ratios}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
