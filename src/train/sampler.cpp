#include "train/sampler.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

namespace anvil {

int32_t sample_token(const float* logits, int V, const SampleOptions& o, Rng& rng) {
  if (o.temperature <= 0.0f) return int32_t(std::max_element(logits, logits + V) - logits);
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  const auto more_likely = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  int k = V;
  if (o.top_k > 0 && o.top_k < V) {
    k = o.top_k;
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), more_likely);
  }
  float maxv = -INFINITY;
  for (int i = 0; i < k; ++i) maxv = std::max(maxv, logits[ids[i]]);
  std::vector<double> p(k);
  double total = 0;
  for (int i = 0; i < k; ++i) total += p[i] = std::exp(double(logits[ids[i]] - maxv) / o.temperature);
  if (o.top_p < 1.0f) {
    // The nucleus: the most likely candidates, in order, until their mass reaches top_p (at least one).
    std::vector<int> order(k);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return more_likely(ids[a], ids[b]); });
    std::vector<int32_t> kept_ids;
    std::vector<double> kept_p;
    double mass = 0;
    for (int i : order) {
      kept_ids.push_back(ids[i]);
      kept_p.push_back(p[i]);
      mass += p[i];
      if (mass >= double(o.top_p) * total) break;
    }
    k = int(kept_ids.size());
    std::copy(kept_ids.begin(), kept_ids.end(), ids.begin());
    p = std::move(kept_p);
    total = mass;
  }
  double u = rng.uniform() * total;
  for (int i = 0; i < k; ++i) {
    u -= p[i];
    if (u <= 0) return ids[i];
  }
  return ids[k - 1];
}

std::vector<int32_t> generate(Engine& engine, const std::vector<int32_t>& prompt, const SampleOptions& o,
                              Rng& rng) {
  Decoder& model = engine.decoder();
  const TransformerConfig& cfg = model.config();
  ANVIL_REQUIRE(!prompt.empty(), "generate: the prompt must contain at least one token");
  for (int32_t id : prompt)
    ANVIL_REQUIRE(id >= 0 && id < cfg.vocab_size,
                  "generate: prompt token {} is outside the vocabulary (size {})", id, cfg.vocab_size);
  std::vector<int32_t> all = prompt, out;
  std::vector<float> row(cfg.padded_vocab_size());
  const int window = model.max_seq();
  for (int i = 0; i < o.max_new_tokens; ++i) {
    const int T = std::min<int>(int(all.size()), window);
    engine.device().copy_to_device(engine.tokens(0), all.data() + all.size() - T, T * sizeof(int32_t));
    model.forward(engine.ops(), engine.tokens(0), nullptr, 1, T, 0.0f, false);
    model.copy_logits_to_host(engine.device(), row.data(), size_t(T - 1), 1);
    const int32_t next = sample_token(row.data(), cfg.vocab_size, o, rng);
    if (next == cfg.eos_token_id) break;
    all.push_back(next);
    out.push_back(next);
  }
  return out;
}

std::string decode_ids(const data::Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string out;
  std::vector<uint32_t> run;
  for (int32_t id : ids) {
    if (id >= 0 && uint64_t(id) < tok.vocab_size()) {
      run.push_back(uint32_t(id));
      continue;
    }
    out += tok.decode(run);
    run.clear();
    out += fmt::format("<|{}|>", id);
  }
  return out + tok.decode(run);
}

// --- Generator
// -----------------------------------------------------------------------------------------------

