#include "optim/adafactor.hpp"

#include <algorithm>
#include <cmath>

namespace anvil {
namespace {

ParamGroup group_of(const ParamUnit& u, const ParamTensor& t) {
  if (!t.decay) return ParamGroup::NoDecay;
  return u.name == "embedding" ? ParamGroup::Embedding : ParamGroup::Decay;
}

}  // namespace

Adafactor::Adafactor(const ParamLayout& layout, const OptimizerHyper& h, int64_t vocab_size,
                     std::optional<ParamRange> shard)
    : Optimizer(layout, h, shard.value_or(layout.all())) {
  ANVIL_REQUIRE(!h.warmup_init || h.relative_step,
                "adafactor_warmup_init requires adafactor_relative_step (as in transformers)");
  ANVIL_REQUIRE(h.clip_threshold > 0, "adafactor_clip_threshold must be > 0, got {}", h.clip_threshold);
  ANVIL_REQUIRE(h.decay_rate <= 0,
                "adafactor_decay_rate must be <= 0 (beta2 at step t is 1 - t^decay_rate), got {}",
                h.decay_rate);
  ANVIL_REQUIRE(h.adafactor_eps1 >= 0 && h.adafactor_eps2 >= 0,
                "adafactor_eps1 and adafactor_eps2 must be >= 0");
  ANVIL_REQUIRE(!h.adafactor_beta1 || (*h.adafactor_beta1 >= 0 && *h.adafactor_beta1 < 1),
                "adafactor_beta1 must be in [0, 1) (or unset for no first moment), got {}",
                h.adafactor_beta1.value_or(0));
  ANVIL_REQUIRE(vocab_size >= 0, "adafactor: vocab_size {} < 0", vocab_size);

  // The tensors of the shard, whole: the factored second moment and the RMS are per tensor, so a ZeRO
  // shard of Adafactor cuts between tensors only (dist/zero_partition.hpp).
  for (const TensorPart& part : layout.parts(shard_)) {
    const ParamTensor& t = layout.tensors()[part.tensor];
    const ParamUnit& u = layout.units()[part.unit];
    if (!t.trainable) continue;  // frozen: no statistics, no update
    ANVIL_REQUIRE(part.whole(t),
                  "adafactor: the shard [{}, {}) holds part of {}; its shards must hold whole tensors",
                  shard_.begin, shard_.end, t.name);
    ANVIL_REQUIRE(t.shape.ndim >= 1 && t.shape.ndim <= 2,
                  "adafactor: tensor {} of shape {}: only vectors and matrices are supported", t.name,
                  t.shape.str());
    AdafactorTensor d;
    d.offset = part.offset;
    d.group = uint32_t(group_of(u, t));
    if (t.shape.ndim == 2) {
      d.rows = uint64_t(t.shape[0]);
      d.cols = uint64_t(t.shape[1]);
      if (vocab_size > 0 && t.name == "transformer.wte.weight") {
        ANVIL_REQUIRE(vocab_size <= t.shape[0], "adafactor: vocab_size {} > the {} rows of {}", vocab_size,
                      t.shape[0], t.name);
        d.rows = uint64_t(vocab_size);
      }
      d.factored = 1;
      d.row_state = n_row_;
      d.col_state = n_col_;  // rebased below, once the row count is known
      n_row_ += d.rows;
      n_col_ += d.cols;
    } else {
      d.rows = 1;
      d.cols = uint64_t(t.shape[0]);
      d.row_state = n_vec_;  // rebased below
      n_vec_ += d.cols;
    }
    tensors_.push_back(d);
  }
  for (AdafactorTensor& d : tensors_) {
    if (d.factored)
      d.col_state += n_row_;
    else
      d.row_state += n_row_ + n_col_;
  }
}

float Adafactor::step_size(float lr, int64_t step, ParamGroup group) const {
  const float mult = h_.lr_multiplier[int(group)];
  if (!h_.relative_step) return lr * mult;
  const double min_step = h_.warmup_init ? 1e-6 * double(step) : 1e-2;
  return float(std::min(min_step, 1.0 / std::sqrt(double(step)))) * mult;
}

std::vector<std::pair<std::string, size_t>> Adafactor::state_buffers() const {
  std::vector<std::pair<std::string, size_t>> b;
  b.emplace_back("adafactor exp_avg_sq (matrix rows and columns, vectors)",
                 (n_row_ + n_col_ + n_vec_) * sizeof(float));
  if (h_.adafactor_beta1) b.emplace_back("adafactor exp_avg", numel() * sizeof(float));
  b.emplace_back("adafactor tensor table", tensors_.size() * sizeof(AdafactorTensor));
  b.emplace_back("adafactor scratch", tensors_.size() * kAdafactorScratchBytesPerTensor);
  return b;
}

void Adafactor::bind_state(const std::vector<void*>& buffers) {
  size_t i = 0;
  sq_ = static_cast<float*>(buffers.at(i++));
  exp_avg_ = h_.adafactor_beta1 ? static_cast<float*>(buffers.at(i++)) : nullptr;
  table_ = static_cast<AdafactorTensor*>(buffers.at(i++));
  scratch_ = buffers.at(i++);
  table_uploaded_ = false;
}

void Adafactor::after_reset(Device& dev) {
  dev.copy_to_device(table_, tensors_.data(), tensors_.size() * sizeof(AdafactorTensor));
  table_uploaded_ = true;
}

AdafactorArgs Adafactor::args(float lr, int64_t step) const {
  ANVIL_REQUIRE(step >= 1, "adafactor: step {} (the 1-based count of updates)", step);
  AdafactorArgs a;
  a.eps1 = h_.adafactor_eps1;
  a.eps2 = h_.adafactor_eps2;
  a.clip_threshold = h_.clip_threshold;
  a.beta2t = float(1.0 - std::pow(double(step), double(h_.decay_rate)));
  a.first_moment = h_.adafactor_beta1.has_value();
  a.beta1 = h_.adafactor_beta1.value_or(0.0f);
  a.scale_parameter = h_.scale_parameter;
  for (int g = 0; g < kNumParamGroups; ++g) {
    a.step_size[g] = step_size(lr, step, ParamGroup(g));
    a.weight_decay[g] = ParamGroup(g) == ParamGroup::NoDecay ? 0.0f : h_.weight_decay;
  }
  return a;
}

void Adafactor::fill_step_values(float lr, int64_t step, StepValues& out) const {
  anvil::fill_step_values(args(lr, step), out);
  out.step = step;
}

void Adafactor::update(Ops& ops, float* params, const void* grads, float lr, int64_t step, float grad_scale,
                       const float* grad_scale_device, const StepValues* step_values) {
  ANVIL_ASSERT(sq_ && table_, "adafactor: step before bind");
  // Once after bind() (reset() uploads it too), so a step's graph recording never meets a synchronous copy.
  if (!table_uploaded_) {
    ops.device().copy_to_device(table_, tensors_.data(), tensors_.size() * sizeof(AdafactorTensor));
    table_uploaded_ = true;
  }
  ops.adafactor_step(params, grads, sq_, exp_avg_, table_, int(tensors_.size()), scratch_,
                     with_call_fields(args(lr, step), grad_scale, grad_scale_device, step_values));
}

std::vector<OptimizerStateTensor> Adafactor::state_tensors() const {
  std::vector<OptimizerStateTensor> s;
  const auto add = [&](const char* name, size_t count, float* data) {
    if (count) s.push_back({name, DType::F32, count, data});
  };
  const auto sq_at = [&](size_t offset) { return sq_ ? sq_ + offset : nullptr; };
  add("adafactor.exp_avg_sq_row", n_row_, sq_at(0));
  add("adafactor.exp_avg_sq_col", n_col_, sq_at(n_row_));
  add("adafactor.exp_avg_sq", n_vec_, sq_at(n_row_ + n_col_));
  if (h_.adafactor_beta1) add("adafactor.exp_avg", numel(), exp_avg_);
  return s;
}

}  // namespace anvil
