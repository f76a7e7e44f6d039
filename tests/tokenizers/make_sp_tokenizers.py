#!/usr/bin/env python3
"""Builds small SentencePiece-style BPE tokenizer.json files (the Llama 2 / Mistral / TinyLlama layouts) with
Hugging Face `tokenizers` and writes their reference ids, for tests/unit/tokenizer_sentencepiece_test.cpp.

Usage: python3 tests/tokenizers/make_sp_tokenizers.py [OUT_DIR]    (default: tests/data/sp_tokenizers)

One BPE is trained on tests/data/tokenizer_corpus.txt (Metaspace words; a limited alphabet, so rarer
characters need byte fallback) and laid out as SentencePiece lays out its vocabulary: <unk> <s> </s>, the
256 byte tokens <0x00>..<0xFF>, then the pieces. The variants dress it in the pipelines real files use:

  llama2/            Llama 2, TinyLlama, Mistral v0.1: normalizer Prepend("▁") + Replace(" ", "▁"), no
                     pre-tokenizer, decoder Replace + ByteFallback + Fuse + Strip, TemplateProcessing
                     "<s> $A", merges as "a b" strings, no ignore_merges field; tokenizer_config.json as
                     Llama 2's (add_bos_token true, add_eos_token false)
  metaspace_first/   newer conversions: Metaspace(prepend_scheme "first", split false), merges as pairs;
                     more added tokens ([INST] [/INST], <mask> with lstrip/rstrip (also a piece of the
                     vocabulary), a normalized non-special "Anvil"); tokenizer_config.json with
                     add_eos_token true (so the template differs from the file's post_processor)
  metaspace_always/  Metaspace in its old form {"add_prefix_space": true} (= "always", split true), the
                     Metaspace decoder, ignore_merges, no byte fallback: unknown characters are <unk>,
                     not fused; post_processor "<s> $A </s>"
  metaspace_never/   Metaspace(prepend_scheme "never", split true), no unk_token, decoder ByteFallback +
                     Fuse + Metaspace("never"), post_processor Sequence[ByteLevel, TemplateProcessing
                     "$A </s>"]

texts.json holds the texts: a hand-written set (spaces, newlines, special tokens in text, characters that
need byte fallback, the empty string) then every line of the corpus. Each directory gets reference.json:
  ids[i]              encode(text, add_special_tokens=False).ids, for every text (llama2, metaspace_first)
                      or for the hand-written ones (the other two, to keep the fixtures small)
  decoded[i]          decode(ids[i], skip_special_tokens=False), or null when that is the text itself
  special[i]          for the hand-written texts: encode(text, add_special_tokens=True).ids with the
                      post-processor transformers builds from tokenizer_config.json (update_post_processor:
                      [bos] $A [eos]) where there is one, else the file's
  decode_cases        random id sequences (byte tokens, pieces, special tokens) with decode(ids) and
                      decode(ids, skip_special_tokens=True)
The training and the random draws are deterministic: the files are the same on every run.
"""
import json
import random
import sys
from collections import Counter
from pathlib import Path

from tokenizers import Tokenizer, __version__, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "data" / "tokenizer_corpus.txt"
SPECIALS = ["<unk>", "<s>", "</s>"]

TEXTS = [
    "",
    " ",
    "   ",
    "Hello world",
    "hello world",
    " Hello world",
    "Hello world ",
    "Hello  world",
    "   leading spaces",
    "trailing spaces   ",
    "a\nb",
    "\n",
    "\n\nline after blank lines\n",
    "line one\nline two\n\n",
    "tabs\tand\r\nCRLF",
    "<s>",
    "</s>",
    "<unk>",
    "<s>Hello</s>",
    "<s> Hello",
    "Hello <s> world </s>",
    "  <s>  spaced  </s>  ",
    "text<unk>more",
    "<s><s></s>",
    "[INST] What is 2+2? [/INST] 4</s>",
    "[INST]no spaces[/INST]",
    "Anvil forges tokens; Anvil!",
    "x <mask> y",
    "x<mask>y",
    "😀",
    "I 😀 emoji 🎉!",
    "👍🏽 thumbs, 👨‍👩‍👧 family, 🇫🇷 flag",
    "日本語のテキストです。",
    "Ελληνικά και Русский текст",
    "مرحبا بالعالم",
    "हिन्दी भाषा",
    "e\u0301 combining, naïve café",
    "a\u00a0b no-break space, ideographic\u3000space",
    "zero\u200bwidth",
    "control \x01\x7f chars",
    "▁ literal metaspace ▁▁",
    "<0x41> is not a byte here",
    "1234567890 3.14159 -42",
    "def f(x):\n    return x ** 2  # comment",
    "https://example.com/path?q=1&r=2",
    "ALL CAPS and MiXeD cAsE",
    "don't won't it's",
    "the the the the the the the the",
    ("The quick brown fox jumps over the lazy dog. " * 40).strip(),
]


