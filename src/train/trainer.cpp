// The training loop (docs/architecture.md, "The training loop"): Run::go is the run's sequence of named
// steps; the task (task.hpp: causal LM or classification) says what differs between the kinds of run, the
// train step (train_step.hpp) runs one optimizer step, and the progress log, evaluation schedule,
// checkpointer, step instruments (profiler, memory trace) and summary are objects of their own.
#include "anvil/trainer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>

#include "anvil/rng.hpp"
#include "dist/dist_env.hpp"
#include "dist/grad_sync.hpp"
#include "dist/process_group.hpp"
#include "dist/watchdog.hpp"
#include "dist/zero_sync.hpp"
#include "io/atomic_dir.hpp"
#include "io/checkpoint.hpp"
#include "io/optimizer_state.hpp"
#include "train/checkpointer.hpp"
#include "train/engine.hpp"
#include "train/eval_schedule.hpp"
#include "train/memory_fit.hpp"
#include "train/metrics_log.hpp"
#include "train/progress_log.hpp"
#include "train/resolved_config.hpp"
#include "train/run_directory.hpp"
#include "train/run_header.hpp"
#include "train/run_model.hpp"
#include "train/run_summary.hpp"
#include "train/step_instruments.hpp"
#include "train/task.hpp"
#include "train/train_step.hpp"
#include "train/zero_checkpoint.hpp"

