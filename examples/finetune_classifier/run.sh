#!/usr/bin/env bash
# Fine-tunes a pretrained MiniLM (a 6-layer BERT) to tell which topic a fortune cookie comes from:
# 9 topics of Debian's `fortunes` package (art, computers, education, food, law, medicine, politics, science,
# sports). See README.md beside this file for the task, the numbers and the options.
#
#   bash examples/finetune_classifier/run.sh [extra `anvil train` flags]
#
# Steps: (1) fetch the fortune files from Debian (apt-get download of a pinned .deb, sha256-checked, cached),
# (2) build the labelled CSV (build_csv.py), (3) tokenise it with the model's tokenizer into train/validation
# shards (`anvil prepare-data`, a seeded 80/20 split), (4) fine-tune (`anvil train`: bf16 on a GPU, fp32 on
# the CPU), (5) print the validation accuracy next to the majority-class baseline and classify a few new
# texts (`anvil predict`).
#
# Environment:
#   ANVIL         the anvil binary (default build/anvil; build it with `bash scripts/build.sh --target anvil`)
#   MODEL         the pretrained model directory (default third_party/minilm, fetched by scripts/fetch_minilm.sh)
#   DATA          where the download, the CSV and the shards go (default data/fortune_topics)
#   OUT           the training output_dir (default runs/fortune_topics)
#   DEVICE        cpu or cuda (default: cuda when a GPU is visible and the binary has the CUDA backend)
#   FROM_SCRATCH  1: also train the same architecture from random initialisation (no pretraining), for comparison
#   PYTHON        the Python 3 interpreter for build_csv.py (default python3)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"

ANVIL=${ANVIL:-build/anvil}
MODEL=${MODEL:-third_party/minilm}
DATA=${DATA:-data/fortune_topics}
OUT=${OUT:-runs/fortune_topics}
PYTHON=${PYTHON:-python3}

# The data: Debian bookworm's `fortunes` package, pinned by version and sha256.
DEB_PACKAGE=fortunes
DEB_VERSION=1:1.99.1-7.3
DEB_FILE=fortunes_1%3a1.99.1-7.3_all.deb
DEB_SHA256=41d0551dc0ff52f875a2ecef7c39da2f672ab468c37e170119f7e0245a9d63c5
TOPICS=art,computers,education,food,law,medicine,politics,science,sports
MAX_CHARS=200     # cookies longer than this are left out (keeps the CPU run short)
MAX_LENGTH=64     # tokens per example, [CLS] and [SEP] included
VAL_FRACTION=0.2
SPLIT_SEED=1234

die() {
  echo "run.sh: error: $*" >&2
  exit 1
}
step() { echo; echo "== $*"; }

[ -x "$ANVIL" ] || die "no anvil binary at $ANVIL: build it with 'bash scripts/build.sh --target anvil' (or set ANVIL)"
command -v "$PYTHON" >/dev/null || die "$PYTHON not found (set PYTHON to a Python 3 interpreter)"

# Device and precision: bf16 mixed precision on a GPU, fp32 on the CPU.
if [ -z "${DEVICE:-}" ]; then
  DEVICE=cpu
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 &&
    "$ANVIL" estimate --model bert-tiny --device cuda >/dev/null 2>&1; then
    DEVICE=cuda
  fi
fi
case "$DEVICE" in
  cuda) precision=(--bf16) ;;
  cpu) precision=() ;;
  *) die "DEVICE must be cpu or cuda, not '$DEVICE'" ;;
esac

step "1. the pretrained model: $MODEL"
if [ ! -f "$MODEL/model.safetensors" ]; then
  [ "$MODEL" = third_party/minilm ] || die "$MODEL has no model.safetensors"
  bash scripts/fetch_minilm.sh "$MODEL"
fi
[ -f "$MODEL/tokenizer.json" ] || die "$MODEL has no tokenizer.json"

step "2. the data: Debian package $DEB_PACKAGE=$DEB_VERSION"
mkdir -p "$DATA/deb"
deb="$DATA/deb/$DEB_FILE"
sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$DEB_SHA256" ]; }
if sha_ok "$deb"; then
  echo "cached: $deb"
