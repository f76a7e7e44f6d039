// Generation with a KV cache (Generator, Decoder::forward_cached, the KV-cache ops) on the CPU: on small
// random decoders of each kind (GPT-2; Llama with grouped-query heads and head_dim != n_embd / n_head;
// Mistral with a sliding window shorter than the sequence), the cached logits equal the full forward's at
// every position, greedy generation equals recomputing the window for every token, and a batch of prompts of
// different lengths equals each prompt alone. Also the sampler (temperature, top-k, top-p) and `anvil
// generate`
// (--prompt_ids output, text batches, errors).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"
#include "test_util.hpp"
#include "train/sampler.hpp"

namespace anvil {
namespace {

TransformerConfig gpt2_config() {
  TransformerConfig c;
  c.family = "gpt2";
  c.n_layer = 2, c.n_head = 4, c.n_embd = 32, c.vocab_size = 97, c.block_size = 32;
  return c;
}

// Grouped-query heads (4 query heads on 2 key/value heads) of head_dim 12 != 32 / 4, RoPE, untied head.
TransformerConfig llama_config() {
  TransformerConfig c;
  c.family = "llama";
  c.n_layer = 2, c.n_head = 4, c.n_kv_head = 2, c.n_embd = 32, c.head_dim = 12;
  c.intermediate_size = 48, c.vocab_size = 101, c.block_size = 40;
  c.rope_theta = 10000, c.tie_word_embeddings = false, c.hidden_act = "silu";
  return c;
}

// Mistral: a sliding window of 5 positions, much shorter than the sequences below.
TransformerConfig mistral_config() {
  TransformerConfig c = llama_config();
  c.family = "mistral";
  c.sliding_window = 5;
  return c;
}

// Weights of a larger spread than the family's initialisation, so the logits are far from uniform and greedy
// choices are not near ties.
std::vector<float> random_weights(const ParamLayout& layout, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 0.3f);
  std::vector<float> w(layout.total_numel());
  for (float& x : w) x = dist(rng);
  return w;
}

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = dist(rng);
  return t;
}

// The full forward's logits of every position of `tokens` (one sequence), [T, padded vocab].
std::vector<float> full_logits(const TransformerConfig& cfg, const std::vector<float>& weights,
                               const std::vector<int32_t>& tokens) {
  EngineOptions o;
  o.batch_size = 1;
  o.seq_len = int(tokens.size());
  Engine e(cfg, o);
  e.decoder().upload_weights(e.device(), weights.data());
  e.device().copy_to_device(e.tokens(0), tokens.data(), tokens.size() * sizeof(int32_t));
  e.decoder().forward(e.ops(), e.tokens(0), nullptr, 1, int(tokens.size()), 0, false);
  std::vector<float> out(tokens.size() * size_t(cfg.padded_vocab_size()));
  e.decoder().copy_logits_to_host(e.device(), out.data(), 0, tokens.size());
  return out;
}

std::unique_ptr<Generator> make_generator(const TransformerConfig& cfg, const std::vector<float>& weights,
                                          int max_batch, int max_len, int prefill_chunk) {
  GeneratorOptions o;
  o.max_batch = max_batch, o.max_len = max_len, o.prefill_chunk = prefill_chunk;
  auto g = std::make_unique<Generator>(cfg, o);
  g->decoder().upload_weights(g->device(), weights.data());
  return g;
}

// max |a - b| over the real vocabulary, relative to max |a|.
double rel_diff(const float* a, const float* b, int V) {
  double err = 0, ref = 0;
  for (int i = 0; i < V; ++i) {
    err = std::max(err, std::fabs(double(a[i]) - b[i]));
    ref = std::max(ref, std::fabs(double(a[i])));
  }
  return err / std::max(ref, 1e-30);
}

constexpr double kTol = 2e-5;  // fp32: the same math in another order

class KvCacheFamilies : public ::testing::TestWithParam<const char*> {
 protected:
  TransformerConfig config() const {
    const std::string f = GetParam();
    return f == "gpt2" ? gpt2_config() : f == "llama" ? llama_config() : mistral_config();
  }
};

