#!/usr/bin/env python3
"""Writes the fixed tokenizers that fuzz_tokenizer_encode loads (tests/fuzz/fixtures/), trained with Hugging
Face `tokenizers` on tests/data/tokenizer_corpus.txt with small vocabularies so the files stay small, and
the seed corpora of every target (tests/fuzz/corpus/<target>/).

Usage: python3 tests/fuzz/make_fixtures.py   (from the repository root; training is deterministic)

  bpe_gpt2.json      ByteLevel pre-tokenizer with GPT-2's regex; added tokens that strip nothing, so
                     decode(encode(text)) == text for valid UTF-8 (the harness checks it)
  bpe_llama3.json    Sequence[Split(Llama 3 regex, Isolated), ByteLevel(use_regex=False)]; also lossless
  bpe_variants.json  Splits with the other behaviors (and invert), ByteLevel with a prefix space, added
                     tokens with lstrip / rstrip / single_word and a normalized one (lossy)
  wordpiece.json     BertNormalizer + BertPreTokenizer + WordPiece, with extra added tokens
  vocab.txt          the same WordPiece vocabulary as a BERT vocab.txt
"""
import json
import os
import re
import struct

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

CORPUS = "tests/data/tokenizer_corpus.txt"
OUT = "tests/fuzz/fixtures"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def lines():
    return open(CORPUS, encoding="utf-8").read().split("\n")


def byte_level_bpe(pre, vocab_size, specials):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines(), trainer=trainer)
    return tok


def save(tok, name):
    # Compact JSON: the files are inputs, not documents.
    data = json.loads(tok.to_str())
    with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


def main():
    os.makedirs(OUT, exist_ok=True)
    gpt2 = byte_level_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), 500,
                          ["<|endoftext|>"])
    gpt2.add_tokens([AddedToken("hello world", normalized=False)])
    save(gpt2, "bpe_gpt2.json")

    llama = byte_level_bpe(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), 500,
        ["<|begin_of_text|>", "<|end_of_text|>"])
    save(llama, "bpe_llama3.json")

    variants = byte_level_bpe(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\d"), behavior="contiguous"),
        pre_tokenizers.Split("-", behavior="removed"),
        pre_tokenizers.Split(Regex(r"[.,!?]"), behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"[:;]"), behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"\s+"), behavior="isolated", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)]), 400, ["</s>"])
    variants.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True),
                                 AddedToken("<|sep|>", rstrip=True, special=True),
                                 AddedToken("<SW>", single_word=True, special=True)])
    variants.add_tokens([AddedToken("Anvil", normalized=True)])
    save(variants, "bpe_variants.json")

    # The WordPiece vocabulary is built here rather than trained (WordPieceTrainer breaks ties differently
    # from run to run): frequent characters alone and as continuations, frequent words, common suffixes.
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    text = open(CORPUS, encoding="utf-8").read().lower()
    char_counts = {}
    for c in text:
        if not c.isspace():
            char_counts[c] = char_counts.get(c, 0) + 1
    chars = [c for c, _ in sorted(char_counts.items(), key=lambda kv: (-kv[1], kv[0]))[:200]]  # rare: [UNK]
    counts = {}
    for w in re.findall(r"\w+", text):
        counts[w] = counts.get(w, 0) + 1
    words = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:300] if len(w) > 1]
    suffixes = ["##s", "##ed", "##ing", "##er", "##ly", "##n't"]
    tokens = specials + chars + ["##" + c for c in chars] + words + suffixes
    vocab = {}
    for t in tokens:
        vocab.setdefault(t, len(vocab))
    wp = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=24))
    wp.normalizer = normalizers.BertNormalizer(lowercase=True)
    wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wp.decoder = decoders.WordPiece()
    wp.add_special_tokens([AddedToken("<extra>", lstrip=True, rstrip=True, special=True)])
    wp.add_tokens([AddedToken("Déjà", normalized=True), AddedToken("x y", single_word=True, normalized=False)])
    save(wp, "wordpiece.json")
    vocab = wp.get_vocab(with_added_tokens=False)
    with open(os.path.join(OUT, "vocab.txt"), "w", encoding="utf-8") as f:
        for token, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
            f.write(token + "\n")
    write_seeds()