namespace {

int planned_length(const TransformerConfig& cfg, const GeneratorOptions& o) {
  ANVIL_REQUIRE(o.max_len >= 0 && o.max_len <= cfg.block_size,
                "generation: max_len {} must be between 1 and the model's block_size {} (0: block_size)",
                o.max_len, cfg.block_size);
  return o.max_len == 0 ? cfg.block_size : o.max_len;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Generator::Generator(const TransformerConfig& cfg, const GeneratorOptions& o)
    : Generator(cfg, o, make_device(o.device)) {}

Generator::Generator(const TransformerConfig& cfg, const GeneratorOptions& o, std::unique_ptr<Device> device)
    : cfg_(cfg), device_(std::move(device)) {
  ANVIL_REQUIRE(
      cfg.is_decoder(),
      "generation needs a causal language model (gpt2, llama, qwen2, mistral); family '{}' is not one",
      cfg.family);
  cfg.validate();
  ANVIL_ASSERT(device_ && device_->kind() == o.device, "Generator: the device is not of the planned kind");
  ANVIL_REQUIRE(o.max_batch >= 1, "generation: the batch must hold at least 1 prompt, got {}", o.max_batch);
  ANVIL_REQUIRE(o.prefill_chunk >= 1, "generation: prefill_chunk must be >= 1, got {}", o.prefill_chunk);
  const int max_len = planned_length(cfg, o);
  chunk_ = std::min(o.prefill_chunk, max_len);
  const OpsPrecision precision{precision_dtype(o.precision), DType::F32};
  // Inference keeps no activation past its block: with every block "checkpointed" all of them share one
  // block's buffers, and only the block outputs are per layer.
  decoder_ = std::make_unique<Decoder>(cfg, o.max_batch, chunk_, false,
                                       CheckpointPolicy{CheckpointMode::Full, 1}, precision);
  quantize_model(*decoder_, o.weight_storage);
  // forward_cached computes the logits of one row per sequence (a prefill chunk's last), never the chunk's.
  decoder_->set_logits_rows(size_t(o.max_batch));
  cache_ = std::make_unique<KvCache>(decoder_->spec(), o.max_batch, max_len, precision.compute);
  MemoryPlan plan;
  decoder_->plan_memory(plan, o.device);
  cache_->plan_memory(plan, o.device);
  i_inputs_ = plan.add("generation inputs (positions, tokens)", MemoryCategory::Data,
                       size_t(o.max_batch) * (1 + size_t(chunk_)) * sizeof(int32_t));
  if (o.device == DeviceKind::CUDA)
    i_workspace_ = plan.add("cuBLASLt workspace", MemoryCategory::Workspace, kCudaGemmWorkspaceBytes);
  const std::optional<size_t> available = device_->available_memory_bytes();
  ANVIL_REQUIRE(
      !available || plan.total_bytes() <= *available,
      "out of memory at start-up: generating {} sequences of up to {} positions needs {} but {} has {} "
      "available (fewer prompts at once, a smaller --max_new_tokens or --dtype bf16 need less):\n{}",
      o.max_batch, max_len, format_bytes(plan.total_bytes()), device_->name(),
      format_bytes(available.value_or(0)), plan.report());
  arena_ = std::make_unique<Arena>(*device_, std::move(plan));
  if (o.device == DeviceKind::CUDA)
    ops_ =
        make_cuda_ops(*device_, Fp32Matmul::Native,
                      CudaGemmBuffers{arena_->get<void>(i_workspace_), kCudaGemmWorkspaceBytes}, precision);
  else
    ops_ = make_cpu_ops(*device_, precision);
  decoder_->bind(*arena_);
  cache_->bind(*arena_);
  decoder_->upload_constants(*device_);
  inputs_ = arena_->get<int32_t>(i_inputs_);
  padded_vocab_ = cfg.padded_vocab_size();
  logits_.assign(size_t(o.max_batch) * padded_vocab_, 0.0f);
}

Generator::~Generator() = default;

void Generator::run(const std::vector<int32_t>& pos, const std::vector<int32_t>& tokens, int B, int Tn,
                    const std::vector<int>& last_rows, const std::vector<bool>& copy) {
  // One upload per forward: the positions, then the tokens.
  std::vector<int32_t> host(pos);
  host.insert(host.end(), tokens.begin(), tokens.end());
  device_->copy_to_device(inputs_, host.data(), host.size() * sizeof(int32_t));
  const int max_end = *std::max_element(pos.begin(), pos.end()) + Tn;
  decoder_->forward_cached(*ops_, *cache_, inputs_ + B, inputs_, B, Tn, max_end, last_rows);
  if (std::all_of(copy.begin(), copy.end(), [](bool c) { return c; })) {
    decoder_->copy_logits_to_host(*device_, logits_.data(), 0, size_t(B));
    return;
  }
  for (int b = 0; b < B; ++b)
    if (copy[b]) decoder_->copy_logits_to_host(*device_, logits_.data() + size_t(b) * padded_vocab_, b, 1);
}

void Generator::prefill(const std::vector<std::vector<int32_t>>& prompts) {
  const int B = int(prompts.size());
  ANVIL_REQUIRE(B >= 1 && B <= max_batch(),
                "generation: {} prompts, but this generator was planned for 1 to {}", B, max_batch());
  int longest = 0;
  for (int b = 0; b < B; ++b) {
    const std::vector<int32_t>& p = prompts[b];
    const int64_t n = int64_t(p.size());
    ANVIL_REQUIRE(n > 0, "generation: prompt {} is empty (it needs at least one token)", b + 1);
    ANVIL_REQUIRE(n <= cfg_.block_size,
                  "generation: prompt {} has {} tokens, more than the model's block_size {} (the longest "
                  "sequence it takes); shorten the prompt",
                  b + 1, n, cfg_.block_size);
    ANVIL_REQUIRE(n <= max_len(),
                  "generation: prompt {} has {} tokens, more than the {} positions planned per "
                  "sequence",
                  b + 1, n, max_len());
    for (int32_t id : p)
      ANVIL_REQUIRE(id >= 0 && id < cfg_.vocab_size,
                    "generation: prompt {} has token id {}, outside the model's vocabulary (0 to {})", b + 1,
                    id, cfg_.vocab_size - 1);
    longest = std::max(longest, int(n));
  }
  batch_ = B;
  lengths_.assign(size_t(B), 0);
  // Chunks of positions [c0, c0 + Tn) of every sequence. A prompt that ends earlier feeds token 0 after its
  // end: those positions lie past its last real one, so no real token attends to them, and decoding
  // overwrites each before any query reads it.
  for (int c0 = 0; c0 < longest; c0 += chunk_) {
    const int Tn = std::min(chunk_, longest - c0);
    std::vector<int32_t> pos(size_t(B), c0), tokens(size_t(B) * Tn, 0);
    std::vector<int> last(size_t(B), 0);
    std::vector<bool> copy(size_t(B), false);
    for (int b = 0; b < B; ++b) {
      const int len = int(prompts[b].size());
      for (int t = 0; t < Tn && c0 + t < len; ++t) tokens[size_t(b) * Tn + t] = prompts[b][c0 + t];
      if (len - 1 >= c0 && len - 1 < c0 + Tn) last[b] = len - 1 - c0, copy[b] = true;
    }
    run(pos, tokens, B, Tn, last, copy);
  }
  for (int b = 0; b < B; ++b) lengths_[b] = int(prompts[b].size());
}

void Generator::step(const std::vector<int32_t>& tokens, const std::vector<bool>& active) {
  const int B = batch_;
  ANVIL_REQUIRE(B > 0, "generation: step() before prefill()");
  ANVIL_REQUIRE(tokens.size() == size_t(B) && (active.empty() || active.size() == size_t(B)),
                "generation: step() got {} tokens for {} sequences", tokens.size(), B);
  std::vector<int32_t> pos(static_cast<size_t>(B)), toks(static_cast<size_t>(B), 0);
  std::vector<bool> on(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) {
    on[b] = active.empty() || active[b];
    if (on[b]) {
      ANVIL_REQUIRE(lengths_[b] < max_len(),
                    "generation: sequence {} already fills the {} positions planned for it", b + 1,
                    max_len());
      ANVIL_REQUIRE(tokens[b] >= 0 && tokens[b] < cfg_.vocab_size,
                    "generation: token id {} of sequence {} is outside the model's vocabulary (0 to {})",
                    tokens[b], b + 1, cfg_.vocab_size - 1);
      pos[b] = lengths_[b], toks[b] = tokens[b];
    } else {
      // A finished sequence rides along on a position of its own that nothing reads any more.
      pos[b] = std::min(lengths_[b], max_len() - 1);
    }
  }
  run(pos, toks, B, 1, {}, on);
  for (int b = 0; b < B; ++b)
    if (on[b]) ++lengths_[b];
}

std::vector<std::vector<int32_t>> Generator::generate(const std::vector<std::vector<int32_t>>& prompts,
                                                      const SampleOptions& o, Rng& rng,
                                                      GenerationStats* stats) {
  ANVIL_REQUIRE(o.max_new_tokens >= 0, "generation: max_new_tokens must be >= 0, got {}", o.max_new_tokens);
  ANVIL_REQUIRE(std::isfinite(o.temperature) && o.temperature >= 0,
                "generation: temperature must be >= 0 (0: greedy), got {}", o.temperature);
  ANVIL_REQUIRE(o.top_k >= 0, "generation: top_k must be >= 0 (0: all tokens), got {}", o.top_k);
  ANVIL_REQUIRE(o.top_p > 0 && o.top_p <= 1, "generation: top_p must be in (0, 1], got {}", o.top_p);
  const int B = int(prompts.size());
  GenerationStats st;
  st.cache_full.assign(size_t(B), false);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(B));
  auto t0 = std::chrono::steady_clock::now();
  prefill(prompts);  // validates the prompts even when no token is asked for
  st.prefill_seconds = seconds_since(t0);
  for (const auto& p : prompts) st.prompt_tokens += int64_t(p.size());
  std::vector<bool> active(size_t(B), o.max_new_tokens > 0);
  std::vector<int32_t> next(size_t(B), 0);
  // Draws in sequence order, so one prompt alone draws as it would in a batch of one.
  const auto sample_all = [&] {
    for (int b = 0; b < B; ++b) {
      if (!active[b]) continue;
      const int32_t id = sample_token(logits(b), cfg_.vocab_size, o, rng);
      if (id == cfg_.eos_token_id) {
        active[b] = false;
        continue;
      }
      out[b].push_back(id);
      next[b] = id;
      if (int(out[b].size()) == o.max_new_tokens) {
        active[b] = false;
      } else if (lengths_[b] >= max_len()) {
        active[b] = false;
        st.cache_full[b] = true;
      }
    }
  };
  t0 = std::chrono::steady_clock::now();
  sample_all();
  while (std::any_of(active.begin(), active.end(), [](bool a) { return a; })) {
    step(next, active);
    ++st.decode_steps;
    sample_all();
  }
  st.decode_seconds = seconds_since(t0);
  for (const auto& ids : out) st.new_tokens += int64_t(ids.size());
  if (stats) *stats = st;
  return out;
}

}  // namespace anvil