// Prefill one token, then one decode step per token: the logits after each equal the full forward's row.
TEST_P(KvCacheFamilies, DecodeStepsEqualTheFullForwardAtEveryPosition) {
  const TransformerConfig cfg = config();
  const int T = 24, V = cfg.vocab_size, Vp = cfg.padded_vocab_size();
  const std::vector<float> w = random_weights(ParamLayout::decoder(cfg), 1);
  const std::vector<int32_t> tokens = random_tokens(T, V, 2);
  const std::vector<float> ref = full_logits(cfg, w, tokens);
  auto gen = make_generator(cfg, w, 1, T, 4);
  gen->prefill({{tokens[0]}});
  EXPECT_LT(rel_diff(ref.data(), gen->logits(0), V), kTol) << "position 0";
  for (int t = 1; t < T; ++t) {
    gen->step({tokens[t]});
    ASSERT_EQ(gen->length(0), t + 1);
    EXPECT_LT(rel_diff(ref.data() + size_t(t) * Vp, gen->logits(0), V), kTol) << "position " << t;
  }
}

// Prompts prefilled in chunks (of 4 and 5 tokens, so chunks end inside and at the end of a prompt), then
// decoded: every logits row equals the full forward's.
TEST_P(KvCacheFamilies, ChunkedPrefillThenDecodeEqualsTheFullForward) {
  const TransformerConfig cfg = config();
  const int T = 30, V = cfg.vocab_size, Vp = cfg.padded_vocab_size();
  const std::vector<float> w = random_weights(ParamLayout::decoder(cfg), 3);
  const std::vector<int32_t> tokens = random_tokens(T, V, 4);
  const std::vector<float> ref = full_logits(cfg, w, tokens);
  for (const int chunk : {4, 5}) {
    for (const int prompt : {1, 7, 8, 20}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk) + ", prompt " + std::to_string(prompt));
      auto gen = make_generator(cfg, w, 1, T, chunk);
      gen->prefill({std::vector<int32_t>(tokens.begin(), tokens.begin() + prompt)});
      EXPECT_LT(rel_diff(ref.data() + size_t(prompt - 1) * Vp, gen->logits(0), V), kTol);
      for (int t = prompt; t < T; ++t) {
        gen->step({tokens[t]});
        EXPECT_LT(rel_diff(ref.data() + size_t(t) * Vp, gen->logits(0), V), kTol) << "position " << t;
      }
    }
  }
}

// Greedy generation with the cache gives the ids of generate(), which recomputes the window for each token.
TEST_P(KvCacheFamilies, GreedyWithTheCacheEqualsRecomputing) {
  const TransformerConfig cfg = config();
  const std::vector<float> w = random_weights(ParamLayout::decoder(cfg), 5);
  const std::vector<int32_t> prompt = random_tokens(9, cfg.vocab_size, 6);
  SampleOptions so;
  so.max_new_tokens = 16, so.temperature = 0;
  EngineOptions eo;
  eo.seq_len = cfg.block_size;
  Engine e(cfg, eo);
  e.decoder().upload_weights(e.device(), w.data());
  Rng r1(7), r2(7);
  const std::vector<int32_t> want = generate(e, prompt, so, r1);
  ASSERT_EQ(want.size(), 16u);
  auto gen = make_generator(cfg, w, 1, 0, 4);
  GenerationStats st;
  const auto got = gen->generate({prompt}, so, r2, &st);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], want);
  EXPECT_EQ(st.new_tokens, 16);
  EXPECT_EQ(st.prompt_tokens, 9);
  EXPECT_EQ(st.decode_steps, 15);  // the last new token is not fed back
  EXPECT_FALSE(st.cache_full[0]);
}

