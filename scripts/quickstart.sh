#!/usr/bin/env bash
# The default job: install dependencies, build, train a byte-level BPE tokenizer on the Shakespeare corpus
# and tokenise the corpus with it, then train the tiny GPT-2 of examples/tiny.json (on the GPU if there is
# one, else on the CPU), printing the summary and a generated sample. Extra arguments go to `anvil train`
# (e.g. --max_steps 50).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh --target anvil
bash scripts/prepare_default_data.sh build/anvil
./build/anvil train --config examples/tiny.json --overwrite_output_dir "$@"
