#!/usr/bin/env bash
# The default job: install dependencies, build, prepare the Shakespeare corpus (byte-level tokens) and
# train the tiny GPT-2 of examples/tiny.json (on the GPU if there is one, else on the CPU), printing the
# summary and a generated sample. Extra arguments go to `anvil train` (e.g. --max_steps 50).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
if [ ! -s data/shakespeare/train.bin ] || [ ! -s data/shakespeare/val.bin ]; then
  ./build/anvil prepare-data --input data/shakespeare/shakespeare.txt --output data/shakespeare --val_fraction 0.05
fi
./build/anvil train --config examples/tiny.json "$@"
