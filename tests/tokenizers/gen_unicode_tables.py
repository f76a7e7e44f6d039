#!/usr/bin/env python3
"""Regenerates the Unicode tables in src/data/unicode.cpp (the block between the GENERATED markers).

The tables serve the BERT normalizer and pre-tokenizer (and the single_word check of added tokens):
character classes, the lower-case mapping, and "canonical decomposition with nonspacing marks removed"
(accent stripping). The base is Python's unicodedata (its Unicode version is recorded in the output).

Hugging Face `tokenizers` (the reference Anvil is checked against) does not use one Unicode version: its
BERT classes (punctuation, control/format, nonspacing marks) come from an older Unicode than its case
mapping. When `tokenizers` is importable, this script probes its BertNormalizer / BertPreTokenizer once
per code point and makes the tables follow it where the two differ; it prints how many code points
each probe moved. Without `tokenizers` the tables are plain unicodedata (and a warning says so).

Usage: python3 tests/tokenizers/gen_unicode_tables.py [src/data/unicode.cpp]
"""
import re
import sys
import unicodedata as ud
from pathlib import Path

# Flags (must match unicode.hpp).
BERT_CONTROL, WHITE_SPACE, BERT_PUNCT, NONSPACING, WORD, CJK = 1, 2, 4, 8, 16, 32

# The White_Space property (stable since Unicode 6.3; Rust's char::is_whitespace).
WS = {0x9, 0xA, 0xB, 0xC, 0xD, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F,
      0x205F, 0x3000}
# BERT's "Chinese character" blocks (CJK Unified Ideographs and extensions, compatibility ideographs).
CJK_RANGES = [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
              (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)]
ASCII_PUNCT = set(map(ord, "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"))
HANGUL = range(0xAC00, 0xD7A4)
MAX = 0x110000


def ucd_flags(c):
    ch = chr(c)
    g = ud.category(ch)
    f = 0
    if c == 0 or c == 0xFFFD or (c not in (9, 10, 13) and g in ("Cc", "Cf", "Co", "Cs")):
        f |= BERT_CONTROL
    if c in WS:
        f |= WHITE_SPACE
    if g[0] == "P" or c in ASCII_PUNCT:
        f |= BERT_PUNCT
    if g[0] in "LM" or g in ("Nd", "Nl", "Pc") or c in (0x200C, 0x200D):
        f |= WORD
    if any(a <= c <= b for a, b in CJK_RANGES):
        f |= CJK
    return f


def ucd_strip(c):
    return "".join(x for x in ud.normalize("NFD", chr(c)) if ud.category(x) != "Mn")


def main():
    out_path = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[2] / "src/data/unicode.cpp")
    flags = [0] * MAX
    strip = {}  # code point -> replacement text (only where it differs from the character itself)
    lower = {}
    for c in range(MAX):
        if 0xD800 <= c <= 0xDFFF:
            flags[c] = BERT_CONTROL
            continue
        flags[c] = ucd_flags(c)
        ch = chr(c)
        if c not in HANGUL:
            s = ucd_strip(c)
            if s != ch:
                strip[c] = s
        if ch.lower() != ch:
            lower[c] = ch.lower()
    source = f"unicodedata {ud.unidata_version}"
    try:
        from tokenizers import normalizers, pre_tokenizers
        import tokenizers
    except ImportError:
        print("warning: `tokenizers` is not importable: tables are plain unicodedata", file=sys.stderr)
    else:
        source += f", adjusted to tokenizers {tokenizers.__version__}"
        probe(flags, strip, lower, normalizers, pre_tokenizers)

    # The "nonspacing" flag is what accent stripping removes: the characters that strip to nothing.
    for c, s in list(strip.items()):
        if s == "":
            flags[c] |= NONSPACING
            del strip[c]
        elif s == chr(c):
            del strip[c]
    emit(out_path, source, flags, strip, lower)


