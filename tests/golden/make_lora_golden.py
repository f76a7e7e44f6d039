#!/usr/bin/env python3
"""Makes the LoRA golden fixtures that Anvil's CPU backend must match (tests/unit/lora_golden_test.cpp).

Run where PyTorch + transformers + peft are installed (e.g. the GPU machine; the math runs on the CPU in fp32):
    python3 tests/golden/make_lora_golden.py tests/golden

For each base fixture already in tests/golden (llama_tiny, gpt2_tiny), writes OUT/lora_<base> with
  adapter_config.json, adapter_model.safetensors   PEFT's save_pretrained of a LoRA on that base, its B factors
                                                   random (not PEFT's zero start, so the adapters change the
                                                   outputs and every gradient is non-trivial)
  golden.safetensors   input_ids [B,T] (I32), logits [B,T,V], loss [] (labels = input_ids), grad.<name> (every
                       LoRA factor, named as in adapter_model.safetensors), updated.<name> (the factors after one
                       torch.optim.AdamW step over the factors only, weight decay on all of them, as HF Trainer
                       applies it to PEFT's parameters)
The base weights are the base fixture's (not copied). The hyper-parameters are in golden.safetensors' metadata.

  lora_llama_tiny   r 4, lora_alpha 8, all seven Linear modules (q/k/v inside Anvil's fused QKV, gate/up inside
                    its fused gate|up): the adapters' column blocks of fused outputs
  lora_gpt2_tiny    r 3, lora_alpha 6, use_rslora (scale alpha / sqrt(r)), c_attn and c_proj (which PEFT
                    matches in the attention and in the MLP); GPT-2's Conv1D (fan_in_fan_out)
"""
import json
import sys
import warnings
from pathlib import Path

import peft
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

LR, BETAS, EPS, WD = 1e-2, (0.9, 0.999), 1e-8, 0.1
B, T = 2, 16

FIXTURES = {
    "lora_llama_tiny": ("llama_tiny", dict(r=4, lora_alpha=8, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])),
    "lora_gpt2_tiny": ("gpt2_tiny", dict(r=3, lora_alpha=6, use_rslora=True, target_modules=["c_attn", "c_proj"],
                                         fan_in_fan_out=True)),
}


def saved_name(n: str) -> str:
    """A PeftModel parameter name as save_pretrained writes it (the adapter name dropped)."""
    return n.replace(".default", "")


def make_fixture(root: Path, name: str, seed: int) -> dict:
    base_name, kw = FIXTURES[name]
    base_dir = root / base_name
    out = root / name
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager", torch_dtype=torch.float32)
    cfg = LoraConfig(task_type="CAUSAL_LM", lora_dropout=0.0, bias="none", **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GPT-2's Conv1D: "fan_in_fan_out is set to True"
        model = get_peft_model(base, cfg).float().eval()
    lora = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in n for n in lora), list(lora)
    with torch.no_grad():
        for n, p in lora.items():
            if "lora_B" in n:
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(out)
    for f in ("README.md",):
        (out / f).unlink(missing_ok=True)

    vocab = base.config.vocab_size
    input_ids = torch.randint(0, vocab, (B, T))
    outputs = model(input_ids=input_ids, labels=input_ids, use_cache=False)
    outputs.loss.backward()
    tensors = {"input_ids": input_ids.to(torch.int32), "logits": outputs.logits.detach().contiguous(),
               "loss": outputs.loss.detach().reshape(())}
    for n, p in lora.items():
        tensors["grad." + saved_name(n)] = p.grad.detach().clone().contiguous()
    # The adapter changes the outputs (the fixture would not see a wrong adapter otherwise).
    with torch.no_grad(), model.disable_adapter():
        plain = model(input_ids=input_ids, use_cache=False).logits
    assert (plain - outputs.logits).abs().max() > 1e-2, "the adapter barely changes the logits"
    opt = torch.optim.AdamW(list(lora.values()), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, foreach=False)
    opt.step()
    for n, p in lora.items():
        tensors["updated." + saved_name(n)] = p.detach().clone().contiguous()
    # What save_pretrained wrote is what the fixture's tensors are named after.
    from safetensors import safe_open
    with safe_open(str(out / "adapter_model.safetensors"), "pt") as f:
        saved = set(f.keys())
    assert saved == {saved_name(n) for n in lora}, (sorted(saved)[:4], sorted(lora)[:4])

    meta = {"lr": str(LR), "beta1": str(BETAS[0]), "beta2": str(BETAS[1]), "eps": str(EPS), "weight_decay": str(WD),
            "base": base_name, "torch": torch.__version__, "transformers": transformers.__version__,
            "peft": peft.__version__}
    save_file(tensors, str(out / "golden.safetensors"), metadata=meta)
    size = sum(f.stat().st_size for f in out.iterdir())
    assert size < 1 << 20, f"{out} is {size} bytes"
    return {"out": str(out), "loss": float(outputs.loss), "factors": len(lora), "bytes": size}


def check_anvil_checkpoint(ckpt: Path, logits_file: Path, input_ids_file: Path) -> None:
    """An Anvil LoRA checkpoint loads in PEFT, and PEFT's logits equal `anvil logits` on the same checkpoint (which
    merges the adapter). A checkpoint that refers to its base (base_model.json) loads as PEFT loads a saved adapter,
    AutoPeftModelForCausalLM reading the base from adapter_config.json's base_model_name_or_path; one that holds its
    base loads it from the checkpoint, the adapter beside it."""
    from safetensors.torch import load_file
    if (ckpt / "base_model.json").exists():
        from peft import AutoPeftModelForCausalLM
        model = AutoPeftModelForCausalLM.from_pretrained(ckpt, attn_implementation="eager",
                                                         torch_dtype=torch.float32).float().eval()
    else:
        base = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="eager", torch_dtype=torch.float32)
        model = PeftModel.from_pretrained(base, ckpt).float().eval()
    ids = load_file(str(input_ids_file))["input_ids"].long()
    with torch.no_grad():
        got = model(input_ids=ids, use_cache=False).logits
        with model.disable_adapter():
            plain = model(input_ids=ids, use_cache=False).logits
    want = load_file(str(logits_file))["logits"].reshape(got.shape)
    err = float((got - want).abs().max() / want.abs().max())
    moved = float((plain - got).abs().max())
    print(json.dumps({"check": str(ckpt), "refers_to_base": (ckpt / "base_model.json").exists(), "rel_error": err,
                      "adapter_effect": moved}))
    assert moved > 1e-3, "the adapter does not change PEFT's logits: the check would not see it"
    assert err < 1e-4, err


def main(argv) -> None:
    if argv and argv[0] == "--check":
        check_anvil_checkpoint(Path(argv[1]), Path(argv[2]), Path(argv[3]))
        return
    root = Path(argv[0] if argv else "tests/golden")
    for seed, name in enumerate(FIXTURES):
        print(json.dumps(make_fixture(root, name, 4321 + seed)))


if __name__ == "__main__":
    main(sys.argv[1:])
