#include "model/param_store.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "anvil/rng.hpp"
#include "core/half.hpp"

namespace anvil {

ParamStore::ParamStore(ParamLayout layout, OpsPrecision precision, bool training)
    : layout_(std::move(layout)),
      master_range_(layout_.all()),
      precision_(precision),
      training_(training),
      weight_elem_(dtype_bits(precision.compute) / 8),
      grad_elem_(dtype_bits(precision.grad) / 8) {
  validate_ops_precision(precision);
}

void ParamStore::set_master_range(ParamRange r) {
  ANVIL_ASSERT(r.begin <= r.end && r.end <= numel(), "master range [{}, {}) outside the {} parameters",
               r.begin, r.end, numel());
  master_range_ = r;
}

void ParamStore::plan_memory(MemoryPlan& plan, bool grads_elsewhere) {
  using M = MemoryCategory;
  const size_t P = numel();
  if (precision_.compute != DType::F32) {
    // Only an optimizer step needs fp32 weights beside the 16-bit ones.
    if (training_)
      i_master_ =
          plan.add(master_sharded() ? "master weights (fp32, this rank's shard)" : "master weights (fp32)",
                   M::MasterWeights, master_range_.numel() * sizeof(float));
    i_weights_ = plan.add(std::string("weights (") + std::string(dtype_name(precision_.compute)) + ")",
                          M::Weights, P * weight_elem_);
  } else {
    i_weights_ = plan.add("parameters", M::Weights, P * sizeof(float));
  }
  if (training_ && !grads_elsewhere) i_grads_ = plan.add("gradients", M::Gradients, grad_bytes());
}

void ParamStore::bind(const Arena& arena) {
  weights_ = arena.get<void>(i_weights_);
  master_ = precision_.compute == DType::F32 ? static_cast<float*>(weights_) + master_range_.begin
            : i_master_ != SIZE_MAX          ? arena.get<float>(i_master_)
                                             : nullptr;
  if (i_grads_ != SIZE_MAX) grads_ = arena.get<void>(i_grads_);
}

float* ParamStore::grads_f32() const {
  ANVIL_ASSERT(precision_.grad == DType::F32, "grads(): the gradients are {}, not F32",
               dtype_name(precision_.grad));
  return static_cast<float*>(grads_);
}

void ParamStore::upload(Device& dev, const float* host) const {
  const size_t n = numel();
  if (precision_.compute == DType::F32) {
    dev.copy_to_device(weights_, host, n * sizeof(float));
    return;
  }
  if (master_) dev.copy_to_device(master_, host + master_range_.begin, master_range_.numel() * sizeof(float));
  std::vector<uint16_t> half(n);
  const bool bf16 = precision_.compute == DType::BF16;
  for (size_t i = 0; i < n; ++i) half[i] = bf16 ? float_to_bf16(host[i]) : float_to_fp16(host[i]);
  dev.copy_to_device(weights_, half.data(), n * sizeof(uint16_t));
}

void ParamStore::download(Device& dev, float* host) const {
  const size_t n = numel();
  if (precision_.compute == DType::F32) {
    dev.copy_to_host(host, weights_, n * sizeof(float));
    return;
  }
  if (master_ && master_sharded()) {
    ANVIL_ASSERT(gather_, "download: the master weights are sharded and no gather is set");
    gather_(dev, host);
    return;
  }
  if (master_) {
    dev.copy_to_host(host, master_, n * sizeof(float));
    return;
  }
  std::vector<uint16_t> half(n);
  dev.copy_to_host(half.data(), weights_, n * sizeof(uint16_t));
  const bool bf16 = precision_.compute == DType::BF16;
  for (size_t i = 0; i < n; ++i) host[i] = bf16 ? bf16_to_float(half[i]) : fp16_to_float(half[i]);
}

void ParamStore::init(uint64_t seed, const ParamInit& how, Device& dev) const {
  std::vector<float> host(numel(), 0.0f);
  Rng rng(seed);
  for (const ParamTensor& t : layout_.tensors()) {
    float* p = host.data() + t.offset;
    const size_t row = t.shape.ndim > 1 ? size_t(t.shape[1]) : 1;
    const size_t n = t.hf_rows >= 0 ? size_t(t.hf_rows) * row : t.numel();  // padded rows stay 0
    switch (t.init) {
      case ParamTensor::Init::Normal:
        for (size_t i = 0; i < n; ++i) p[i] = how.std * rng.normal();
        break;
      case ParamTensor::Init::NormalResidual:
        for (size_t i = 0; i < n; ++i) p[i] = how.residual_std * rng.normal();
        break;
      case ParamTensor::Init::Ones:
        std::fill_n(p, n, 1.0f);
        break;
      case ParamTensor::Init::Zeros:
        break;
    }
    if (t.role == TensorRole::TokenEmbedding && how.zero_row >= 0)
      std::fill_n(p + size_t(how.zero_row) * row, row, 0.0f);
  }
  upload(dev, host.data());
}

void ParamStore::sync(Ops& ops, uint64_t rounding_seed, const StepValues* step_values) const {
  if (precision_.compute == DType::F32) return;
  ANVIL_ASSERT(master_, "sync: a store planned without training has no master weights to cast");
  if (master_range_.numel() == 0) return;  // an empty ZeRO shard
  // With step values the kernel reads the seed there (the trainer writes the shard's seed into them).
  ops.cast_weights(weight_at(master_range_.begin), master_, master_range_.numel(),
                   step_values ? rounding_seed : shard_rounding_seed(rounding_seed, master_range_.begin),
                   step_values);
}

}  // namespace anvil
