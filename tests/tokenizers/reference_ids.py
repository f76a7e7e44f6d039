#!/usr/bin/env python3
"""Reference token ids from Hugging Face `tokenizers`, for Anvil's exactness tests.

Usage: reference_ids.py TOKENIZER_JSON CORPUS

Splits CORPUS (UTF-8) on '\n' (a final newline ends the last line; it does not start an empty one),
encodes each line with no template tokens (add_special_tokens=False), no truncation and no padding, and
prints one JSON object: {"ids": [[...] per line], "decoded": [decode(ids, skip_special_tokens=False) per
line], "version": tokenizers.__version__}.
"""
import json
import sys

from tokenizers import Tokenizer
import tokenizers


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tok = Tokenizer.from_file(sys.argv[1])
    tok.no_truncation()
    tok.no_padding()
    text = open(sys.argv[2], "rb").read().decode("utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    ids = [tok.encode(line, add_special_tokens=False).ids for line in lines]
    decoded = [tok.decode(i, skip_special_tokens=False) for i in ids]
    json.dump({"ids": ids, "decoded": decoded, "version": tokenizers.__version__}, sys.stdout, ensure_ascii=True)


if __name__ == "__main__":
    main()
