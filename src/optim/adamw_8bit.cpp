#include "optim/adamw_8bit.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil {

// --- AdamW8bit ---------------------------------------------------------------------------------------------

size_t AdamW8bit::HostTable::device_bytes() const {
  const size_t c = begins.size();
  return 2 * c * sizeof(uint64_t) + (c + 7) / 8 * 8;
}

std::vector<char> AdamW8bit::HostTable::serialize() const {
  const size_t c = begins.size();
  std::vector<char> out(device_bytes(), 0);
  std::memcpy(out.data(), begins.data(), c * sizeof(uint64_t));
  std::memcpy(out.data() + c * sizeof(uint64_t), state_begins.data(), c * sizeof(uint64_t));
  std::memcpy(out.data() + 2 * c * sizeof(uint64_t), groups.data(), c);
  return out;
}

ParamGroupTable AdamW8bit::device_table(const HostTable& t, void* at) const {
  const size_t c = t.begins.size();
  auto* base = static_cast<char*>(at);
  ParamGroupTable g;
  g.begins = reinterpret_cast<const uint64_t*>(base);
  g.state_begins = reinterpret_cast<const uint64_t*>(base + c * sizeof(uint64_t));
  g.groups = reinterpret_cast<const uint8_t*>(base + 2 * c * sizeof(uint64_t));
  g.count = int(c);
  return g;
}

AdamW8bit::AdamW8bit(const ParamLayout& layout, const OptimizerHyper& h, std::optional<ParamRange> shard)
    : Optimizer(layout, h, shard.value_or(layout.all())),
      m_map_(dynamic_quant_map(true)),
      v_map_(dynamic_quant_map(false)) {
  ANVIL_REQUIRE(h.beta1 >= 0 && h.beta1 < 1 && h.beta2 >= 0 && h.beta2 < 1,
                "adamw_8bit: betas must be in [0, 1), got ({}, {})", h.beta1, h.beta2);
  ANVIL_REQUIRE(h.eps >= 0, "adamw_8bit: eps must be >= 0, got {}", h.eps);
  constexpr size_t B = kAdamW8bitBlockSize;

  // The group of every tensor, from the base's range table (the lead's grouping: decay, no_decay, embedding).
  auto group_of = [&](size_t offset) {
    const auto it = std::upper_bound(ranges_.begins.begin(), ranges_.begins.end(), uint64_t(offset));
    ANVIL_ASSERT(it != ranges_.begins.begin(), "offset {} before the first parameter range", offset);
    return ranges_.groups[size_t(it - ranges_.begins.begin()) - 1];
  };
  auto push = [](HostTable& t, size_t begin, uint8_t group, uint64_t state_begin, bool mergeable) {
    if (mergeable && !t.groups.empty() && t.groups.back() == group) return;
    t.begins.push_back(begin);
    t.groups.push_back(group);
    t.state_begins.push_back(state_begin);
  };

  // The tensors (or, under ZeRO, the pieces of them) in the shard. Whether a tensor's states are 8-bit
  // depends on the whole tensor, and a shard cuts an 8-bit tensor only on a block boundary from its start
  // (dist/zero_partition.hpp), so a shard's blocks are those of one process.
  const auto& tensors = layout.tensors();
  quantized_.resize(tensors.size());
  uint64_t s8 = 0, sf = 0;
  size_t expect = 0;
  for (const TensorPart& part : layout.parts(shard_)) {
    const ParamTensor& t = tensors[part.tensor];
    ANVIL_ASSERT(part.offset == expect, "parameter {} at {} is not contiguous with the previous one", t.name,
                 part.offset);
    expect = part.offset + part.count;
    const uint8_t g = group_of(part.offset);
    if (g == kSkipGroup) {  // frozen: no state, skipped by both tables
      push(t8_, part.offset, kSkipGroup, s8, true);
      push(tf_, part.offset, kSkipGroup, sf, true);
      quantized_[part.tensor] = false;
      continue;
    }
    const bool q =
        t.numel() >= h.min_8bit_size && !(h.embedding_fp32_states && g == uint8_t(ParamGroup::Embedding));
    const size_t cut = part.first % B != 0 ? part.first : part.first + part.count;
    ANVIL_REQUIRE(!q || cut % B == 0 || cut == t.numel(),
                  "adamw_8bit: the shard [{}, {}) cuts {} at element {}, not on a {}-element block boundary",
                  shard_.begin, shard_.end, t.name, cut, B);
    quantized_[part.tensor] = q;
    if (q) {
      // Each 8-bit tensor is a range of its own starting on a block boundary of the state; skipped ranges
      // take the state start of the next 8-bit range (what adamw8bit_step's search needs).
      push(t8_, part.offset, g, s8, false);
      push(tf_, part.offset, kSkipGroup, sf, true);
      s8 += (part.count + B - 1) / B * B;
      n8_ += part.count;
    } else {
      push(t8_, part.offset, kSkipGroup, s8, true);
      // fp32 states are contiguous in layout order, so neighbours of one group share a range.
      push(tf_, part.offset, g, sf, true);
      sf += part.count;
      nf_ += part.count;
    }
  }
  ANVIL_ASSERT(expect == numel(), "parameters cover {} of {} elements", expect, numel());
  num_blocks_ = size_t(s8 / B);
}