else
  command -v apt-get >/dev/null || die "apt-get not found: this step needs Debian's package tools"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # apt-get download writes into the current directory; -o APT::Sandbox::User=root avoids the warning
  # about the _apt user not being able to write there when run as root.
  sandbox=()
  [ "$(id -u)" = 0 ] && sandbox=(-o APT::Sandbox::User=root)
  (cd "$tmp" && apt-get download "${sandbox[@]}" "$DEB_PACKAGE=$DEB_VERSION") ||
    die "apt-get could not download $DEB_PACKAGE=$DEB_VERSION (run 'apt-get update' as root first; the version is Debian 12 bookworm's)"
  got=$(sha256sum "$tmp/$DEB_FILE" | cut -d' ' -f1)
  [ "$got" = "$DEB_SHA256" ] || die "$DEB_FILE: sha256 $got, expected $DEB_SHA256: not the pinned package"
  mv "$tmp/$DEB_FILE" "$deb"
fi
rm -rf "$DATA/pkg"
dpkg-deb -x "$deb" "$DATA/pkg" 2>/dev/null || die "cannot unpack $deb (dpkg-deb)"
"$PYTHON" "$here/build_csv.py" "$DATA/pkg/usr/share/games/fortunes" "$DATA/fortune_topics.csv" \
  --topics "$TOPICS" --max_chars "$MAX_CHARS"

step "3. tokenise with the model's tokenizer, split ${VAL_FRACTION} for validation (seed $SPLIT_SEED)"
"$ANVIL" prepare-data --input "$DATA/fortune_topics.csv" --text_column text --label_column label \
  --tokenizer "$MODEL/tokenizer.json" --max_length "$MAX_LENGTH" \
  --val_fraction "$VAL_FRACTION" --seed "$SPLIT_SEED" --output "$DATA/shards"

# The training flags shared by the fine-tuning and the from-scratch runs (evaluation covers every validation
# example: the default for classification).
common=(--train_data "$DATA/shards/train.cls" --val_data "$DATA/shards/val.cls"
  --per_device_train_batch_size 16 --per_device_eval_batch_size 64
  --num_train_epochs 2 --warmup_steps 30 --weight_decay 0.01 --lr_scheduler_type linear
  --logging_steps 25 --eval_steps 100 --seed 42 --device "$DEVICE" "${precision[@]}")

step "4. fine-tune $MODEL on $DEVICE${precision:+ (${precision[*]})}"
rm -rf "$OUT"
"$ANVIL" train --model_name_or_path "$MODEL" --learning_rate 1e-4 "${common[@]}" --output_dir "$OUT" "$@"

if [ "${FROM_SCRATCH:-0}" = 1 ]; then
  step "4b. the same architecture from random initialisation (no pretraining), for comparison"
  rm -rf "$OUT-scratch"
  "$ANVIL" train --model "$MODEL/config.json" --tokenizer "$MODEL/tokenizer.json" --learning_rate 1e-4 \
    "${common[@]}" --output_dir "$OUT-scratch" "$@"
fi

step "5. results"
"$PYTHON" - "$DATA/shards/prepare_summary.json" "$OUT" "${FROM_SCRATCH:-0}" <<'PY'
import json, sys
summary_path, out, scratch = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
prep = json.load(open(summary_path))
counts = prep["val"]["label_counts"]
n = sum(counts.values())
majority = max(counts, key=counts.get)
def run(d):
    s = json.load(open(f"{d}/summary.json"))
    return s["eval_accuracy"], s["train_runtime"]
acc, secs = run(out)
print(f"validation examples: {n} ({', '.join(f'{k} {v}' for k, v in counts.items())})")
print(f"majority-class baseline (always '{majority}'): {counts[majority] / n:.4f}")
print(f"fine-tuned MiniLM:                        {acc:.4f}   (training {secs:.0f} s)")
if scratch:
    acc, secs = run(out + "-scratch")
    print(f"same model from random init:              {acc:.4f}   (training {secs:.0f} s)")
PY

step "6. anvil predict on new texts"
cat >"$DATA/new_texts.txt" <<'EOF'
The compiler crashed again, so I rebooted the server and lost the whole afternoon.
The senator promised lower taxes, then voted for the opposite bill the next morning.
Never trust a chef who does not taste his own soup.
The jury took four hours to acquit him; his lawyer took four minutes to send the bill.
Our quarterback threw three interceptions, and the coach still calls it a rebuilding year.
The experiment failed, which proves either the theory or the graduate student is wrong.
EOF
"$ANVIL" predict --model "$OUT" --input "$DATA/new_texts.txt" --output "$DATA/predictions.jsonl" \
  --device "$DEVICE"
"$PYTHON" - "$DATA/predictions.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    p = json.loads(line)
    print(f"{p['label']:>10} {p['score']:.2f}  {p['text']}")
PY
