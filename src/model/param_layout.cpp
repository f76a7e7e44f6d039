#include "model/param_layout.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <utility>

#include "model/arch_spec.hpp"

namespace anvil {

void ParamLayout::begin_unit(std::string name) {
  ParamUnit u;
  u.name = std::move(name);
  u.offset = total_;
  units_.push_back(std::move(u));
}

ParamTensor& ParamLayout::add(std::string name, Shape shape, bool decay, ParamTensor::Init init,
                              bool hf_transposed) {
  ParamUnit& u = units_.back();
  ANVIL_ASSERT(!decay || u.decay_numel == u.numel, "decayed tensor {} after a non-decayed one", name);
  ParamTensor t;
  t.name = std::move(name), t.shape = shape, t.offset = total_, t.decay = decay;
  t.hf_transposed = hf_transposed, t.init = init;
  u.numel += t.numel();
  if (decay) u.decay_numel += t.numel();
  total_ += t.numel();
  u.tensors.push_back(tensors_.size());
  tensors_.push_back(std::move(t));
  return tensors_.back();
}

std::vector<int64_t> ParamTensor::hf_shape() const {
  std::vector<int64_t> s(shape.dims.begin(), shape.dims.begin() + shape.ndim);
  if (hf_rows >= 0) s[0] = hf_rows;
  if (hf_transposed) std::swap(s[0], s[1]);
  return s;
}

ParamLayout ParamLayout::decoder(const TransformerConfig& cfg, const LoraConfig& lora) {
  using I = ParamTensor::Init;
  using R = TensorRole;
  const ArchSpec s = ArchSpec::of(cfg);
  const DecoderNames& n = DecoderNames::of(cfg.family);
  const int64_t C = s.C, F = s.ffn, Q = s.q_width(), KV = s.kv_width();
  const bool T = n.matrices_transposed;
  ParamLayout l;
  l.lora_ = lora;
  const std::vector<std::string> targets =
      lora.enabled() ? lora_targets(lora, cfg.family) : std::vector<std::string>{};
  std::vector<bool> target_used(targets.size(), false);
  l.hf_ignored_suffixes_ = n.ignored_suffixes;
  // Tensors of a tied head are the embedding's: a file may still hold the head (HF ignores it then).
  if (s.tied_head && !n.head.empty()) l.hf_ignored_suffixes_.push_back(n.head + ".weight");
  auto tensor = [&](std::string name, Shape shape, bool decay, I init, R role, int layer, bool transposed) {
    ParamTensor& t = l.add(std::move(name), shape, decay, init, transposed);
    t.role = role, t.layer = layer;
    if (!n.alias_strip.empty() && t.name.starts_with(n.alias_strip))
      t.aliases.push_back(t.name.substr(n.alias_strip.size()));
    return &t;
  };
  l.begin_unit("embedding");
  tensor(n.token_embedding, {s.padded_vocab, C}, true, I::Normal, R::TokenEmbedding, -1, false)->hf_rows =
      s.vocab;
  if (s.positions == PositionKind::Learned)
    tensor(n.position_embedding, {s.max_positions, C}, true, I::Normal, R::PositionEmbedding, -1, false);
  // q, k, v (or gate, up) as one module, or as adjacent parts of the fused matrix / bias.
  const std::vector<int64_t> qkv_rows =
      n.qkv.size() == 1 ? std::vector<int64_t>{Q + 2 * KV} : std::vector<int64_t>{Q, KV, KV};
  const std::vector<int64_t> mlp_rows =
      n.mlp_in.size() == 1 ? std::vector<int64_t>{s.mlp_in_width()} : std::vector<int64_t>{F, F};
  ANVIL_ASSERT(int64_t(n.mlp_in.size()) * (s.mlp == MlpKind::SwiGLU ? 1 : 2) == 2,
               "{}: the name table's MLP does not match its spec", cfg.family);
  for (int i = 0; i < s.n_layer; ++i) {
    std::string p = n.block;
    p.replace(p.find("{L}"), 3, std::to_string(i));
    l.begin_unit("block." + std::to_string(i));
    for (size_t k = 0; k < n.qkv.size(); ++k)
      tensor(p + n.qkv[k] + ".weight", {qkv_rows[k], C}, true, I::Normal, R::QkvWeight, i, T);
    tensor(p + n.out + ".weight", {C, Q}, true, I::NormalResidual, R::OutWeight, i, T);
    for (size_t k = 0; k < n.mlp_in.size(); ++k)
      tensor(p + n.mlp_in[k] + ".weight", {mlp_rows[k], C}, true, I::Normal, R::MlpInWeight, i, T);
    const size_t last_matrix =
        tensor(p + n.mlp_out + ".weight", {C, F}, true, I::NormalResidual, R::MlpOutWeight, i, T) -
        l.tensors_.data();
    // LoRA factors of the targeted matrices (they take weight decay, as PEFT's under HF Trainer do).
    for (size_t m = l.units_.back().tensors.front(); lora.enabled() && m <= last_matrix; ++m) {
      const std::string module = l.tensors_[m].name.substr(0, l.tensors_[m].name.size() - 7);  // ".weight"
      bool hit = false;
      for (size_t k = 0; k < targets.size(); ++k)
        if (lora_targets_module({targets[k]}, module)) hit = target_used[k] = true;
      if (!hit) continue;
      const int64_t out = l.tensors_[m].shape[0], in = l.tensors_[m].shape[1];
      const std::string peft = "base_model.model." + module;
      tensor(peft + ".lora_A.weight", {lora.r, in}, true, I::LoraA, R::LoraA, i, false)->adapts = int(m);
      tensor(peft + ".lora_B.weight", {out, lora.r}, true, I::Zeros, R::LoraB, i, false)->adapts = int(m);
    }
    tensor(p + n.norm1 + ".weight", {C}, false, I::Ones, R::Norm1Weight, i, false);
    if (s.norm_has_bias()) tensor(p + n.norm1 + ".bias", {C}, false, I::Zeros, R::Norm1Bias, i, false);
    if (s.qkv_bias)
      for (size_t k = 0; k < n.qkv.size(); ++k)
        tensor(p + n.qkv[k] + ".bias", {qkv_rows[k]}, false, I::Zeros, R::QkvBias, i, false);
    if (s.out_bias) tensor(p + n.out + ".bias", {C}, false, I::Zeros, R::OutBias, i, false);
    tensor(p + n.norm2 + ".weight", {C}, false, I::Ones, R::Norm2Weight, i, false);
    if (s.norm_has_bias()) tensor(p + n.norm2 + ".bias", {C}, false, I::Zeros, R::Norm2Bias, i, false);
    if (s.mlp_bias) {
      for (size_t k = 0; k < n.mlp_in.size(); ++k)
        tensor(p + n.mlp_in[k] + ".bias", {mlp_rows[k]}, false, I::Zeros, R::MlpInBias, i, false);
      tensor(p + n.mlp_out + ".bias", {C}, false, I::Zeros, R::MlpOutBias, i, false);
    }
  }
  l.begin_unit("final");
  if (!s.tied_head)
    tensor(n.head + ".weight", {s.padded_vocab, C}, true, I::Normal, R::HeadWeight, -1, false)->hf_rows =
        s.vocab;
  tensor(n.final_norm + ".weight", {C}, false, I::Ones, R::FinalNormWeight, -1, false);
  if (s.norm_has_bias()) tensor(n.final_norm + ".bias", {C}, false, I::Zeros, R::FinalNormBias, -1, false);
  for (size_t k = 0; k < targets.size(); ++k)
    ANVIL_REQUIRE(target_used[k] || targets[k] == "all-linear",
                  "lora_target_modules: '{}' names no Linear module of this {} model (its block modules: {}, "
                  "{}, {}, {})",
                  targets[k], cfg.family, fmt::join(n.qkv, ", "), n.out, fmt::join(n.mlp_in, ", "),
                  n.mlp_out);
  if (lora.enabled())
    for (ParamTensor& t : l.tensors_) t.trainable = t.is_adapter();
  return l;
}

std::vector<std::string> ParamLayout::lora_modules() const {
  std::vector<std::string> out;
  for (const ParamTensor& t : tensors_)
    if (t.role == TensorRole::LoraA)
      out.push_back(tensors_[size_t(t.adapts)].name.substr(0, tensors_[size_t(t.adapts)].name.size() - 7));
  return out;
}

ParamLayout ParamLayout::bert(const TransformerConfig& cfg) {
  using I = ParamTensor::Init;
  ANVIL_REQUIRE(cfg.family == "bert", "model family '{}' cannot be built as a BERT (family bert)",
                cfg.family);
  const int64_t C = cfg.n_embd, F = cfg.ffn_size();
  ParamLayout l;
  l.begin_unit("embedding");
  l.add("bert.embeddings.word_embeddings.weight", {cfg.vocab_size, C}, true, I::Normal).role =
      TensorRole::TokenEmbedding;
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

const ParamTensor* ParamLayout::find_hf(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
    for (const auto& a : t.aliases)
      if (a == name) return &t;
  }
  return nullptr;
}

bool ParamLayout::hf_ignored(const std::string& name) const {
  for (const auto& suffix : hf_ignored_suffixes_)
    if (name.ends_with(suffix)) return true;
  return false;
}

const ParamTensor* ParamLayout::find_role(TensorRole role, int layer) const {
  for (const auto& t : tensors_)
    if (t.role == role && t.layer == layer) return &t;
  return nullptr;
}

std::vector<TensorPart> ParamLayout::parts(ParamRange r) const {
  ANVIL_ASSERT(r.begin <= r.end && r.end <= total_, "range [{}, {}) outside the {} parameters", r.begin,
               r.end, total_);
  std::vector<TensorPart> out;
  for (size_t u = 0; u < units_.size(); ++u)
    for (size_t ti : units_[u].tensors) {
      const ParamTensor& t = tensors_[ti];
      const size_t b = std::max(t.offset, r.begin), e = std::min(t.offset + t.numel(), r.end);
      if (b < e) out.push_back({ti, u, b - t.offset, e - b, b - r.begin});
    }
  return out;
}

const ParamTensor& ParamLayout::get(const std::string& name) const {
  const ParamTensor* t = find(name);
  ANVIL_ASSERT(t, "no parameter named {}", name);
  return *t;
}

bool ParamLayout::any_trainable(ParamRange r) const {
  // Tensors lie in offset order: start at the one holding r.begin.
  auto it = std::upper_bound(tensors_.begin(), tensors_.end(), r.begin,
                             [](size_t o, const ParamTensor& t) { return o < t.offset; });
  if (it != tensors_.begin()) --it;
  for (; it != tensors_.end() && it->offset < r.end; ++it)
    if (it->trainable && it->offset + it->numel() > r.begin) return true;
  return false;
}

std::vector<ParamRange> ParamLayout::frozen_ranges() const {
  std::vector<ParamRange> out;
  for (const ParamTensor& t : tensors_) {
    if (t.trainable) continue;
    if (!out.empty() && out.back().end == t.offset)
      out.back().end += t.numel();
    else
      out.push_back({t.offset, t.offset + t.numel()});
  }
  return out;
}

int ParamLayout::first_trainable_unit() const {
  for (size_t u = 0; u < units_.size(); ++u)
    if (any_trainable({units_[u].offset, units_[u].offset + units_[u].numel})) return int(u);
  return int(units_.size());
}

ParamLayout ParamLayout::trainable_part() const {
  ParamLayout out;
  out.hf_ignored_suffixes_ = hf_ignored_suffixes_;
  out.lora_ = lora_;
  for (const ParamUnit& u : units_) {
    bool begun = false;
    for (size_t i : u.tensors) {
      const ParamTensor& t = tensors_[i];
      if (!t.trainable) continue;
      if (!begun) out.begin_unit(u.name);
      begun = true;
      ParamTensor& c = out.add(t.name, t.shape, t.decay, t.init, t.hf_transposed);
      const size_t offset = c.offset;
      c = t;
      c.offset = offset;
      c.adapts = -1;
    }
  }
  return out;
}

int ParamLayout::unit_of(size_t offset) const {
  ANVIL_ASSERT(offset < total_, "element {} outside the {} parameters", offset, total_);
  const auto it = std::upper_bound(units_.begin(), units_.end(), offset,
                                   [](size_t o, const ParamUnit& u) { return o < u.offset; });
  ANVIL_ASSERT(it != units_.begin(), "element {} lies before the first unit", offset);
  return int(it - units_.begin()) - 1;
}

}  // namespace anvil
