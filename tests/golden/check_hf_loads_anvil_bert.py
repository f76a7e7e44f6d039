#!/usr/bin/env python3
"""Checks that Anvil's BERT checkpoints load in Hugging Face transformers, and the reverse, with the same
predictions.

    python3 tests/golden/check_hf_loads_anvil_bert.py ANVIL_BINARY [--tokenizer tokenizer.json] [--keep DIR]

Needs PyTorch + transformers + tokenizers, and a BERT WordPiece tokenizer.json: the default is
all-MiniLM-L6-v2's (third_party/minilm/ from `bash scripts/fetch_minilm.sh`, or data/tokenizers/minilm/
from `python3 tests/tokenizers/fetch_tokenizers.py`). Everything runs on the CPU, in fp32.

1. Anvil -> transformers, two classifiers trained by the anvil binary on a synthetic 3-class CSV (which
   colour word a text names) after `anvil prepare-data`:
   a. `tiny`: the bert-tiny preset from scratch (2 layers x 64, the tokenizer's 30522-token vocabulary),
      30 steps;
   b. `minilm`: fine-tuned from all-MiniLM-L6-v2 (a BertModel directory: the classifier starts new) for
      10 steps, when third_party/minilm exists (skipped, and said so, otherwise).
   The last checkpoint must load with BertForSequenceClassification.from_pretrained(output_loading_info=
   True) without missing, unexpected or mismatched keys or errors; AutoConfig must read the labels back
   (id2label: the data's labels in prepare-data's sorted order), AutoModelForSequenceClassification must
   give the same model, and AutoTokenizer (the tokenizer.json the checkpoint carries) the tokenizers
   library's ids. On texts of several lengths (so `anvil predict` pads them within its batches),
   transformers' softmax(logits) must equal predict's probabilities, and transformers' logits predict's
   log-probabilities up to the per-text constant that softmax drops (both centred over the classes), within
   1e-4 absolute; the labels must agree.
2. transformers -> Anvil: a random BertForSequenceClassification (3 labels with names, 2 layers x 48,
   intermediate 80, non-trivial LayerNorms and biases) saved by save_pretrained (safetensors) with the
   tokenizer, classified by `anvil predict`, compared the same way.

Prints one JSON object per case and a summary; exits 1 on any mismatch.
"""
import argparse
import datetime
import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import tokenizers
import torch
import transformers
from transformers import (AutoConfig, AutoModelForSequenceClassification, AutoTokenizer, BertConfig,
                          BertForSequenceClassification)

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-4
COLOURS = ["red", "green", "blue"]
FILLER = ("the a small large old new quick slow bright dark happy quiet river stone cloud table music light "
          "house paper horse water bread chair glass plant night sugar watch train tiger lemon ocean piano").split()
# Texts to classify: several lengths, punctuation, accents, an unknown character, an empty line.
TEXTS = [
    "red",
    "a quiet green river under a dark cloud",
    "Blue! The old piano, the new watch... and a bright lemon.",
    "Café crème at the blue house; naïve tiger; 🤗",
    "green green green red blue",
    "",
    "the slow train crossed the bridge at night while the river ran fast beside an old stone house, and a "
    "red kite flew over the water towards the distant hills where the sugar cane grows tall in summer",
    "stone",
]


def run(cmd, what):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{what} failed (exit {r.returncode}): {' '.join(map(str, cmd))}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def write_csv(path: Path, rows: int, seed: int) -> None:
    rng = random.Random(seed)
    lines = ["text,label"]
    for _ in range(rows):
        label = rng.randrange(3)
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 14))]
        words.insert(rng.randrange(len(words) + 1), COLOURS[label])
        lines.append(" ".join(words) + "," + COLOURS[label])
    path.write_text("\n".join(lines) + "\n")


def encode(tokenizer_file: Path, texts):
    """[CLS] text [SEP] with the tokenizers library (tokenizer.json's own pipeline), padded to the longest."""
    tok = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    tok.no_truncation()
    tok.no_padding()
    ids = [tok.encode(t).ids for t in texts]
    T = max(len(i) for i in ids)
    pad = tok.token_to_id("[PAD]")
    input_ids = torch.tensor([i + [pad] * (T - len(i)) for i in ids])
    mask = torch.tensor([[1] * len(i) + [0] * (T - len(i)) for i in ids])
    return input_ids, mask


