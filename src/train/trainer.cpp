#include "anvil/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <tuple>

#include "anvil/rng.hpp"
#include "data/classification_loader.hpp"
#include "data/loader.hpp"
#include "data/token_shard.hpp"
#include "data/tokenizer.hpp"
#include "io/atomic_dir.hpp"
#include "io/checkpoint.hpp"
#include "memory/memory_trace.hpp"
#include "optim/lr_schedule.hpp"
#include "precision/loss_scaler.hpp"
#include "runtime/step_profiler.hpp"
#include "train/engine.hpp"
#include "train/memory_fit.hpp"
#include "train/metrics_log.hpp"
#include "train/mfu.hpp"
#include "train/run_directory.hpp"
#include "train/run_model.hpp"
#include "train/sampler.hpp"

namespace anvil {
namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// fp32 | tf32 | 3xtf32 | bf16 | fp16
std::string precision_label(const TrainConfig& c) {
  return c.bf16 ? "bf16" : c.fp16 ? "fp16" : c.fp32_matmul_mode();
}

std::string precision_description(const TrainConfig& c, const LossScaler* scaler) {
  if (!c.bf16 && !c.fp16) {
    const std::string m = c.fp32_matmul_mode();
    const bool cuda = resolve_device(c.device) == DeviceKind::CUDA;
    if (m == "tf32") return cuda ? "fp32 storage, TF32 matmuls" : "fp32 (TF32 applies on CUDA only)";
    if (m == "3xtf32")
      return cuda ? "fp32 storage, 3xTF32 matmuls (fp32-accurate on the TF32 tensor cores)"
                  : "fp32 (3xTF32 applies on CUDA only)";
    return "fp32";
  }
  std::string d =
      fmt::format("{} weights and activations, fp32 master weights and optimizer states, {} gradients",
                  c.bf16 ? "bf16" : "fp16", c.grad_accum_dtype);
  if (c.stochastic_rounding) d += ", stochastic rounding of the weights";
  if (scaler)
    d += scaler->dynamic() ? fmt::format("; dynamic loss scale from {} (window {}, hysteresis {}, min {})",
                                         format_loss_scale(scaler->scale()), c.loss_scale_window,
                                         c.hysteresis, format_loss_scale(c.min_loss_scale))
                           : fmt::format("; static loss scale {}", format_loss_scale(scaler->scale()));
  return d;
}

// A nonzero per-step seed for stochastic rounding.
uint64_t rounding_seed(uint64_t seed, int64_t step) {
  return Rng(seed ^ (uint64_t(step) * 0x9e3779b97f4a7c15ull)).next_u64() | 1;
}

// The dropout seed of a step: another stream of the run's seed than the rounding seeds'.
uint64_t dropout_seed(uint64_t seed, int64_t step) {
  return Rng(~seed ^ (uint64_t(step) * 0xd1b54a32d192ed03ull)).next_u64();
}

std::string checkpoint_dir(const TrainConfig& cfg, int64_t step) {
  return (fs::path(cfg.output_dir) / ("checkpoint-" + std::to_string(step))).string();
}

// An evaluation's results: the mean loss over the evaluated rows (tokens for GPT-2, sequences for BERT)
// and, for classification, the fraction of sequences whose most likely class is the label.
struct EvalResult {
  double loss = -1;
  double accuracy = -1;  // -1: not a classification run
  int64_t examples = 0;  // classification: the labelled sequences evaluated
};

class Run {
 public:
  explicit Run(const TrainConfig& cfg) : cfg_(cfg) {}
  TrainSummary go();
  // After a failure: the error goes into the run directory (once training has started).
  void record_error(std::string_view message) noexcept {
    if (run_dir_) run_dir_->record_error(message);
  }

 private:
  EvalResult evaluate(int slot);
  EvalResult evaluate_classification(int slot);
  // The training loader of the run's kind (LM windows or classification examples).
  uint64_t batches_per_epoch() const {
    return classification_ ? example_loader_->batches_per_epoch() : train_loader_->batches_per_epoch();
  }
  data::LoaderPosition train_position() const {
    return classification_ ? example_loader_->position() : train_loader_->position();
  }
  double data_wait_seconds() const {
    return classification_ ? example_loader_->wait_seconds() : train_loader_->wait_seconds();
  }
  // `loss_sum`/`loss_steps`: the running train-loss total over all steps so far (including before a resume).
  void save(int64_t step, double loss_sum, int64_t loss_steps);
  void log_json(const json& j) { metrics_->write(j); }

  // First, so it goes last: the lock on output_dir is held until everything writing there is gone.
  std::unique_ptr<RunDirectory> run_dir_;
  TrainConfig cfg_;  // as run: auto_find_batch_size may change the micro-batch and accumulation
  TransformerConfig model_cfg_;
  std::unique_ptr<Engine> engine_;
  // Language modelling (GPT-2): token windows; classification (BERT): labelled examples.
  bool classification_ = false;
  std::unique_ptr<data::DataLoader> train_loader_, val_loader_;
  std::unique_ptr<data::ClassificationLoader> example_loader_, val_example_loader_;
  std::optional<MetricsLog> metrics_;
  Rng rng_{0};
  int64_t total_steps_ = 0;
  double loss_sum_before_ = 0;  // sum of step losses before a resume (for train_loss)
  int64_t steps_before_ = 0;
  data::LoaderPosition resume_pos_;   // the first batch not yet consumed by a finished step
  std::optional<LossScaler> scaler_;  // fp16 only
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::string tokenizer_file_;  // copied into checkpoints ("" for the byte tokenizer)
};

// Uses the device input buffers of `slot`, which must not hold a staged training batch.
EvalResult Run::evaluate(int slot) {
  if (classification_) return evaluate_classification(slot);
  Engine& e = *engine_;
  if (!val_loader_) return {};
  val_loader_->seek({});
  const int64_t n = std::min<int64_t>(cfg_.max_eval_batches > 0 ? cfg_.max_eval_batches : 20,
                                      int64_t(val_loader_->batches_per_epoch()));
  double sum = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const data::HostBatch& b = val_loader_->next();
    const size_t bt = size_t(b.batch_size) * b.seq_len;
    e.device().copy_to_device(e.tokens(slot), b.inputs, bt * sizeof(int32_t));
    e.device().copy_to_device(e.targets(slot), b.targets, bt * sizeof(int32_t));
    e.gpt().forward(e.ops(), e.tokens(slot), e.targets(slot), b.batch_size, b.seq_len, 0.0f, false);
    sum += e.ops().sum(e.model().losses(), bt);
    count += int64_t(bt);
  }
  return {sum / double(count), -1};
}