// A batch of prompts of different lengths (some ending inside a prefill chunk, one longer than a chunk)
// decodes to what each prompt gives alone, greedily and in its logits.
TEST_P(KvCacheFamilies, BatchOfDifferentLengthsEqualsEachPromptAlone) {
  const TransformerConfig cfg = config();
  const int V = cfg.vocab_size;
  const std::vector<float> w = random_weights(ParamLayout::decoder(cfg), 8);
  const std::vector<std::vector<int32_t>> prompts = {random_tokens(3, V, 10), random_tokens(11, V, 11),
                                                     random_tokens(1, V, 12), random_tokens(6, V, 13)};
  SampleOptions so;
  so.max_new_tokens = 10, so.temperature = 0;
  auto batch = make_generator(cfg, w, int(prompts.size()), 0, 4);
  batch->prefill(prompts);
  std::vector<std::vector<float>> batch_logits;
  for (size_t b = 0; b < prompts.size(); ++b)
    batch_logits.emplace_back(batch->logits(int(b)), batch->logits(int(b)) + V);
  Rng rng(1);
  const auto together = batch->generate(prompts, so, rng);
  for (size_t b = 0; b < prompts.size(); ++b) {
    SCOPED_TRACE("prompt " + std::to_string(b));
    auto alone = make_generator(cfg, w, 1, 0, 4);
    alone->prefill({prompts[b]});
    EXPECT_LT(rel_diff(alone->logits(0), batch_logits[b].data(), V), kTol);
    Rng r(1);
    EXPECT_EQ(alone->generate({prompts[b]}, so, r)[0], together[b]);
  }
}

INSTANTIATE_TEST_SUITE_P(Decoders, KvCacheFamilies, ::testing::Values("gpt2", "llama", "mistral"),
                         [](const auto& info) { return std::string(info.param); });

// The model's eos token ends a sequence (not returned) while the others of the batch go on.
TEST(Generator, StopsEachSequenceAtEos) {
  TransformerConfig cfg = llama_config();
  const std::vector<float> w = random_weights(ParamLayout::decoder(cfg), 20);
  const std::vector<std::vector<int32_t>> prompts = {random_tokens(4, cfg.vocab_size, 21),
                                                     random_tokens(7, cfg.vocab_size, 22)};
  SampleOptions so;
  so.max_new_tokens = 12, so.temperature = 0;
  Rng rng(0);
  const auto free_run = make_generator(cfg, w, 2, 0, 8)->generate(prompts, so, rng);
  // The eos: sequence 0's third token, cut at its first occurrence in each sequence.
  cfg.eos_token_id = free_run[0][2];
  const auto cut = [&](const std::vector<int32_t>& ids) {
    return std::vector<int32_t>(ids.begin(), std::find(ids.begin(), ids.end(), cfg.eos_token_id));
  };
  const auto stopped = make_generator(cfg, w, 2, 0, 8)->generate(prompts, so, rng);
  EXPECT_EQ(stopped[0], cut(free_run[0]));
  EXPECT_EQ(stopped[1], cut(free_run[1]));
  EXPECT_LE(stopped[0].size(), 2u);
}

// A cache of max_len positions holds prompt and generated tokens but the last; then the sequence stops.
TEST(Generator, StopsWhenTheCacheIsFull) {
  const TransformerConfig cfg = gpt2_config();
  const std::vector<float> w = random_weights(ParamLayout::decoder(cfg), 30);
  SampleOptions so;
  so.max_new_tokens = 50, so.temperature = 0;
  auto gen = make_generator(cfg, w, 2, 10, 4);
  Rng rng(0);
  GenerationStats st;
  const auto out = gen->generate({random_tokens(6, cfg.vocab_size, 31), random_tokens(2, cfg.vocab_size, 32)},
                                 so, rng, &st);
  EXPECT_EQ(out[0].size(), 5u);  // positions 6..9 cached, plus the token after position 9
  EXPECT_EQ(out[1].size(), 9u);
  EXPECT_TRUE(st.cache_full[0]);
  EXPECT_TRUE(st.cache_full[1]);
  // The whole block_size: the recomputing reference agrees up to there.
  auto full = make_generator(cfg, w, 1, 0, 8);
  const std::vector<int32_t> prompt = random_tokens(20, cfg.vocab_size, 33);
  GenerationStats fs;
  const auto ids = full->generate({prompt}, so, rng, &fs)[0];
  EXPECT_EQ(ids.size(), size_t(cfg.block_size - 20 + 1));
  EXPECT_TRUE(fs.cache_full[0]);
}