def hf_logits(model, tokenizer_file: Path, texts):
    input_ids, mask = encode(tokenizer_file, texts)
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=mask,
                     token_type_ids=torch.zeros_like(input_ids)).logits.double()


def anvil_predict(anvil: str, model_dir: Path, texts, work: Path):
    inp, out = work / "texts.txt", work / "predictions.jsonl"
    inp.write_text("\n".join(texts) + "\n")
    run([anvil, "predict", "--model", model_dir, "--input", inp, "--output", out, "--device", "cpu",
         "--batch_size", 3], "anvil predict")
    return [json.loads(line) for line in out.read_text().splitlines()]


def compare(name: str, model, tokenizer_file: Path, preds, texts) -> dict:
    """transformers' logits vs anvil predict's probabilities (one record per text)."""
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    logits = hf_logits(model, tokenizer_file, texts)
    assert len(preds) == len(texts), (len(preds), len(texts))
    max_p = max_centred = 0.0
    label_mismatch = []
    for i, (p, row) in enumerate(zip(preds, logits)):
        assert p["index"] == i and p["text"] == texts[i], (i, p)
        anvil_p = torch.tensor([p["probabilities"][k] for k in labels], dtype=torch.float64)
        hf_p = torch.softmax(row, 0)
        max_p = max(max_p, float((anvil_p - hf_p).abs().max()))
        # log-probabilities are the logits less log-sum-exp: centred, both are the logits less their mean.
        anvil_log = anvil_p.log()
        max_centred = max(max_centred, float(((anvil_log - anvil_log.mean()) - (row - row.mean())).abs().max()))
        if p["label"] != labels[int(row.argmax())]:
            label_mismatch.append(i)
    return {"case": name, "texts": len(texts), "labels": labels,
            "max_abs_diff_probabilities": max_p, "max_abs_diff_centred_logits": max_centred,
            "max_abs_hf_logit": float(logits.abs().max()), "label_mismatches": label_mismatch,
            "ok": max_p < TOLERANCE and max_centred < TOLERANCE and not label_mismatch}


def check_anvil_checkpoint(name: str, anvil: str, tokenizer_file: Path, work: Path, train_args) -> dict:
    """Trains with anvil, loads the last checkpoint in transformers, compares predictions."""
    work.mkdir(parents=True)
    write_csv(work / "data.csv", rows=240, seed=len(name))
    run([anvil, "prepare-data", "--input", work / "data.csv", "--tokenizer", tokenizer_file, "--output",
         work / "data", "--val_fraction", 0.2, "--max_length", 64, "--threads", 1], "anvil prepare-data")
    out = work / "run"
    run([anvil, "train", "--train_data", work / "data/train.cls", "--val_data", work / "data/val.cls",
         "--device", "cpu", "--seed", 3, "--logging_steps", 5, "--output_dir", out, *train_args], "anvil train")
    ck = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))

    model, info = BertForSequenceClassification.from_pretrained(ck, output_loading_info=True)
    model = model.float().eval()
    problems = {k: list(v) for k, v in info.items() if v}
    config = AutoConfig.from_pretrained(ck)
    auto = AutoModelForSequenceClassification.from_pretrained(ck).float().eval()
    input_ids, mask = encode(tokenizer_file, TEXTS)
    # The tokenizer.json the checkpoint carries, through transformers: the same ids.
    hf_tok = AutoTokenizer.from_pretrained(ck)(TEXTS, padding="longest", return_tensors="pt")
    same_tokenizer = torch.equal(hf_tok["input_ids"], input_ids) and torch.equal(hf_tok["attention_mask"], mask)
    with torch.no_grad():
        same_auto = torch.equal(model(input_ids=input_ids, attention_mask=mask).logits,
                                auto(input_ids=input_ids, attention_mask=mask).logits)
    result = compare(name, model, tokenizer_file, anvil_predict(anvil, ck, TEXTS, work), TEXTS)
    result.update({
        "checkpoint": str(ck.relative_to(work)),
        "parameters": sum(p.numel() for p in model.parameters()),
        "loading_info_problems": problems,
        "auto_config": {"model_type": config.model_type, "architectures": config.architectures,
                        "id2label": config.id2label},
        "auto_model_class": type(auto).__name__,
        "auto_model_same_logits": same_auto,
        "auto_tokenizer_same_ids": same_tokenizer,
        "eval_accuracy": json.loads((out / "summary.json").read_text()).get("eval_accuracy"),
    })
    result["ok"] = (result["ok"] and not problems and same_auto and same_tokenizer and config.model_type == "bert"
                    and [config.id2label[i] for i in range(3)] == sorted(COLOURS)  # prepare-data's order
                    and type(auto).__name__ == "BertForSequenceClassification")
    return result


