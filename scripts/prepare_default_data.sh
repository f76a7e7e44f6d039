#!/usr/bin/env bash
# The default job's data: a 4096-token byte-level BPE trained on the Shakespeare corpus, and the corpus
# tokenised with it into train/validation shards (the last 5% is validation). Skips what exists.
# Usage: scripts/prepare_default_data.sh [ANVIL_BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
anvil=${1:-build/anvil}
corpus=data/shakespeare/shakespeare.txt
out=data/shakespeare_bpe
[ -s "$corpus" ] || { echo "missing $corpus: run scripts/setup.sh first" >&2; exit 1; }
mkdir -p "$out"
if [ ! -s "$out/tokenizer.json" ]; then
  "$anvil" train-tokenizer --input "$corpus" --vocab_size 4096 --special_tokens "<|endoftext|>" --output "$out/tokenizer.json"
fi
if [ ! -s "$out/train.bin" ] || [ ! -s "$out/val.bin" ] || [ "$out/tokenizer.json" -nt "$out/train.bin" ]; then
  "$anvil" prepare-data --input "$corpus" --tokenizer "$out/tokenizer.json" --output "$out" --val_fraction 0.05
fi
