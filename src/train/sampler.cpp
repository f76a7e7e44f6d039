#include "train/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace anvil {

int32_t sample_token(const float* logits, int V, const SampleOptions& o, Rng& rng) {
  if (o.temperature <= 0.0f) return int32_t(std::max_element(logits, logits + V) - logits);
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  int k = V;
  if (o.top_k > 0 && o.top_k < V) {
    k = o.top_k;
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
  }
  float maxv = -INFINITY;
  for (int i = 0; i < k; ++i) maxv = std::max(maxv, logits[ids[i]]);
  std::vector<double> p(k);
  double total = 0;
  for (int i = 0; i < k; ++i) total += p[i] = std::exp(double(logits[ids[i]] - maxv) / o.temperature);
  double u = rng.uniform() * total;
  for (int i = 0; i < k; ++i) {
    u -= p[i];
    if (u <= 0) return ids[i];
  }
  return ids[k - 1];
}

std::vector<int32_t> generate(Engine& engine, const std::vector<int32_t>& prompt, const SampleOptions& o,
                              Rng& rng) {
  GptModel& model = engine.gpt();
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

}  // namespace anvil
