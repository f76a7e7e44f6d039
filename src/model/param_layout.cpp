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
  ANVIL_REQUIRE(cfg.family == "gpt2", "model family '{}' cannot be built as a GPT-2 (family gpt2)",
                cfg.family);
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

ParamLayout ParamLayout::bert(const TransformerConfig& cfg) {
  using I = ParamTensor::Init;
  ANVIL_REQUIRE(cfg.family == "bert", "model family '{}' cannot be built as a BERT (family bert)",
                cfg.family);
  const int64_t C = cfg.n_embd, F = cfg.ffn_size();
  ParamLayout l;
  l.begin_unit("embedding");
  l.add("bert.embeddings.word_embeddings.weight", {cfg.vocab_size, C}, true, I::Normal);
  l.add("bert.embeddings.position_embeddings.weight", {cfg.block_size, C}, true, I::Normal);
  l.add("bert.embeddings.token_type_embeddings.weight", {cfg.type_vocab_size, C}, true, I::Normal);
  l.add("bert.embeddings.LayerNorm.weight", {C}, false, I::Ones);
  l.add("bert.embeddings.LayerNorm.bias", {C}, false, I::Zeros);
  for (int i = 0; i < cfg.n_layer; ++i) {
    const std::string p = "bert.encoder.layer." + std::to_string(i) + ".";
    l.begin_unit("block." + std::to_string(i));
    // query, key, value adjacent: one [3C, C] matrix (and below one [3C] bias) for the fused QKV GEMM.
    l.add(p + "attention.self.query.weight", {C, C}, true, I::Normal);
    l.add(p + "attention.self.key.weight", {C, C}, true, I::Normal);
    l.add(p + "attention.self.value.weight", {C, C}, true, I::Normal);
    l.add(p + "attention.output.dense.weight", {C, C}, true, I::Normal);
    l.add(p + "intermediate.dense.weight", {F, C}, true, I::Normal);
    l.add(p + "output.dense.weight", {C, F}, true, I::Normal);
    l.add(p + "attention.self.query.bias", {C}, false, I::Zeros);
    l.add(p + "attention.self.key.bias", {C}, false, I::Zeros);
    l.add(p + "attention.self.value.bias", {C}, false, I::Zeros);
    l.add(p + "attention.output.dense.bias", {C}, false, I::Zeros);
    l.add(p + "attention.output.LayerNorm.weight", {C}, false, I::Ones);
    l.add(p + "attention.output.LayerNorm.bias", {C}, false, I::Zeros);
    l.add(p + "intermediate.dense.bias", {F}, false, I::Zeros);
    l.add(p + "output.dense.bias", {C}, false, I::Zeros);
    l.add(p + "output.LayerNorm.weight", {C}, false, I::Ones);
    l.add(p + "output.LayerNorm.bias", {C}, false, I::Zeros);
  }
  l.begin_unit("final");
  l.add("bert.pooler.dense.weight", {C, C}, true, I::Normal);
  l.add("classifier.weight", {cfg.num_labels, C}, true, I::Normal);
  l.add("bert.pooler.dense.bias", {C}, false, I::Zeros);
  l.add("classifier.bias", {cfg.num_labels}, false, I::Zeros);
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