def corpus_lines():
    text = CORPUS.read_text(encoding="utf-8")
    lines = text.split("\n")
    return lines[:-1] if text.endswith("\n") else lines


def train():
    """Vocabulary (SentencePiece layout) and merges of a BPE trained on Metaspace words of the corpus.

    The alphabet is the 120 most frequent characters (ties by code point); the others are deleted from the
    training text, so they need byte fallback. (The trainer's own limit_alphabet breaks ties differently
    from run to run.)"""
    lines = corpus_lines()
    counts = Counter(c for line in lines for c in line.replace(" ", ""))
    alphabet = {c for c, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:120]}
    training = ["".join(c for c in line if c == " " or c in alphabet) for line in lines]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator(training, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]):
        if t in SPECIALS:
            continue
        assert t not in vocab, f"trained piece {t!r} collides with a byte token"
        vocab[t] = len(vocab)
    merges = [list(m) if isinstance(m, (list, tuple)) else m.split(" ") for m in model["merges"]]
    return vocab, merges


def added(vocab, previous, content, special=True, normalized=False, lstrip=False, rstrip=False):
    """An added token with the id tokenizers gives it on loading: its id in the vocabulary, else the next
    one after the vocabulary and the added tokens before it."""
    id_ = vocab.get(content, max([len(vocab) - 1] + [t["id"] for t in previous]) + 1)
    return {"id": id_, "content": content, "single_word": False, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": normalized, "special": special}


def to_json(obj):
    """A tokenizers component (normalizer, pre-tokenizer, decoder, post-processor) as its JSON."""
    return json.loads(obj.__getstate__())


def tokenizer_json(vocab, merges, *, normalizer, pre_tokenizer, decoder, post_processor, added_tokens,
                   unk="<unk>", fuse_unk=True, byte_fallback=True, ignore_merges=None, string_merges=False):
    model = {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": fuse_unk, "byte_fallback": byte_fallback}
    if ignore_merges is not None:
        model["ignore_merges"] = ignore_merges
    model["vocab"] = vocab
    model["merges"] = [" ".join(m) for m in merges] if string_merges else merges
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": post_processor,
            "decoder": decoder, "model": model}


def llama_template(add_bos, add_eos, bos_id, eos_id):
    """The post-processor transformers' update_post_processor() builds from tokenizer_config.json."""
    single = ("<s>:0 " if add_bos else "") + "$A:0" + (" </s>:0" if add_eos else "")
    pair = single + (" <s>:1" if add_bos else "") + " $B:1" + (" </s>:1" if add_eos else "")
    specials = ([("<s>", bos_id)] if add_bos else []) + ([("</s>", eos_id)] if add_eos else [])
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def variants(vocab, merges):
    specials = [added(vocab, [], t) for t in SPECIALS]
    mistral_added = list(specials)
    for content, options in [("[INST]", {}), ("[/INST]", {}), ("<mask>", {"lstrip": True, "rstrip": True}),
                             ("Anvil", {"special": False, "normalized": True})]:
        mistral_added.append(added(vocab, mistral_added, content, **options))
    legacy_decoder = to_json(decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                                decoders.Strip(" ", 1, 0)]))
    bos_template = to_json(processors.TemplateProcessing(single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1",
                                                         special_tokens=[("<s>", 1)]))
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": {
        "__type": "AddedToken", "content": "<s>", "lstrip": False, "normalized": False, "rstrip": False,
        "single_word": False}, "clean_up_tokenization_spaces": False, "eos_token": {
        "__type": "AddedToken", "content": "</s>", "lstrip": False, "normalized": False, "rstrip": False,
        "single_word": False}, "legacy": False, "model_max_length": 1000000000000000019884624838656,
        "pad_token": None, "padding_side": "right", "sp_model_kwargs": {}, "tokenizer_class": "LlamaTokenizer",
        "unk_token": {"__type": "AddedToken", "content": "<unk>", "lstrip": False, "normalized": False,
                      "rstrip": False, "single_word": False}}
    yield "llama2", tokenizer_json(
        vocab, merges,
        normalizer=to_json(normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])),
        pre_tokenizer=None, decoder=legacy_decoder, post_processor=bos_template, added_tokens=specials,
        string_merges=True), config

    mistral_config = dict(config, add_eos_token=True)
    yield "metaspace_first", tokenizer_json(
        vocab, merges, normalizer=None,
        pre_tokenizer=to_json(pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)),
        decoder=legacy_decoder, post_processor=bos_template, ignore_merges=False,
        added_tokens=mistral_added), mistral_config

    yield "metaspace_always", tokenizer_json(
        vocab, merges, normalizer=None,
        pre_tokenizer={"type": "Metaspace", "replacement": "▁", "add_prefix_space": True},
        decoder=to_json(decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)),
        post_processor=to_json(processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> $B </s>", special_tokens=[("<s>", 1), ("</s>", 2)])),
        added_tokens=specials, fuse_unk=False, byte_fallback=False, ignore_merges=True), None

    yield "metaspace_never", tokenizer_json(
        vocab, merges, normalizer=None,
        pre_tokenizer=to_json(pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)),
        decoder=to_json(decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Metaspace(replacement="▁", prepend_scheme="never")])),
        post_processor=to_json(processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])])),
        added_tokens=specials, unk=None, ignore_merges=False), None


