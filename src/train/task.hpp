// A training task: what differs between language modelling (a GPT-2 causal LM over token windows,
// causal_lm_task.cpp) and sequence classification (a BERT classifier over labelled examples,
// classification_task.cpp). The trainer loop, the train step and the run's outputs are the same for both;
// they ask the task for its loaders, for how a batch is staged into the model's inputs, for what a step's
// loss is averaged over, for the evaluation, for what the header, progress line, metrics and summary add,
// and for the end-of-run sample. No other part of the loop asks which family the model is.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "anvil/rng.hpp"
#include "anvil/train_config.hpp"
#include "anvil/trainer.hpp"
#include "data/prefetch_ring.hpp"
#include "data/tokenizer.hpp"
#include "train/engine.hpp"
#include "train/metrics_log.hpp"
#include "train/run_model.hpp"

namespace anvil {

// A training batch whose copy into an input slot has been queued: its shape, its rows with a target (target
// tokens, or labelled sequences; a step's loss is the mean over them) and the loader position it came from.
struct StagedBatch {
  int B = 0, T = 0;
  int64_t valid = 0;
  data::LoaderPosition pos;
};

// An evaluation's results: the mean loss over the evaluated rows (tokens for GPT-2, sequences for BERT)
// and, for classification, the fraction of sequences whose most likely class is the label.
struct EvalResult {
  double loss = -1;
  double accuracy = -1;  // -1: not a classification run
  int64_t examples = 0;  // classification: the labelled sequences evaluated
};

class Task {
 public:
  virtual ~Task() = default;

  // --- start-up ---------------------------------------------------------------------------------------
  // Whether the model is initialised even when weights are loaded: a directory may lack a classifier (and
  // its pooler), which then keeps its initialisation, as transformers initialises a new head.
  virtual bool init_before_load() const = 0;
  // Opens the train loader and (with val data) the eval loader. `cfg` is the run's config as the memory fit
  // settled it (micro-batch, accumulation); the task keeps a reference, so it must outlive the task. With
  // several processes the train loader reads rank `rank`'s part of every global batch of `ranks` x the
  // micro-batch (evaluation reads the same batches on every rank).
  virtual void open_loaders(const TrainConfig& cfg, Device& dev, int rank, int ranks) = 0;
  // The header's model, data and batch lines (`run_text`: "from scratch" or "resuming at N").
  virtual void print_header(int64_t total_steps, const std::string& run_text) const = 0;

  // --- the training data ----------------------------------------------------------------------------
  virtual uint64_t batches_per_epoch() const = 0;
  // The position of the next batch the train loader hands out; seek() moves it (a resume).
  virtual data::LoaderPosition position() const = 0;
  virtual void seek(data::LoaderPosition pos) = 0;
  virtual double data_wait_seconds() const = 0;
  // Takes the next training batch and queues its copy into the input buffers of `slot` (copy stream).
  virtual StagedBatch stage(Engine& e, int slot) = 0;

  // --- the loss --------------------------------------------------------------------------------------
  // The rows a step's loss is nominally averaged over: gradients carry loss_scale / this (fp16 then sees the
  // magnitudes of a mean loss times the scale, as in DeepSpeed); the optimizer divides by it and by the real
  // count of rows with a target.
  virtual double nominal_rows() const = 0;
  // What those rows are, for the error about a step without any.
  virtual const char* target_rows_name() const = 0;

  // --- evaluation -----------------------------------------------------------------------------------
  virtual bool has_eval() const = 0;
  // Uses the device input buffers of `slot`, which must not hold a staged training batch.
  virtual EvalResult evaluate(Engine& e, int slot) = 0;
  // Prints the eval line of global step `step` and writes its metrics record.
  virtual void report_eval(const EvalResult& r, int64_t step, int64_t total_steps, MetricsLog& log) const = 0;

  // --- the progress line, metrics and summary ---------------------------------------------------------
  // Text before the tokens/s of the progress line, and fields of the step's metrics record, for a step
  // that took `step_time` seconds.
  virtual std::string progress_text(double step_time) const { return ""; }
  virtual void add_progress_metrics(nlohmann::json& record, double step_time) const {}
  // Tokens per second and FLOPs per token of the whole run, from this process's totals.
  virtual double tokens_per_second(int64_t steps_run, int64_t tokens_total, double runtime) const = 0;
  virtual double flops_per_token(int64_t tokens_total, double flops_total) const = 0;
  virtual void add_summary(nlohmann::json& summary, const TrainSummary& s) const {}

  // --- generation ------------------------------------------------------------------------------------
  // The end-of-run sample (sample_prompt and its continuation); "" when none is asked for.
  virtual std::string sample(Engine& e, Rng& rng) const { return ""; }
};

// The task of the run's data (RunData::classification), for `model`. Throws anvil::Error for settings the
// task cannot honour (sample_prompt with a classifier). The tokenizer serves the sample.
std::unique_ptr<Task> make_task(const TrainConfig& cfg, const RunData& data, const TransformerConfig& model,
                                std::unique_ptr<data::Tokenizer> tokenizer);
std::unique_ptr<Task> make_causal_lm_task(const RunData& data, const TransformerConfig& model,
                                          std::unique_ptr<data::Tokenizer> tokenizer);
std::unique_ptr<Task> make_classification_task(const TrainConfig& cfg, const RunData& data,
                                               const TransformerConfig& model);

}  // namespace anvil
