// BPE from a Hugging Face tokenizer.json, in the two pipelines real models use:
//
// Byte-level (GPT-2, RoBERTa, Llama 3): pre_tokenizer ByteLevel (add_prefix_space, use_regex) or a Sequence
// of Split steps (regex or literal pattern, any behavior, invert) ending in ByteLevel; normalizer null;
// decoder ByteLevel or null.
//
// SentencePiece-style (Llama 2, Mistral, TinyLlama; chosen when no ByteLevel step is present): the model
// works on characters, with byte_fallback (a character not in the vocabulary becomes its UTF-8 bytes as
// <0xNN> tokens; all 256 must be present); normalizer null or Prepend / Replace (String pattern) steps;
// pre_tokenizer null or Metaspace (replacement, prepend_scheme first/always/never, split); decoder null or
// Replace (String pattern), ByteFallback, Fuse, Strip, Metaspace steps.
//
// Both: model BPE (vocab, merges as "a b" strings or [a, b] pairs, ignore_merges, unk_token, fuse_unk);
// added tokens (special or not, single_word, lstrip, rstrip, normalized), split out before the model. The
// post_processor is read by load_tokenizer (special_template()); encode() adds no template tokens.
// Anything else is rejected with an error naming the file, the field and the value.
#pragma once
#include <memory>

#include "data/tokenizer.hpp"
#include "data/tokenizer_json.hpp"

namespace anvil::data {

std::unique_ptr<Tokenizer> make_bpe_tokenizer(const TokenizerJson& tj);

// The pre-tokenizer regex of GPT-2's ByteLevel (ByteLevel with use_regex).
extern const char* const kGpt2Pattern;

}  // namespace anvil::data