def decode_cases(tok, vocab, rng):
    """Random id sequences that stress the decoder: runs of byte tokens (valid UTF-8 or not), pieces with
    and without "▁", special tokens."""
    byte_ids = list(range(3, 259))
    utf8_runs = [[3 + b for b in ch.encode("utf-8")] for ch in "é😀日€"]
    pieces = [i for t, i in vocab.items() if i >= 259]
    all_ids = list(range(tok.get_vocab_size(with_added_tokens=True)))
    cases = []
    for _ in range(60):
        ids = []
        for _ in range(rng.randint(0, 10)):
            kind = rng.random()
            if kind < 0.3:
                ids.append(rng.choice(byte_ids))
            elif kind < 0.45:
                ids.extend(rng.choice(utf8_runs))
            elif kind < 0.75:
                ids.append(rng.choice(pieces))
            elif kind < 0.85:
                ids.append(rng.choice([0, 1, 2]))
            else:
                ids.append(rng.choice(all_ids))
        cases.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                      "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
    return cases


def dump_reference(ref):
    """JSON with one line per text, so that a change shows as a small diff."""
    out = ["{", f'  "tokenizers_version": {json.dumps(ref["tokenizers_version"])},']
    for key in ("ids", "decoded", "special", "decode_cases"):
        rows = [json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in ref[key]]
        out.append(f'  "{key}": [\n    ' + ",\n    ".join(rows) + "\n  ]" + ("," if key != "decode_cases" else ""))
    out.append("}")
    return "\n".join(out) + "\n"


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "data" / "sp_tokenizers"
    texts = TEXTS + corpus_lines()
    out.mkdir(parents=True, exist_ok=True)
    (out / "texts.json").write_text(json.dumps({"hand_written": len(TEXTS), "texts": texts}, ensure_ascii=False,
                                               indent=0) + "\n", encoding="utf-8")
    vocab, merges = train()
    for name, tj, config in variants(vocab, merges):
        d = out / name
        d.mkdir(exist_ok=True)
        text = json.dumps(tj, ensure_ascii=False, indent=1) + "\n"
        (d / "tokenizer.json").write_text(text, encoding="utf-8")
        if config is not None:
            (d / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        tok = Tokenizer.from_str(text)
        with_special = Tokenizer.from_str(text)
        if config is not None:
            with_special.post_processor = llama_template(config["add_bos_token"], config["add_eos_token"], 1, 2)
        covered = texts if name in ("llama2", "metaspace_first") else TEXTS
        ids = [tok.encode(t, add_special_tokens=False).ids for t in covered]
        decoded = [tok.decode(i, skip_special_tokens=False) for i in ids]
        ref = {"tokenizers_version": __version__, "ids": ids,
               "decoded": [None if dec == t else dec for dec, t in zip(decoded, covered)],
               "special": [with_special.encode(t, add_special_tokens=True).ids for t in TEXTS],
               "decode_cases": decode_cases(tok, vocab, random.Random(1234))}
        (d / "reference.json").write_text(dump_reference(ref), encoding="utf-8")
        print(f"[sp_tokenizers] {d}: vocab {tok.get_vocab_size()}, {len(merges)} merges, {sum(map(len, ids))} ids")


if __name__ == "__main__":
    main()
