#!/usr/bin/env python3
"""Checks that an Anvil checkpoint loads in Hugging Face transformers and gives Anvil's numbers.

Loads <output_dir>/checkpoint-<step> with GPT2LMHeadModel.from_pretrained, evaluates the same validation
windows Anvil's evaluation uses (the first max_eval_batches batches of non-overlapping windows of val_data,
in order; sizes from the checkpoint's trainer_state.json) and compares the mean loss with the eval_loss
Anvil recorded in <output_dir>/summary.json. Exits non-zero on a mismatch.

    python3 tests/golden/check_hf_export.py runs/tiny/checkpoint-600
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import GPT2LMHeadModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
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
    print(json.dumps({"checkpoint": args.checkpoint, "hf_eval_loss": hf_loss, "anvil_eval_loss": anvil_loss,
                      "relative_difference": rel}))
    sys.exit(0 if rel < 1e-4 else 1)


if __name__ == "__main__":
    main()