# ---- Seed corpora: a few small valid inputs per target (and one near miss), for the fuzzer to mutate.

def seed(target, name, data):
    d = os.path.join("tests/fuzz/corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))


def safetensors(tensors, metadata=None):
    """tensors: (name, dtype, shape, raw bytes)."""
    header, offset = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors)


def token_shard(tokens, vocab_size, u32=False):
    body = struct.pack(f"<{len(tokens)}{'I' if u32 else 'H'}", *tokens)
    header = b"ANVILTOK" + struct.pack("<IIQQ", 1, 2 if u32 else 1, len(tokens), vocab_size)
    return header + b"\0" * (64 - len(header)) + body


def pad8(b):
    return b + b"\0" * (-len(b) % 8)


def classification_shard(examples, labels, names, vocab_size, max_length, u32=False):
    names_json = json.dumps(names, separators=(",", ":"), ensure_ascii=False).encode()
    offsets = [0]
    for e in examples:
        offsets.append(offsets[-1] + len(e))
    tokens = [t for e in examples for t in e]
    header = b"ANVILCLS" + struct.pack("<IIQQIIQQ", 1, 2 if u32 else 1, len(examples), vocab_size, max_length,
                                       len(names), len(names_json), len(tokens))
    header += b"\0" * (64 - len(header))
    return (header + pad8(names_json) + struct.pack(f"<{len(offsets)}Q", *offsets) +
            pad8(struct.pack(f"<{len(tokens)}{'I' if u32 else 'H'}", *tokens)) +
            pad8(struct.pack(f"<{len(labels)}i", *labels)))


def byte_chars():
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    chars, n = {}, 256
    for b in range(256):
        chars[b] = chr(b) if b in printable else chr(n)
        if b not in printable:
            n += 1
    return chars


