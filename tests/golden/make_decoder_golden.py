#!/usr/bin/env python3
"""Makes the Llama / Qwen2 / Mistral golden fixtures that Anvil's CPU backend must match.

Run where PyTorch + transformers (4.4x or 5.x) are installed (e.g. the GPU machine; the math runs on the CPU in
fp32):
    python3 tests/golden/make_decoder_golden.py tests/golden

Writes OUT/llama_tiny, OUT/qwen2_tiny and OUT/mistral_tiny, each with
  config.json, model.safetensors   a tiny random *ForCausalLM saved by transformers (Anvil loads it directly)
  golden.safetensors               input_ids [B,T] (I32), logits [B,T,V], loss [] (labels = input_ids, shifted
                                   inside the model), grad.<name> (every parameter, Hugging Face names and
                                   shapes; a tied head counts once, in model.embed_tokens.weight), updated.<name>
                                   (weights after one torch.optim.AdamW step with two parameter groups: no weight
                                   decay for biases and RMSNorm weights, as Anvil does), inv_freq [head_dim/2] (the
                                   model's RoPE inverse frequencies), generate_prompt [1,P] (I32) and generate_ids
                                   [1,N] (I32: the N new ids of greedy model.generate, eos disabled so it runs
                                   all N steps)
The hyper-parameters of the step are stored in golden.safetensors' metadata.

What each fixture exercises (eager attention, no dropout, initializer_range 0.2 so attention is far from uniform,
non-trivial RMSNorm weights and biases; vocabulary 100, not a multiple of 128):
  llama_tiny    grouped-query attention (4 heads, 2 key/value heads), head_dim 12 != hidden/heads = 8, untied
                head, llama3 rope_scaling with original_max_position_embeddings 64 (all three frequency bands
                occur), no biases, pad_token_id 0 (nn.Embedding padding_idx: the pad row gets no gradient from
                the lookup; input_ids contain it)
  qwen2_tiny    tied head, q/k/v biases, rope_theta 1e6, rms_norm_eps 1e-6, linear rope_scaling factor 2
  mistral_tiny  one key/value head (MQA), sliding_window 6 < T: a query sees itself and the 5 keys before it
                (checked here: the logits of the first 6 positions do not depend on the window, later ones do)
"""
import copy
import json
import math
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.1
B, T = 2, 16
PROMPT, NEW_TOKENS = 5, 8
VOCAB = 100
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4,
              hidden_act="silu", initializer_range=0.2, attention_dropout=0.0, use_cache=True)

FIXTURES = {
    "llama_tiny": (LlamaConfig, LlamaForCausalLM, dict(
        COMMON, num_key_value_heads=2, head_dim=12, max_position_embeddings=128, rms_norm_eps=1e-5,
        rope_theta=10000.0,
        rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64},
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False, bos_token_id=98, eos_token_id=99,
        pad_token_id=0)),
    "qwen2_tiny": (Qwen2Config, Qwen2ForCausalLM, dict(
        COMMON, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=1e6,
        rope_scaling={"rope_type": "linear", "factor": 2.0}, tie_word_embeddings=True, use_sliding_window=False,
        bos_token_id=None, eos_token_id=99, pad_token_id=None)),
    "mistral_tiny": (MistralConfig, MistralForCausalLM, dict(
        COMMON, num_key_value_heads=1, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
        sliding_window=6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=None)),
}


def expected_inv_freq(kw: dict) -> torch.Tensor:
    """The inverse frequencies from the formulas, in fp64 (to check transformers applied the scaling)."""
    hs = kw.get("head_dim") or kw["hidden_size"] // kw["num_attention_heads"]
    inv = 1.0 / kw["rope_theta"] ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs)
    rs = kw.get("rope_scaling")
    if rs and rs["rope_type"] == "linear":
        inv = inv / rs["factor"]
    elif rs and rs["rope_type"] == "llama3":
        orig, lo, hi, f = (rs["original_max_position_embeddings"], rs["low_freq_factor"], rs["high_freq_factor"],
                           rs["factor"])
        wavelen = 2 * math.pi / inv
        s = (orig / wavelen - lo) / (hi - lo)
        smooth = (1 - s) * inv / f + s * inv
        inv = torch.where(wavelen > orig / lo, inv / f, torch.where(wavelen < orig / hi, inv, smooth))
        bands = {"high": bool((wavelen < orig / hi).any()), "low": bool((wavelen > orig / lo).any()),
                 "mid": bool(((wavelen >= orig / hi) & (wavelen <= orig / lo)).any())}
        assert all(bands.values()), f"llama3 scaling should touch every band: {bands}"
    return inv


def model_inv_freq(model) -> torch.Tensor:
    # transformers 5 (and Llama/Qwen2 in 4.4x) keep one rotary_emb in the model; Mistral in 4.4x one per layer.
    for name, module in model.named_modules():
        if name.endswith("rotary_emb") and hasattr(module, "inv_freq"):
            return module.inv_freq.detach().float().clone()
    raise RuntimeError("no rotary_emb.inv_freq in the model")


