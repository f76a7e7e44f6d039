#!/usr/bin/env python3
"""Makes the GPT-2 golden fixture that Anvil's CPU backend must match (tests/unit/golden_gpt2_test.cpp).

Run where PyTorch + transformers are installed (e.g. the GPU machine; the math runs on the CPU in fp32):
    python3 tests/golden/make_gpt2_golden.py tests/golden/gpt2_tiny

Writes, into the output directory:
  config.json, model.safetensors   a tiny random GPT2LMHeadModel saved by transformers (Anvil loads it directly)
  golden.safetensors               input_ids [B,T] (I32), logits [B,T,V], loss [], grad.<name> (every parameter,
                                   Hugging Face names and shapes), updated.<name> (weights after one
                                   torch.optim.AdamW step with two parameter groups: no weight decay for
                                   biases and LayerNorm weights, as Anvil does)
The hyper-parameters of the step are stored in golden.safetensors' metadata.
"""
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.1


def main(out: Path) -> None:
    torch.manual_seed(1234)
    out.mkdir(parents=True, exist_ok=True)
    cfg = GPT2Config(vocab_size=100, n_positions=16, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                     bos_token_id=99, eos_token_id=99)
    model = GPT2LMHeadModel._from_config(cfg, attn_implementation="eager").float().eval()
    # Non-trivial LayerNorm parameters and biases, so their gradients and updates are exercised.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(out, safe_serialization=True)

    B, T = 2, 16
    input_ids = torch.randint(0, cfg.vocab_size, (B, T))
    outputs = model(input_ids=input_ids, labels=input_ids)
    outputs.loss.backward()

    tensors = {"input_ids": input_ids.to(torch.int32), "logits": outputs.logits.detach().contiguous(),
               "loss": outputs.loss.detach().reshape(())}
    params = dict(model.named_parameters())
    for name, p in params.items():
        tensors["grad." + name] = p.grad.detach().clone().contiguous()

    no_decay = [p for n, p in params.items() if n.endswith("bias") or ".ln_" in n]
    decay = [p for n, p in params.items() if not (n.endswith("bias") or ".ln_" in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS, foreach=False)
    opt.step()
    for name, p in params.items():
        tensors["updated." + name] = p.detach().clone().contiguous()

    meta = {"lr": str(LR), "beta1": str(BETAS[0]), "beta2": str(BETAS[1]), "eps": str(EPS), "weight_decay": str(WD),
            "torch": torch.__version__}
    save_file(tensors, str(out / "golden.safetensors"), metadata=meta)
    print(json.dumps({"out": str(out), "loss": float(outputs.loss), "params": len(params)}))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/golden/gpt2_tiny"))