bool AdamW8bit::quantized(const ParamTensor& t) const {
  const auto& tensors = layout_.tensors();
  for (size_t k = 0; k < tensors.size(); ++k)
    if (tensors[k].offset == t.offset && tensors[k].name == t.name) return quantized_[k];
  ANVIL_THROW("adamw_8bit: {} is not a parameter of this layout", t.name);
}

std::vector<std::pair<std::string, size_t>> AdamW8bit::state_buffers() const {
  const size_t codes = num_blocks_ * kAdamW8bitBlockSize;
  return {{"adamw8bit m codes", codes},
          {"adamw8bit m absmax", num_blocks_ * sizeof(float)},
          {"adamw8bit v codes", codes},
          {"adamw8bit v absmax", num_blocks_ * sizeof(float)},
          {"adamw8bit m fp32", nf_ * sizeof(float)},
          {"adamw8bit v fp32", nf_ * sizeof(float)},
          {"adamw8bit quantisation maps", 2 * 256 * sizeof(float)},
          {"adamw8bit 8-bit ranges", t8_.device_bytes()},
          {"adamw8bit fp32 ranges", tf_.device_bytes()}};
}

void AdamW8bit::bind_state(const std::vector<void*>& b) {
  ANVIL_ASSERT(b.size() == 9, "adamw8bit: {} state buffers bound, 9 planned", b.size());
  m_codes_ = static_cast<uint8_t*>(b[0]);
  m_absmax_ = static_cast<float*>(b[1]);
  v_codes_ = static_cast<uint8_t*>(b[2]);
  v_absmax_ = static_cast<float*>(b[3]);
  m_fp32_ = static_cast<float*>(b[4]);
  v_fp32_ = static_cast<float*>(b[5]);
  maps_ = static_cast<float*>(b[6]);
  table8_ = b[7];
  tablef_ = b[8];
  g8_ = device_table(t8_, table8_);
  gf_ = device_table(tf_, tablef_);
  uploaded_ = false;
}

void AdamW8bit::upload_constants(Device& dev) {
  float maps[512];
  std::memcpy(maps, m_map_.data(), sizeof(float) * 256);
  std::memcpy(maps + 256, v_map_.data(), sizeof(float) * 256);
  dev.copy_to_device(maps_, maps, sizeof(maps));
  const std::vector<char> t8 = t8_.serialize(), tf = tf_.serialize();
  dev.copy_to_device(table8_, t8.data(), t8.size());
  dev.copy_to_device(tablef_, tf.data(), tf.size());
  uploaded_ = true;
}

AdamW8bitArgs AdamW8bit::args(float lr, int64_t step) const {
  AdamW8bitArgs a;
  a.beta1 = h_.beta1, a.beta2 = h_.beta2, a.eps = h_.eps, a.step = step;
  group_args(lr, a.lr, a.weight_decay);
  return a;
}

// The fp32-state ranges take the same lr, step and bias terms as the 8-bit ones (one set of step values).
FusedAdamWArgs AdamW8bit::fp32_args(float lr, int64_t step) const {
  FusedAdamWArgs a;
  a.beta1 = h_.beta1, a.beta2 = h_.beta2, a.eps = h_.eps, a.step = step;
  group_args(lr, a.lr, a.weight_decay);
  return a;
}

void AdamW8bit::fill_step_values(float lr, int64_t step, StepValues& out) const {
  anvil::fill_step_values(args(lr, step), out);
}

void AdamW8bit::update(Ops& ops, float* params, const void* grads, float lr, int64_t step, float grad_scale,
                       const float* grad_scale_device, const StepValues* step_values) {
  ANVIL_ASSERT(maps_, "adamw_8bit: step before bind");
  // Once after bind() (reset() uploads them too), so a step's graph recording never meets a synchronous copy.
  if (!uploaded_) upload_constants(ops.device());
  if (num_blocks_) {
    ops.adamw8bit_step(params, grads, m_codes_, m_absmax_, v_codes_, v_absmax_, maps_, maps_ + 256, numel(),
                       num_blocks_, g8_,
                       with_call_fields(args(lr, step), grad_scale, grad_scale_device, step_values));
  }
  if (nf_) {
    ops.adamw_fused_step(params, grads, m_fp32_, v_fp32_, DType::F32, numel(), gf_,
                         with_call_fields(fp32_args(lr, step), grad_scale, grad_scale_device, step_values));
  }
}

std::vector<OptimizerStateTensor> AdamW8bit::state_tensors() const {
  std::vector<OptimizerStateTensor> out;
  const size_t codes = num_blocks_ * kAdamW8bitBlockSize;
  if (num_blocks_) {
    out.push_back({"adamw8bit.m_codes", DType::I8, codes, m_codes_});
    out.push_back({"adamw8bit.m_absmax", DType::F32, num_blocks_, m_absmax_});
    out.push_back({"adamw8bit.v_codes", DType::I8, codes, v_codes_});
    out.push_back({"adamw8bit.v_absmax", DType::F32, num_blocks_, v_absmax_});
  }
  if (nf_) {
    out.push_back({"adamw8bit.m_fp32", DType::F32, nf_, m_fp32_});
    out.push_back({"adamw8bit.v_fp32", DType::F32, nf_, v_fp32_});
  }
  return out;
}

}  // namespace anvil