def write_seeds():
    f32 = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
    seed("fuzz_safetensors", "two_tensors_metadata", safetensors(
        [("wte.weight", "F32", [2, 3], f32), ("ln.bias", "F16", [2], b"\0\x3c\0\x40")], {"format": "pt"}))
    seed("fuzz_safetensors", "every_dtype", safetensors(
        [("a", "BF16", [1], b"\x80\x3f"), ("b", "I8", [3], b"\1\2\3"), ("c", "I32", [], b"\7\0\0\0"),
         ("d", "U16", [1, 1], b"\5\0"), ("e", "F32", [0, 4], b"")]))
    seed("fuzz_safetensors", "empty_header", safetensors([]))
    seed("fuzz_safetensors", "truncated", safetensors([("x", "F32", [2, 3], f32)])[:-4])
    # Regressions: inputs of bugs the fuzzers led to (docs/testing.md, "Fuzzing").
    seed("fuzz_safetensors", "regress_numel_overflow",
         safetensors([("w", "F32", [2**62, 2, 0], b"")]))

    chars = byte_chars()
    vocab = {chars[b]: b for b in range(256)}
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "w")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    bpe = {"version": "1.0", "added_tokens": [
               {"id": len(vocab), "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                "rstrip": False, "normalized": False, "special": True},
               {"id": len(vocab) + 1, "content": "<m>", "single_word": True, "lstrip": True, "rstrip": True,
                "normalized": True, "special": False}],
           "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                             "use_regex": True},
           "post_processor": None, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False,
                     "byte_fallback": False, "ignore_merges": False, "vocab": vocab,
                     "merges": [[a, b] for a, b in merges]}}
    dump = lambda j: json.dumps(j, ensure_ascii=False, separators=(",", ":"))
    seed("fuzz_tokenizer_json", "bpe_byte_level.json", dump(bpe))
    bpe["model"]["merges"] = [f"{a} {b}" for a, b in merges]
    bpe["model"]["ignore_merges"] = True
    bpe["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\p{N}{1,3}|\s+(?!\S)|[^\s\p{L}\p{N}]+"},
         "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"String": "-"}, "behavior": "MergedWithNext", "invert": True},
        {"type": "ByteLevel", "add_prefix_space": True, "use_regex": False}]}
    seed("fuzz_tokenizer_json", "bpe_split_sequence.json", dump(bpe))
    wp = {"added_tokens": [{"id": 1, "content": "[UNK]", "special": True},
                           {"id": 2, "content": "[CLS]", "special": True},
                           {"id": 7, "content": "<x>", "lstrip": True, "normalized": True}],
          "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                         "strip_accents": None, "lowercase": True},
          "pre_tokenizer": {"type": "BertPreTokenizer"},
          "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
          "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                    "max_input_chars_per_word": 100,
                    "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "hello": 4, "##lo": 5, "he": 6,
                              "<x>": 7, "é": 8}}}
    seed("fuzz_tokenizer_json", "wordpiece.json", dump(wp))
    small = {"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel"}}
    seed("fuzz_tokenizer_json", "regress_number_overflow.json", dump(small)[:-1] + ',"dropout":1e500}')
    small["model"]["vocab"]["b"] = 2**31 - 1
    seed("fuzz_tokenizer_json", "regress_sparse_ids.json", dump(small))
    del small["model"]["vocab"]["b"]
    small["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\C"}, "behavior": "Isolated"}, {"type": "ByteLevel"}]}
    seed("fuzz_tokenizer_json", "regress_backslash_c.json", dump(small))
    seed("fuzz_tokenizer_json", "vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n##s\nhello\n")

    texts = ["Hello world, it's 2024! <|endoftext|>hello world",
             "Déjà vu — naïve café 日本語 🙂\t\r\n  x y <extra> [CLS] [MASK]",
             "<mask> a <|sep|>  <SW> Anvil 12345-67: a; b.",
             "bad \xff\xfe UTF-8 \xe2\x82 and \xed\xa0\x80 surrogates"]
    for i, text in enumerate(texts):
        raw = text.encode("utf-8", "surrogateescape") if "\xff" not in text else text.encode("latin-1")
        for selector in (1, 2, 3, 4, 5, 6):  # tokenizers 1..5 and 0 with mode 1 (encode)
            seed("fuzz_tokenizer_encode", f"encode_{i}_{selector % 6}", bytes([selector]) + raw)
    seed("fuzz_tokenizer_encode", "decode_ids", bytes([12 + 1]) + struct.pack("<6H", 10, 200, 300, 40, 5, 6))
    seed("fuzz_tokenizer_encode", "helpers_wordpiece", bytes([18 + 4]) + "Ünïcödé ÅΣ İ x\u0301".encode())

    seed("fuzz_token_shard", "u16", token_shard([1, 2, 3, 255, 0], 256))
    seed("fuzz_token_shard", "u32", token_shard([70000, 1, 65536], 70001, u32=True))
    seed("fuzz_token_shard", "empty", token_shard([], 50257))

    seed("fuzz_classification_shard", "u16", classification_shard(
        [[5, 6, 7], [], [1]], [1, 0, 1], ["neg", "pos"], 100, 4))
    seed("fuzz_classification_shard", "u32", classification_shard(
        [[70000, 2]], [2], ["a", "b", "ç"], 70001, 2, u32=True))
    seed("fuzz_classification_shard", "empty", classification_shard([], [], ["only"], 1, 1))

    jsonl = '{"text": "first doc"}\n\n{"text": "caf\u00e9 \\u00e9"}\r\n[1]\n{"t": 1}\nnot json\n{"text": "end"}'
    csv = 'text,label\n"a, ""quoted""\nfield",pos\nplain,neg\r\n\nmissing\nx,other\ny,\n'
    seed("fuzz_csv_jsonl", "lines", "\x00\ufeff" + jsonl)
    seed("fuzz_csv_jsonl", "csv", "\x01" + csv)
    seed("fuzz_csv_jsonl", "segments", b"\x02\x05\x00" + "héllo wörld\nsecond line".encode())
    seed("fuzz_csv_jsonl", "prepare_jsonl", b"\x03\x0a" + jsonl.encode())
    seed("fuzz_csv_jsonl", "prepare_csv", b"\x03\x4a" + csv.replace("pos", "neg", 1).encode())
    seed("fuzz_csv_jsonl", "regress_partial_char_in_message", b"\x03\x0a" + b'{"text": "ok"}\n\x8d\n')
    seed("fuzz_csv_jsonl", "prepare_text", b"\x03\x09" + "Some text\nwith lines.\n".encode())


if __name__ == "__main__":
    main()