def no_decay(name: str) -> bool:
    return name.endswith("bias") or "norm" in name  # input_layernorm, post_attention_layernorm, model.norm


def greedy(model, prompt: torch.Tensor):
    """Greedy decoding by full forwards (no cache), and the smallest top-1 / top-2 logit margin on the way."""
    ids, margin = prompt, float("inf")
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(input_ids=ids, use_cache=False).logits[0, -1]
            top = torch.topk(logits, 2).values
            margin = min(margin, float(top[0] - top[1]))
            ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
    return ids[:, prompt.shape[1]:], margin


def make_fixture(out: Path, name: str, seed: int) -> dict:
    cfg_cls, model_cls, kw = FIXTURES[name]
    torch.manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    cfg = cfg_cls(**copy.deepcopy(kw))
    model = model_cls._from_config(cfg, attn_implementation="eager").float().eval()
    # Non-trivial RMSNorm weights and biases, so their gradients and updates are exercised.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if no_decay(n):
                p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(out)  # safetensors (the default since transformers 4.35)

    inv_freq = model_inv_freq(model)
    torch.testing.assert_close(inv_freq.double(), expected_inv_freq(kw), rtol=2e-6, atol=0)

    input_ids = torch.randint(0, VOCAB, (B, T))
    pad = kw.get("pad_token_id")
    if pad is not None:
        input_ids[0, 3] = input_ids[1, 9] = pad  # the padding_idx row: no gradient from these lookups
    outputs = model(input_ids=input_ids, labels=input_ids, use_cache=False)
    outputs.loss.backward()
    logits = outputs.logits.detach().contiguous()

    if kw.get("sliding_window"):
        # The window must really apply in this transformers' eager attention: without it, positions that
        # see more than `sliding_window` keys change, the first `sliding_window` positions do not.
        w = kw["sliding_window"]
        saved = model.config.sliding_window
        model.config.sliding_window = None
        with torch.no_grad():
            no_window = model(input_ids=input_ids, use_cache=False).logits
        model.config.sliding_window = saved
        torch.testing.assert_close(no_window[:, :w], logits[:, :w], rtol=1e-5, atol=1e-5)
        assert (no_window[:, w] - logits[:, w]).abs().max() > 1e-3, "sliding_window was not applied"
        with torch.no_grad():
            again = model(input_ids=input_ids, use_cache=False).logits
        torch.testing.assert_close(again, logits, rtol=1e-6, atol=1e-6)

    tensors = {"input_ids": input_ids.to(torch.int32), "logits": logits, "loss": outputs.loss.detach().reshape(()),
               "inv_freq": inv_freq.contiguous()}
    params = dict(model.named_parameters())
    for n, p in params.items():
        tensors["grad." + n] = p.grad.detach().clone().contiguous()

    # Greedy generation (before the optimizer step changes the weights), eos disabled so all steps run.
    prompt = torch.randint(0, VOCAB, (1, PROMPT))
    # generate() fills a None it is given from model.generation_config, so eos goes off there (min_new_tokens
    # would instead mask eos out of the argmax).
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        generated = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                   max_new_tokens=NEW_TOKENS, pad_token_id=0)[:, PROMPT:]
    manual, margin = greedy(model, prompt)
    assert generated.shape == (1, NEW_TOKENS), generated.shape
    assert torch.equal(generated, manual), f"generate {generated.tolist()} != full-forward greedy {manual.tolist()}"
    assert margin > 1e-3, f"greedy choice too close to a tie ({margin}); change the seed"
    tensors["generate_prompt"] = prompt.to(torch.int32)
    tensors["generate_ids"] = generated.to(torch.int32).contiguous()

    # One AdamW step on the gradients above (generation ran without gradients).
    opt = torch.optim.AdamW([{"params": [p for n, p in params.items() if not no_decay(n)], "weight_decay": WD},
                             {"params": [p for n, p in params.items() if no_decay(n)], "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS, foreach=False)
    opt.step()
    for n, p in params.items():
        tensors["updated." + n] = p.detach().clone().contiguous()

    meta = {"lr": str(LR), "beta1": str(BETAS[0]), "beta2": str(BETAS[1]), "eps": str(EPS), "weight_decay": str(WD),
            "torch": torch.__version__, "transformers": transformers.__version__, "greedy_margin": f"{margin:.4g}"}
    save_file(tensors, str(out / "golden.safetensors"), metadata=meta)
    size = sum(f.stat().st_size for f in out.iterdir())
    assert size < 1 << 20, f"{out} is {size} bytes"
    return {"out": str(out), "loss": float(outputs.loss), "params": len(params), "bytes": size,
            "generate_ids": generated.tolist()[0], "greedy_margin": margin}


def main(root: Path) -> None:
    for seed, name in enumerate(FIXTURES):
        print(json.dumps(make_fixture(root / name, name, 1234 + seed)))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/golden"))
