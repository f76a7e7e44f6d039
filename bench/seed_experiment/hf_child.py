#!/usr/bin/env python3
"""One row of the seed experiment with Hugging Face Trainer, in a fresh process (the seed restarts its
kernel between experiments). Started by bench/seed_experiment.py; not meant to be run by hand, but it can
be: `python3 hf_child.py --spec spec.json --result result.json`.

It follows the seed guide (shared/seeds/000_08c4f1cb5a69cf12.txt, "efficient training on a single GPU")
line for line, with these deliberate differences, each recorded in the result's `notes`:

- The model is `BertForSequenceClassification` built from a `BertConfig` of `bert-large-uncased`'s shape,
  randomly initialised (`torch.manual_seed(init_seed)` first): the GPU machine has no internet, and the
  weights do not change the work. The seed's `from_pretrained("bert-large-uncased")` would give the same
  shape, dropout 0.1 and 2 labels.
- `evaluation_strategy="steps"` of the seed's default_args is dropped: it was renamed `eval_strategy`, and
  current transformers refuses "steps" without an eval dataset (the seed passes none, so it never evaluated).
- `save_strategy="no"`: current Trainer saves a checkpoint at the last step inside `train_runtime` (the
  2022 Trainer of the seed did not); the benchmark times training only, for both systems.
- Without `datasets` installed, a torch Dataset returning the same dicts replaces `Dataset.from_dict` +
  `set_format("pt")`.
"""
import argparse
import hashlib
import json
import os
import sys
import time
import traceback

T_START = time.time()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchlib.nvml import MIB, GpuMemory  # noqa: E402


def make_dataset(spec, notes):
    """The seed's dummy data: random token ids in [100, 30000) and labels from randint(0, 1), i.e. all 0."""
    import numpy as np

    np.random.seed(spec["data_seed"])
    seq_len, dataset_size = spec["seq_len"], spec["samples"]
    dummy_data = {
        "input_ids": np.random.randint(spec["id_low"], spec["id_high"], (dataset_size, seq_len)),
        "labels": np.random.randint(0, 1, (dataset_size)),
    }
    digest = hashlib.sha256(dummy_data["input_ids"].astype("<i8").tobytes()).hexdigest()
    try:
        from datasets import Dataset

        ds = Dataset.from_dict(dummy_data)
        ds.set_format("pt")
        return ds, digest, "datasets.Dataset.from_dict + set_format('pt') (as the seed)"
    except ImportError:
        import torch

        class DictDataset(torch.utils.data.Dataset):
            """What Dataset.from_dict(...).set_format("pt") yields: a dict of int64 tensors per example."""

            def __init__(self, data):
                self.ids = torch.from_numpy(data["input_ids"].astype("int64"))
                self.labels = torch.from_numpy(data["labels"].astype("int64"))

            def __len__(self):
                return len(self.labels)

            def __getitem__(self, i):
                return {"input_ids": self.ids[i], "labels": self.labels[i]}

        notes.append("`datasets` is not installed: a torch Dataset returning the same dicts of int64 tensors")
        return DictDataset(dummy_data), digest, "torch Dataset of dicts (datasets not installed)"


