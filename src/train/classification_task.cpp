// Sequence classification (a BERT classifier): labelled examples padded per batch, the loss averaged over
// labelled sequences, evaluation by loss and accuracy, throughput in samples per second first.
#include <algorithm>

#include "data/classification_loader.hpp"
#include "train/mfu.hpp"
#include "train/task.hpp"

namespace anvil {
namespace {

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

class ClassificationTask final : public Task {
 public:
  ClassificationTask(const TrainConfig& cfg, const RunData& data, const TransformerConfig& model)
      : data_(data), model_(model) {
    ANVIL_REQUIRE(cfg.sample_prompt.empty(),
                  "sample_prompt generates text, which needs a GPT-2 model; the model is a BERT classifier "
                  "(use `anvil predict` on the trained checkpoint)");
  }

  bool init_before_load() const override { return true; }

  void open_loaders(const TrainConfig& cfg, Device& dev, int rank, int ranks) override {
    cfg_ = &cfg;
    const int workers = std::max(1, cfg.dataloader_num_workers);
    const bool pin = cfg.dataloader_pin_memory;
    const int T = cfg.seq_len();  // the longest batch the data can make (open_run_data)
    // Padding holds the model's pad token (its value reaches nothing; BERT masks padded keys).
    const int32_t pad = std::max(0, model_.pad_token_id);
    train_ = std::make_unique<data::ClassificationLoader>(
        data_.train_examples,
        data::ClassificationLoaderConfig{cfg.per_device_train_batch_size, T, cfg.seed, true, true, pad, 8, 4,
                                         workers, pin, ranks, rank},
        dev);
    // Evaluation sees every example once, in order: the last batch may be partial.
    if (data_.val_examples)
      val_ = std::make_unique<data::ClassificationLoader>(
          data_.val_examples,
          data::ClassificationLoaderConfig{cfg.eval_batch_size(), T, cfg.seed, false, false, pad, 8, 2,
                                           workers, pin},
          dev);
  }

  void print_header(int64_t total_steps, const std::string& run_text) const override;

  uint64_t batches_per_epoch() const override { return train_->batches_per_epoch(); }
  data::LoaderPosition position() const override { return train_->position(); }
  void seek(data::LoaderPosition pos) override { train_->seek(pos); }
  double data_wait_seconds() const override { return train_->wait_seconds(); }

  StagedBatch stage(Engine& e, int slot) override {
    const data::ClassificationHostBatch& b = train_->next();
    const size_t rows = size_t(b.batch_size);
    const StagedBatch staged{
        b.batch_size, b.length,
        int64_t(std::count_if(b.labels, b.labels + rows, [](int32_t l) { return l != kIgnoreIndex; })),
        b.pos};
    Device& dev = e.device();
    dev.copy_to_device_async(e.tokens(slot), b.ids, rows * size_t(b.length) * sizeof(int32_t));
    dev.copy_to_device_async(e.lengths(slot), b.lengths, rows * sizeof(int32_t));
    dev.copy_to_device_async(e.labels(slot), b.labels, rows * sizeof(int32_t));
    return staged;
  }

  double nominal_rows() const override {
    return double(cfg_->per_device_train_batch_size) * cfg_->gradient_accumulation_steps;
  }
  const char* target_rows_name() const override { return "labelled examples"; }

  bool has_eval() const override { return val_ != nullptr; }
  EvalResult evaluate(Engine& e, int slot) override;
  void report_eval(const EvalResult& r, int64_t step, int64_t total_steps, MetricsLog& log) const override {
    fmt::print("eval  {:>5}/{} | eval_loss {:.4f} | eval_accuracy {:.4f}\n", step, total_steps, r.loss,
               r.accuracy);
    log.write({{"step", step},
               {"eval_loss", r.loss},
               {"eval_accuracy", r.accuracy},
               {"eval_examples", r.examples}});
  }

