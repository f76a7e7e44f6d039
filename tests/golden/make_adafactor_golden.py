#!/usr/bin/env python3
"""Makes the Adafactor golden fixture that Anvil's CPU Adafactor must match (tests/unit/adafactor_golden_test.cpp).

Run where PyTorch + transformers are installed (e.g. the GPU machine; the math runs on the CPU in fp32):
    python3 tests/golden/make_adafactor_golden.py tests/golden/adafactor_golden.safetensors

The tiny random GPT-2 of make_gpt2_golden.py (same config, seed and LayerNorm/bias perturbation) takes STEPS
steps of transformers.optimization.Adafactor from fixed synthetic gradients, under each setting of SETTINGS,
with Anvil's parameter groups: "decay" (matrices), "no_decay" (biases and LayerNorm weights: no weight decay),
"embedding" (wte, wpe: weight decay like the matrices). A setting's lr_multiplier scales its groups' lr (only
meaningful without relative_step: transformers then ignores lr).

Writes one safetensors file, every tensor fp32 in Hugging Face's names and shapes (Conv1D weights [in, out],
the real vocabulary):
  init.<name>                  the weights before the first step
  grad.<step>.<name>           the gradient of step 1..STEPS
  <setting>.param.<name>       the weights after STEPS steps
  <setting>.<state>.<name>     the optimizer state after STEPS steps: exp_avg_sq_row and exp_avg_sq_col
                               (matrices), exp_avg_sq (vectors), exp_avg (with beta1)
and metadata: "settings" (JSON list of {name, adafactor: every Adafactor option as transformers resolved it,
lr_multiplier: {decay, no_decay, embedding}}), "steps", "config" (the GPT2Config fields Anvil needs), versions.
"""
import json
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.optimization import Adafactor

STEPS = 3
SETTINGS = [
    {"name": "defaults", "adafactor": {}},
    {"name": "external_lr", "adafactor": {"scale_parameter": False, "relative_step": False, "warmup_init": False,
                                          "lr": 1e-3, "beta1": 0.9, "weight_decay": 0.01}},
    {"name": "warmup_init", "adafactor": {"warmup_init": True, "beta1": 0.8, "weight_decay": 0.1,
                                          "clip_threshold": 0.5, "decay_rate": -0.6}},
    {"name": "group_lrs", "adafactor": {"relative_step": False, "scale_parameter": True, "lr": 1e-2,
                                        "weight_decay": 0.05, "eps": (1e-30, 1e-2)},
     "lr_multiplier": {"decay": 1.0, "no_decay": 2.0, "embedding": 0.5}},
]


def build_model() -> GPT2LMHeadModel:
    """The model of make_gpt2_golden.py, built the same way."""
    torch.manual_seed(1234)
    cfg = GPT2Config(vocab_size=100, n_positions=16, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                     bos_token_id=99, eos_token_id=99)
    model = GPT2LMHeadModel._from_config(cfg, attn_implementation="eager").float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.05 * torch.randn_like(p))
    return model


def group_of(name: str) -> str:
    if name.endswith("bias") or ".ln_" in name:
        return "no_decay"
    if name in ("transformer.wte.weight", "transformer.wpe.weight"):
        return "embedding"
    return "decay"


def synthetic_grads(params: dict, gen: torch.Generator) -> dict:
    """Gradients with row and column structure (so the factored statistics matter)."""
    grads = {}
    for name, p in params.items():
        g = 1e-2 * torch.randn(p.shape, generator=gen)
        if p.dim() == 2:
            g *= torch.exp(0.7 * torch.randn(p.shape[0], 1, generator=gen))
            g *= torch.exp(0.7 * torch.randn(1, p.shape[1], generator=gen))
        else:
            g *= torch.exp(0.7 * torch.randn(p.shape, generator=gen))
        grads[name] = g.float().contiguous()
    return grads


def main(out: Path) -> None:
    model = build_model()
    params = dict(model.named_parameters())  # the tied lm_head.weight is wte: listed once
    init = {name: p.detach().clone() for name, p in params.items()}
    gen = torch.Generator().manual_seed(4321)
    grads = [synthetic_grads(params, gen) for _ in range(STEPS)]

    tensors = {}
    for name, t in init.items():
        tensors["init." + name] = t.contiguous()
    for step, g in enumerate(grads, start=1):
        for name, t in g.items():
            tensors[f"grad.{step}.{name}"] = t

    settings_meta = []
    for setting in SETTINGS:
        kwargs = dict(setting["adafactor"])
        mult = {"decay": 1.0, "no_decay": 1.0, "embedding": 1.0, **setting.get("lr_multiplier", {})}
        weight_decay = kwargs.pop("weight_decay", 0.0)
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(init[name])
        groups = []
        for group in ("decay", "no_decay", "embedding"):
            g = {"params": [p for n, p in params.items() if group_of(n) == group],
                 "weight_decay": 0.0 if group == "no_decay" else weight_decay}
            if kwargs.get("lr") is not None:
                g["lr"] = kwargs["lr"] * mult[group]
            groups.append(g)
        opt = Adafactor(groups, **kwargs)
        for step in range(STEPS):
            for name, p in params.items():
                p.grad = grads[step][name].clone()
            opt.step()
        prefix = setting["name"] + "."
        for name, p in params.items():
            tensors[prefix + "param." + name] = p.detach().clone().contiguous()
            state = opt.state[p]
            for key in ("exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq", "exp_avg"):
                if key in state:
                    tensors[prefix + key + "." + name] = state[key].detach().float().clone().contiguous()
        resolved = dict(opt.defaults)
        resolved["weight_decay"] = weight_decay
        resolved["eps"] = list(resolved["eps"])
        settings_meta.append({"name": setting["name"], "adafactor": resolved, "lr_multiplier": mult})

    cfg = model.config
    meta = {
        "settings": json.dumps(settings_meta),
        "steps": str(STEPS),
        "config": json.dumps({"vocab_size": cfg.vocab_size, "n_positions": cfg.n_positions, "n_embd": cfg.n_embd,
                              "n_layer": cfg.n_layer, "n_head": cfg.n_head}),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out), metadata=meta)
    print(json.dumps({"out": str(out), "settings": [s["name"] for s in SETTINGS], "steps": STEPS,
                      "tensors": len(tensors)}))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/golden/adafactor_golden.safetensors"))
