#!/usr/bin/env python3
"""Anvil's int8 / NF4 weight storage against bitsandbytes, through transformers (GPU machine; needs the
bitsandbytes package).

Makes a small random LlamaForCausalLM (fp32, hidden 256, 2 layers, grouped-query heads), then compares the
logits of `anvil logits --device cuda --quantization Q` on that directory with transformers loading it with
BitsAndBytesConfig:
  nf4  load_in_4bit, bnb_4bit_quant_type "nf4", bnb_4bit_compute_dtype float32, no double quantization:
       bitsandbytes dequantizes each weight (blocks of 64, absmax scales) and multiplies in fp32, as Anvil does,
       so the same codes and scales give logits equal to fp32 GEMM rounding. Check: relative max difference
       < 1e-3, while NF4's own error (either side against the unquantized model) is far larger, and printed.
  nf4-dq  the same with bnb_4bit_use_double_quant=True: the block absmax quantized again (their mean, 8-bit
       codes of the dynamic map in blocks of 256); the same check (< 1e-3; the mean may round differently
       in its last bit).
  int8 load_in_8bit runs LLM.int8 matmuls (int8 activations, outlier columns in 16 bits), not a dequantized
       matmul, so the two differ by activation quantization: printed, checked only to be of the size of the
       int8 error itself (< 3x Anvil's own distance from the unquantized model, or 5e-2).
Exits non-zero on a failed check.

    python3 tests/golden/check_bnb_quantized.py --anvil build-cuda/anvil
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--anvil", default="build-cuda/anvil")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="anvil_bnb_"))
    model_dir = work / "model"
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=4, vocab_size=1000, max_position_embeddings=256,
                      tie_word_embeddings=False, initializer_range=0.02, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(str(model_dir), safe_serialization=True)
    ids = torch.randint(3, 1000, (2, 48), dtype=torch.int64)
    save_file({"input_ids": ids}, str(work / "inputs.safetensors"))

    def anvil(q):
        out = work / f"anvil_{q}.safetensors"
        subprocess.run([args.anvil, "logits", "--checkpoint", str(model_dir), "--input_ids",
                        str(work / "inputs.safetensors"), "--output", str(out), "--device", "cuda",
                        "--quantization", q], check=True)
        return load_file(str(out))["logits"].double()

    def hf(quant):
        kw = {}
        if quant in ("nf4", "nf4-dq"):
            kw["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                           bnb_4bit_compute_dtype=torch.float32,
                                                           bnb_4bit_use_double_quant=quant == "nf4-dq")
        elif quant == "int8":
            kw["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
        m = LlamaForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, device_map="cuda", **kw).eval()
        with torch.inference_mode():
            return m(input_ids=ids.cuda()).logits.double().cpu()

    ref = hf("none")
    rows = {"anvil none vs transformers fp32": rel(anvil("none"), ref)}
    a4, h4 = anvil("nf4"), hf("nf4")
    rows["anvil nf4 vs transformers+bitsandbytes nf4"] = rel(a4, h4)
    rows["anvil nf4 vs unquantized (NF4's error)"] = rel(a4, ref)
    rows["bitsandbytes nf4 vs unquantized (NF4's error)"] = rel(h4, ref)
    ad, hd = anvil("nf4-dq"), hf("nf4-dq")
    rows["anvil nf4-dq vs transformers+bitsandbytes nf4 double quant"] = rel(ad, hd)
    rows["anvil nf4-dq vs anvil nf4 (double quantization's error)"] = rel(ad, a4)
    a8, h8 = anvil("int8"), hf("int8")
    rows["anvil int8 vs transformers+bitsandbytes int8 (LLM.int8 matmul)"] = rel(a8, h8)
    rows["anvil int8 vs unquantized (int8's error)"] = rel(a8, ref)
    rows["bitsandbytes int8 vs unquantized"] = rel(h8, ref)
    for k, v in rows.items():
        print(f"  {k:66s} relative max difference {v:.3g}")
    ok = rows["anvil none vs transformers fp32"] < 1e-4
    ok &= rows["anvil nf4 vs transformers+bitsandbytes nf4"] < 1e-3
    ok &= rows["anvil nf4 vs unquantized (NF4's error)"] > 10 * rows["anvil nf4 vs transformers+bitsandbytes nf4"]
    ok &= rows["anvil nf4-dq vs transformers+bitsandbytes nf4 double quant"] < 1e-3
    ok &= rows["anvil nf4-dq vs anvil nf4 (double quantization's error)"] > 0
    ok &= rows["anvil int8 vs transformers+bitsandbytes int8 (LLM.int8 matmul)"] < max(
        3 * rows["anvil int8 vs unquantized (int8's error)"], 5e-2)
    print(json.dumps(rows))
    print("PASS" if ok else "FAIL", "anvil int8/nf4/nf4-dq against bitsandbytes")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