def check_hf_checkpoint(anvil: str, tokenizer_file: Path, work: Path) -> dict:
    """A random BertForSequenceClassification saved by transformers, classified by anvil predict."""
    work.mkdir(parents=True)
    torch.manual_seed(11)
    vocab = tokenizers.Tokenizer.from_file(str(tokenizer_file)).get_vocab_size()
    labels = ["sad", "neutral", "happy"]
    cfg = BertConfig(vocab_size=vocab, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=80, max_position_embeddings=96, initializer_range=0.1,
                     hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, num_labels=3,
                     id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    model = BertForSequenceClassification(cfg).eval()
    with torch.no_grad():  # non-trivial LayerNorms and biases (zero and one at initialisation)
        for n, p in model.named_parameters():
            if n.endswith("bias") or "LayerNorm" in n:
                p.add_(0.1 * torch.randn_like(p))
    ck = work / "hf_model"
    model.save_pretrained(ck, safe_serialization=True)
    shutil.copy(tokenizer_file, ck / "tokenizer.json")
    files = sorted(p.name for p in ck.iterdir())
    result = compare("transformers -> anvil", model, tokenizer_file, anvil_predict(anvil, ck, TEXTS, work), TEXTS)
    result.update({"files": files, "parameters": sum(p.numel() for p in model.parameters())})
    result["ok"] = result["ok"] and "model.safetensors" in files
    return result


def default_tokenizer() -> Path:
    for p in (ROOT / "third_party/minilm/tokenizer.json", ROOT / "data/tokenizers/minilm/tokenizer.json"):
        if p.is_file():
            return p
    sys.exit("no BERT tokenizer.json: run `bash scripts/fetch_minilm.sh` (or give --tokenizer FILE)")


def git(*args) -> str:
    r = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("anvil", help="the anvil binary")
    ap.add_argument("--tokenizer", type=Path, help="a BERT WordPiece tokenizer.json (default: all-MiniLM-L6-v2's)")
    ap.add_argument("--minilm", type=Path, default=ROOT / "third_party/minilm",
                    help="all-MiniLM-L6-v2's directory for the fine-tuning case (skipped when absent)")
    ap.add_argument("--keep", type=Path, help="work in this (new) directory and keep it")
    args = ap.parse_args()
    anvil = str(Path(args.anvil).resolve())
    tokenizer_file = (args.tokenizer or default_tokenizer()).resolve()
    print(f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"commit: {git('rev-parse', 'HEAD')}" + (" (with uncommitted changes)" if git("status", "--porcelain") else ""))
    print(f"anvil: {anvil}")
    print(f"tokenizer: {tokenizer_file}")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")

    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        results = []
        tiny = ["--model", "bert-tiny", "--tokenizer", tokenizer_file, "--per_device_train_batch_size", 16,
                "--max_steps", 30, "--learning_rate", 3e-3, "--warmup_steps", 3, "--save_steps", 30]
        results.append(check_anvil_checkpoint("anvil bert-tiny -> transformers", anvil, tokenizer_file,
                                              work / "tiny", tiny))
        if (args.minilm / "model.safetensors").is_file():
            minilm = ["--model_name_or_path", args.minilm.resolve(), "--per_device_train_batch_size", 8,
                      "--max_steps", 10, "--learning_rate", 2e-4, "--save_steps", 10]
            results.append(check_anvil_checkpoint("anvil all-MiniLM-L6-v2 fine-tuned -> transformers", anvil,
                                                  args.minilm / "tokenizer.json", work / "minilm", minilm))
        else:
            print(f"skipped the MiniLM fine-tuning case: no {args.minilm}/model.safetensors "
                  "(bash scripts/fetch_minilm.sh)")
        results.append(check_hf_checkpoint(anvil, tokenizer_file, work / "hf"))
    for r in results:
        print(json.dumps(r))
    ok = all(r["ok"] for r in results)
    worst = {k: max(r[k] for r in results) for k in ("max_abs_diff_probabilities", "max_abs_diff_centred_logits")}
    print(f"{'PASS' if ok else 'FAIL'}: {len(results)} cases, tolerance {TOLERANCE} absolute; worst {json.dumps(worst)}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