def run(spec, result):
    notes = result["notes"]
    gpu = GpuMemory(spec.get("gpu_index", 0))

    import torch
    import transformers
    from torch import nn
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments, logging

    logging.set_verbosity_error()
    cuda = torch.cuda.is_available()
    result.update(torch=torch.__version__, transformers=transformers.__version__, cuda=cuda,
                  device=torch.cuda.get_device_name() if cuda else "cpu")
    try:
        import accelerate

        result["accelerate"] = accelerate.__version__
    except ImportError:
        result["accelerate"] = None

    ds, digest, ds_kind = make_dataset(spec, notes)
    result.update(data_sha256=digest, dataset=ds_kind)

    # The model: bert-large-uncased's config (BertConfig defaults are bert-base's; the shape is set here).
    shape = spec["shape"]
    config = BertConfig(vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"],
                        num_hidden_layers=shape["num_hidden_layers"],
                        num_attention_heads=shape["num_attention_heads"],
                        intermediate_size=shape["intermediate_size"],
                        max_position_embeddings=shape["max_position_embeddings"], num_labels=2,
                        hidden_dropout_prob=spec["dropout"], attention_probs_dropout_prob=spec["dropout"])
    torch.manual_seed(spec["init_seed"])
    model = BertForSequenceClassification(config)
    if cuda:
        model = model.to("cuda")
    result["parameters"] = sum(p.numel() for p in model.parameters())
    result["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    if gpu.available:
        result["used_after_model_load_mib"] = gpu.used_bytes() // MIB

    default_args = {
        "output_dir": spec["output_dir"],
        "num_train_epochs": 1,
        "log_level": "error",
        "report_to": "none",
        "save_strategy": "no",
    }
    row = spec["row"]
    kwargs = {"per_device_train_batch_size": row["batch"]}
    if row["accum"] > 1:
        kwargs["gradient_accumulation_steps"] = row["accum"]
    if row["checkpointing"]:
        kwargs["gradient_checkpointing"] = True
    if row["precision"] == "fp16":
        kwargs["fp16"] = True
    elif row["precision"] == "bf16_tf32":
        kwargs["bf16"] = True
        if cuda:
            kwargs["tf32"] = True
        else:
            notes.append("tf32 not set: no CUDA device (a CPU smoke test)")
    if row["optim"] == "adafactor":
        kwargs["optim"] = "adafactor"
    if not cuda:
        kwargs["use_cpu"] = True  # CPU smoke tests only: transformers wants it for bf16/fp16 on the CPU
    training_args = TrainingArguments(**kwargs, **default_args)
    result["training_args"] = {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v))
                               for k, v in training_args.to_dict().items()}

    optimizers = (None, None)
    if row["optim"] == "adam8bit":
        # The seed's code: bitsandbytes' Adam8bit over two parameter groups (decay / no decay), AdamW's
        # hyper-parameters from the TrainingArguments; the Trainer makes its linear schedule around it.
        try:
            import bitsandbytes as bnb
        except Exception as e:  # ImportError, or a bitsandbytes build that fails to load its library
            raise BnbMissing(f"bitsandbytes not available: {type(e).__name__}: {e}") from e
        result["bitsandbytes"] = getattr(bnb, "__version__", "?")
        from transformers.trainer_pt_utils import get_parameter_names

        decay_parameters = get_parameter_names(model, [nn.LayerNorm])
        decay_parameters = [name for name in decay_parameters if "bias" not in name]
        optimizer_grouped_parameters = [
            {
                "params": [p for n, p in model.named_parameters() if n in decay_parameters],
                "weight_decay": training_args.weight_decay,
            },
            {
                "params": [p for n, p in model.named_parameters() if n not in decay_parameters],
                "weight_decay": 0.0,
            },
        ]
        adam_bnb_optim = bnb.optim.Adam8bit(
            optimizer_grouped_parameters,
            betas=(training_args.adam_beta1, training_args.adam_beta2),
            eps=training_args.adam_epsilon,
            lr=training_args.learning_rate,
        )
        optimizers = (adam_bnb_optim, None)

    trainer = Trainer(model=model, args=training_args, train_dataset=ds, optimizers=optimizers)
    if gpu.available:
        result["used_before_train_mib"] = gpu.used_bytes() // MIB
    t0 = time.time()
    train_result = trainer.train()
    result["train_call_seconds"] = time.time() - t0
    # The parent samples NVML when it reads this line: training memory is still held, as when the seed
    # calls print_summary right after trainer.train().
    print("SEED_EXPERIMENT_TRAIN_END", flush=True)

    m = train_result.metrics
    result.update(train_runtime=m["train_runtime"], train_samples_per_second=m["train_samples_per_second"],
                  train_steps_per_second=m.get("train_steps_per_second"), train_loss=m.get("train_loss"),
                  global_step=train_result.global_step, total_flos=m.get("total_flos"))
    # The seed's print_summary, with its in-process NVML reading.
    print(f"Time: {m['train_runtime']:.2f}")
    print(f"Samples/second: {m['train_samples_per_second']:.2f}")
    if gpu.available:
        used = gpu.used_bytes() // MIB
        result["seed_used_at_end_mib"] = used
        print(f"GPU memory occupied: {used} MB.")
    else:
        print("GPU memory occupied: n/a (no NVML)")
    if cuda:
        result["torch_max_memory_allocated"] = torch.cuda.max_memory_allocated()
        result["torch_max_memory_reserved"] = torch.cuda.max_memory_reserved()
        result["matmul_allow_tf32"] = matmul_tf32_enabled(torch)
        result["amp_dtype"] = "fp16" if training_args.fp16 else "bf16" if training_args.bf16 else None


def matmul_tf32_enabled(torch):
    """Whether fp32 matmuls may use TF32. Recent torch refuses to read the legacy allow_tf32 flag once the
    new fp32_precision API has set it (as TrainingArguments(tf32=True) does), so the new API comes first."""
    try:
        precision = str(torch.backends.cuda.matmul.fp32_precision)  # "none": inherits the global setting
        if precision == "none":
            precision = str(getattr(torch.backends, "fp32_precision", "ieee"))
        return precision == "tf32"
    except AttributeError:  # torch < 2.9: only the legacy flag
        return bool(torch.backends.cuda.matmul.allow_tf32)


class BnbMissing(RuntimeError):
    pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True, help="JSON written by bench/seed_experiment.py")
    ap.add_argument("--result", required=True, help="where to write the result JSON")
    a = ap.parse_args()
    with open(a.spec) as f:
        spec = json.load(f)
    result = {"notes": []}
    status = 0
    try:
        run(spec, result)
    except BnbMissing as e:
        result["error"] = str(e)
        status = 3
    except Exception as e:  # report, do not hide: the parent prints it in the row
        traceback.print_exc()
        result["error"] = f"{type(e).__name__}: {e}"
        status = 1
    result["process_seconds_in_python"] = time.time() - T_START
    with open(a.result, "w") as f:
        json.dump(result, f, indent=2)
    sys.exit(status)


if __name__ == "__main__":
    main()
