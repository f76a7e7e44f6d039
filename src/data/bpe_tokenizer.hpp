// Byte-level BPE (GPT-2, RoBERTa, Llama 3 style) from a Hugging Face tokenizer.json.
//
// Supported: model BPE (vocab, merges as "a b" strings or [a, b] pairs, ignore_merges, unk_token,
// fuse_unk); pre_tokenizer ByteLevel (add_prefix_space, use_regex) or a Sequence of Split steps (regex or
// literal pattern, any behavior, invert) ending in ByteLevel; normalizer null; decoder ByteLevel or null;
// added tokens (special or not, single_word, lstrip, rstrip, normalized). The post_processor is ignored
// (encode() adds no template tokens). Anything else is rejected with an error naming the file and field.
#pragma once
#include <memory>

#include "data/tokenizer.hpp"
#include "data/tokenizer_json.hpp"

namespace anvil::data {

std::unique_ptr<Tokenizer> make_bpe_tokenizer(const TokenizerJson& tj);

// The pre-tokenizer regex of GPT-2's ByteLevel (ByteLevel with use_regex).
extern const char* const kGpt2Pattern;

}  // namespace anvil::data
