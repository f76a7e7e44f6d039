#!/usr/bin/env python3
"""Checks that an Anvil checkpoint loads in Hugging Face transformers and gives Anvil's numbers.

Loads <checkpoint> with GPT2LMHeadModel.from_pretrained, evaluates the same validation windows Anvil's
evaluation uses (the first N batches of non-overlapping windows of the token shard, in order) and compares
the mean loss with the eval_loss Anvil recorded in <output_dir>/summary.json. Exits non-zero on a mismatch.

    python3 tests/golden/check_hf_export.py runs/tiny/checkpoint-300 data/shakespeare/val.bin \
        --batch 16 --seq 128 --batches 10 --summary runs/tiny/summary.json
"""
import argparse
import json
import sys

import numpy as np
import torch
from transformers import GPT2LMHeadModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("shard")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--batches", type=int, required=True)
    ap.add_argument("--summary", required=True)
    args = ap.parse_args()

    raw = open(args.shard, "rb").read()
    assert raw[:8] == b"ANVILTOK"
    dtype = np.uint16 if np.frombuffer(raw[12:16], np.uint32)[0] == 1 else np.uint32
    tokens = np.frombuffer(raw[64:], dtype=dtype).astype(np.int64)
    model = GPT2LMHeadModel.from_pretrained(args.checkpoint).float().eval()
    B, T = args.batch, args.seq
    nwin = (len(tokens) - 1) // T
    n = min(args.batches, nwin // B)
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
    anvil_loss = json.load(open(args.summary))["eval_loss"]
    rel = abs(hf_loss - anvil_loss) / anvil_loss
    print(json.dumps({"checkpoint": args.checkpoint, "hf_eval_loss": hf_loss, "anvil_eval_loss": anvil_loss,
                      "relative_difference": rel}))
    sys.exit(0 if rel < 1e-4 else 1)


if __name__ == "__main__":
    main()
