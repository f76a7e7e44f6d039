#include "train/train_step.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/half.hpp"
#include "optim/lr_schedule.hpp"
#include "train/mfu.hpp"

namespace anvil {
namespace {

using Part = StepGraphs::Part;

// The dropout seed of a step: another stream of the run's seed than the rounding seeds'.
uint64_t dropout_seed(uint64_t seed, int64_t step) {
  return Rng(~seed ^ (uint64_t(step) * 0xd1b54a32d192ed03ull)).next_u64();
}

}  // namespace

TrainStep::TrainStep(const TrainConfig& cfg, const ResolvedTrainConfig& rc,
                     const TransformerConfig& model_cfg, Engine& e, Task& task, int64_t total_steps,
                     dist::ProcessGroup& group, dist::GradSync* sync, dist::ZeroSync* zero)
    : cfg_(cfg),
      rc_(rc),
      model_cfg_(model_cfg),
      e_(e),
      dev_(e.device()),
      model_(e.model()),
      task_(task),
      total_steps_(total_steps),
      accum_(cfg.gradient_accumulation_steps),
      nominal_rows_(task.nominal_rows()),
      // (Weights paged from NVMe: the host reads the file while it queues the step, which a graph cannot.)
      use_graphs_(cfg.cuda_graphs && e.device().kind() == DeviceKind::CUDA && !e.weight_pages()),
      nparams_(e.model().param_store().optimizer_layout().total_numel()),
      grad_dtype_(e.model().precision().grad),
      scalars_(e.step_scalars()),
      group_(group),
      sync_(sync),
      zero_(zero),
      graphs_(e.device()) {
  if (rc.loss_scaling()) scaler_.emplace(cfg.loss_scaler());
  // Gradients offloaded across the bus: their norm's squares are summed as they are written (the CPU
  // backend's host gradients are its own memory: the norm reads them in one pass, as without offload).
  if (sync_ && e.model().param_store().grads_on_host() && dev_.kind() == DeviceKind::CUDA)
    sync_->set_norm_sink(&scalars_->grad_sum_squares);
}

uint64_t TrainStep::weight_cast_seed(uint64_t run_seed, int64_t step) {
  return Rng(run_seed ^ (uint64_t(step) * 0x9e3779b97f4a7c15ull)).next_u64() | 1;
}

void TrainStep::stage_first() {
  stage(slot_);
}

StepResult TrainStep::run(int64_t step, StepInstruments& instruments) {
  begin(step, instruments);
  if (!cur_.whole) head();
  micro_batches();
  require_targets();
  if (cur_.inject) inject_overflow();
  const bool skipped = !cur_.whole && tail();
  dev_.synchronize();
  // ZeRO-3: the update changed the weights the slots were gathered from. (A step replayed from a CUDA graph
  // runs none of the store's host code, so this is said here, where every step passes.)
  model_.param_store().forget_gathered();
  return end(skipped);
}

void TrainStep::begin(int64_t step, StepInstruments& instruments) {
  instruments_ = &instruments;
  cur_ = Current{};
  if (group_.distributed()) group_.comm().begin_timing(instruments.profiling(step + 1));
  cur_.step = step;
  cur_.loss_scale = scaler_ ? scaler_->scale() : 1.0;
  cur_.lr = lr_at(rc_.lr_schedule, cfg_.learning_rate, step, cfg_.warmup_steps, total_steps_);
  // The optimizer's own step count (bias correction) does not advance on skipped steps.
  cur_.opt_step = step + 1 - (scaler_ ? scaler_->skipped_steps() : 0);
  const std::vector<int64_t>& inject = cfg_.debug_inject_overflow_steps;
  cur_.inject = std::binary_search(inject.begin(), inject.end(), step + 1);
  // Profiled, memory-traced and overflow-injected steps run eagerly. One micro-batch without the fp16 loss
  // scaler: the whole step is one graph; gradient accumulation: one graph per micro-batch (the next batch's
  // copy runs between them, from host buffers that change) and one for the tail; the fp16 loss scaler: the
  // host decides between the norm and the update (a skipped step must not touch the weights), so
  // micro-batches, the norm and the update are separate graphs.
  cur_.eager = !use_graphs_ || instruments.watching(step + 1) || cur_.inject;
  // (Optimizer offload: the update runs on the host, outside any graph.)
  cur_.whole = !cur_.eager && accum_ == 1 && !scaler_ && !e_.host_optimizer();
  // The loss of a step is the mean over every row with a target of all its micro-batches. Gradients are
  // accumulated as sums and divided by the step's count in the optimizer, so N micro-batches of B give the
  // same update as one batch of N*B whatever the padding. The count is known on the host (counted when the
  // batch was staged); the loss sum stays on the device.
  cur_.grad_scale = float(cur_.loss_scale / nominal_rows_);
  // Dropout masks: this step's seed (a function of the run's seed and the step, so a resumed run draws what
  // the uninterrupted one drew); each micro-batch's forward advances the counter on the device.
  if (e_.has_dropout()) e_.dropout_state_host() = DropoutState{dropout_seed(cfg_.seed, step + 1), 0, 0};
}

void TrainStep::stage(int slot) {
  dev_.sync_copies();  // the host slot handed out two calls ago may now be reused by the loader
  staged_[slot] = task_.stage(e_, slot);
  resume_pos_ = staged_[slot].pos;
}

void TrainStep::micro_batches() {
  for (int micro = 0; micro < accum_; ++micro) {
    instruments_->phase("data (wait for the batch)");
    if (sync_) sync_->begin_micro_batch(micro == 0, micro + 1 == accum_);
    dev_.wait_for_copies();
    const bool last_batch = cur_.step + 1 == total_steps_ && micro + 1 == accum_;
    const int s = slot_;
    const StagedBatch& in = staged_[s];
    cur_.valid += in.valid;
    cur_.result.tokens += int64_t(in.B) * in.T;
    cur_.result.flops +=
        double(in.B) * in.T *
        (training_flops_per_token(model_cfg_, in.T) - model_.skipped_backward_flops_per_token(in.T));
    if (cur_.whole) {
      require_targets();
      write_values();
      whole_step_replays_ += graphs_.run(false, Part::Step, s, in.B, in.T, cur_.grad_scale, [&] {
        head();
        micro_batch(s);
        norm_part();
        update_part();
      });
    } else {
      // With several processes the step's last micro-batch also queues the gradient reduction: a graph of
      // its own (gradients by unit reduce in every micro-batch).
      const bool reduces = sync_ && (micro + 1 == accum_ || sync_->reduces_every_micro_batch());
      const Part part = !reduces                                           ? Part::Micro
                        : micro == 0 && sync_->first_micro_batch_differs() ? Part::MicroReduceFirst
                                                                           : Part::MicroReduce;
      graphs_.run(cur_.eager, part, s, in.B, in.T, cur_.grad_scale, [&] { micro_batch(s); });
    }
    // The next batch's copy overlaps this micro-batch's compute; it waits only for the previous micro-batch,
    // the last reader of the buffers it fills.
    if (!last_batch) {
      stage(s ^ 1);
    } else {
      resume_pos_ = task_.position();
    }
    dev_.release_inputs_to_copies();
    slot_ ^= 1;
  }
}

bool TrainStep::tail() {
  write_values();
  instruments_->phase("gradient norm");
  if (scaler_) {
    graphs_.run(cur_.eager, Part::Norm, 0, 0, 0, 0, [&] { norm_part(); });
    // fp16 with the loss scaler keeps a host decision before the optimizer: an overflowing step must be
    // skipped (and the scale lowered) before it touches the weights, so the host waits for the norm here.
    // This is the one synchronisation inside an fp16 step; fp32 / bf16 steps have none.
    read_scalars();
    const LossScaler::Update u = scaler_->update(not_finite(), cur_.step + 1);
    if (u.skip) {
      fmt::print("{}\n", u.message);
      return true;
    }
    instruments_->phase("optimizer");  // the update and the compute-type weight copy
    if (e_.host_optimizer())
      update_part();
    else
      graphs_.run(cur_.eager, Part::Update, 0, 0, 0, 0, [&] { update_part(); });
  } else if (e_.host_optimizer()) {
    graphs_.run(cur_.eager, Part::Norm, 0, 0, 0, 0, [&] { norm_part(); });
    instruments_->phase("optimizer");  // on the host: gradients down, the update, the weights up
    update_part();
  } else if (cur_.eager) {
    norm_part();
    instruments_->phase("optimizer");  // the update and the compute-type weight copy
    update_part();
  } else {
    graphs_.run(false, Part::Tail, 0, 0, 0, 0, [&] {
      norm_part();
      update_part();
    });
  }
  return false;
}

// Test hook: an infinite gradient, as an fp16 overflow in backward would leave.
void TrainStep::inject_overflow() {
  const float inf = std::numeric_limits<float>::infinity();
  const uint16_t half_inf = grad_dtype_ == DType::BF16 ? uint16_t(0x7f80) : uint16_t(0x7c00);
  const void* value = grad_dtype_ == DType::F32 ? static_cast<const void*>(&inf) : &half_inf;
  const size_t bytes = dtype_bytes(grad_dtype_, 1);
  if (model_.param_store().grads_on_host()) {  // offloaded gradients: host memory, once backward wrote it
    dev_.synchronize();
    std::memcpy(model_.grad_buffer(), value, bytes);
    // (Their norm's squares were summed as they were written: the overflow shows there too.)
    const double inf64 = std::numeric_limits<double>::infinity();
    if (sync_ && sync_->sums_norm()) dev_.copy_to_device(&scalars_->grad_sum_squares, &inf64, sizeof(double));
  } else {
    dev_.copy_to_device(model_.grad_buffer(), value, bytes);
  }
}

StepResult TrainStep::end(bool skipped) {
  if (!scaler_) {
    read_scalars();
    // Without a loss scaler a non-finite loss or gradient norm stops the run; it is only seen now, after the
    // step's update was queued. The error is raised before anything of this step is logged, evaluated or
    // saved, so the weights it produced are never written: the last checkpoint holds the last good state.
    ANVIL_REQUIRE(!not_finite(),
                  "step {}: the loss ({}) or gradient norm ({}) is not finite; lower the learning_rate{}",
                  cur_.step + 1, host_.loss_sum / double(cur_.global_valid), host_.grad_norm,
                  rc_.precision == Precision::BF16 ? "" : " or try --bf16");
  }
  StepResult r = cur_.result;
  if (group_.distributed()) {
    const dist::CommTimes t = group_.comm().end_timing();
    r.comm_seconds = t.busy_seconds;
    r.comm_exposed_seconds = t.exposed_seconds;
    instruments_->communication(t.spans);
  }
  // Tokens and FLOPs of the whole world: every rank's batches have this rank's shapes (classification: its
  // padded length, which may differ a little between ranks).
  r.tokens *= rc_.world_size;
  r.flops *= rc_.world_size;
  r.loss = host_.loss_sum / double(cur_.global_valid);
  r.grad_norm = host_.grad_norm;
  r.lr = cur_.lr;
  r.skipped = skipped;
  return r;
}

// (Gradients in activation memory are zeroed by backward, unit by unit, once it is their turn; offloaded
// gradients are overwritten by the first micro-batch, dist::GradSync.)
void TrainStep::head() {
  if (!model_.grads_share_activations() && !model_.param_store().grads_on_host())
    dev_.fill_zero(model_.grad_buffer(), model_.grad_bytes());
  if (e_.has_dropout()) e_.upload_dropout_state();
  dev_.fill_zero(scalars_, sizeof(StepScalars));  // queued, like everything below until the end of the step
}

// One micro-batch's forward, backward and loss sum (fp64, as Ops::sum; no wait), with the inputs of `slot`.
void TrainStep::micro_batch(int slot) {
  const ModelInputs in = e_.inputs(slot, staged_[slot].B, staged_[slot].T);
  // ZeRO-3: each micro-batch gathers its units afresh (a graph of one replays the same gathers every time).
  model_.param_store().forget_gathered();
  model_.forward(e_.ops(), in, cur_.grad_scale, true);
  model_.backward(e_.ops(), in);
  e_.ops().accumulate_sum(&scalars_->loss_sum, model_.losses(), model_.loss_rows(in.B, in.T));
  // The step's last micro-batch: compute waits for its gradient buckets here, inside the same graph as the
  // collectives (a graph may only wait for work it captured), before the norm and the update read them.
  if (sync_ && sync_->armed()) sync_->finish();
}

// The global norm and the optimizer's multiplier (clip factor x unscale) on the device, in fp64
// (Ops::grad_clip_scale). The host-side arguments are ignored in favour of the step values, which this part
// uploads first.
void TrainStep::norm_part() {
  e_.upload_step_values();
  // Offloaded gradients across the bus: the last micro-batch summed the norm's squares as it wrote them,
  // frozen tensors left out (host memory is not zeroed from the device).
  const bool summed = sync_ && sync_->sums_norm();
  // Frozen tensors (freeze_parameters): the gradients a model computed for them anyway leave no trace.
  if (!summed) model_.param_store().zero_frozen_grads(dev_);
  // ZeRO stage 2: this rank's shard of the reduced gradients, its sum of squares then summed over the ranks.
  const ParamRange g = zero_ ? zero_->reduced_grads() : ParamRange{0, nparams_};
  // (An empty shard adds nothing: the sum was zeroed with the step's scalars.)
  if (g.numel() && !summed)
    e_.ops().sum_squares_to(&scalars_->grad_sum_squares, model_.param_store().reduced_grad_at(g.begin),
                            grad_dtype_, g.numel());
  if (zero_) zero_->reduce_norm(&scalars_->grad_sum_squares);
  e_.ops().grad_clip_scale(&scalars_->grad_scale, &scalars_->grad_norm, &scalars_->grad_sum_squares, 1.0,
                           cfg_.max_grad_norm, e_.step_values());
}

// The update and the weight cast. Host scale 1 times the device's clip x unscale: the very float the host
// used to pass.
void TrainStep::update_part() {
  if (offload::HostOptimizer* host = e_.host_optimizer()) {
    host->step(float(cur_.lr), cur_.opt_step, &scalars_->grad_scale);
    if (zero_) zero_->gather_weights();
    return;
  }
  const StepValues* values = e_.step_values();
  // ZeRO: params() is the shard's master weights; the gradients from the shard's first element.
  const size_t first = zero_ ? zero_->shard().begin : 0;
  e_.optimizer().step(e_.update_ops(), model_.params(), model_.param_store().reduced_grad_at(first),
                      float(cur_.lr), cur_.opt_step, 1.0f, &scalars_->grad_scale, values);
  instruments_->trace_phase("optimizer");
  model_.sync_weights(e_.ops(), cfg_.stochastic_rounding ? 1 : 0, values);
  if (zero_) zero_->gather_weights();
}

// The step's values, written before anything of the step is queued that uploads them (the previous step's
// upload has run: every step ends with a synchronisation). Stored gradients x unscale = the gradient of the
// step's mean loss; the count is final once every micro-batch is staged.
void TrainStep::write_values() {
  StepValues& values = e_.step_values_host();
  e_.optimizer().fill_step_values(float(cur_.lr), cur_.opt_step, values);
  values.cast_seed = cfg_.stochastic_rounding ? weight_cast_seed(cfg_.seed, cur_.step + 1) : 0;
  // ZeRO: the shard's elements draw the rounding bits one process draws for them (the optimizer's own
  // seeds are its shard's already).
  if (zero_) values.cast_seed = shard_rounding_seed(values.cast_seed, zero_->shard().begin);
  values.unscale = nominal_rows_ / (cur_.loss_scale * double(cur_.global_valid));
}

// The step's count of rows with a target, over every rank (once per step: every micro-batch is staged by
// the time it is asked for).
void TrainStep::require_targets() {
  if (cur_.global_valid < 0) {
    double v = double(cur_.valid);
    if (group_.distributed()) group_.comm().all_reduce_host(&v, 1);
    cur_.global_valid = int64_t(v);
  }
  ANVIL_REQUIRE(cur_.global_valid > 0, "step {}: its batches contain no {} (all are ignore-index {})",
                cur_.step + 1, task_.target_rows_name(), kIgnoreIndex);
}

// The step's scalars; the loss sum over every rank (the norm is every rank's already: the gradients are).
void TrainStep::read_scalars() {
  dev_.copy_to_host(&host_, scalars_, sizeof(StepScalars));
  if (group_.distributed()) {
    group_.comm().check();
    group_.comm().all_reduce_host(&host_.loss_sum, 1);
  }
}

bool TrainStep::not_finite() const {
  return !std::isfinite(host_.loss_sum / double(cur_.global_valid)) || !std::isfinite(host_.grad_norm);
}

}  // namespace anvil