  // Classification runs count sequences first (their padded tokens/s follows).
  std::string progress_text(double step_time) const override {
    return fmt::format(" {:>8.1f} samples/s |", samples_per_second(step_time));
  }
  void add_progress_metrics(nlohmann::json& record, double step_time) const override {
    record["samples_per_second"] = samples_per_second(step_time);
  }
  // Batches are padded to their own length: the run's tokens and FLOPs are summed over its batches, so the
  // FLOPs per token are the run's average.
  double tokens_per_second(int64_t, int64_t tokens_total, double runtime) const override {
    return double(tokens_total) / runtime;
  }
  double flops_per_token(int64_t tokens_total, double flops_total) const override {
    return tokens_total > 0 ? flops_total / double(tokens_total) : 0;
  }
  void add_summary(nlohmann::json& summary, const TrainSummary& s) const override {
    summary["eval_accuracy"] =
        s.eval_accuracy >= 0 ? nlohmann::json(s.eval_accuracy) : nlohmann::json(nullptr);
  }

 private:
  double samples_per_second(double step_time) const {
    return double(cfg_->per_device_train_batch_size) * cfg_->gradient_accumulation_steps / step_time;
  }

  RunData data_;
  TransformerConfig model_;
  const TrainConfig* cfg_ = nullptr;
  std::unique_ptr<data::ClassificationLoader> train_, val_;
};

void ClassificationTask::print_header(int64_t total_steps, const std::string& run_text) const {
  const TrainConfig& c = *cfg_;
  const int B = c.per_device_train_batch_size, T = c.seq_len(), accum = c.gradient_accumulation_steps;
  fmt::print(
      "  model: {} layers, {} heads, {} dims, intermediate {}, vocab {}, max positions {}, {} labels ({}): "
      "{:.2f}M parameters\n",
      model_.n_layer, model_.n_head, model_.n_embd, model_.ffn_size(), model_.vocab_size, model_.block_size,
      model_.num_labels, join_names(model_.label_names), model_.num_parameters() / 1e6);
  fmt::print("  data: {} examples ({} tokens) in {}, {} batches/epoch; sequence length {} ({})\n",
             data_.train_examples->size(), data_.train_examples->num_tokens(), c.train_data,
             batches_per_epoch(), T, data_.seq_len_note);
  fmt::print(
      "  batch: {} sequences (padded per batch to a multiple of 8, at most {} tokens) x {} accumulation = "
      "effective batch {} sequences; {} steps ({}), lr {} {} warmup {}\n",
      B, T, accum, B * accum, total_steps, run_text, c.learning_rate, c.lr_scheduler_type, c.warmup_steps);
}

// The first max_eval_batches batches of val_data (by default all of them; the last one may be partial): the
// mean loss over the labelled sequences and the accuracy of the argmax of the logits.
EvalResult ClassificationTask::evaluate(Engine& e, int slot) {
  BertModel& model = e.bert();
  val_->seek({});
  const int64_t all = int64_t(val_->batches_per_epoch());
  const int64_t n = cfg_->max_eval_batches > 0 ? std::min<int64_t>(cfg_->max_eval_batches, all) : all;
  const int NL = model.config().num_labels;
  std::vector<float> logits;
  double sum = 0;
  int64_t count = 0, correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    const data::ClassificationHostBatch& b = val_->next();
    const size_t rows = size_t(b.batch_size);
    e.device().copy_to_device(e.tokens(slot), b.ids, rows * size_t(b.length) * sizeof(int32_t));
    e.device().copy_to_device(e.lengths(slot), b.lengths, rows * sizeof(int32_t));
    e.device().copy_to_device(e.labels(slot), b.labels, rows * sizeof(int32_t));
    model.forward(e.ops(), e.inputs(slot, b.batch_size, b.length), 0.0f, false);
    sum += e.ops().sum(model.losses(), rows);  // ignored labels contribute 0
    logits.resize(rows * size_t(NL));
    model.copy_logits_to_host(e.device(), logits.data(), b.batch_size);
    for (size_t r = 0; r < rows; ++r) {
      if (b.labels[r] == kIgnoreIndex) continue;
      const float* row = logits.data() + r * size_t(NL);
      correct += int64_t(std::max_element(row, row + NL) - row) == b.labels[r] ? 1 : 0;
      ++count;
    }
  }
  if (count == 0) return {0, 0, 0};
  return {sum / double(count), double(correct) / double(count), count};
}

}  // namespace

std::unique_ptr<Task> make_classification_task(const TrainConfig& cfg, const RunData& data,
                                               const TransformerConfig& model) {
  return std::make_unique<ClassificationTask>(cfg, data, model);
}

}  // namespace anvil