TEST(Generator, BadPromptsAreClearErrors) {
  const TransformerConfig cfg = gpt2_config();
  const std::vector<float> w = random_weights(ParamLayout::decoder(cfg), 40);
  auto gen = make_generator(cfg, w, 2, 0, 8);
  test::expect_error([&] { gen->prefill({random_tokens(33, cfg.vocab_size, 1)}); },
                     {"prompt 1 has 33 tokens, more than the model's block_size 32"});
  test::expect_error([&] { gen->prefill({{1, 2}, {}}); }, {"prompt 2 is empty"});
  test::expect_error(
      [&] {
        gen->prefill({{1, 97}});
      },
      {"prompt 1 has token id 97, outside the model's vocabulary (0 to 96)"});
  test::expect_error([&] { gen->prefill({{1}, {2}, {3}}); }, {"3 prompts", "planned for 1 to 2"});
  SampleOptions so;
  so.top_p = 0;
  Rng rng(0);
  test::expect_error([&] { gen->generate({{1}}, so, rng); }, {"top_p must be in (0, 1], got 0"});
  auto small = make_generator(cfg, w, 1, 8, 8);
  test::expect_error([&] { small->prefill({random_tokens(9, cfg.vocab_size, 1)}); },
                     {"prompt 1 has 9 tokens, more than the 8 positions planned per sequence"});
}

// The plan holds the cache: per layer K and V of [B, max_len, NKV, HS] in the compute type.
TEST(Generator, PlansTheCacheBeforeTheFirstToken) {
  const TransformerConfig cfg = llama_config();
  GeneratorOptions o;
  o.max_batch = 3, o.max_len = 20, o.precision = Precision::BF16;
  Generator gen(cfg, o);
  size_t kv = 0;
  for (const PlannedBuffer& b : gen.plan().buffers())
    if (b.name.starts_with("kv cache")) kv += b.bytes;
  EXPECT_EQ(kv, size_t(2) * cfg.n_layer * 3 * 20 * cfg.kv_heads() * cfg.head_size() * 2);
  EXPECT_EQ(gen.cache().bytes(), kv);
  EXPECT_EQ(KvCache::bytes_per_position(gen.decoder().spec(), DType::BF16) * 3 * 20, kv);
  // Logits for one row per sequence (a prefill chunk's last position), not for the whole chunk.
  size_t logits = 0;
  for (const PlannedBuffer& b : gen.plan().buffers())
    if (b.name == "logits") logits += b.bytes;
  EXPECT_EQ(gen.decoder().logits_rows(), 3u);
  EXPECT_EQ(logits, size_t(3) * cfg.padded_vocab_size() * 2);
}

// --- the ops on the CPU -----------------------------------------------------------------------------------

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// At position 0 the embedding is embedding_fwd's; with every sequence at p0, RoPE is rope_fwd(p0)'s: bit
// for bit, so a decode step computes what the full forward computes.
TEST(KvCacheOps, PositionsAgreeWithTheFullForwardOps) {
  auto dev = make_cpu_device();
  auto ops = make_cpu_ops(*dev);
  const int B = 2, T = 5, C = 8, V = 11;
  const std::vector<float> wte = randn(size_t(V) * C, 1), wpe = randn(size_t(T + 3) * C, 2);
  const std::vector<int32_t> tokens = random_tokens(B * T, V, 3), zero(B, 0), three(B, 3);
  std::vector<float> a(size_t(B) * T * C), b(a.size());
  ops->embedding_fwd(a.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  ops->embedding_fwd_at(b.data(), tokens.data(), wte.data(), wpe.data(), zero.data(), B, T, C);
  EXPECT_EQ(a, b);
  // Sequence 1 at position 3: its rows take wpe rows 3..7.
  const std::vector<int32_t> mixed = {0, 3};
  ops->embedding_fwd_at(b.data(), tokens.data(), wte.data(), wpe.data(), mixed.data(), B, T, C);
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c)
      EXPECT_EQ(b[(size_t(T) + t) * C + c], wte[size_t(tokens[T + t]) * C + c] + wpe[size_t(3 + t) * C + c]);

  const AttentionShape s{B, T, 4, 2, 6};
  const std::vector<float> inv_freq = {1.f, 0.1f, 0.01f}, qkv = randn(size_t(B) * T * s.qkv_width(), 4);
  std::vector<float> r1 = qkv, r2 = qkv;
  ops->rope_fwd(r1.data(), inv_freq.data(), s, 3);
  ops->rope_fwd_at(r2.data(), inv_freq.data(), s, three.data());
  EXPECT_EQ(r1, r2);
}

