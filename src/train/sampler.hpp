// Autoregressive sampling (temperature, top-k) from a model bound to an Engine.
#pragma once
#include <vector>

#include "anvil/rng.hpp"
#include "data/tokenizer.hpp"
#include "train/engine.hpp"

namespace anvil {

struct SampleOptions {
  int max_new_tokens = 200;
  float temperature = 0.8f;  // 0: greedy
  int top_k = 40;            // 0: the whole vocabulary
};

// Picks a token id from one row of logits (the real vocabulary, size V).
int32_t sample_token(const float* logits, int V, const SampleOptions& o, Rng& rng);

// Extends `prompt` by up to max_new_tokens ids, stopping early at the model's eos token. The context
// is the last engine seq_len tokens. Returns only the new ids.
std::vector<int32_t> generate(Engine& engine, const std::vector<int32_t>& prompt, const SampleOptions& o,
                              Rng& rng);

// Decodes generated ids; ids the tokenizer does not know (a model vocabulary larger than the
// tokenizer's) show as <|id|>.
std::string decode_ids(const data::Tokenizer& tok, const std::vector<int32_t>& ids);

}  // namespace anvil
