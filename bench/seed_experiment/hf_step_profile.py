#!/usr/bin/env python3
"""Where HF's strict-fp32 vanilla step spends its GPU time: the seed experiment's vanilla row (bert-large,
batch 4 x 512, dropout 0.1, fused AdamW, clipping at 1.0, TF32 off) as the loop HF Trainer runs, profiled with
torch.profiler, kernels summed by kind (GEMMs, attention, optimizer, the rest). Set beside Anvil's profile of
the same row (`--profile_steps`, bench/tools/phase_kernels.py), it bounds what any engine running the same
cuBLAS GEMMs can gain over HF in strict fp32: HF's step time over the GEMMs' time.

Usage (GPU machine): python3 bench/seed_experiment/hf_step_profile.py [--steps 3] [--out FILE.json]
"""
import argparse
import json
import re
import time

import numpy as np
import torch
from transformers import BertConfig, BertForSequenceClassification

# Kernel kinds, first match wins: attention before GEMMs (PyTorch's fp32 memory-efficient attention kernels
# are CUTLASS kernels too).
KINDS = [
    ("attention", re.compile(r"fmha|attention|flash|softmax", re.I)),
    ("gemm", re.compile(r"gemm|xmma|cutlass|splitKreduce", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor|foreach|lpnorm", re.I)),
]


def kind(name):
    return next((k for k, pat in KINDS if pat.search(name)), "other")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3, help="profiled steps (after 5 warm-up steps)")
    ap.add_argument("--timed_steps", type=int, default=20, help="steps timed without the profiler")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq_len", type=int, default=512)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--out", default="")
    a = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False  # torch's default, stated: strict fp32
    config = BertConfig(vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                        intermediate_size=4096, max_position_embeddings=512, num_labels=2,
                        hidden_dropout_prob=a.dropout, attention_probs_dropout_prob=a.dropout)
    torch.manual_seed(42)
    model = BertForSequenceClassification(config).cuda().train()
    # HF Trainer's default optimizer (adamw_torch_fused) and settings of the vanilla row.
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                            fused=True)
    np.random.seed(0)
    ids = torch.from_numpy(np.random.randint(100, 30000, (a.batch, a.seq_len))).cuda()
    labels = torch.zeros(a.batch, dtype=torch.int64, device="cuda")

    def step():
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t0 = time.time()
    for _ in range(a.timed_steps):
        step()
    torch.cuda.synchronize()
    step_ms = (time.time() - t0) / a.timed_steps * 1e3

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
    per_kind, per_kernel = {}, {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = e.time_range.elapsed_us() / a.steps  # a kernel event: its GPU time
        per_kind[kind(e.name)] = per_kind.get(kind(e.name), 0.0) + us
        per_kernel[e.name] = per_kernel.get(e.name, 0.0) + us
    total = sum(per_kind.values())
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: HF vanilla step (bs {a.batch} x "
          f"{a.seq_len}, strict fp32, dropout {a.dropout}) {step_ms:.1f} ms wall over {a.timed_steps} steps; "
          f"GPU kernels {total / 1e3:.1f} ms a step")
    for k in ("gemm", "attention", "optimizer", "other"):
        print(f"  {k:10} {per_kind.get(k, 0.0) / 1e3:7.2f} ms")
    print("  top kernels (ms a step):")
    for n, us in sorted(per_kernel.items(), key=lambda x: -x[1])[:15]:
        print(f"    {us / 1e3:7.2f}  [{kind(n)}] {n[:110]}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "step_ms": step_ms,
                       "kernel_ms_per_step": total / 1e3, "by_kind_ms": {k: v / 1e3 for k, v in per_kind.items()},
                       "top_kernels_ms": {n: us / 1e3 for n, us in sorted(per_kernel.items(),
                                                                           key=lambda x: -x[1])[:40]}}, f, indent=2)


if __name__ == "__main__":
    main()
