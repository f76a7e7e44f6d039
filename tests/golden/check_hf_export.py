#!/usr/bin/env python3
"""Checks that an Anvil checkpoint loads in Hugging Face transformers and gives Anvil's numbers.

Loads <output_dir>/checkpoint-<step> with GPT2LMHeadModel.from_pretrained, evaluates the same validation
windows Anvil's evaluation uses (the first max_eval_batches batches of non-overlapping windows of val_data,
in order; sizes from the checkpoint's trainer_state.json) and compares the mean loss with the eval_loss
Anvil recorded in <output_dir>/summary.json; then runs `anvil logits` on the first validation batch and
compares the logits with transformers' (max |difference| relative to max |logit|). Exits non-zero on a
mismatch (loss: relative 1e-4; logits: 1e-4).

    python3 tests/golden/check_hf_export.py runs/tiny/checkpoint-600 --anvil build/anvil
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import GPT2LMHeadModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--anvil", default="build/anvil", help="the anvil binary (for the logits comparison)")
    ap.add_argument("--device", default="cpu", help="device for anvil logits")
    args = ap.parse_args()
    ck = Path(args.checkpoint)
    cfg = json.loads((ck / "trainer_state.json").read_text())["config"]
    B = cfg["per_device_eval_batch_size"] or cfg["per_device_train_batch_size"]
    T = cfg["max_seq_length"] or json.loads((ck / "config.json").read_text())["n_positions"]
    summary = json.loads((ck.parent / "summary.json").read_text())
    step = json.loads((ck / "trainer_state.json").read_text())["global_step"]
    if step != summary["global_step"]:
        sys.exit(f"{ck}: step {step} is not the run's last step ({summary['global_step']}), whose eval_loss summary.json holds")

    raw = open(cfg["val_data"], "rb").read()
    assert raw[:8] == b"ANVILTOK"
    dtype = np.uint16 if np.frombuffer(raw[12:16], np.uint32)[0] == 1 else np.uint32
    tokens = np.frombuffer(raw[64:], dtype=dtype).astype(np.int64)
    model = GPT2LMHeadModel.from_pretrained(args.checkpoint).float().eval()
    nwin = (len(tokens) - 1) // T
    n = min(cfg["max_eval_batches"], nwin // B)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(n):
            w = np.arange(i * B, (i + 1) * B)
            x = torch.from_numpy(np.stack([tokens[k * T:(k + 1) * T] for k in w]))
            y = torch.from_numpy(np.stack([tokens[k * T + 1:(k + 1) * T + 1] for k in w]))
            logits = model(input_ids=x).logits
            total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1),
                                                       reduction="sum").item()
            count += y.numel()
    hf_loss = total / count
    anvil_loss = summary["eval_loss"]
    rel = abs(hf_loss - anvil_loss) / anvil_loss

    # Logits of the first validation batch, both ways.
    from safetensors.numpy import load_file, save_file
    x = np.stack([tokens[k * T:(k + 1) * T] for k in range(B)]).astype(np.int32)
    with tempfile.TemporaryDirectory() as tmp:
        save_file({"input_ids": x}, f"{tmp}/ids.safetensors")
        subprocess.run([args.anvil, "logits", "--checkpoint", args.checkpoint, "--input_ids", f"{tmp}/ids.safetensors",
                        "--output", f"{tmp}/logits.safetensors", "--device", args.device], check=True,
                       capture_output=True)
        anvil_logits = load_file(f"{tmp}/logits.safetensors")["logits"]
    with torch.no_grad():
        hf_logits = model(input_ids=torch.from_numpy(x).long()).logits.numpy()
    logits_rel = float(np.abs(anvil_logits - hf_logits).max() / np.abs(hf_logits).max())
    print(json.dumps({"checkpoint": args.checkpoint, "hf_eval_loss": hf_loss, "anvil_eval_loss": anvil_loss,
                      "loss_relative_difference": rel, "logits_shape": list(hf_logits.shape),
                      "logits_max_relative_difference": logits_rel, "anvil_logits_device": args.device}))
    sys.exit(0 if rel < 1e-4 and logits_rel < 1e-4 else 1)


if __name__ == "__main__":
    main()
