#!/usr/bin/env python3
"""Trains the byte-level BPE tokenizers Anvil's exactness tests check against, with `tokenizers` itself.

Usage: make_test_tokenizers.py OUT_DIR CORPUS...

Writes to OUT_DIR:
  gpt2_style.json    ByteLevelBPETokenizer (ByteLevel pre-tokenizer with GPT-2's regex), special tokens
                     with lstrip / rstrip / single_word, and non-special added tokens (normalized or not)
  prefix_space.json  ByteLevelBPETokenizer(add_prefix_space=True)
  llama3_style.json  Sequence[Split(Llama 3 regex, Isolated), ByteLevel(use_regex=False)], Llama 3 specials
  split_variants.json  Sequence of Splits with every other behavior (and invert), then ByteLevel
Training is deterministic, so the files are the same on every run.
"""
import sys

from tokenizers import AddedToken, ByteLevelBPETokenizer, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def lines_of(paths):
    for p in paths:
        yield from open(p, encoding="utf-8").read().split("\n")


def bpe_with(pre_tokenizer, corpus, vocab_size, specials):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines_of(corpus), trainer=trainer)
    return tok


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, corpus = sys.argv[1], sys.argv[2:]

    gpt2 = ByteLevelBPETokenizer()
    gpt2.train_from_iterator(lines_of(corpus), vocab_size=1500, special_tokens=["<|endoftext|>", "<pad>"],
                             show_progress=False)
    gpt2.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True),
                             AddedToken("<|sep|>", rstrip=True, special=True),
                             AddedToken("<SW>", single_word=True, special=True),
                             AddedToken("[CLS]", special=True), AddedToken("[SEP]", special=True)])
    gpt2.add_tokens([AddedToken("Anvil", normalized=True), AddedToken("hello world", normalized=False)])
    gpt2.save(f"{out}/gpt2_style.json")

    prefix = ByteLevelBPETokenizer(add_prefix_space=True)
    prefix.train_from_iterator(lines_of(corpus), vocab_size=800, special_tokens=["<|endoftext|>"],
                               show_progress=False)
    prefix.save(f"{out}/prefix_space.json")

    llama = bpe_with(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), corpus, 2000,
        ["<|begin_of_text|>", "<|end_of_text|>"])
    llama.add_special_tokens(["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"])
    llama.save(f"{out}/llama3_style.json")

    variants = bpe_with(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\d"), behavior="contiguous"),
        pre_tokenizers.Split("-", behavior="removed"),
        pre_tokenizers.Split(Regex(r"[.,!?]"), behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"[:;]"), behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"\s+"), behavior="isolated", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)]), corpus, 1000, ["</s>"])
    variants.save(f"{out}/split_variants.json")


if __name__ == "__main__":
    main()
