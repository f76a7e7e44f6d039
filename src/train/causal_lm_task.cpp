// Language modelling (GPT-2): windows of a token shard, next-token targets, the loss averaged over target
// tokens, evaluation by loss and perplexity, and the end-of-run sample.
#include <algorithm>
#include <cmath>

#include "data/loader.hpp"
#include "train/mfu.hpp"
#include "train/sampler.hpp"
#include "train/task.hpp"

namespace anvil {
namespace {

class CausalLmTask final : public Task {
 public:
  CausalLmTask(const RunData& data, const TransformerConfig& model,
               std::unique_ptr<data::Tokenizer> tokenizer)
      : data_(data), model_(model), tokenizer_(std::move(tokenizer)) {}

  bool init_before_load() const override { return false; }

  void open_loaders(const TrainConfig& cfg, Device& dev, int rank, int ranks) override {
    cfg_ = &cfg;
    const int workers = std::max(1, cfg.dataloader_num_workers);
    const bool pin = cfg.dataloader_pin_memory;
    const int T = cfg.seq_len();
    train_ = std::make_unique<data::DataLoader>(
        data_.train_tokens,
        data::LoaderConfig{cfg.per_device_train_batch_size, T, cfg.seed, true, 4, workers, pin, ranks, rank},
        dev);
    if (data_.val_tokens)
      val_ = std::make_unique<data::DataLoader>(
          data_.val_tokens, data::LoaderConfig{cfg.eval_batch_size(), T, cfg.seed, false, 2, workers, pin},
          dev);
  }

  void print_header(int64_t total_steps, const std::string& run_text) const override {
    const TrainConfig& c = *cfg_;
    const int B = c.per_device_train_batch_size, accum = c.gradient_accumulation_steps;
    fmt::print(
        "  model: {} layers, {} heads, {} dims, vocab {} (padded {}), context {}: {:.2f}M parameters\n",
        model_.n_layer, model_.n_head, model_.n_embd, model_.vocab_size, model_.padded_vocab_size(),
        model_.block_size, model_.num_parameters() / 1e6);
    fmt::print("  data: {} tokens in {} ({} batches/epoch)\n", data_.train_tokens->size(), c.train_data,
               batches_per_epoch());
    fmt::print(
        "  batch: {} x {} tokens x {} accumulation = effective batch {} sequences, {} tokens/step; {} steps "
        "({}), "
        "lr {} {} warmup {}\n",
        B, c.seq_len(), accum, B * accum, c.tokens_per_step(), total_steps, run_text, c.learning_rate,
        c.lr_scheduler_type, c.warmup_steps);
  }

  uint64_t batches_per_epoch() const override { return train_->batches_per_epoch(); }
  data::LoaderPosition position() const override { return train_->position(); }
  void seek(data::LoaderPosition pos) override { train_->seek(pos); }
  double data_wait_seconds() const override { return train_->wait_seconds(); }

  StagedBatch stage(Engine& e, int slot) override {
    const data::HostBatch& b = train_->next();
    const int B = cfg_->per_device_train_batch_size, T = cfg_->seq_len();
    const size_t bt = size_t(B) * T;
    const StagedBatch staged{
        B, T, int64_t(std::count_if(b.targets, b.targets + bt, [](int32_t t) { return t != kIgnoreIndex; })),
        b.pos};
    e.device().copy_to_device_async(e.tokens(slot), b.inputs, bt * sizeof(int32_t));
    e.device().copy_to_device_async(e.targets(slot), b.targets, bt * sizeof(int32_t));
    return staged;
  }

  double nominal_rows() const override { return double(cfg_->tokens_per_step()); }
  const char* target_rows_name() const override { return "target tokens"; }

  bool has_eval() const override { return val_ != nullptr; }
  EvalResult evaluate(Engine& e, int slot) override;
  void report_eval(const EvalResult& r, int64_t step, int64_t total_steps, MetricsLog& log) const override {
    fmt::print("eval  {:>5}/{} | eval_loss {:.4f} | perplexity {:.2f}\n", step, total_steps, r.loss,
               std::exp(r.loss));
    log.write({{"step", step}, {"eval_loss", r.loss}});
  }

  // Every window is full: the run's tokens (every rank's) are the nominal ones, at the run's length.
  double tokens_per_second(int64_t, int64_t tokens, double runtime) const override {
    return double(tokens) / runtime;
  }
  // The steps' FLOPs per token (frozen weights' skipped gradient matmuls left out; before any step: the
  // whole model's).
  double flops_per_token(int64_t tokens_total, double flops_total) const override {
    return tokens_total > 0 ? flops_total / double(tokens_total)
                            : training_flops_per_token(model_, cfg_->seq_len());
  }

  std::string sample(Engine& e, Rng& rng) const override {
    const TrainConfig& c = *cfg_;
    if (c.sample_prompt.empty() || c.sample_max_new_tokens <= 0) return "";
    SampleOptions so{c.sample_max_new_tokens, float(c.sample_temperature), c.sample_top_k};
    // The prompt as `anvil generate` encodes it (the template's prefix, <s> for Llama 2, then the text), and
    // the new ids decoded after it, so that a SentencePiece decoder keeps the first new word's space.
    const std::vector<uint32_t> context = tokenizer_->encode_prompt(c.sample_prompt);
    const std::vector<int32_t> prompt(context.begin(), context.end());
    const std::vector<int32_t> ids = generate(e, prompt, so, rng);
    // A model vocabulary larger than the tokenizer's can give ids the tokenizer lacks: decode_ids marks them.
    const bool known = std::all_of(ids.begin(), ids.end(), [&](int32_t id) {
      return id >= 0 && uint64_t(id) < tokenizer_->vocab_size();
    });
    if (!known) return c.sample_prompt + decode_ids(*tokenizer_, ids);
    return c.sample_prompt +
           tokenizer_->decode_continuation(context, std::vector<uint32_t>(ids.begin(), ids.end()));
  }

 private:
  RunData data_;
  TransformerConfig model_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  const TrainConfig* cfg_ = nullptr;
  std::unique_ptr<data::DataLoader> train_, val_;
};

// The first max_eval_batches batches of val_data (20 by default).
EvalResult CausalLmTask::evaluate(Engine& e, int slot) {
  val_->seek({});
  const int64_t n = std::min<int64_t>(cfg_->max_eval_batches > 0 ? cfg_->max_eval_batches : 20,
                                      int64_t(val_->batches_per_epoch()));
  double sum = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const data::HostBatch& b = val_->next();
    const size_t bt = size_t(b.batch_size) * b.seq_len;
    e.device().copy_to_device(e.tokens(slot), b.inputs, bt * sizeof(int32_t));
    e.device().copy_to_device(e.targets(slot), b.targets, bt * sizeof(int32_t));
    e.decoder().forward(e.ops(), e.tokens(slot), e.targets(slot), b.batch_size, b.seq_len, 0.0f, false);
    sum += e.ops().sum(e.model().losses(), bt);
    count += int64_t(bt);
  }
  return {sum / double(count), -1};
}

}  // namespace

std::unique_ptr<Task> make_causal_lm_task(const RunData& data, const TransformerConfig& model,
                                          std::unique_ptr<data::Tokenizer> tokenizer) {
  return std::make_unique<CausalLmTask>(data, model, std::move(tokenizer));
}

}  // namespace anvil
