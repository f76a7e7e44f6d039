// Adafactor with the semantics and defaults of transformers.optimization.Adafactor (docs/optimizers.md):
// factored second moments (a row and a column running average) for matrices, a full one for vectors, an
// optional first moment, update clipping by RMS, relative step sizes scaled by the parameter's RMS.
//
// Orientation: Anvil stores matrices [out, in] where Hugging Face's GPT-2 Conv1D weights are [in, out]
// (ParamTensor::hf_transposed). Adafactor's statistics follow Anvil's shape: exp_avg_sq_row has one entry
// per row of Anvil's tensor, so for hf_transposed tensors it is what transformers calls exp_avg_sq_col and
// vice versa. The update is the same function of the gradient (rsqrt(row_i / mean(row)) * rsqrt(col_j)
// equals rsqrt(col_j / mean(col)) * rsqrt(row_i), since the row and column averages have the same mean),
// up to rounding.
//
// Parameter groups: the group's lr multiplier multiplies the learning rate Hugging Face would use before
// the parameter scale: the scheduled lr when relative_step is off, the relative step size
// min(1e-2 or 1e-6 * step with warmup_init, 1 / sqrt(step)) when it is on (the scheduled lr is then
// ignored, as transformers ignores it). Weight decay (p -= weight_decay * lr * p, with the tensor's lr)
// applies to the decay and embedding groups.
//
// Vocabulary padding: with `vocab_size` > 0, only the first vocab_size rows of transformer.wte.weight
// (the real vocabulary) are updated and enter its statistics; the padding rows are left untouched, so the
// parameter RMS, the factored statistics and the update RMS are those of the unpadded tensor transformers
// sees.
//
// Memory (all planned): the second moments (rows + cols floats per matrix, numel per vector), the first
// moment (numel floats, with beta1), the tensor table the kernels read (48 bytes per tensor) and a scratch
// of kAdafactorScratchBytesPerTensor per tensor.
#pragma once
#include <vector>

#include "optim/optimizer.hpp"

namespace anvil {

class Adafactor final : public Optimizer {
 public:
  Adafactor(const ParamLayout& layout, const OptimizerHyper& h, int64_t vocab_size = 0,
            std::optional<ParamRange> shard = {});
  OptimizerKind kind() const override { return OptimizerKind::Adafactor; }

  // "adafactor.exp_avg_sq_row" (every matrix's rows, in layout order), "adafactor.exp_avg_sq_col" (every
  // matrix's columns), "adafactor.exp_avg_sq" (every vector's elements), "adafactor.exp_avg" (with beta1:
  // numel, indexed like the parameters); all fp32.
  std::vector<OptimizerStateTensor> state_tensors() const override;

  // The learning rate of `group` at `step` before the parameter scale (AdafactorArgs::step_size).
  float step_size(float lr, int64_t step, ParamGroup group) const;
  // The tensors as the kernels see them, in layout order (the host copy of the device table).
  const std::vector<AdafactorTensor>& tensor_table() const { return tensors_; }
  // Floats of fp32 state: row + column second moments of the matrices, vector second moments, first moment.
  size_t row_state_floats() const { return n_row_; }
  size_t col_state_floats() const { return n_col_; }
  size_t vector_state_floats() const { return n_vec_; }
  size_t first_moment_floats() const { return h_.adafactor_beta1 ? numel() : 0; }

 protected:
  void update(Ops& ops, float* params, const void* grads, float lr, int64_t step, float grad_scale,
              const float* grad_scale_device, const StepValues* step_values) override;
  void fill_step_values(float lr, int64_t step, StepValues& out) const override;
  std::vector<std::pair<std::string, size_t>> state_buffers() const override;
  void bind_state(const std::vector<void*>& buffers) override;

 private:
  AdafactorArgs args(float lr, int64_t step) const;  // everything but the gradient scale
  std::vector<AdafactorTensor> tensors_;
  size_t n_row_ = 0, n_col_ = 0, n_vec_ = 0;
  float* sq_ = nullptr;       // rows, then columns, then vectors
  float* exp_avg_ = nullptr;  // with beta1
  AdafactorTensor* table_ = nullptr;
  void* scratch_ = nullptr;
  // The device table is uploaded by reset() (after_reset: reset zeroes every state buffer, this one
  // included) or, after a bind() without reset, by the first step.
  bool table_uploaded_ = false;
  void after_reset(Device& dev) override;
};

}  // namespace anvil