namespace anvil {
namespace {

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Ranks other than 0 print nothing on stdout while they train (rank 0 speaks for the run; errors go to
// stderr, which every rank keeps).
class SilencedStdout {
 public:
  SilencedStdout() {
    std::fflush(stdout);
    saved_ = ::dup(STDOUT_FILENO);
    ANVIL_REQUIRE(saved_ >= 0, "dup(stdout) failed: {}", std::strerror(errno));
    const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    ANVIL_REQUIRE(null >= 0, "open(/dev/null) failed: {}", std::strerror(errno));
    const int r = ::dup2(null, STDOUT_FILENO);
    ::close(null);
    ANVIL_REQUIRE(r >= 0, "dup2(/dev/null, stdout) failed: {}", std::strerror(errno));
  }
  ~SilencedStdout() {
    std::fflush(stdout);
    ::dup2(saved_, STDOUT_FILENO);
    ::close(saved_);
  }
  SilencedStdout(const SilencedStdout&) = delete;
  SilencedStdout& operator=(const SilencedStdout&) = delete;

 private:
  int saved_ = -1;
};

class Run {
 public:
  explicit Run(const TrainConfig& cfg) : cfg_(cfg), env_(dist::read_dist_env()) {}
  TrainSummary go();
  // After a failure: the error goes into the run directory (once training has started).
  void record_error(std::string_view message) noexcept {
    if (run_dir_) run_dir_->record_error(message);
    if (watchdog_) watchdog_->post_failure(std::string(message));
  }

 private:
  void open_model_and_data();
  void make_engine();
  std::optional<size_t> agreed_available_memory(const Device& device);
  void share_weights();
  void open_loaders();
  void load_weights();
  void resume();
  void begin_outputs();
  StepResult run_step_named(int64_t step, StepInstruments& instruments);
  void leave_job();
  void run_step(int64_t step, ProgressLog& progress, StepInstruments& instruments, EvalSchedule& eval,
                Checkpointer& checkpoints);
  TrainSummary finish(const ProgressLog& progress, const EvalSchedule& eval, const Checkpointer& checkpoints);

  // First, so it goes last: the lock on output_dir is held until everything writing there is gone. Rank 0's
  // only: the other ranks of a data-parallel run write nothing.
  std::unique_ptr<RunDirectory> run_dir_;
  std::optional<SilencedStdout> silenced_;
  TrainConfig cfg_;         // as run: auto_find_batch_size may change the micro-batch and accumulation
  ResolvedTrainConfig rc_;  // cfg_'s typed values, resolved once the memory fit has settled cfg_
  TransformerConfig model_cfg_;
  dist::DistEnv env_;           // where this process stands in its job (one process without a launcher)
  std::string weights_from_;    // checkpoint or HF directory, or "" for a fresh initialisation
  std::string tokenizer_file_;  // copied into checkpoints ("" for the byte tokenizer)
  std::optional<io::TrainerState> resume_state_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Task> task_;  // after the engine: its loaders use the device
  // After the engine (they use its device and model), so they go first.
  std::unique_ptr<dist::ProcessGroup> group_;
  std::unique_ptr<dist::ZeroSync> zero_sync_;  // ZeRO stages 1-3 (one process: stage 3 with offload_param)
  std::unique_ptr<dist::GradSync> grad_sync_;  // several processes, or one under ZeRO
  std::unique_ptr<dist::Watchdog> watchdog_;
  std::unique_ptr<TrainStep> step_;
  std::optional<MetricsLog> metrics_;
  Rng rng_{0};
  int64_t total_steps_ = 0, start_step_ = 0;
  double loss_sum_before_ = 0;  // sum of step losses before a resume (for train_loss)
  int64_t steps_before_ = 0;
  double runtime_ = 0;
};

TrainSummary Run::go() {
  if (env_.rank != 0) silenced_.emplace();
  open_model_and_data();
  make_engine();
  open_loaders();
  rng_.set_state(cfg_.seed);
  step_ = std::make_unique<TrainStep>(cfg_, rc_, model_cfg_, *engine_, *task_, total_steps_, *group_,
                                      grad_sync_.get(), zero_sync_.get());
  load_weights();
  if (resume_state_) resume();
  share_weights();
  begin_outputs();
  print_run_header({cfg_, rc_, model_cfg_, weights_from_, start_step_, total_steps_, step_->scaler()}, *task_,
                   *engine_);

  ProgressLog progress(cfg_, rc_, *task_, *engine_, *metrics_, step_->scaler(), start_step_, total_steps_);
  step_->stage_first();
  StepInstruments instruments(cfg_, rc_, *engine_, start_step_, total_steps_,
                              env_.distributed() ? &group_->comm() : nullptr);
  EvalSchedule eval(cfg_, *task_, *engine_, *metrics_, total_steps_);
  Checkpointer checkpoints(cfg_, rc_, *engine_, run_dir_.get(), tokenizer_file_, group_.get(),
                           zero_sync_.get());
  for (int64_t step = start_step_; step < total_steps_; ++step)
    run_step(step, progress, instruments, eval, checkpoints);
  runtime_ = progress.elapsed();
  instruments.finish();
  TrainSummary s = finish(progress, eval, checkpoints);
  leave_job();
  return s;
}

// The ranks part together: every watchdog stops before any rank (rank 0: the job's store) goes away.
void Run::leave_job() {
  if (!env_.distributed()) return;
  group_->comm().barrier();
  watchdog_.reset();
  group_->comm().barrier();
}

// The model's shape, starting point and tokenizer; the run directory; the data (its kind must be the
// model's; a classifier takes its labels and sequence length from it), and the task it makes.
void Run::open_model_and_data() {
  RunModel rm = resolve_run_model(cfg_);
  weights_from_ = rm.weights_from;
  tokenizer_file_ = rm.tokenizer_file;
  std::unique_ptr<data::Tokenizer> tokenizer = std::move(rm.tokenizer);
  resume_state_ = std::move(rm.resume_state);
  // The lock on output_dir, the cleanup of interrupted saves, and the refusal to mix with an earlier run.
  if (env_.rank == 0) run_dir_ = std::make_unique<RunDirectory>(cfg_);
  const RunData data = open_run_data(cfg_, rm);
  model_cfg_ = rm.config;
  // Weights from a directory fix the shape, so the sequence length defaults to its block_size (not to the
  // config's preset) and train_config.json records the shape that was trained.
  if (!weights_from_.empty()) {
    cfg_.model = model_cfg_;
    cfg_.model_preset.clear();
  }
  task_ = make_task(cfg_, data, model_cfg_, std::move(tokenizer));
}

// auto_find_batch_size and the out-of-memory check, before anything is allocated; then the engine (plan,
// arena, model, optimizer). The config is final from here on, and resolved.
//
// Several processes: each uses the GPU of its local rank; the ranks meet (ProcessGroup), fit their memory to
// the smallest free memory among them (so that auto_find_batch_size settles the same batch everywhere), and
// check that they all run the same resolved config before anything is allocated.
void Run::make_engine() {
  const DeviceKind kind = resolve_device(cfg_.device);
  std::unique_ptr<Device> device =
      kind == DeviceKind::CUDA && env_.distributed() ? make_cuda_device(env_.local_rank) : make_device(kind);
  group_ = std::make_unique<dist::ProcessGroup>(env_, *device, std::chrono::seconds(cfg_.ddp_timeout));
  watchdog_ = std::make_unique<dist::Watchdog>(*group_, std::chrono::seconds(cfg_.ddp_timeout));
  MemoryFit fit = fit_to_memory(cfg_, model_cfg_, device->kind(), agreed_available_memory(*device),
                                device->context_overhead_bytes(), device->name());
  fmt::print("{}", fit.message);
  cfg_ = std::move(fit.config);
  rc_ = resolve_train_config(cfg_);
  rc_.world_size = env_.world_size;
  group_->require_same("config", cfg_.to_json().dump(2));
  if (env_.distributed())
    fmt::print(
        "  processes: {} on {} node(s) ({}, started by {}); global batch {} sequences per step\n",
        env_.world_size, env_.num_nodes, group_->comm().backend(), env_.launcher,
        int64_t(cfg_.per_device_train_batch_size) * cfg_.gradient_accumulation_steps * env_.world_size);
  EngineOptions options = training_engine_options(cfg_);
  options.zero_rank = env_.rank;  // the plan fitted the largest shard; this rank binds its own
  engine_ = std::make_unique<Engine>(model_cfg_, options, std::move(device));
  // (One process runs a ZeRO stage only under parameter offload: stage 3 on one rank.)
  if (!env_.distributed() && options.zero_stage == 0) return;
  ParamStore& store = engine_->model().param_store();
  if (options.zero_stage > 0) {
    static const char* const kept[] = {"", "master weights and optimizer state",
                                       "master weights, optimizer state and reduced gradients",
                                       "weights, master weights, optimizer state and reduced gradients"};
    if (store.trainable_only())  // LoRA: the frozen base has no master weights, gradients or state
      fmt::print(
          "  ZeRO stage {}: this rank keeps {} of the {} trainable parameters' master weights, optimizer "
          "state{}{}\n",
          options.zero_stage, store.master_range().numel(), store.optimizer_layout().total_numel(),
          options.zero_stage >= 2 ? " and reduced gradients" : "",
          options.zero_stage >= 3 ? fmt::format(", and {} of the {} parameters' weights",
                                                store.weight_range().numel(), store.numel())
                                  : "");
    else
      fmt::print("  ZeRO stage {}: this rank keeps {} of the {} parameters' {}\n", options.zero_stage,
                 store.master_range().numel(), store.numel(), kept[std::clamp(options.zero_stage, 1, 3)]);
    zero_sync_ = std::make_unique<dist::ZeroSync>(
        group_->comm(), engine_->device(), store,
        dist::ZeroPartition(store.layout(), env_.world_size, dist::shard_cuts(rc_.optimizer)),
        options.zero_stage, size_t(cfg_.zero_allgather_bucket_size));
  }
  grad_sync_ = std::make_unique<dist::GradSync>(
      group_->comm(), store, size_t(cfg_.ddp_bucket_cap_mb * 1024 * 1024),
      zero_sync_ && zero_sync_->stage() >= 2 ? &zero_sync_->partition() : nullptr, &engine_->ops());
}

// The device memory every rank can count on: the least any of them has free (nullopt where unknown).
std::optional<size_t> Run::agreed_available_memory(const Device& device) {
  const std::optional<size_t> mine = device.available_memory_bytes();
  if (!env_.distributed()) return mine;
  std::optional<size_t> least;
  for (const std::string& v :
       group_->exchange("available memory", mine ? std::to_string(*mine) : "unknown")) {
    if (v == "unknown") return std::nullopt;
    const size_t bytes = std::stoull(v);
    least = least ? std::min(*least, bytes) : bytes;
  }
  return least;
}

// Data parallelism starts from identical replicas: rank 0's weights (initialised, loaded or resumed) go to
// every rank. (Every rank read the same checkpoint's optimizer state.) ZeRO: each rank's shard of the master
// weights is the authority for its range, all-gathered into every rank's weights as after a step.
// A run resumed under stochastic rounding casts the master weights as its last step did (the same seed),
// so that its compute weights, and so the rest of the run, are the uninterrupted run's.
void Run::share_weights() {
  Model& m = engine_->model();
  const uint64_t cast_seed =
      resume_state_ && cfg_.stochastic_rounding ? TrainStep::weight_cast_seed(cfg_.seed, start_step_) : 0;
  if (!env_.distributed()) {
    if (cast_seed) m.sync_weights(engine_->ops(), cast_seed);
    return;
  }
  if (zero_sync_) {
    // (Offloaded master weights: the weights were written from them when they were set, to nearest.)
    if (!m.param_store().master_on_host()) m.sync_weights(engine_->ops(), cast_seed);
    zero_sync_->gather_weights();
    engine_->device().synchronize();
    group_->comm().check();
    return;
  }
  const ParamStore& store = m.param_store();
  group_->comm().broadcast(m.params(), store.optimizer_layout().total_numel(), DType::F32, 0);
  // A store of the trainable tensors only: the frozen tensors are in the compute-type weights alone (QLoRA:
  // those not quantized; the codes are quantized alike on every rank from the same values).
  if (store.trainable_only())
    group_->comm().broadcast(m.weights(),
                             store.quantized() ? store.quantized()->dense_numel() : store.numel(),
                             store.precision().compute, 0);
  group_->comm().join();
  m.sync_weights(engine_->ops(), cast_seed);
  engine_->device().synchronize();
}

void Run::open_loaders() {
  task_->open_loaders(cfg_, engine_->device(), env_.rank, env_.world_size);
  total_steps_ = cfg_.max_steps > 0
                     ? cfg_.max_steps
                     : std::max<int64_t>(
                           1, int64_t(std::ceil(cfg_.num_train_epochs * double(task_->batches_per_epoch()) /
                                                cfg_.gradient_accumulation_steps)));
}

void Run::load_weights() {
  Engine& e = *engine_;
  // LoRA adapters start from their initialisation unless the directory holds them too.
  if (weights_from_.empty() || task_->init_before_load() || e.model().layout().lora().enabled())
    e.model().init_weights(cfg_.seed, e.device());
  if (weights_from_.empty()) return;
  // A run's starting adapter kept apart from its base (lora_adapter); a resumed run's are in the checkpoint.
  const io::BertLoadReport report =
      io::load_model_weights(weights_from_, e.model(), e.device(), resume_state_ ? "" : cfg_.lora_adapter);
  if (!report.kept.empty())
    fmt::print("  newly initialised (not in {}): {}\n", weights_from_, join_names(report.kept));
  if (!report.ignored.empty())
    fmt::print("  not used from {}: {}\n", weights_from_, join_names(report.ignored));
}

// The checkpoint's state (validated by io::read_trainer_state): step, loader position, RNG, loss totals,
// loss scaler and optimizer.
void Run::resume() {
  const io::TrainerState& rs = *resume_state_;
  start_step_ = rs.global_step;
  task_->seek(data::LoaderPosition{rs.loader_epoch, rs.loader_batch});
  rng_.set_state(rs.rng_state);
  loss_sum_before_ = rs.train_loss_sum;
  steps_before_ = rs.train_loss_steps;
  if (LossScaler* scaler = step_->scaler(); scaler && !rs.loss_scaler.is_null())
    scaler->load_state(rs.loss_scaler, cfg_.resume_from_checkpoint + "/trainer_state.json: loss_scaler");
  // Any partition reads its slices of the state from either layout (io/optimizer_state.hpp).
  const io::StateSlices slices =
      zero_sync_ ? zero_state_slices(engine_->optimizer(), zero_sync_->partition(), env_.rank)
                 : io::StateSlices{};
  io::load_optimizer_state(cfg_.resume_from_checkpoint, engine_->optimizer_state(true),
                           engine_->optimizer_device(), slices);
  ANVIL_REQUIRE(start_step_ < total_steps_, "{}: the checkpoint is at step {} but the run has only {} steps",
                cfg_.resume_from_checkpoint, start_step_, total_steps_);
}

void Run::begin_outputs() {
  if (!run_dir_) {  // not rank 0: its metrics go nowhere
    metrics_ = MetricsLog::create("/dev/null");
    return;
  }
  run_dir_->begin();
  const std::string metrics_path = run_dir_->file("metrics.jsonl");
  metrics_ = resume_state_ ? MetricsLog::resume(metrics_path, start_step_) : MetricsLog::create(metrics_path);
  io::write_text_file_synced(run_dir_->file("train_config.json"), cfg_.to_json().dump(2) + "\n");
}

void Run::run_step(int64_t step, ProgressLog& progress, StepInstruments& instruments, EvalSchedule& eval,
                   Checkpointer& checkpoints) {
  const Clock::time_point started = Clock::now();
  instruments.begin_step(step + 1);
  const StepResult r = run_step_named(step, instruments);
  instruments.end_step(step + 1);
  progress.step_done(step, r, started);
  eval.after_step(step + 1, step_->free_slot());
  if (checkpoints.due(step + 1, total_steps_))
    checkpoints.save({step + 1, total_steps_, step_->resume_position(), rng_.state(),
                      loss_sum_before_ + progress.totals().loss_sum, steps_before_ + step + 1 - start_step_,
                      step_->scaler()});
}

// With several processes a failed collective (a rank died, hangs or diverged) names the step it broke.
StepResult Run::run_step_named(int64_t step, StepInstruments& instruments) {
  if (!env_.distributed()) return step_->run(step, instruments);
  try {
    watchdog_->step_begins(step + 1);
    const StepResult r = step_->run(step, instruments);
    watchdog_->step_ends();
    return r;
  } catch (const Error& e) {
    ANVIL_THROW("step {}: {}", step + 1, e.what());
  }
}

TrainSummary Run::finish(const ProgressLog& progress, const EvalSchedule& eval,
                         const Checkpointer& checkpoints) {
  const RunRecord r{start_step_,
                    total_steps_,
                    runtime_,
                    loss_sum_before_,
                    steps_before_,
                    progress.totals(),
                    eval.last(),
                    checkpoints.last(),
                    step_->scaler(),
                    rc_.precision_label(),
                    step_->graphs().recorded(),
                    step_->graphs().launches(),
                    step_->whole_step_replays(),
                    progress.peak_flops(),
                    env_.world_size};
  TrainSummary s = summarize_run(r, cfg_, *task_, *engine_);
  s.rank = env_.rank;
  s.world_size = env_.world_size;
  metrics_->close();
  // ZeRO-3: the model's forward gathers its units from every rank, so every rank generates the sample (the
  // same: the same weights and random state); rank 0 keeps it.
  const bool every_rank_samples = zero_sync_ && zero_sync_->stage() >= 3;
  if (!run_dir_) {  // not rank 0
    if (every_rank_samples) (void)task_->sample(*engine_, rng_);
    return s;
  }
  s.sample = task_->sample(*engine_, rng_);
  const nlohmann::json summary = summary_json(s, r, *task_, *engine_);
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
