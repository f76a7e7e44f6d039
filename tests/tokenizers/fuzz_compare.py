#!/usr/bin/env python3
"""Compares `anvil tokenize` with `tokenizers` on random text (a development check, not run by CI).

Usage: fuzz_compare.py ANVIL_BINARY TOKENIZER_JSON [LINES] [SEED]

Random lines mix ASCII words, punctuation, whitespace of every kind, accented and non-Latin letters,
digits, emoji and, when the tokenizer has added tokens, those tokens with and without surrounding
spaces. Prints the mismatching lines (at most 10) and a count; exit status 1 if any.
"""
import json
import os
import random
import subprocess
import sys
import tempfile
import unicodedata

from tokenizers import Tokenizer

POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " ", " \t\n\r\x0b\x0c",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "\u00a0\u2000\u2009\u200b\u200d\u2028\u3000\u0085\u180e\ufeff",
    "éèêëàâäôöûüçñßøåæœÉÈÀÖÜÇÑİıſ", "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГД", "αβγδεζηθικλμνξοπρσςτυφχψωΣΩ",
    "的一是不了人我在有他这为之大来以个中上们", "あいうえおアイウエオ한국어", "ابتثجحخدذرزسشصضطظعغفقكلمنهوي", "कखगघचछजझटठडढणतथदधनपफबभमयरलवशषसह्ािीुूेैोौं",
    "\u0301\u0308\u0323\u0303", "😀👍🏽👨‍👩‍👧🇯🇵❤️\ufe0f", "'s 't 're 've 'm 'll 'd 'S 'T 'RE", "\x00\x01\x1b\x7f\ue000\U0010fffd",
]


# Only code points assigned in Python's Unicode version (see random_line).
ASSIGNED_ONLY = True


def random_line(rng, specials):
    parts = []
    for _ in range(rng.randint(0, 30)):
        r = rng.random()
        if specials and r < 0.08:
            parts.append(rng.choice(["", " ", "  "]) + rng.choice(specials) + rng.choice(["", " ", "\t"]))
        elif r < 0.15:
            # Any code point assigned in Python's Unicode version; PCRE2 10.42 (Unicode 14) sees later
            # additions as unassigned, a known difference (docs/tokenizers.md).
            c = chr(rng.randint(0x80, 0x2FFFF))
            parts.append(c if unicodedata.category(c) != "Cn" or not ASSIGNED_ONLY else "")
        else:
            pool = rng.choice(POOLS)
            parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
    return "".join(parts).replace("\n", " ").replace("\ud800", "")


def main():
    anvil, path = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
    rng = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 1)
    tok = Tokenizer.from_file(path)
    tok.no_truncation()
    tok.no_padding()
    specials = [t.content for t in tok.get_added_tokens_decoder().values()]
    lines = []
    for _ in range(n):
        s = random_line(rng, specials)
        s = "".join(c for c in s if not 0xD800 <= ord(c) <= 0xDFFF)
        lines.append(s)
    with tempfile.NamedTemporaryFile("wb", delete=False) as f:
        f.write(("\n".join(lines) + "\n").encode("utf-8"))
    try:
        out = subprocess.run([anvil, "tokenize", "--tokenizer", path], stdin=open(f.name, "rb"), capture_output=True,
                             check=True).stdout.decode()
    finally:
        os.unlink(f.name)
    got = [[int(x) for x in l.split()] for l in out.split("\n")[:-1]]
    bad = 0
    for i, line in enumerate(lines):
        want = tok.encode(line, add_special_tokens=False).ids
        if got[i] != want:
            bad += 1
            if bad <= 10:
                print(f"line {i + 1}: {line!r}\n  tokenizers {want}\n  anvil      {got[i]}")
    print(f"{path}: {bad} of {n} random lines differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