TEST(KvCacheOps, WritesAndAttendsAtEachSequencesPositions) {
  auto dev = make_cpu_device();
  auto ops = make_cpu_ops(*dev);
  const AttentionShape s{2, 3, 4, 2, 6};  // 2 sequences, 3 new tokens each, groups of 2 query heads
  const int S = 10;
  const size_t cache_n = size_t(s.B) * S * s.NKV * s.HS;
  std::vector<float> k(cache_n, 0.f), v(cache_n, 0.f);
  const KvCacheLayer cache{k.data(), v.data(), S};
  const std::vector<float> qkv = randn(size_t(s.B) * s.T * s.qkv_width(), 5);
  const std::vector<int32_t> pos = {0, 7};
  ops->kv_cache_write(cache, qkv.data(), pos.data(), s);
  const int W = s.qkv_width(), kv_row = s.NKV * s.HS;
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t)
      for (int c = 0; c < kv_row; ++c) {
        const size_t at = (size_t(b) * S + pos[b] + t) * kv_row + c, row = (size_t(b) * s.T + t) * W;
        EXPECT_EQ(k[at], qkv[row + s.q_width() + c]);
        EXPECT_EQ(v[at], qkv[row + s.q_width() + kv_row + c]);
      }
  // Sequence 0's first new token sees only itself: its output is its own value head.
  std::vector<float> out(size_t(s.B) * s.T * s.q_width());
  ops->cached_attention_fwd(out.data(), qkv.data(), cache, pos.data(), 10, 0, nullptr, 0, s);
  for (int h = 0; h < s.NH; ++h)
    for (int i = 0; i < s.HS; ++i)
      EXPECT_FLOAT_EQ(out[size_t(h) * s.HS + i], qkv[size_t(s.q_width() + kv_row) + (h / 2) * s.HS + i]);
  // Positions past the cache or past max_keys are errors naming the sequence.
  const std::vector<int32_t> far = {0, 8};
  test::expect_error(
      [&] { ops->kv_cache_write(cache, qkv.data(), far.data(), s); },
      {"kv_cache_write: sequence 1 at position 8 with 3 new tokens does not fit the cache capacity 10"});
  test::expect_error(
      [&] { ops->cached_attention_fwd(out.data(), qkv.data(), cache, pos.data(), 9, 0, nullptr, 0, s); },
      {"sequence 1 at position 7 with 3 new tokens does not fit max_keys 9"});
}

// --- the sampler ------------------------------------------------------------------------------------------

std::vector<int> histogram(const std::vector<float>& logits, const SampleOptions& o, int draws,
                           uint64_t seed) {
  Rng rng(seed);
  std::vector<int> h(logits.size(), 0);
  for (int i = 0; i < draws; ++i) ++h[size_t(sample_token(logits.data(), int(logits.size()), o, rng))];
  return h;
}

std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

TEST(Sampler, GreedyTakesTheFirstMaximum) {
  const std::vector<float> logits = {0.1f, 2.f, -1.f, 2.f, 0.f};
  SampleOptions o;
  o.temperature = 0;
  Rng rng(0);
  EXPECT_EQ(sample_token(logits.data(), 5, o, rng), 1);
  // top_k 1 or a tiny nucleus samples the maximum too.
  o.temperature = 1.5f, o.top_k = 1;
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sample_token(logits.data(), 5, o, rng), 1);
  o.top_k = 0, o.top_p = 1e-6f;
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sample_token(logits.data(), 5, o, rng), 1);
}

TEST(Sampler, TemperatureOneDrawsTheSoftmax) {
  const std::vector<double> p = {0.1, 0.4, 0.2, 0.3};
  SampleOptions o;
  o.temperature = 1, o.top_k = 0;
  const int n = 40000;
  const std::vector<int> h = histogram(logits_of(p), o, n, 3);
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(double(h[i]) / n, p[i], 0.01) << i;
  // A low temperature sharpens towards the maximum; a high one flattens.
  o.temperature = 0.25f;
  EXPECT_GT(histogram(logits_of(p), o, n, 4)[1], int(0.7 * n));
  o.temperature = 100;
  for (int c : histogram(logits_of(p), o, n, 5)) EXPECT_NEAR(double(c) / n, 0.25, 0.015);
}