// The first max_eval_batches batches of val_data (by default all of them; the last one may be partial): the
// mean loss over the labelled sequences and the accuracy of the argmax of the logits.
EvalResult Run::evaluate_classification(int slot) {
  Engine& e = *engine_;
  if (!val_example_loader_) return {};
  BertModel& model = e.bert();
  val_example_loader_->seek({});
  const int64_t all = int64_t(val_example_loader_->batches_per_epoch());
  const int64_t n = cfg_.max_eval_batches > 0 ? std::min<int64_t>(cfg_.max_eval_batches, all) : all;
  const int NL = model.config().num_labels;
  std::vector<float> logits;
  double sum = 0;
  int64_t count = 0, correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    const data::ClassificationHostBatch& b = val_example_loader_->next();
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

void Run::save(int64_t step, double loss_sum, int64_t loss_steps) {
  json state = {{"global_step", step},
                {"total_steps", total_steps_},
                {"loader", {{"epoch", resume_pos_.epoch}, {"batch", resume_pos_.batch}}},
                {"rng_state", rng_.state()},
                {"train_loss_sum", loss_sum},
                {"train_loss_steps", loss_steps},
                {"lr_scheduler_type", cfg_.lr_scheduler_type},
                {"learning_rate", cfg_.learning_rate},
                {"warmup_steps", cfg_.warmup_steps},
                {"config", cfg_.to_json()}};
  if (scaler_) state["loss_scaler"] = scaler_->state();
  const std::string dir = checkpoint_dir(cfg_, step);
  io::save_checkpoint(dir, engine_->model(), engine_->optimizer(), state, tokenizer_file_, engine_->device());
  fmt::print("saved checkpoint {}\n", dir);
  for (const std::string& old : run_dir_->rotate_checkpoints(dir))
    fmt::print("deleted checkpoint {} (save_total_limit {})\n", old, cfg_.save_total_limit);
}

TrainSummary Run::go() {
  // --- model shape, starting point and tokenizer ----------------------------------------------------
  RunModel rm = resolve_run_model(cfg_);
  const std::string weights_from = rm.weights_from;
  tokenizer_file_ = rm.tokenizer_file;
  tokenizer_ = std::move(rm.tokenizer);
  const std::optional<io::TrainerState> resume_state = std::move(rm.resume_state);
  // The lock on output_dir, the cleanup of interrupted saves, and the refusal to mix with an earlier run.
  run_dir_ = std::make_unique<RunDirectory>(cfg_);

  // --- data: its kind must be the model's; a classifier takes its labels and sequence length from it --
  const RunData data = open_run_data(cfg_, rm);
  classification_ = data.classification;
  model_cfg_ = rm.config;
  // Weights from a directory fix the shape, so the sequence length defaults to its block_size (not to the
  // config's preset) and train_config.json records the shape that was trained.
  if (!weights_from.empty()) {
    cfg_.model = model_cfg_;
    cfg_.model_preset.clear();
  }
  const int T = cfg_.seq_len();  // classification: the longest batch the data can make (open_run_data)
  ANVIL_REQUIRE(!model_cfg_.is_bert() || cfg_.sample_prompt.empty(),
                "sample_prompt generates text, which needs a GPT-2 model; the model is a BERT classifier "
                "(use `anvil predict` on the trained checkpoint)");

  // --- memory: auto_find_batch_size and the out-of-memory check, before anything is allocated ------
  std::unique_ptr<Device> device = make_device(resolve_device(cfg_.device));
  MemoryFit fit = fit_to_memory(cfg_, model_cfg_, device->kind(), device->available_memory_bytes(),
                                device->context_overhead_bytes(), device->name());
  fmt::print("{}", fit.message);
  cfg_ = std::move(fit.config);
  const int B = cfg_.per_device_train_batch_size;

  // --- engine: plan, arena, model, optimizer --------------------------------------------------
  engine_ = std::make_unique<Engine>(model_cfg_, training_engine_options(cfg_), std::move(device));
  Engine& e = *engine_;
  Device& dev = e.device();

  const int workers = std::max(1, cfg_.dataloader_num_workers);
  const bool pin = cfg_.dataloader_pin_memory;
  if (classification_) {
    // Padding holds the model's pad token (its value reaches nothing; BERT masks padded keys).
    const int32_t pad = std::max(0, model_cfg_.pad_token_id);
    example_loader_ = std::make_unique<data::ClassificationLoader>(
        data.train_examples,
        data::ClassificationLoaderConfig{B, T, cfg_.seed, true, true, pad, 8, 4, workers, pin}, dev);
    // Evaluation sees every example once, in order: the last batch may be partial.
    if (data.val_examples)
      val_example_loader_ = std::make_unique<data::ClassificationLoader>(
          data.val_examples,
          data::ClassificationLoaderConfig{cfg_.eval_batch_size(), T, cfg_.seed, false, false, pad, 8, 2,
                                           workers, pin},
          dev);
  } else {
    train_loader_ = std::make_unique<data::DataLoader>(
        data.train_tokens, data::LoaderConfig{B, T, cfg_.seed, true, 4, workers, pin}, dev);
    if (data.val_tokens)
      val_loader_ = std::make_unique<data::DataLoader>(
          data.val_tokens, data::LoaderConfig{cfg_.eval_batch_size(), T, cfg_.seed, false, 2, workers, pin},
          dev);
  }

  const int accum = cfg_.gradient_accumulation_steps;
  total_steps_ =
      cfg_.max_steps > 0
          ? cfg_.max_steps
          : std::max<int64_t>(
                1, int64_t(std::ceil(cfg_.num_train_epochs * double(batches_per_epoch()) / accum)));
  const LrSchedule schedule = parse_lr_schedule(cfg_.lr_scheduler_type);

  int64_t start_step = 0;
  rng_.set_state(cfg_.seed);
  if (cfg_.fp16) scaler_.emplace(cfg_.loss_scaler());
  // A BERT directory may lack the classifier (and the pooler): those keep their initialisation, as
  // transformers initialises a new head, so a BERT model is initialised before any load.
  if (weights_from.empty() || model_cfg_.is_bert()) e.model().init_weights(cfg_.seed, dev);
  if (!weights_from.empty()) {
    const io::BertLoadReport report = io::load_model_weights(weights_from, e.model(), dev);
    if (!report.kept.empty())
      fmt::print("  newly initialised (not in {}): {}\n", weights_from, join_names(report.kept));
    if (!report.ignored.empty())
      fmt::print("  not used from {}: {}\n", weights_from, join_names(report.ignored));
  }
  if (resume_state) {  // validated by io::read_trainer_state
    start_step = resume_state->global_step;
    const data::LoaderPosition pos{resume_state->loader_epoch, resume_state->loader_batch};
    if (classification_)
      example_loader_->seek(pos);
    else
      train_loader_->seek(pos);
    rng_.set_state(resume_state->rng_state);
    loss_sum_before_ = resume_state->train_loss_sum;
    steps_before_ = resume_state->train_loss_steps;
    if (scaler_ && !resume_state->loss_scaler.is_null())
      scaler_->load_state(resume_state->loss_scaler,
                          cfg_.resume_from_checkpoint + "/trainer_state.json: loss_scaler");
    io::load_optimizer(cfg_.resume_from_checkpoint + "/optimizer.safetensors", e.optimizer(), dev);
    ANVIL_REQUIRE(start_step < total_steps_, "{}: the checkpoint is at step {} but the run has only {} steps",
                  cfg_.resume_from_checkpoint, start_step, total_steps_);
  }

  run_dir_->begin();
  const std::string metrics_path = run_dir_->file("metrics.jsonl");
  metrics_ = resume_state ? MetricsLog::resume(metrics_path, start_step) : MetricsLog::create(metrics_path);
  io::write_text_file_synced(run_dir_->file("train_config.json"), cfg_.to_json().dump(2) + "\n");

  const std::string model_name =
      !cfg_.model_preset.empty() && weights_from.empty()
          ? (model_cfg_.is_bert() ? cfg_.model_preset : "gpt2 " + cfg_.model_preset)
          : model_cfg_.family + (weights_from.empty() ? " (custom shape)" : " from " + weights_from);
  fmt::print("anvil train: {} on {}\n", model_name, dev.name());
  const std::string run_text = start_step ? fmt::format("resuming at {}", start_step) : "from scratch";
  if (classification_) {
    fmt::print(
        "  model: {} layers, {} heads, {} dims, intermediate {}, vocab {}, max positions {}, {} labels ({}): "
        "{:.2f}M parameters\n",
        model_cfg_.n_layer, model_cfg_.n_head, model_cfg_.n_embd, model_cfg_.ffn_size(),
        model_cfg_.vocab_size, model_cfg_.block_size, model_cfg_.num_labels,
        join_names(model_cfg_.label_names), model_cfg_.num_parameters() / 1e6);
    fmt::print("  data: {} examples ({} tokens) in {}, {} batches/epoch; sequence length {} ({})\n",
               data.train_examples->size(), data.train_examples->num_tokens(), cfg_.train_data,
               batches_per_epoch(), T, data.seq_len_note);
    fmt::print(
        "  batch: {} sequences (padded per batch to a multiple of 8, at most {} tokens) x {} accumulation = "
        "effective batch {} sequences; {} steps ({}), lr {} {} warmup {}\n",
        B, T, accum, B * accum, total_steps_, run_text, cfg_.learning_rate, cfg_.lr_scheduler_type,
        cfg_.warmup_steps);
  } else {
    fmt::print(
        "  model: {} layers, {} heads, {} dims, vocab {} (padded {}), context {}: {:.2f}M parameters\n",
        model_cfg_.n_layer, model_cfg_.n_head, model_cfg_.n_embd, model_cfg_.vocab_size,
        model_cfg_.padded_vocab_size(), model_cfg_.block_size, model_cfg_.num_parameters() / 1e6);
    fmt::print("  data: {} tokens in {} ({} batches/epoch)\n", data.train_tokens->size(), cfg_.train_data,
               batches_per_epoch());
    fmt::print(
        "  batch: {} x {} tokens x {} accumulation = effective batch {} sequences, {} tokens/step; {} steps "
        "({}), "
        "lr {} {} warmup {}\n",
        B, T, accum, B * accum, cfg_.tokens_per_step(), total_steps_, run_text, cfg_.learning_rate,
        cfg_.lr_scheduler_type, cfg_.warmup_steps);
  }
  if (cfg_.gradient_checkpointing)
    fmt::print("  activation checkpointing: {} every {} block(s)\n", cfg_.gradient_checkpointing_mode,
               cfg_.gradient_checkpointing_every);
  fmt::print("  precision: {}\n", precision_description(cfg_, scaler_ ? &*scaler_ : nullptr));
  const bool attention_dropout = e.has_dropout() && model_cfg_.attention_probs_dropout_prob > 0;
  if (e.has_dropout())
    fmt::print("  dropout: hidden {}, attention probabilities {}, classifier {}\n",
               model_cfg_.hidden_dropout_prob, model_cfg_.attention_probs_dropout_prob,
               model_cfg_.classifier_dropout_prob());
  if (dev.kind() == DeviceKind::CUDA) {  // which attention path the shapes and build take (performance.md)
    fmt::print("  attention: {}\n",
               cuda_attention_implementation(e.ops().precision().compute, model_cfg_.n_embd,
                                             model_cfg_.n_head, attention_dropout));
    fmt::print("  cuda graphs: {}\n",
               !cfg_.cuda_graphs        ? "off (--cuda_graphs false)"
               : accum == 1 && !scaler_ ? "on (each step replayed whole from one graph)"
               : scaler_ ? "on (micro-batches, gradient norm and update replayed as graphs; the fp16 loss "
                           "scaler decides between the last two)"
                         : "on (each micro-batch replayed from a graph, then the step's tail from one)");
  }
  fmt::print("  optimizer: {} ({} of state)\n", optimizer_name(e.optimizer().kind()),
             format_bytes(e.optimizer().state_bytes()));
  if (e.optimizer().kind() == OptimizerKind::Adafactor && cfg_.adafactor_relative_step)
    fmt::print(
        "  adafactor_relative_step: Adafactor sets its own step size (HF semantics); the lr column shows the "
        "schedule, which it ignores\n");
  fmt::print("  memory plan ({}):\n{}", device_name(dev.kind()), e.plan().report());

  // --- the loop ----------------------------------------------------------------------------------
  Model& model = e.model();
  const size_t nparams = model.layout().total_numel();
  const DType grad_dtype = model.precision().grad;
  const size_t bt = size_t(B) * T;
  const auto t0 = Clock::now();
  double loss_sum = 0;
  EvalResult eval;
  size_t peak_driver = 0;
  int64_t step = start_step;
  std::string last_ckpt;
  // Gradients carry the factor loss_scale / nominal loss rows of the step (so fp16 sees the magnitudes of a
  // mean loss times the scale, as in DeepSpeed); the optimizer divides by it and by the real count of rows
  // with a target. The rows are target tokens (GPT-2) or labelled sequences (classification).
  const double nominal_rows = classification_ ? double(B) * accum : double(cfg_.tokens_per_step());
  const std::vector<int64_t>& inject = cfg_.debug_inject_overflow_steps;
  // Work per step, for tokens/s and MFU: classification batches are padded to their own length, so the
  // tokens and FLOPs of a step are summed over its micro-batches (each B x its length).
  int64_t step_tokens = 0, tokens_total = 0;
  double step_flops = 0, flops_total = 0;
  const PeakFlops peak = peak_flops(dev.name(), precision_label(cfg_), cfg_.peak_flops);
  // No host synchronisation inside a step: its loss, gradient norm and clip factor are computed into these
  // device scalars, the optimizer reads the clip factor from there, and the host reads them once, after the
  // step's final synchronisation. (With the fp16 loss scaler the host reads them once before the optimizer
  // instead: see below.)
  StepScalars* const scalars = e.step_scalars();

  // Stage the first micro-batch; afterwards each micro-batch's copy is issued before the previous compute
  // ends.
  int slot = 0;
  // The shape of the batch staged in each slot and its rows with a target (not ignore-index): target tokens
  // (GPT-2) or labelled sequences (classification).
  struct Staged {
    int B = 0, T = 0;
    int64_t valid = 0;
  };
  Staged staged[2];
  auto stage = [&](int s) {
    dev.sync_copies();  // the host slot handed out two calls ago may now be reused by the loader
    if (classification_) {
      const data::ClassificationHostBatch& b = example_loader_->next();
      resume_pos_ = b.pos;
      const size_t rows = size_t(b.batch_size);
      staged[s] = {
          b.batch_size, b.length,
          int64_t(std::count_if(b.labels, b.labels + rows, [](int32_t l) { return l != kIgnoreIndex; }))};
      dev.copy_to_device_async(e.tokens(s), b.ids, rows * size_t(b.length) * sizeof(int32_t));
      dev.copy_to_device_async(e.lengths(s), b.lengths, rows * sizeof(int32_t));
      dev.copy_to_device_async(e.labels(s), b.labels, rows * sizeof(int32_t));
      return;
    }
    const data::HostBatch& b = train_loader_->next();
    resume_pos_ = b.pos;
    staged[s] = {
        B, T, int64_t(std::count_if(b.targets, b.targets + bt, [](int32_t t) { return t != kIgnoreIndex; }))};
    dev.copy_to_device_async(e.tokens(s), b.inputs, bt * sizeof(int32_t));
    dev.copy_to_device_async(e.targets(s), b.targets, bt * sizeof(int32_t));
  };
  stage(slot);
  // Memory history: the first step at or after memory_trace_step (a resumed run may start later).
  std::unique_ptr<MemoryTrace> trace;
  const int64_t trace_step = std::max<int64_t>(cfg_.memory_trace_step, start_step + 1);
  if (!cfg_.memory_trace.empty() && trace_step > total_steps_)
    fmt::print("  memory_trace: step {} is past the run's last step {}; no trace written\n", trace_step,
               total_steps_);
  std::unique_ptr<StepProfiler> profiler;
  if (const auto [first, last] = cfg_.profile_range(); first > 0) {
    const std::string path =
        (fs::path(cfg_.output_dir) / fmt::format("profile_steps_{}-{}.json", first, last)).string();
    profiler = std::make_unique<StepProfiler>(dev, path, first, last);
    model.set_profiler(profiler.get());
  }
  // One micro-batch's forward, backward and loss sum, with the inputs of slot `s`.
  const auto micro_batch = [&](int s, float grad_scale) {
    const ModelInputs in = e.inputs(s, staged[s].B, staged[s].T);
    model.forward(e.ops(), in, grad_scale, true);
    model.backward(e.ops(), in);
    // fp64, as Ops::sum; no wait
    e.ops().accumulate_sum(&scalars->loss_sum, model.losses(), model.loss_rows(in.B, in.T));
  };
  // CUDA graphs (cuda_graphs). A step whose work is all on the device is recorded once and replayed with
  // one launch: the kernels read the step's learning rate, bias terms, seeds and unscale factor from the
  // engine's step values, which the graph itself uploads from pinned memory the host rewrote for this step.
  //   - one micro-batch per step, no fp16 loss scaler: the whole step (gradient zeroing, forward, backward,
  //     loss sum, gradient norm, clip factor, optimizer, weight cast) is one graph per input slot and shape;
  //   - gradient accumulation: one graph per micro-batch (per slot and shape; the next batch's copy runs
  //     between micro-batches, from host buffers that change) and one for the step's tail (norm to cast);
  //   - the fp16 loss scaler: the host decides between the norm and the optimizer (a skipped step must not
  //     touch the weights), so micro-batches, the norm and the update are separate graphs.
  // A graph is recorded at the second use of its key (the first runs eagerly: it builds the attention plans
  // and GEMM algorithm choices the recording then keeps). Micro-batch graphs bake in the loss-gradient
  // scale, so an fp16 scale change records them again. Profiled, memory-traced and overflow-injected
  // steps run eagerly.
  const bool use_graphs = cfg_.cuda_graphs && dev.kind() == DeviceKind::CUDA;
  enum class Part { Step, Micro, Tail, Norm, Update };
  struct CachedGraph {
    std::unique_ptr<Device::Graph> graph;
    float grad_scale = 0;
    int64_t uses = 0;
  };
  std::map<std::tuple<Part, int, int, int>, CachedGraph> graphs;  // by (part, slot, B, T)
  int64_t graphs_recorded = 0, graph_launches = 0, whole_step_replays = 0;
  // Runs `work` eagerly, or records / replays it as the graph of `key`; true when replayed.
  const auto run_part = [&](bool eager, std::tuple<Part, int, int, int> key, float grad_scale,
                            const std::function<void()>& work) {
    if (eager) return work(), false;
    CachedGraph& g = graphs[key];
    if (g.uses++ == 0) return work(), false;
    if (!g.graph || g.grad_scale != grad_scale) {
      g.graph = dev.capture(work);
      g.grad_scale = grad_scale;
      ++graphs_recorded;
    }
    g.graph->launch();
    ++graph_launches;
    return true;
  };
  StepValues& values = e.step_values_host();
  double lr = 0;         // this step's scheduled learning rate
  int64_t opt_step = 0;  // and the optimizer's count of applied updates including it
  const StepValues* const device_values = e.step_values();
  // The step's tail, in two parts: the global norm and the optimizer's multiplier (clip factor x unscale) on
  // the device, in fp64 as the host did before (Ops::grad_clip_scale); then the update and the weight cast.
  // The host-side arguments are ignored in favour of the step values (which the norm part uploads first).
  const auto norm_part = [&] {
    e.upload_step_values();
    e.ops().sum_squares_to(&scalars->grad_sum_squares, model.grad_buffer(), grad_dtype, nparams);
    e.ops().grad_clip_scale(&scalars->grad_scale, &scalars->grad_norm, &scalars->grad_sum_squares, 1.0,
                            cfg_.max_grad_norm, device_values);
  };
  const auto update_part = [&] {
    // Host scale 1 times the device's clip x unscale: the very float the host used to pass.
    e.optimizer().step(e.ops(), model.params(), model.grad_buffer(), float(lr), opt_step, 1.0f,
                       &scalars->grad_scale, device_values);
    if (trace) trace->phase("optimizer");
    model.sync_weights(e.ops(), cfg_.stochastic_rounding ? 1 : 0, device_values);
  };
  for (; step < total_steps_; ++step) {
    const auto ts = Clock::now();
    if (profiler) profiler->begin_step(step + 1);
    if (!cfg_.memory_trace.empty() && step + 1 == trace_step) {
      trace = std::make_unique<MemoryTrace>(cfg_.memory_trace, dev.name(), e.plan().total_bytes(),
                                            dev.context_overhead_bytes(), step + 1);
      for (const PlannedBuffer& b : e.plan().buffers()) {
        if (b.shared_bytes == 0) {
          trace->buffer(b.name, b.category, b.bytes);
          continue;
        }
        // The part over other buffers is their memory (already listed): only the rest is this buffer's own.
        trace->buffer(
            fmt::format("{} (a further {} reuses activation memory)", b.name, format_bytes(b.shared_bytes)),
            b.category, b.bytes - std::min(b.bytes, b.shared_bytes));
      }
      model.set_memory_trace(trace.get());
    }
    const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
    lr = lr_at(schedule, cfg_.learning_rate, step, cfg_.warmup_steps, total_steps_);
    // The optimizer's own step count (bias correction) does not advance on skipped steps.
    opt_step = step + 1 - (scaler_ ? scaler_->skipped_steps() : 0);
    const bool inject_here = std::binary_search(inject.begin(), inject.end(), step + 1);
    const bool eager_step =
        !use_graphs || (profiler && profiler->profiling(step + 1)) || trace || inject_here;
    const bool whole_step = !eager_step && accum == 1 && !scaler_;
    // The loss of a step is the mean over every target token (classification: every labelled sequence) of
    // all its micro-batches. Gradients are accumulated as sums and divided by the step's count in the
    // optimizer, so N micro-batches of B give the same update as one batch of N*B whatever the padding. The
    // count is known on the host (counted when the batch was staged); the loss sum stays on the device.
    int64_t step_valid = 0;
    step_tokens = 0, step_flops = 0;
    const float grad_scale = float(loss_scale / nominal_rows);
    // The step's values, written before anything of the step is queued that uploads them (the previous
    // step's upload has run: every step ends with a synchronisation). Stored gradients x unscale = the
    // gradient of the step's mean loss; the count is final once every micro-batch is staged.
    const auto write_values = [&] {
      e.optimizer().fill_step_values(float(lr), opt_step, values);
      values.cast_seed = cfg_.stochastic_rounding ? rounding_seed(cfg_.seed, step + 1) : 0;
      values.unscale = nominal_rows / (loss_scale * double(step_valid));
    };
    // Dropout masks: this step's seed (a function of the run's seed and the step, so a resumed run draws what
    // the uninterrupted one drew); each micro-batch's forward advances the counter on the device.
    if (e.has_dropout()) e.dropout_state_host() = DropoutState{dropout_seed(cfg_.seed, step + 1), 0, 0};
    const auto require_targets = [&] {
      ANVIL_REQUIRE(step_valid > 0, "step {}: its batches contain no {} (all are ignore-index {})", step + 1,
                    classification_ ? "labelled examples" : "target tokens", kIgnoreIndex);
    };
    const auto head = [&] {
      // (Gradients in activation memory are zeroed by backward, unit by unit, once it is their turn.)
      if (!model.grads_share_activations()) dev.fill_zero(model.grad_buffer(), model.grad_bytes());
      if (e.has_dropout()) e.upload_dropout_state();
      dev.fill_zero(scalars, sizeof(StepScalars));  // queued, like everything below until the end of the step
    };
    if (!whole_step) head();
    for (int micro = 0; micro < accum; ++micro) {
      if (profiler) profiler->phase("data (wait for the batch)");
      dev.wait_for_copies();
      const bool last_batch = step + 1 == total_steps_ && micro + 1 == accum;
      const Staged& in = staged[slot];
      step_valid += in.valid;
      step_tokens += int64_t(in.B) * in.T;
      step_flops += double(in.B) * in.T * training_flops_per_token(model_cfg_, in.T);
      if (whole_step) {
        require_targets();
        write_values();
        whole_step_replays += run_part(false, {Part::Step, slot, in.B, in.T}, grad_scale, [&] {
          head();
          micro_batch(slot, grad_scale);
          norm_part();
          update_part();
        });
      } else {
        run_part(eager_step, {Part::Micro, slot, in.B, in.T}, grad_scale,
                 [&] { micro_batch(slot, grad_scale); });
      }
      // The next batch's copy overlaps this micro-batch's compute; it waits only for the previous
      // micro-batch, the last reader of the buffers it fills.
      if (!last_batch) {
        stage(slot ^ 1);
      } else {
        resume_pos_ = train_position();
      }
      dev.release_inputs_to_copies();
      slot ^= 1;
    }
    require_targets();
    if (inject_here) {
      // Test hook: an infinite gradient, as an fp16 overflow in backward would leave.
      const float inf = std::numeric_limits<float>::infinity();
      const uint16_t half_inf = grad_dtype == DType::BF16 ? uint16_t(0x7f80) : uint16_t(0x7c00);
      if (grad_dtype == DType::F32)
        dev.copy_to_device(model.grad_buffer(), &inf, sizeof(float));
      else
        dev.copy_to_device(model.grad_buffer(), &half_inf, sizeof(uint16_t));
    }
    StepScalars host;  // the step's scalars as the host reads them (once per step)
    const auto read_scalars = [&] { dev.copy_to_host(&host, scalars, sizeof(StepScalars)); };
    const auto not_finite = [&] {
      return !std::isfinite(host.loss_sum / double(step_valid)) || !std::isfinite(host.grad_norm);
    };
    bool skipped = false;
    if (!whole_step) {
      write_values();
      if (profiler) profiler->phase("gradient norm");
      if (scaler_) {
        run_part(eager_step, {Part::Norm, 0, 0, 0}, 0, norm_part);
        // fp16 with the loss scaler keeps a host decision before the optimizer: an overflowing step must be
        // skipped (and the scale lowered) before it touches the weights, so the host waits for the norm
        // here. This is the one synchronisation inside an fp16 step; fp32 / bf16 steps have none.
        read_scalars();
        const LossScaler::Update u = scaler_->update(not_finite(), step + 1);
        if (u.skip) {
          fmt::print("{}\n", u.message);
          skipped = true;
        }
        if (!skipped) {
          if (profiler) profiler->phase("optimizer");  // the update and the compute-type weight copy
          run_part(eager_step, {Part::Update, 0, 0, 0}, 0, update_part);
        }
      } else if (eager_step) {
        norm_part();
        if (profiler) profiler->phase("optimizer");  // the update and the compute-type weight copy
        update_part();
      } else {
        run_part(false, {Part::Tail, 0, 0, 0}, 0, [&] {
          norm_part();
          update_part();
        });
      }
    }
    dev.synchronize();
    if (!scaler_) {
      read_scalars();
      // Without a loss scaler a non-finite loss or gradient norm stops the run, as it always did; it is
      // only seen now, after the step's update was queued (the step no longer waits for the norm before the
      // optimizer). The error is raised before anything of this step is logged, evaluated or saved, so the
      // weights it produced are never written: the last checkpoint holds the last good state.
      ANVIL_REQUIRE(!not_finite(),
                    "step {}: the loss ({}) or gradient norm ({}) is not finite; lower the learning_rate{}",
                    step + 1, host.loss_sum / double(step_valid), host.grad_norm,
                    cfg_.bf16 ? "" : " or try --bf16");
    }
    const double step_loss = host.loss_sum / double(step_valid);
    const double grad_norm = host.grad_norm;
    if (profiler && profiler->in_step()) profiler->end_step();
    if (trace) {
      model.set_memory_trace(nullptr);
      trace->finish();
      fmt::print("memory trace of step {} -> {} (peak of live data {}; render: anvil memory-report {})\n",
                 step + 1, trace->path(), format_bytes(trace->peak_live_bytes()), trace->path());
      trace.reset();
    }
    loss_sum += skipped ? 0.0 : step_loss;
    tokens_total += step_tokens;
    flops_total += step_flops;
    peak_driver = std::max(peak_driver, dev.driver_used_bytes());
    const double step_time = seconds_since(ts);
    const double elapsed = seconds_since(t0);
    const size_t peak_mem = std::max(e.plan().total_bytes(), peak_driver);
    if ((step + 1) % cfg_.logging_steps == 0 || step + 1 == total_steps_ || step == start_step || skipped) {
      const double tps = double(step_tokens) / step_time;
      const double mfu = peak.flops > 0 ? step_flops / step_time / peak.flops : -1;
      // Classification runs count sequences first (their padded tokens/s follows).
      const double sps = double(B) * accum / step_time;
      const std::string sps_text = classification_ ? fmt::format(" {:>8.1f} samples/s |", sps) : "";
      const std::string mfu_text = mfu >= 0 ? fmt::format(" | MFU {:4.1f}%", 100 * mfu) : "";
      const std::string scale_text =
          scaler_ ? fmt::format(" | scale {} | skipped {}", format_loss_scale(scaler_->scale()),
                                scaler_->skipped_steps())
                  : "";
      fmt::print(
          "step {:>5}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.4f}{} |{} {:>9.0f} tok/s{} | {:7.1f}s | "
          "peak "
          "{}\n",
          step + 1, total_steps_, step_loss, lr, grad_norm, scale_text, sps_text, tps, mfu_text, elapsed,
          format_bytes(peak_mem));
      std::fflush(stdout);
      json line = {{"step", step + 1},
                   {"loss", std::isfinite(step_loss) ? json(step_loss) : json(nullptr)},
                   {"learning_rate", lr},
                   {"grad_norm", std::isfinite(grad_norm) ? json(grad_norm) : json(nullptr)},
                   {"tokens_per_second", tps},
                   {"step_time", step_time},
                   {"elapsed", elapsed},
                   {"data_wait_seconds", data_wait_seconds()},
                   {"peak_memory_bytes", peak_mem}};
      if (classification_) line["samples_per_second"] = sps;
      if (mfu >= 0) line["mfu"] = mfu;
      if (scaler_) {
        line["loss_scale"] = scaler_->scale();
        line["skipped_steps"] = scaler_->skipped_steps();
        line["overflow"] = skipped;
      }
      log_json(line);
    }
    const bool last = step + 1 == total_steps_;
    if ((val_loader_ || val_example_loader_) &&
        ((cfg_.eval_steps > 0 && (step + 1) % cfg_.eval_steps == 0) || last)) {
      eval = evaluate(slot ^ 1);  // `slot` may hold the staged next batch
      if (classification_) {
        fmt::print("eval  {:>5}/{} | eval_loss {:.4f} | eval_accuracy {:.4f}\n", step + 1, total_steps_,
                   eval.loss, eval.accuracy);
        log_json({{"step", step + 1},
                  {"eval_loss", eval.loss},
                  {"eval_accuracy", eval.accuracy},
                  {"eval_examples", eval.examples}});
      } else {
        fmt::print("eval  {:>5}/{} | eval_loss {:.4f} | perplexity {:.2f}\n", step + 1, total_steps_,
                   eval.loss, std::exp(eval.loss));
        log_json({{"step", step + 1}, {"eval_loss", eval.loss}});
      }
    }
    if (cfg_.save_strategy != "no" && ((cfg_.save_steps > 0 && (step + 1) % cfg_.save_steps == 0) || last)) {
      save(step + 1, loss_sum_before_ + loss_sum, steps_before_ + step + 1 - start_step);
      last_ckpt = checkpoint_dir(cfg_, step + 1);
    }
  }
  const double runtime = seconds_since(t0);
  if (profiler) {
    model.set_profiler(nullptr);
    const auto [first, last] = cfg_.profile_range();
    if (first > total_steps_ || last <= start_step) {
      fmt::print("profile_steps {}: outside this run's steps {}..{}; no profile written\n",
                 cfg_.profile_steps, start_step + 1, total_steps_);
    } else {
      const size_t events = profiler->finish();
      fmt::print(
          "profile of steps {} -> {} ({} ranges; open in https://ui.perfetto.dev or chrome://tracing)\n",
          cfg_.profile_steps, profiler->path(), events);
    }
  }

  TrainSummary s;
  const int64_t steps_run = total_steps_ - start_step;
  s.global_step = total_steps_;
  s.train_runtime = runtime;
  s.train_steps_per_second = steps_run / runtime;
  s.train_samples_per_second = double(steps_run) * B * accum / runtime;
  // GPT-2's tokens are the nominal ones (every window is full); classification counts padded batch tokens.
  s.train_tokens_per_second =
      classification_ ? double(tokens_total) / runtime : double(steps_run) * cfg_.tokens_per_step() / runtime;
  const int64_t skipped_total = scaler_ ? scaler_->skipped_steps() : 0;
  s.train_loss =
      (loss_sum + loss_sum_before_) / double(std::max<int64_t>(1, steps_run + steps_before_ - skipped_total));
  s.precision = precision_label(cfg_);
  s.skipped_steps = skipped_total;
  s.loss_scale = scaler_ ? scaler_->scale() : 0.0;
  s.eval_loss = eval.loss;
  s.eval_accuracy = eval.accuracy;
  s.peak_memory_bytes = std::max(e.plan().total_bytes(), peak_driver);
  s.allocator_peak_bytes = dev.memory_stats().peak_allocated_bytes;
  s.planned_memory_bytes = e.plan().total_bytes();
  s.data_wait_seconds = data_wait_seconds();
  s.device = dev.name();
  s.last_checkpoint = last_ckpt;
  s.cuda_graphs_recorded = graphs_recorded;
  s.cuda_graph_launches = graph_launches;
  s.cuda_graph_whole_steps = whole_step_replays;

  if (!cfg_.sample_prompt.empty() && cfg_.sample_max_new_tokens > 0) {
    SampleOptions so{cfg_.sample_max_new_tokens, float(cfg_.sample_temperature), cfg_.sample_top_k};
    std::vector<int32_t> prompt;
    for (uint32_t id : tokenizer_->encode(cfg_.sample_prompt)) prompt.push_back(int32_t(id));
    const std::vector<int32_t> ids = generate(e, prompt, so, rng_);
    s.sample = cfg_.sample_prompt + decode_ids(*tokenizer_, ids);
  }

  // GPT-2: the FLOPs of a token at the run's length; classification: the run's average (lengths vary).
  const double flops_per_token = classification_ ? (tokens_total > 0 ? flops_total / double(tokens_total) : 0)
                                                 : training_flops_per_token(model_cfg_, T);
  json by_category = json::object();
  for (int c = 0; c < kMemoryCategories; ++c)
    by_category[memory_category_name(MemoryCategory(c))] = e.plan().bytes(MemoryCategory(c));
  json summary = {{"train_runtime", s.train_runtime},
                  {"train_samples_per_second", s.train_samples_per_second},
                  {"train_steps_per_second", s.train_steps_per_second},
                  {"train_tokens_per_second", s.train_tokens_per_second},
                  {"train_loss", s.train_loss},
                  {"eval_loss", s.eval_loss >= 0 ? json(s.eval_loss) : json(nullptr)},
                  {"peak_memory_bytes", s.peak_memory_bytes},
                  {"data_wait_seconds", s.data_wait_seconds},
                  {"data_wait_fraction", s.data_wait_seconds / runtime},
                  {"planned_memory_bytes", e.plan().total_bytes()},
                  {"planned_memory_by_category", by_category},
                  // Memory accounting (docs/memory.md): the allocator's peak vs the plan, the runtime's
                  // overhead measured when the device was made, the driver's peak in use (CUDA).
                  {"allocator_peak_bytes", s.allocator_peak_bytes},
                  {"context_overhead_bytes", dev.context_overhead_bytes()},
                  {"driver_peak_bytes", peak_driver},
                  {"precision", s.precision},
                  {"flops_per_token", flops_per_token},
                  {"peak_flops", peak.flops > 0 ? json(peak.flops) : json(nullptr)},
                  {"peak_flops_source", peak.source},
                  {"mfu", peak.flops > 0 ? json(s.train_tokens_per_second * flops_per_token / peak.flops)
                                         : json(nullptr)},
                  {"skipped_steps", s.skipped_steps},
                  {"loss_scale", scaler_ ? json(s.loss_scale) : json(nullptr)},
                  {"global_step", s.global_step},
                  {"cuda_graphs",
                   {{"recorded", s.cuda_graphs_recorded},
                    {"launches", s.cuda_graph_launches},
                    {"whole_step_replays", s.cuda_graph_whole_steps}}},
                  {"device", s.device},
                  {"last_checkpoint", s.last_checkpoint}};
  if (classification_)
    summary["eval_accuracy"] = s.eval_accuracy >= 0 ? json(s.eval_accuracy) : json(nullptr);
  metrics_->close();
  io::write_text_file_synced(run_dir_->file("summary.json"), summary.dump(2) + "\n");
  return s;
}

}  // namespace

TrainSummary train(const TrainConfig& cfg) {
  Run run(cfg);
  try {
    return run.go();
  } catch (const std::exception& e) {
    run.record_error(e.what());
    throw;
  }
}

}  // namespace anvil
