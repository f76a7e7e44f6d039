// Autoregressive sampling from a decoder (every family): greedy, temperature, top-k and top-p (nucleus).
// Generator generates with a KV cache, several prompts of different lengths decoding together, everything
// it needs planned in one arena before the first token; generate() recomputes the whole window for every
// token on an Engine's model (the trainer's samples, and the reference the cache is tested against).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "anvil/rng.hpp"
#include "data/tokenizer.hpp"
#include "model/kv_cache.hpp"
#include "train/engine.hpp"

namespace anvil {

struct SampleOptions {
  int max_new_tokens = 200;
  float temperature = 0.8f;  // 0: greedy
  int top_k = 40;            // 0: the whole vocabulary
  // Nucleus sampling: among the top_k, the most likely tokens whose probabilities (at this temperature) first
  // reach top_p together; 1: all of them. In (0, 1].
  float top_p = 1.0f;
};

// Picks a token id from one row of logits (the real vocabulary, size V): the first maximum when temperature
// is 0, else a draw from softmax(logits / temperature) restricted to the top_k most likely ids (ties: the
// lower id first) and then to the top_p nucleus. With top_p = 1 the draw is the same as before top_p existed
// (one rng.uniform() per token).
int32_t sample_token(const float* logits, int V, const SampleOptions& o, Rng& rng);

// Extends `prompt` by up to max_new_tokens ids, stopping early at the model's eos token (not returned), by
// recomputing the last engine seq_len tokens for every new one. Returns only the new ids.
std::vector<int32_t> generate(Engine& engine, const std::vector<int32_t>& prompt, const SampleOptions& o,
                              Rng& rng);

// Decodes generated ids; ids the tokenizer does not know (a model vocabulary larger than the
// tokenizer's) show as <|id|>.
std::string decode_ids(const data::Tokenizer& tok, const std::vector<int32_t>& ids);

struct GeneratorOptions {
  DeviceKind device = DeviceKind::CPU;
  Precision precision = Precision::FP32;
  int max_batch = 1;  // prompts generated together
  // Positions per sequence the KV cache holds (prompt and generated tokens); 0: the model's block_size.
  int max_len = 0;
  // Prompt tokens per sequence in one prefill forward (the decoder's planned sequence length).
  int prefill_chunk = 256;
  // The block Linear weights kept quantized (int8 / NF4: quantize_model); Compute: none.
  WeightStorage weight_storage = WeightStorage::Compute;
};

// What one Generator::generate did, for the tokens/s line.
struct GenerationStats {
  int64_t prompt_tokens = 0, new_tokens = 0;
  int decode_steps = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  // Per sequence: stopped because its cache was full (max_len positions) before max_new_tokens or eos.
  std::vector<bool> cache_full;
};

class Generator {
 public:
  // Makes the device of o.device (or takes the caller's), plans the decoder (one prefill chunk of
  // activations, all recomputed into shared buffers), the KV cache and the inputs, and allocates the arena:
  // an anvil::Error naming the plan, before allocating, when it does not fit the device.
  Generator(const TransformerConfig& cfg, const GeneratorOptions& o);
  Generator(const TransformerConfig& cfg, const GeneratorOptions& o, std::unique_ptr<Device> device);
  ~Generator();

  Device& device() { return *device_; }
  Ops& ops() { return *ops_; }
  Decoder& decoder() { return *decoder_; }
  const KvCache& cache() const { return *cache_; }
  const MemoryPlan& plan() const { return arena_->plan(); }
  int max_batch() const { return cache_->max_batch(); }
  int max_len() const { return cache_->max_len(); }

  // Runs the prompts (at most max_batch(), each 1..max_len() ids of the vocabulary, no longer than the
  // model's block_size) from position 0; logits(b) is then the next-token distribution after prompt b.
  // Throws anvil::Error naming the prompt and the value for a bad prompt.
  void prefill(const std::vector<std::vector<int32_t>>& prompts);
  // Appends tokens[b] to each sequence b after the last prefill: logits(b) becomes the distribution after it.
  // A sequence with active[b] false (empty: all active) is finished: its token is ignored and its length
  // kept. An active sequence needs room: length(b) < max_len().
  void step(const std::vector<int32_t>& tokens, const std::vector<bool>& active = {});
  // The logits of the real vocabulary (fp32) after sequence b's last token.
  const float* logits(int b) const { return logits_.data() + size_t(b) * padded_vocab_; }
  int length(int b) const { return lengths_[size_t(b)]; }

  // Generates up to o.max_new_tokens ids after each prompt, the sequences decoding together. A sequence
  // stops at the model's eos token (not returned), after max_new_tokens, or when its cache is full (max_len()
  // positions: prompt plus generated tokens, the last generated one uncached). Returns the new ids per
  // prompt.
  std::vector<std::vector<int32_t>> generate(const std::vector<std::vector<int32_t>>& prompts,
                                             const SampleOptions& o, Rng& rng,
                                             GenerationStats* stats = nullptr);

 private:
  // Uploads positions and tokens [B, Tn] and runs the cached forward; copies rows `copy` of the logits.
  void run(const std::vector<int32_t>& pos, const std::vector<int32_t>& tokens, int B, int Tn,
           const std::vector<int>& last_rows, const std::vector<bool>& copy);

  TransformerConfig cfg_;
  std::unique_ptr<Device> device_;  // declared first: destroyed after everything living on it
  std::unique_ptr<Decoder> decoder_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<Ops> ops_;
  size_t i_inputs_ = 0, i_workspace_ = SIZE_MAX;
  int32_t* inputs_ = nullptr;  // device: [B] positions, then [B, Tn] tokens
  int chunk_ = 1, batch_ = 0, padded_vocab_ = 0;
  std::vector<int> lengths_;   // cached positions per sequence
  std::vector<float> logits_;  // host [max_batch, padded vocab]
};

}  // namespace anvil