def probe(flags, strip, lower, normalizers, pre_tokenizers):
    clean = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=False, strip_accents=False,
                                       lowercase=False)
    chinese = normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=True, strip_accents=False,
                                         lowercase=False)
    accents = normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=False, strip_accents=True,
                                         lowercase=False)
    lowercase = normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=False, strip_accents=False,
                                           lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    moved = {"control": 0, "cjk": 0, "punct": 0, "strip": 0, "lower": 0}

    def set_flag(c, flag, on, name):
        if bool(flags[c] & flag) != on:
            flags[c] ^= flag
            moved[name] += 1

    for c in range(MAX):
        if 0xD800 <= c <= 0xDFFF:
            continue
        ch = chr(c)
        s = "x" + ch + "y"
        r = clean.normalize_str(s)
        set_flag(c, BERT_CONTROL, r == "xy", "control")
        set_flag(c, CJK, chinese.normalize_str(s) == "x " + ch + " y", "cjk")
        if not flags[c] & WHITE_SPACE:
            set_flag(c, BERT_PUNCT, [p for p, _ in pre.pre_tokenize_str(s)] == ["x", ch, "y"], "punct")
        if c not in HANGUL:
            r = accents.normalize_str(s)[1:-1]
            if r != strip.get(c, ch):
                moved["strip"] += 1
                strip[c] = r
            r = lowercase.normalize_str(s)[1:-1]
            if r != lower.get(c, ch):
                moved["lower"] += 1
                if r == ch:
                    del lower[c]
                else:
                    lower[c] = r
    print("code points moved to follow tokenizers:", moved)


def runs_of(values):
    out, prev = [], None
    for c, v in enumerate(values):
        if v != prev:
            out.append((c, v))
            prev = v
    return out


def emit(out_path, source, flags, strip, lower):
    lines = [f"// Generated by tests/tokenizers/gen_unicode_tables.py from {source}. Do not edit.",
             "// clang-format off"]

    runs = runs_of(flags)
    lines.append(f"// Character-class runs: (first code point << 8) | flags, {len(runs)} runs.")
    lines.append("constexpr uint32_t kClassRuns[] = {")
    lines += wrap([f"0x{(c << 8) | f:x}" for c, f in runs])
    lines.append("};")

    # Lower-case mapping as runs of (start, count, stride, delta); multi-code-point results listed apart.
    singles = sorted((c, ord(l)) for c, l in lower.items() if len(l) == 1)
    multi = sorted((c, l) for c, l in lower.items() if len(l) != 1)
    lruns = []
    for c, l in singles:
        d = l - c
        if lruns and lruns[-1][3] == d:
            s, n, st, _ = lruns[-1]
            if n == 1 and 0 < c - s <= 255:
                lruns[-1] = (s, 2, c - s, d)
                continue
            if n > 1 and c == s + n * st:
                lruns[-1] = (s, n + 1, st, d)
                continue
        lruns.append((c, 1, 1, d))
    lines.append(f"// Lower-case runs {{first, count, stride, delta}}: {len(singles)} code points in {len(lruns)} runs.")
    lines.append("constexpr LowerRun kLowerRuns[] = {")
    lines += wrap([f"{{0x{s:x}, {n}, {st}, {d}}}" for s, n, st, d in lruns], 6)
    lines.append("};")
    lines.append("// Lower-case mappings to more than one code point.")
    lines.append("constexpr MultiMap kLowerMulti[] = {")
    lines += wrap([f"{{0x{c:x}, {{{', '.join(f'0x{ord(x):x}' for x in l)}}}}}" for c, l in multi], 4)
    lines.append("};")

    ssingle = sorted((c, ord(s)) for c, s in strip.items() if len(s) == 1)
    smulti = sorted((c, s) for c, s in strip.items() if len(s) != 1)
    assert all(0 < len(s) <= 3 for _, s in smulti), smulti
    lines.append(f"// Accent stripping (NFD, nonspacing marks removed; Hangul is algorithmic): {len(ssingle)} pairs.")
    lines.append("constexpr uint32_t kStripPairs[][2] = {")
    lines += wrap([f"{{0x{c:x}, 0x{s:x}}}" for c, s in ssingle], 8)
    lines.append("};")
    lines.append("constexpr MultiMap kStripMulti[] = {")
    lines += wrap([f"{{0x{c:x}, {{{', '.join(f'0x{ord(x):x}' for x in s)}}}}}" for c, s in smulti], 4)
    lines.append("};")

    lines.append("// clang-format on")
    text = out_path.read_text()
    begin, end = "// BEGIN GENERATED TABLES\n", "// END GENERATED TABLES\n"
    i, j = text.index(begin) + len(begin), text.index(end)
    out_path.write_text(text[:i] + "\n".join(lines) + "\n" + text[j:])
    print(f"wrote {out_path}: {len(runs)} class runs, {len(lruns)} lower runs, {len(ssingle)}+{len(smulti)} strip entries")


def wrap(items, per_line=10):
    return ["    " + ", ".join(items[i:i + per_line]) + "," for i in range(0, len(items), per_line)]


if __name__ == "__main__":
    main()
