// 8-bit AdamW with block-wise quantised optimizer states (bitsandbytes' bnb.optim.AdamW8bit, block_wise=True;
// HF `optim="adamw_bnb_8bit"`). The first moment is stored as 8-bit codes into the signed dynamic map, the
// second into the unsigned one, each block of kAdamW8bitBlockSize (256) consecutive states with its own fp32
// absmax; every step dequantises, updates in fp32 and requantises in one fused launch (Ops::adamw8bit_step).
//
// As in bitsandbytes, tensors with fewer than OptimizerHyper::min_8bit_size (4096) elements keep fp32 states,
// and so, by default (OptimizerHyper::embedding_fp32_states), do the token and position embeddings (the
// bitsandbytes advice for embedding stability: StableEmbedding / GlobalOptimManager's 32-bit override). Those
// elements take the fp32 AdamW of Ops::adamw_fused_step, in a second launch.
//
// State, compact (each kind of state holds only its own elements, in layout order): m and v codes (1 byte
// each per element, every 8-bit tensor's codes starting on a block boundary, so blocks never span tensors),
// one fp32 absmax per block per moment, fp32 m and v for the fp32 elements, the two 256-float maps and the
// two range tables (8-bit view and fp32 view of the flat buffer, with state_begins).
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "kernels/quantization.hpp"
#include "optim/optimizer.hpp"

namespace anvil {

// dynamic_quant_map, quantize_blockwise and dequantize_blockwise: kernels/quantization.hpp.

class AdamW8bit final : public Optimizer {
 public:
  AdamW8bit(const ParamLayout& layout, const OptimizerHyper& h, std::optional<ParamRange> shard = {});
  OptimizerKind kind() const override { return OptimizerKind::AdamW8bit; }
  std::vector<OptimizerStateTensor> state_tensors() const override;

  // Whether the tensor's states are 8-bit (else fp32).
  bool quantized(const ParamTensor& t) const;
  size_t quantized_numel() const { return n8_; }  // elements with 8-bit states
  size_t padded_quantized_numel() const { return num_blocks_ * kAdamW8bitBlockSize; }
  size_t num_blocks() const { return num_blocks_; }  // quantisation blocks (per moment)
  size_t fp32_numel() const { return nf_; }          // elements with fp32 states

  const std::array<float, 256>& m_map() const { return m_map_; }
  const std::array<float, 256>& v_map() const { return v_map_; }

 protected:
  void update(Ops& ops, float* params, const void* grads, float lr, int64_t step, float grad_scale,
              const float* grad_scale_device, const StepValues* step_values) override;
  void fill_step_values(float lr, int64_t step, StepValues& out) const override;
  std::vector<std::pair<std::string, size_t>> state_buffers() const override;
  void bind_state(const std::vector<void*>& buffers) override;

 private:
  AdamW8bitArgs args(float lr, int64_t step) const;        // the 8-bit ranges, but the gradient scale
  FusedAdamWArgs fp32_args(float lr, int64_t step) const;  // the fp32-state ranges, likewise
  // A ParamGroupTable on the host: the 8-bit or the fp32 view of the flat buffer.
  struct HostTable {
    std::vector<uint64_t> begins, state_begins;
    std::vector<uint8_t> groups;
    size_t device_bytes() const;  // begins, state_begins, groups (padded to 8 bytes)
    std::vector<char> serialize() const;
  };
  ParamGroupTable device_table(const HostTable& t, void* at) const;
  void upload_constants(Device& dev);
  void after_reset(Device& dev) override { upload_constants(dev); }

  size_t n8_ = 0, nf_ = 0, num_blocks_ = 0;
  std::vector<bool> quantized_;  // per layout tensor
  std::array<float, 256> m_map_{}, v_map_{};
  HostTable t8_, tf_;

  uint8_t *m_codes_ = nullptr, *v_codes_ = nullptr;
  float *m_absmax_ = nullptr, *v_absmax_ = nullptr, *m_fp32_ = nullptr, *v_fp32_ = nullptr;
  float* maps_ = nullptr;  // m map then v map
  void *table8_ = nullptr, *tablef_ = nullptr;
  ParamGroupTable g8_, gf_;
  // Optimizer::reset() zeroes every state buffer, the maps and tables included, then uploads them again
  // (after_reset); after a bind() without reset the first step uploads them.
  bool uploaded_ = false;
};

}  // namespace anvil