TEST(Sampler, TopKKeepsTheKMostLikely) {
  const std::vector<double> p = {0.1, 0.4, 0.2, 0.3};
  SampleOptions o;
  o.temperature = 1, o.top_k = 2;
  const int n = 40000;
  const std::vector<int> h = histogram(logits_of(p), o, n, 6);
  EXPECT_EQ(h[0], 0);
  EXPECT_EQ(h[2], 0);
  EXPECT_NEAR(double(h[1]) / n, 0.4 / 0.7, 0.01);
  EXPECT_NEAR(double(h[3]) / n, 0.3 / 0.7, 0.01);
}

TEST(Sampler, TopPKeepsTheSmallestNucleusReachingP) {
  const std::vector<double> p = {0.1, 0.4, 0.2, 0.3};
  SampleOptions o;
  o.temperature = 1, o.top_k = 0, o.top_p = 0.6f;  // 0.4 < 0.6 <= 0.4 + 0.3: the nucleus is {1, 3}
  const int n = 40000;
  std::vector<int> h = histogram(logits_of(p), o, n, 7);
  EXPECT_EQ(h[0] + h[2], 0);
  EXPECT_NEAR(double(h[1]) / n, 0.4 / 0.7, 0.01);
  o.top_p = 0.75f;  // 0.7 < 0.75: token 2 joins
  h = histogram(logits_of(p), o, n, 8);
  EXPECT_EQ(h[0], 0);
  EXPECT_NEAR(double(h[2]) / n, 0.2 / 0.9, 0.01);
  // After top-k: the nucleus of the two kept tokens' renormalised distribution (0.57, 0.43).
  o.top_k = 2, o.top_p = 0.5f;
  h = histogram(logits_of(p), o, n, 9);
  EXPECT_EQ(h[1], n);
}

// One uniform draw per sampled token, with or without top-k and top-p (a seed replays a run).
TEST(Sampler, OneDrawPerToken) {
  const std::vector<float> logits = logits_of({0.1, 0.4, 0.2, 0.3});
  for (const float top_p : {1.0f, 0.8f}) {
    SampleOptions o;
    o.temperature = 0.7f, o.top_k = 3, o.top_p = top_p;
    Rng a(10), b(10);
    for (int i = 0; i < 100; ++i) sample_token(logits.data(), 4, o, a);
    for (int i = 0; i < 100; ++i) b.uniform();
    EXPECT_EQ(a.state(), b.state()) << top_p;
  }
}

// --- anvil generate
// -------------------------------------------------------------------------------------------

// Runs the CLI with stdout and stderr apart.
struct Outputs {
  int exit_code = -1;
  std::string out, err;
};
Outputs run_split(const std::string& args, const test::TempDir& dir) {
  const std::string err_file = dir / "stderr.txt";
  const std::string cmd = std::string(ANVIL_BINARY) + " " + args + " 2>" + err_file;
  Outputs r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = test::read_file(err_file);
  return r;
}

std::vector<std::vector<int32_t>> parse_lines(const std::string& text) {
  std::vector<std::vector<int32_t>> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::vector<int32_t> ids;
    int32_t id;
    while (words >> id) ids.push_back(id);
    lines.push_back(ids);
  }
  return lines;
}

class GenerateCli : public ::testing::Test {
 protected:
  // A model directory (config.json, model.safetensors) of `cfg` with random weights.
  std::string save(const TransformerConfig& cfg, const std::vector<float>& w, const std::string& name) {
    const std::string path = dir / name;
    std::filesystem::create_directories(path);
    Engine e(cfg, EngineOptions{});
    e.decoder().upload_weights(e.device(), w.data());
    io::save_model(path, e.decoder(), e.device());
    return path;
  }
  test::TempDir dir;
};

