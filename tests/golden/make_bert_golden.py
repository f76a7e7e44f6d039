#!/usr/bin/env python3
"""Makes the BERT golden fixtures that Anvil's CPU backend must match (tests/unit/golden_bert_test.cpp).

Run where PyTorch + transformers are installed (e.g. the GPU machine; the math runs on the CPU in fp32):
    python3 tests/golden/make_bert_golden.py tests/golden/bert_tiny

Writes two tiny random BertForSequenceClassification models, each saved by transformers (Anvil loads the
directory directly) with the reference results of one batch:
  OUT/             3 labels, cross-entropy (int labels, one of them ignored with -100)
  OUT/regression/  1 label, mean squared error (float labels)
Each directory holds config.json, model.safetensors and golden.safetensors:
  input_ids, token_type_ids, attention_mask [B,T] (I32; padded sequences: the mask is a prefix of ones, the
  pad token fills the padding and also occurs once as a real token), labels [B] (I32, or F32 for regression),
  logits [B,num_labels], loss [], grad.<name> for every parameter (Hugging Face names and shapes).
The model runs in eval mode (no dropout, as Anvil trains) with eager attention.
"""
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertForSequenceClassification

B, T = 4, 16
LENGTHS = [16, 11, 7, 13]
PAD = 0


def make_model(num_labels: int) -> BertForSequenceClassification:
    # initializer_range 0.2 rather than BERT's 0.02: with tiny weights the network is nearly linear and the
    # attention nearly uniform, which would leave parts of the backward unexercised.
    cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                     hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                     max_position_embeddings=24, type_vocab_size=2, initializer_range=0.2, layer_norm_eps=1e-12,
                     pad_token_id=PAD, num_labels=num_labels)
    model = BertForSequenceClassification._from_config(cfg, attn_implementation="eager").float().eval()
    # Non-trivial LayerNorm parameters and biases, so their gradients are exercised.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def make_batch(vocab_size: int):
    input_ids = torch.full((B, T), PAD, dtype=torch.long)
    token_type_ids = torch.zeros((B, T), dtype=torch.long)
    attention_mask = torch.zeros((B, T), dtype=torch.long)
    for b, n in enumerate(LENGTHS):
        input_ids[b, :n] = torch.randint(1, vocab_size, (n,))
        token_type_ids[b, n // 2:n] = 1  # sentence A, then sentence B
        attention_mask[b, :n] = 1
    input_ids[1, 3] = PAD  # the pad token as a real token: its embedding row gets no gradient (padding_idx)
    return input_ids, token_type_ids, attention_mask


def write_fixture(out: Path, num_labels: int) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    model = make_model(num_labels)
    model.save_pretrained(out, safe_serialization=True)
    input_ids, token_type_ids, attention_mask = make_batch(model.config.vocab_size)
    if num_labels == 1:
        labels = torch.randn(B)
    else:
        labels = torch.tensor([2, 0, -100, 1], dtype=torch.long)
    outputs = model(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
                    labels=labels)
    outputs.loss.backward()
    tensors = {
        "input_ids": input_ids.to(torch.int32),
        "token_type_ids": token_type_ids.to(torch.int32),
        "attention_mask": attention_mask.to(torch.int32),
        "labels": labels.to(torch.float32 if num_labels == 1 else torch.int32),
        "logits": outputs.logits.detach().contiguous(),
        "loss": outputs.loss.detach().reshape(()),
    }
    params = dict(model.named_parameters())
    for name, p in params.items():
        tensors["grad." + name] = p.grad.detach().clone().contiguous()
    save_file(tensors, str(out / "golden.safetensors"), metadata={"torch": torch.__version__})
    return {"out": str(out), "loss": float(outputs.loss), "params": len(params)}


def main(out: Path) -> None:
    torch.manual_seed(1234)
    results = [write_fixture(out, 3), write_fixture(out / "regression", 1)]
    print(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/golden/bert_tiny"))
