#include "model/param_layout.hpp"

namespace anvil {

void ParamLayout::begin_unit(std::string name) {
  ParamUnit u;
  u.name = std::move(name);
  u.offset = total_;
  units_.push_back(std::move(u));
}

void ParamLayout::add(std::string name, Shape shape, bool decay, ParamTensor::Init init, bool hf_transposed) {
  ParamUnit& u = units_.back();
  ANVIL_ASSERT(!decay || u.decay_numel == u.numel, "decayed tensor {} after a non-decayed one", name);
  ParamTensor t{std::move(name), shape, total_, decay, hf_transposed, init};
  u.numel += t.numel();
  if (decay) u.decay_numel += t.numel();
  total_ += t.numel();
  u.tensors.push_back(tensors_.size());
  tensors_.push_back(std::move(t));
}

ParamLayout ParamLayout::gpt2(const TransformerConfig& cfg) {
  using I = ParamTensor::Init;
  const int64_t C = cfg.n_embd;
  ParamLayout l;
  l.begin_unit("embedding");
  l.add("transformer.wte.weight", {cfg.padded_vocab_size(), C}, true, I::Normal);
  l.add("transformer.wpe.weight", {cfg.block_size, C}, true, I::Normal);
  for (int i = 0; i < cfg.n_layer; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    l.begin_unit("block." + std::to_string(i));
    l.add(p + "attn.c_attn.weight", {3 * C, C}, true, I::Normal, true);
    l.add(p + "attn.c_proj.weight", {C, C}, true, I::NormalResidual, true);
    l.add(p + "mlp.c_fc.weight", {4 * C, C}, true, I::Normal, true);
    l.add(p + "mlp.c_proj.weight", {C, 4 * C}, true, I::NormalResidual, true);
    l.add(p + "ln_1.weight", {C}, false, I::Ones);
    l.add(p + "ln_1.bias", {C}, false, I::Zeros);
    l.add(p + "attn.c_attn.bias", {3 * C}, false, I::Zeros);
    l.add(p + "attn.c_proj.bias", {C}, false, I::Zeros);
    l.add(p + "ln_2.weight", {C}, false, I::Ones);
    l.add(p + "ln_2.bias", {C}, false, I::Zeros);
    l.add(p + "mlp.c_fc.bias", {4 * C}, false, I::Zeros);
    l.add(p + "mlp.c_proj.bias", {C}, false, I::Zeros);
  }
  l.begin_unit("final");
  l.add("transformer.ln_f.weight", {C}, false, I::Ones);
  l.add("transformer.ln_f.bias", {C}, false, I::Zeros);
  return l;
}

const ParamTensor* ParamLayout::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const ParamTensor& ParamLayout::get(const std::string& name) const {
  const ParamTensor* t = find(name);
  ANVIL_ASSERT(t, "no parameter named {}", name);
  return *t;
}

}  // namespace anvil