TEST_F(GenerateCli, PromptIdsPrintTheGreedyIdsOfEachPrompt) {
  const TransformerConfig cfg = llama_config();
  const std::vector<float> w = random_weights(ParamLayout::decoder(cfg), 50);
  const std::string ck = save(cfg, w, "llama");
  const Outputs r =
      run_split("generate --device cpu --checkpoint " + ck +
                    " --temperature 0 --max_new_tokens 6 --prompt_ids '5 6 7' --prompt_ids ' 9  '",
                dir);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // stdout: one line of ids per prompt, nothing else; the speed line goes to stderr.
  const auto lines = parse_lines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  SampleOptions so;
  so.max_new_tokens = 6, so.temperature = 0;
  Rng rng(0);
  const auto want = make_generator(cfg, w, 2, 0, 256)->generate({{5, 6, 7}, {9}}, so, rng);
  EXPECT_EQ(lines[0], want[0]);
  EXPECT_EQ(lines[1], want[1]);
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("tokens/s"), std::string::npos) << r.out;
}

TEST_F(GenerateCli, TextPromptsDecodeTogether) {
  TransformerConfig cfg = gpt2_config();
  cfg.vocab_size = 256;  // the bytes tokenizer's
  const std::string ck = save(cfg, random_weights(ParamLayout::decoder(cfg), 51), "gpt2");
  const Outputs r = run_split("generate --device cpu --checkpoint " + ck +
                                  " --max_new_tokens 4 --top_p 0.9 --prompt ab --prompt 'xyz w'",
                              dir);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(r.out.starts_with("--- 1 of 2 ---\nab")) << r.out;
  EXPECT_NE(r.out.find("\n--- 2 of 2 ---\nxyz w"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("generated 8 tokens"), std::string::npos) << r.err;
}

TEST_F(GenerateCli, BadPromptsNameTheFlagAndValue) {
  const TransformerConfig cfg = llama_config();
  const std::string ck = save(cfg, random_weights(ParamLayout::decoder(cfg), 52), "llama");
  const std::string gen = "generate --device cpu --checkpoint " + ck;
  const auto fails = [&](const std::string& args, const std::string& message) {
    const test::CommandResult r = test::run_anvil(gen + " " + args);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("error: " + message), std::string::npos) << args << "\n" << r.output;
  };
  fails("--prompt_ids '1 x'", "--prompt_ids '1 x': 'x' is not a token id");
  fails("--prompt_ids '1 101'",
        "--prompt_ids '1 101': token id 101 is outside the vocabulary of the model in " + ck + " (0 to 100)");
  fails("--prompt_ids '1 -2'", "--prompt_ids '1 -2': token id -2 is outside the vocabulary");
  fails("--prompt_ids '  '", "--prompt_ids '  ': no token ids (give at least one)");
  fails("--prompt_ids 1 --prompt a", "--prompt and --prompt_ids both given");
  fails("--prompt_ids 1 --top_p 0", "--top_p must be in (0, 1], got 0");
  fails("--prompt_ids 1 --top_p 1.5", "--top_p must be in (0, 1], got 1.5");
  fails("--prompt_ids 1 --precision fp64", "--precision must be fp32, bf16 or fp16, got 'fp64'");
  std::string long_prompt;
  for (int i = 0; i <= cfg.block_size; ++i) long_prompt += "3 ";
  fails("--prompt_ids 1 --prompt_ids '" + long_prompt + "'",
        "--prompt_ids 2 of 2: 41 tokens, more than the model's block_size 40");
  // Text needs a tokenizer of the model's vocabulary (101 here, bytes have 256).
  fails("--prompt hi",
        "the tokenizer 'bytes' has 256 tokens but the model in " + ck + " has a vocabulary of 101");
}

TEST_F(GenerateCli, EmptyTextPromptIsAnError) {
  TransformerConfig cfg = gpt2_config();
  cfg.vocab_size = 256;
  const std::string ck = save(cfg, random_weights(ParamLayout::decoder(cfg), 53), "gpt2");
  const test::CommandResult r = test::run_anvil("generate --device cpu --checkpoint " + ck + " --prompt ''");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("error: --prompt '' is empty: it encodes to no tokens"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace anvil
