#!/usr/bin/env python3
"""The Hugging Face `tokenizers` package's view of a tokenizer.json, for tests/unit/bpe_trainer_test.cpp.

  encode TOKENIZER IN_JSON OUT_JSON   OUT_JSON: the ids of each string of the JSON list IN_JSON
  resave TOKENIZER OUT                OUT: Tokenizer.from_file(TOKENIZER) saved again (pretty JSON)
  pretokenize IN_JSON OUT_JSON        OUT_JSON: GPT-2 ByteLevel pre-tokens (add_prefix_space=False,
                                      byte-level mapped) of each string of IN_JSON

Exits with status 3 when `tokenizers` cannot be imported, so the caller can skip.
"""
import json
import sys

try:
    from tokenizers import Tokenizer, pre_tokenizers
except ImportError as e:  # the C++ test skips on status 3
    print(f"tokenizers not available: {e}", file=sys.stderr)
    sys.exit(3)


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False)


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "encode" and len(argv) == 5:
        tok = Tokenizer.from_file(argv[2])
        write_json(argv[4], [tok.encode(text).ids for text in read_json(argv[3])])
    elif cmd == "resave" and len(argv) == 4:
        with open(argv[3], "w", encoding="utf-8") as f:
            f.write(Tokenizer.from_file(argv[2]).to_str(pretty=True))
    elif cmd == "pretokenize" and len(argv) == 4:
        pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        write_json(argv[3], [[piece for piece, _ in pre.pre_tokenize_str(t)] for t in read_json(argv[2])])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
