#include "model/decoder.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/half.hpp"
#include "model/rope.hpp"

namespace anvil {
namespace {
constexpr const char* kSavedNames[] = {"ln_1 output",      "ln_1 mean/rstd", "qkv",
                                       "attention output", "attention lse",  "residual after attn",
                                       "ln_2 output",      "ln_2 mean/rstd", "mlp pre-activation",
                                       "mlp activation"};
constexpr size_t kNone = SIZE_MAX;

size_t offset_of(const ParamLayout& l, TensorRole role, int layer) {
  const ParamTensor* t = l.find_role(role, layer);
  return t ? t->offset : kNone;
}
}  // namespace

Decoder::Decoder(TransformerConfig cfg, int max_batch, int max_seq, bool training,
                 CheckpointPolicy checkpointing, OpsPrecision precision, const LoraConfig& lora)
    : cfg_((cfg.validate(), std::move(cfg))),
      spec_(ArchSpec::of(cfg_)),
      store_(ParamLayout::decoder(cfg_, lora), precision, training),
      B_(max_batch),
      T_(max_seq),
      training_(training),
      // A training model computes the LM head and loss in row chunks (forward()); only inference keeps all
      // rows.
      logits_rows_(training ? std::min(size_t(max_batch) * max_seq, kLossChunkRows)
                            : size_t(max_batch) * max_seq),
      checkpointing_(checkpointing),
      ae_(dtype_bits(precision.compute) / 8),
      stats_rows_(spec_.norm == NormKind::LayerNorm ? 2 : 1),
      proj_width_(size_t(std::max(spec_.C, spec_.q_width()))) {
  ANVIL_REQUIRE(checkpointing.every >= 1, "gradient_checkpointing_every must be >= 1, got {}",
                checkpointing.every);
  using R = TensorRole;
  const ParamLayout& l = store_.layout();
  wte_off_ = offset_of(l, R::TokenEmbedding, -1);
  wpe_off_ = offset_of(l, R::PositionEmbedding, -1);
  head_off_ = spec_.tied_head ? wte_off_ : offset_of(l, R::HeadWeight, -1);
  lnfw_off_ = offset_of(l, R::FinalNormWeight, -1);
  lnfb_off_ = offset_of(l, R::FinalNormBias, -1);
  unit_final_ = int(l.units().size()) - 1;
  head_unit_ = l.unit_of(head_off_);
  for (int i = 0; i < spec_.n_layer; ++i) {
    auto at = [&](R role) { return offset_of(l, role, i); };
    layer_offsets_.push_back({at(R::Norm1Weight), at(R::Norm1Bias), at(R::QkvWeight), at(R::QkvBias),
                              at(R::OutWeight), at(R::OutBias), at(R::Norm2Weight), at(R::Norm2Bias),
                              at(R::MlpInWeight), at(R::MlpInBias), at(R::MlpOutWeight), at(R::MlpOutBias)});
  }
  // Each LoRA factor pair goes to the Linear whose fused matrix holds the weight it adapts.
  lora_slots_.resize(size_t(spec_.n_layer));
  for (const ParamTensor& t : l.tensors()) {
    if (t.role != R::LoraA) continue;
    const ParamTensor& w = l.tensors()[size_t(t.adapts)];
    const ParamTensor* b = &t + 1;
    ANVIL_ASSERT(b->role == R::LoraB && b->adapts == t.adapts, "LoRA factor {} without its B", t.name);
    const LayerTensors<size_t>& o = layer_offsets_[size_t(t.layer)];
    const size_t starts[4] = {o.qkvw, o.attprojw, o.fcw, o.fcprojw};
    int k = 3;
    while (k > 0 && starts[k] > w.offset) --k;
    const size_t in = size_t(w.shape[1]);
    lora_slots_[size_t(t.layer)][size_t(k)].push_back(
        {t.offset, b->offset, int((w.offset - starts[k]) / in), int(w.shape[0])});
    ANVIL_ASSERT(lora_slots_[size_t(t.layer)][size_t(k)].size() <= lora_parts_[0].size(),
                 "block {}: more LoRA parts in one Linear than q, k and v", t.layer);
  }
  ANVIL_REQUIRE(max_batch >= 1, "batch size must be >= 1, got {}", max_batch);
  ANVIL_REQUIRE(max_seq >= 1 && max_seq <= cfg_.block_size,
                "sequence length {} must be between 1 and the model's block_size {}", max_seq,
                cfg_.block_size);
}

void Decoder::plan_memory(MemoryPlan& plan, DeviceKind backend) {
  using M = MemoryCategory;
  const size_t f = sizeof(float), a = ae_;
  const size_t L = spec_.n_layer, C = spec_.C, NH = spec_.NH, BT = size_t(B_) * T_;
  const size_t F = spec_.ffn, FI = spec_.mlp_in_width();
  store_.plan_memory(plan);
  i_encoded_ = plan.add("embedding output", M::Activations, BT * C * a);
  // Per-layer saved activations: stored per layer, or (checkpointed blocks) in one recompute buffer.
  const size_t per_layer[kSavedKinds] = {BT * C * a,
                                         stats_rows_ * BT * f,
                                         BT * size_t(spec_.qkv_width()) * a,
                                         BT * size_t(spec_.q_width()) * a,
                                         size_t(B_) * NH * T_ * f,
                                         BT * C * a,
                                         BT * C * a,
                                         stats_rows_ * BT * f,
                                         BT * FI * a,
                                         BT * F * a};
  for (int k = 0; k < kSavedKinds; ++k) {
    SavedKind& sk = saved_[k];
    sk.bytes = per_layer[k];
    sk.slot.assign(L, -1);
    int stored = 0;
    for (size_t l = 0; l < L; ++l)
      if (!recomputed(k, int(l))) sk.slot[l] = stored++;
    if (stored) sk.i_stored = plan.add(kSavedNames[k], M::Activations, size_t(stored) * sk.bytes);
    if (stored < int(L))
      sk.i_recompute = plan.add(std::string("recompute: ") + kSavedNames[k], M::Recompute, sk.bytes);
  }
  i_res3_ = plan.add("block output", M::Activations, L * BT * C * a);
  i_lnf_ = plan.add("ln_f output", M::Activations, BT * C * a);
  i_lnf_stats_ =
      plan.add(stats_rows_ == 2 ? "ln_f mean/rstd" : "final norm rstd", M::Activations, stats_rows_ * BT * f);
  i_logits_ = plan.add(training_ ? "logits (one chunk of rows)" : "logits", M::Activations,
                       logits_rows_ * spec_.padded_vocab * a);
  i_losses_ = plan.add("losses", M::Activations, BT * f);
  i_tmp_c_ = plan.add("projection scratch", M::Workspace, BT * proj_width_ * a);
  i_attn_scratch_ =
      plan.add("attention scratch", M::Workspace,
               attention_scratch_bytes(backend, store_.precision().compute, attention_shape(B_, T_), false));
  if (spec_.positions == PositionKind::Rope)
    i_inv_freq_ = plan.add("rope frequencies", M::Weights, size_t(spec_.HS / 2) * f);
  if (store_.layout().lora().enabled())
    i_lora_scratch_ = plan.add("LoRA scratch", M::Workspace,
                               LoraAdapter::scratch_elements(int(BT), store_.layout().lora().r) * a);
  if (training_ && store_.layout().lora().enabled() && store_.layout().lora().dropout > 0) {
    // The widest input of a block Linear: C, the attention's q width (o_proj), or the MLP width (down_proj).
    const size_t widest = std::max({C, size_t(spec_.q_width()), F});
    i_lora_dropout_scratch_ = plan.add("LoRA dropout scratch", M::Workspace, BT * widest * a);
    i_lora_dropout_state_ = plan.add("dropout state", M::Workspace, sizeof(DropoutState));
  }
  if (training_) {
    i_dres_ = plan.add("residual gradient", M::Workspace, BT * C * a);
    i_d4c_ = plan.add("mlp gradient", M::Workspace, BT * FI * a);
    if (spec_.mlp == MlpKind::SwiGLU) i_dact_ = plan.add("mlp activation gradient", M::Workspace, BT * F * a);
    i_dqkv_ = plan.add("qkv gradient", M::Workspace, BT * size_t(spec_.qkv_width()) * a);
  }
}

void Decoder::set_logits_rows(size_t rows) {
  ANVIL_ASSERT(!training_ && rows >= size_t(B_) && rows <= size_t(B_) * T_,
               "set_logits_rows({}): an inference model of batch {} x {} keeps {} to {} rows", rows, B_, T_,
               B_, size_t(B_) * T_);
  logits_rows_ = rows;
}

void Decoder::bind(const Arena& ar) {
  store_.bind(ar);
  encoded_ = ar.get<void>(i_encoded_), res3_ = ar.get<void>(i_res3_);
  for (SavedKind& sk : saved_) {
    const bool any_stored = std::count(sk.slot.begin(), sk.slot.end(), -1) < int(sk.slot.size());
    sk.stored = any_stored ? ar.get<char>(sk.i_stored) : nullptr;
    sk.recompute = any_stored && std::count(sk.slot.begin(), sk.slot.end(), -1) == 0
                       ? nullptr
                       : ar.get<char>(sk.i_recompute);
  }
  lnf_ = ar.get<void>(i_lnf_), lnf_stats_ = ar.get<float>(i_lnf_stats_), logits_ = ar.get<void>(i_logits_),
  losses_ = ar.get<float>(i_losses_);
  tmp_c_ = ar.get<void>(i_tmp_c_), attn_scratch_ = ar.get<void>(i_attn_scratch_);
  if (i_inv_freq_ != SIZE_MAX) inv_freq_ = ar.get<float>(i_inv_freq_);
  if (i_lora_scratch_ != SIZE_MAX) lora_scratch_ = ar.get<void>(i_lora_scratch_);
  if (i_lora_dropout_state_ != SIZE_MAX) {
    lora_dropout_state_ = ar.get<DropoutState>(i_lora_dropout_state_);
    lora_dropout_scratch_ = ar.get<void>(i_lora_dropout_scratch_);
  }
  if (training_) {
    dres_ = ar.get<void>(i_dres_), d4c_ = ar.get<void>(i_d4c_), dqkv_ = ar.get<void>(i_dqkv_);
    if (i_dact_ != SIZE_MAX) dact_ = ar.get<void>(i_dact_);
  }
}

void Decoder::upload_constants(Device& dev) const {
  if (!inv_freq_) return;
  const std::vector<float> inv_freq = rope_inv_freq(cfg_);
  ANVIL_ASSERT(inv_freq.size() == size_t(spec_.HS / 2), "rope_inv_freq: {} frequencies for head size {}",
               inv_freq.size(), spec_.HS);
  dev.copy_to_device(inv_freq_, inv_freq.data(), inv_freq.size() * sizeof(float));
}

void Decoder::upload_weights(Device& dev, const float* host) const {
  store_.upload(dev, host);
}

void Decoder::copy_logits_to_host(Device& dev, float* dst, size_t first_row, size_t rows) const {
  const size_t Vp = spec_.padded_vocab, n = rows * Vp;
  const char* src = static_cast<const char*>(logits_) + first_row * Vp * ae_;
  const DType compute = store_.precision().compute;
  if (compute == DType::F32) {
    dev.copy_to_host(dst, src, n * sizeof(float));
    return;
  }
  std::vector<uint16_t> half(n);
  dev.copy_to_host(half.data(), src, n * sizeof(uint16_t));
  const bool bf16 = compute == DType::BF16;
  for (size_t i = 0; i < n; ++i) dst[i] = bf16 ? bf16_to_float(half[i]) : fp16_to_float(half[i]);
}

void Decoder::init_weights(uint64_t seed, Device& dev) const {
  ParamInit how;
  how.std = 0.02f;
  how.residual_std = 0.02f / std::sqrt(2.0f * spec_.n_layer);
  how.zero_row = spec_.padding_idx;
  store_.init(seed, how, dev);
}

void* Decoder::weight_or_null(size_t offset) const {
  return offset == kNone ? nullptr : store_.weight_at(offset);
}
void* Decoder::grad_or_null(size_t offset) const {
  return offset == kNone ? nullptr : store_.grad_at(offset);
}

void* Decoder::trainable_grad_or_null(size_t offset, size_t numel) const {
  if (offset == kNone || !store_.layout().any_trainable({offset, offset + numel})) return nullptr;
  return store_.grad_at(offset);
}

double Decoder::skipped_backward_flops_per_token(int seq_len) const {
  // What backward leaves out (asked of the layout: the gradient views of a store with sharded gradients
  // exist only during a unit's backward): the weight-gradient matmuls of frozen Linears, and for the blocks
  // below the first trainable unit their whole backward (input-gradient matmuls, attention's backward: 8 C T
  // of the 12 C T per layer the FLOPs convention counts).
  const ParamLayout& l = store_.layout();
  const int first = l.first_trainable_unit();
  double flops = 0;
  const size_t C = size_t(spec_.C);
  for (int i = 0; i < spec_.n_layer; ++i) {
    const LayerTensors<size_t>& o = layer_offsets_[size_t(i)];
    const size_t sizes[4] = {C * spec_.qkv_width(), size_t(spec_.q_width()) * C, C * spec_.mlp_in_width(),
                             size_t(spec_.ffn) * C};
    const size_t offsets[4] = {o.qkvw, o.attprojw, o.fcw, o.fcprojw};
    const bool whole_block = 1 + i < first;
    for (int k = 0; k < 4; ++k) {
      if (!l.any_trainable({offsets[k], offsets[k] + sizes[k]})) flops += 2.0 * double(sizes[k]);
      if (whole_block) flops += 2.0 * double(sizes[k]);
    }
    if (whole_block) flops += 8.0 * double(C) * seq_len;
  }
  // The head multiplies the real vocabulary's rows (TransformerConfig::num_parameters counts those).
  if (!l.any_trainable({head_off_, head_off_ + size_t(spec_.padded_vocab) * C}))
    flops += 2.0 * double(spec_.vocab) * double(C);
  return flops;
}

Decoder::LayerParams Decoder::layer_weights(int l) const {
  const LayerTensors<size_t>& o = layer_offsets_[l];
  auto w = [&](size_t off) { return weight_or_null(off); };
  // The matrices are read through block_linears; a quantized one has no dense view (null here).
  auto m = [&](size_t off) { return const_cast<void*>(store_.linear_weight(off).dense); };
  return {w(o.ln1w), w(o.ln1b), m(o.qkvw), w(o.qkvb), m(o.attprojw), w(o.attprojb),
          w(o.ln2w), w(o.ln2b), m(o.fcw),  w(o.fcb),  m(o.fcprojw),  w(o.fcprojb)};
}

Decoder::LayerParams Decoder::layer_grads(int l) const {
  const LayerTensors<size_t>& o = layer_offsets_[l];
  auto g = [&](size_t off) { return grad_or_null(off); };
  return {g(o.ln1w), g(o.ln1b), g(o.qkvw), g(o.qkvb), g(o.attprojw), g(o.attprojb),
          g(o.ln2w), g(o.ln2b), g(o.fcw),  g(o.fcb),  g(o.fcprojw),  g(o.fcprojb)};
}

Decoder::BlockLinears Decoder::block_linears(int l, bool with_grads) const {
  const LayerTensors<size_t>& o = layer_offsets_[l];
  const OpsPrecision pr = store_.precision();
  auto lin = [&](size_t w, size_t b, int in, int out) {
    const Linear base(store_.linear_weight(w), weight_or_null(b), in, out, pr);
    return with_grads
               ? base.with_grads(trainable_grad_or_null(w, size_t(in) * out), trainable_grad_or_null(b, out))
               : base;
  };
  const int C = spec_.C;
  BlockLinears out{lin(o.qkvw, o.qkvb, C, spec_.qkv_width()), lin(o.attprojw, o.attprojb, spec_.q_width(), C),
                   lin(o.fcw, o.fcb, C, spec_.mlp_in_width()), lin(o.fcprojw, o.fcprojb, spec_.ffn, C)};
  if (!lora_scratch_) return out;
  Linear* linears[4] = {&out.qkv, &out.out, &out.mlp_in, &out.mlp_out};
  const LoraConfig& lora = store_.layout().lora();
  for (size_t k = 0; k < 4; ++k) {
    const std::vector<LoraSlot>& slots = lora_slots_[size_t(l)][k];
    if (slots.empty()) continue;
    std::array<LoraPart, 3>& parts = lora_parts_[k];
    for (size_t i = 0; i < slots.size(); ++i) {
      const LoraSlot& s = slots[i];
      const bool grads = with_grads && store_.layout().any_trainable({s.a, s.a + 1});
      parts[i] = {s.first,
                  s.rows,
                  store_.weight_at(s.a),
                  store_.weight_at(s.b),
                  grads ? store_.grad_at(s.a) : nullptr,
                  grads ? store_.grad_at(s.b) : nullptr};
    }
    Linear& base = *linears[k];
    // Dropout sites: four per Linear (q, k, v at most), four Linears per block.
    LoraDropout drop;
    if (lora_dropping_)
      drop = {float(lora.dropout), lora_dropout_state_, uint32_t((size_t(l) * 4 + k) * 4),
              lora_dropout_scratch_};
    adapters_[k] = LoraAdapter(std::span<const LoraPart>(parts.data(), slots.size()), base.in(), base.out(),
                               lora.r, lora.scale(), lora_scratch_, pr, drop);
    base = base.with_adapter(&adapters_[k]);
  }
  return out;
}

Linear Decoder::head_linear(bool with_grads) const {
  const Linear head(store_.weight_at(head_off_), nullptr, spec_.C, spec_.padded_vocab, store_.precision());
  return with_grads ? head.with_grads(trainable_grad_or_null(head_off_, size_t(spec_.padded_vocab) * spec_.C),
                                      nullptr)
                    : head;
}

void Decoder::norm_fwd(Ops& ops, void* out, float* st, const void* inp, const void* w, const void* b, int N) {
  const size_t sBT = size_t(B_) * T_;
  if (spec_.norm == NormKind::LayerNorm)
    ops.layernorm_fwd(out, st, st + sBT, inp, w, b, N, spec_.C, spec_.norm_eps);
  else
    ops.rmsnorm_fwd(out, st, inp, w, N, spec_.C, spec_.norm_eps);
}

void Decoder::residual_norm_fwd(Ops& ops, void* out, void* ln, float* st, const void* a, const void* b,
                                const void* w, const void* bias, int N) {
  const size_t sBT = size_t(B_) * T_;
  if (spec_.norm == NormKind::LayerNorm)
    ops.residual_layernorm_fwd(out, ln, st, st + sBT, a, b, w, bias, N, spec_.C, spec_.norm_eps);
  else
    ops.residual_rmsnorm_fwd(out, ln, st, a, b, w, N, spec_.C, spec_.norm_eps);
}

void Decoder::norm_bwd(Ops& ops, void* dinp, void* dw, void* db, const void* dout, const void* inp,
                       const void* w, const float* st, int N) {
  const size_t sBT = size_t(B_) * T_;
  if (spec_.norm == NormKind::LayerNorm)
    ops.layernorm_bwd(dinp, dw, db, dout, inp, w, st, st + sBT, N, spec_.C);
  else
    ops.rmsnorm_bwd(dinp, dw, dout, inp, w, st, N, spec_.C);
}

AttentionMask Decoder::attention_mask() const {
  AttentionMask m;
  m.window = spec_.window > 0 && spec_.window < T_ ? spec_.window : 0;  // a window >= T changes nothing
  return m;
}

bool Decoder::recomputed(int kind, int layer) const {
  if (!checkpointing_.checkpointed(layer)) return false;
  if (checkpointing_.mode == CheckpointMode::Full) return true;
  return kind != kQkv && kind != kAtty && kind != kLse;  // selective keeps the attention tensors
}

void* Decoder::act(int kind, int layer) const {
  const SavedKind& sk = saved_[kind];
  const int slot = sk.slot[layer];
  return slot < 0 ? sk.recompute : sk.stored + size_t(slot) * sk.bytes;
}

// The MLP's activation from its input `inp` (norm-2 output): with `pre_too`, the first GEMM into `pre` as
// well (GELU: one GEMM with the GELU epilogue; SwiGLU: the fused gate/up GEMM, then SwiGLU), else only the
// activation from the saved `pre`.
void Decoder::mlp_forward(Ops& ops, const BlockLinears& lin, void* out, void* pre, const void* inp, int N,
                          bool pre_too) {
  const int F = spec_.ffn;
  if (spec_.mlp == MlpKind::Gelu) {
    if (pre_too)
      lin.mlp_in.forward_gelu(ops, out, pre, inp, N);
    else
      ops.gelu_fwd(out, pre, size_t(N) * F);
    return;
  }
  if (pre_too) lin.mlp_in.forward(ops, pre, inp, N);
  ops.swiglu_fwd(out, pre, N, F);
}

void Decoder::block_forward(Ops& ops, int l, int B, int T, bool only_recomputed) {
  const int C = spec_.C, N = B * T;
  const size_t sBTC = size_t(B_) * T_ * C;
  const AttentionShape shape = attention_shape(B, T);
  store_.acquire(1 + l);
  // The next unit's weights gather while this block computes (a no-op unless they are sharded: ZeRO-3).
  if (!only_recomputed) store_.prefetch(l + 1 < spec_.n_layer ? 2 + l : unit_final_);
  const LayerParams p = layer_weights(l);
  const BlockLinears lin = block_linears(l, false);
  const void* x = l == 0 ? encoded_ : at(res3_, (l - 1) * sBTC);
  void *ln1 = act(kLn1, l), *qkv = act(kQkv, l), *atty = act(kAtty, l);
  void *res2 = act(kRes2, l), *ln2 = act(kLn2, l), *fch = act(kFch, l), *fch_gelu = act(kFchGelu, l);
  float *ln1_stats = stats(kLn1Stats, l), *ln2_stats = stats(kLn2Stats, l);
  auto run = [&](int kind) { return !only_recomputed || recomputed(kind, l); };
  // In the full forward pass the previous block's output step already wrote this norm (fused with its
  // residual add); a recompute pass rebuilds it here.
  if (run(kLn1) && (only_recomputed || l == 0)) norm_fwd(ops, ln1, ln1_stats, x, p.ln1w, p.ln1b, N);
  if (run(kQkv)) {
    lin.qkv.forward(ops, qkv, ln1, N);
    if (inv_freq_) ops.rope_fwd(qkv, inv_freq_, shape, 0);
  }
  if (run(kAtty)) ops.attention_fwd(atty, stats(kLse, l), qkv, attn_scratch_, shape, attention_mask());
  if (run(kRes2)) {
    lin.out.forward(ops, tmp_c_, atty, N);
    if (run(kLn2))  // the residual add and the next norm in one pass
      residual_norm_fwd(ops, res2, ln2, ln2_stats, x, tmp_c_, p.ln2w, p.ln2b, N);
    else
      ops.residual_fwd(res2, x, tmp_c_, size_t(N) * C);
  } else if (run(kLn2)) {
    norm_fwd(ops, ln2, ln2_stats, res2, p.ln2w, p.ln2b, N);
  }
  // Checkpointing recomputes the MLP's first GEMM and its activation together; should only the activation
  // be missing, it is recomputed alone.
  if (run(kFch))
    mlp_forward(ops, lin, fch_gelu, fch, ln2, N, true);
  else if (run(kFchGelu))
    mlp_forward(ops, lin, fch_gelu, fch, ln2, N, false);
  if (trace_) {
    // Stored kinds stay live until this block's backward; in the forward pass the recompute buffers are
    // scratch that the next block overwrites; rebuilt (recompute phase) they live until the backward.
    const char* phase = only_recomputed ? "recompute" : "forward";
    for (int k = 0; k < kSavedKinds; ++k) {
      const bool rec = recomputed(k, l);
      if (only_recomputed && !rec) continue;
      int& id = trace_saved_[l][k];
      trace_alloc(id, kSavedNames[k], rec ? MemoryCategory::Recompute : MemoryCategory::Activations,
                  saved_[k].bytes, l, phase);
      if (rec && !only_recomputed) trace_free(id, phase);
    }
  }
  if (only_recomputed) return;  // the block output is stored: it is the next block's checkpoint
  lin.mlp_out.forward(ops, tmp_c_, fch_gelu, N);
  block_output_fwd(ops, l, res2, N);
  store_.release(1 + l);  // (backward acquires it again)
  trace_alloc(trace_block_out_[l], "block output", MemoryCategory::Activations, size_t(B_) * T_ * C * ae_, l,
              "forward");
}

void Decoder::block_output_fwd(Ops& ops, int l, const void* res2, int N) {
  // The block output and the norm that reads it next, in one pass: the next block's norm 1 (into its
  // stored or recompute buffer, which nothing else writes before that block runs), or the final norm.
  void* out = at(res3_, l * size_t(B_) * T_ * spec_.C);
  if (l + 1 < spec_.n_layer) {
    store_.acquire(2 + l);
    const LayerParams pn = layer_weights(l + 1);
    residual_norm_fwd(ops, out, act(kLn1, l + 1), stats(kLn1Stats, l + 1), res2, tmp_c_, pn.ln1w, pn.ln1b, N);
  } else {
    store_.acquire(unit_final_);
    residual_norm_fwd(ops, out, lnf_, lnf_stats_, res2, tmp_c_, weight_or_null(lnfw_off_),
                      weight_or_null(lnfb_off_), N);
  }
}

void Decoder::forward(Ops& ops, const int32_t* tokens, const int32_t* targets, int B, int T, float grad_scale,
                      bool write_grad) {
  ANVIL_ASSERT(B <= B_ && T <= T_, "forward shape {}x{} exceeds planned {}x{}", B, T, B_, T_);
  ANVIL_ASSERT(!write_grad || (training_ && targets), "write_grad needs a training model and targets");
  ANVIL_ASSERT(
      ops.precision().compute == precision().compute && ops.precision().grad == store_.written_grad_type(),
      "the ops' precision does not match the model's");
  const int C = spec_.C, L = spec_.n_layer, V = spec_.vocab, Vp = spec_.padded_vocab;
  const int N = B * T;
  const size_t sBTC = size_t(B_) * T_ * C, sBT = size_t(B_) * T_;
  // LoRA dropout in a training forward only (and its backward); each draws the next micro-batch's masks.
  lora_dropping_ = write_grad && lora_dropout_state_;
  if (lora_dropping_) ops.dropout_next_micro(lora_dropout_state_);
  trace_phase("forward", -1);
  store_.acquire(0);
  if (L > 0) store_.prefetch(1);
  ops.embedding_fwd(encoded_, tokens, store_.weight_at(wte_off_), weight_or_null(wpe_off_), B, T, C);
  trace_alloc(trace_encoded_, "embedding output", MemoryCategory::Activations, sBTC * ae_, -1, "forward");
  for (int l = 0; l < L; ++l) {
    trace_phase("forward", l);
    block_forward(ops, l, B, T, false);
  }
  trace_phase("forward head", -1);  // the final norm was computed by the last block (fused with its add)
  trace_alloc(trace_lnf_, "ln_f output + mean/rstd", MemoryCategory::Activations,
              sBTC * ae_ + stats_rows_ * sBT * 4, -1, "forward");
  head_grad_ready_ = false;
  if (!targets) {
    ANVIL_REQUIRE(
        size_t(N) <= logits_rows_,
        "the logits of {} rows do not fit this model's {}-row logits buffer (a training model keeps "
        "one loss chunk; ask for fewer rows)",
        N, logits_rows_);
    head_linear(false).forward(ops, logits_, lnf_, N);
    trace_alloc(trace_logits_, "logits", MemoryCategory::Activations, logits_rows_ * Vp * ae_, -1, "forward");
    return;
  }
  // LM head + loss (+ the head's backward) one chunk of rows at a time: the logits of a chunk are
  // overwritten by their gradient, which immediately gives the chunk's d(final norm output) rows (into
  // tmp_c_, where backward() picks them up) and its share of the head's gradient (the token embedding's,
  // when tied).
  trace_alloc(trace_logits_, "logits (one chunk of rows)", MemoryCategory::Activations,
              logits_rows_ * Vp * ae_, -1, "forward");
  if (write_grad) store_.begin_grads(ops.device(), head_unit_);
  const Linear head = head_linear(write_grad);
  for (size_t r0 = 0; r0 < size_t(N); r0 += logits_rows_) {
    const int n = int(std::min(logits_rows_, size_t(N) - r0));
    const void* x = at(lnf_, r0 * C);
    head.forward(ops, logits_, x, n);
    ops.softmax_xent_fwd_bwd(losses_ + r0, logits_, targets + r0, n, V, Vp, grad_scale, write_grad);
    if (write_grad) head.backward(ops, at(tmp_c_, r0 * C), logits_, x, n);
  }
  head_grad_ready_ = write_grad;
  trace_free(trace_logits_, "forward");
  trace_alloc(trace_losses_, "losses", MemoryCategory::Activations, sBT * 4, -1, "forward");
}

void Decoder::block_backward(Ops& ops, int l, int B, int T) {
  const int C = spec_.C, F = spec_.ffn, N = B * T;
  const size_t sBTC = size_t(B_) * T_ * C;
  const AttentionShape shape = attention_shape(B, T);
  const LayerParams p = layer_weights(l);
  const LayerParams g = layer_grads(l);
  const BlockLinears lin = block_linears(l, true);
  const void* x = l == 0 ? encoded_ : at(res3_, (l - 1) * sBTC);
  // MLP: out = res2 + act(norm2(res2) Win^T + bin) Wout^T + bout; dres_ holds dout.
  if (spec_.mlp == MlpKind::Gelu) {
    lin.mlp_out.backward_dgelu(ops, d4c_, dres_, act(kFchGelu, l), act(kFch, l), N);
  } else {
    lin.mlp_out.backward(ops, dact_, dres_, act(kFchGelu, l), N);
    ops.swiglu_bwd(d4c_, act(kFch, l), dact_, N, F);
  }
  lin.mlp_in.backward(ops, tmp_c_, d4c_, act(kLn2, l), N);
  norm_bwd(ops, dres_, g.ln2w, g.ln2b, tmp_c_, act(kRes2, l), p.ln2w, stats(kLn2Stats, l), N);
  // Attention: res2 = x + attn(norm1(x)) Wo^T + bo; dres_ now holds d(res2).
  lin.out.backward(ops, tmp_c_, dres_, act(kAtty, l), N);
  ops.attention_bwd(dqkv_, tmp_c_, act(kQkv, l), act(kAtty, l), stats(kLse, l), attn_scratch_, shape,
                    attention_mask());
  if (inv_freq_) ops.rope_bwd(dqkv_, inv_freq_, shape, 0);
  lin.qkv.backward(ops, tmp_c_, dqkv_, act(kLn1, l), N);
  norm_bwd(ops, dres_, g.ln1w, g.ln1b, tmp_c_, x, p.ln1w, stats(kLn1Stats, l), N);
}

void Decoder::backward(Ops& ops, const int32_t* tokens, int B, int T) {
  ANVIL_ASSERT(training_, "backward on a model planned without gradients");
  const int C = spec_.C, L = spec_.n_layer;
  const int N = B * T;
  const size_t sBTC = size_t(B_) * T_ * C;
  ANVIL_ASSERT(head_grad_ready_, "backward() needs the preceding forward() with targets and write_grad");
  head_grad_ready_ = false;

  // The head's backward ran chunk by chunk in forward(): tmp_c_ holds d(final norm output). Final norm next.
  trace_phase("backward head", -1);
  ops.device().fill_zero(dres_, size_t(N) * C * ae_);
  store_.begin_grads(ops.device(), unit_final_);
  norm_bwd(ops, dres_, grad_or_null(lnfw_off_), grad_or_null(lnfb_off_), tmp_c_, at(res3_, (L - 1) * sBTC),
           weight_or_null(lnfw_off_), lnf_stats_, N);
  store_.release(unit_final_);
  store_.grads_ready(unit_final_);
  trace_free(trace_lnf_, "backward");
  trace_free(trace_block_out_[L - 1], "backward");

  // Below the first unit with a trainable tensor (freeze_parameters) no gradient is needed: those units'
  // backward is skipped, their gradient hooks still run (nothing written: the reduction sees zeros).
  const int first = store_.layout().first_trainable_unit();
  for (int l = L - 1; l >= 0; --l) {
    if (1 + l < first) {
      store_.begin_grads(ops.device(), 1 + l);
      store_.grads_ready(1 + l);
      if (trace_) {
        for (int& id : trace_saved_[l]) trace_free(id, "backward");
        trace_free(l == 0 ? trace_encoded_ : trace_block_out_[l - 1], "backward");
      }
      continue;
    }
    if (l > 0 && l >= first) store_.prefetch(l);  // the block before, during this one (ZeRO-3)
    if (checkpointing_.checkpointed(l)) {
      trace_phase("recompute", l);
      block_forward(ops, l, B, T, true);
    }
    trace_phase("backward", l);
    store_.acquire(1 + l);
    store_.begin_grads(ops.device(), 1 + l);
    block_backward(ops, l, B, T);
    store_.release(1 + l);
    store_.grads_ready(1 + l);
    if (trace_) {
      for (int& id : trace_saved_[l]) trace_free(id, "backward");
      trace_free(l == 0 ? trace_encoded_ : trace_block_out_[l - 1], "backward");
    }
  }
  trace_phase("backward embedding", -1);
  store_.begin_grads(ops.device(), 0);
  // (A frozen token embedding beside learned positions still gets its gradient written: the step zeroes it.)
  if (first == 0) {
    if (spec_.padding_idx >= 0)  // no learned positions in a family with a padding_idx
      ops.embedding_bwd_skip(store_.grad_at(wte_off_), dres_, tokens, B, T, C, spec_.padding_idx);
    else
      ops.embedding_bwd(store_.grad_at(wte_off_), grad_or_null(wpe_off_), dres_, tokens, B, T, C);
  }
  store_.release(0);
  store_.grads_ready(0);
  trace_free(trace_losses_, "backward");
}

void Decoder::set_memory_trace(MemoryTrace* trace) {
  trace_ = trace;
  trace_saved_.assign(spec_.n_layer, {});
  for (auto& ids : trace_saved_) ids.fill(-1);
  trace_block_out_.assign(spec_.n_layer, -1);
  trace_encoded_ = trace_lnf_ = trace_logits_ = trace_losses_ = -1;
}

void Decoder::trace_phase(const char* name, int layer) {
  if (trace_) trace_->phase(name, layer);
  if (profiler_) profiler_->phase(name, layer);
}

void Decoder::trace_alloc(int& id, const char* name, MemoryCategory c, size_t bytes, int layer,
                          const char* phase) {
  if (!trace_) return;
  if (id >= 0) trace_->free(id, phase);  // overwritten (e.g. the next micro-batch)
  id = trace_->alloc(name, c, bytes, layer, phase);
}

void Decoder::trace_free(int& id, const char* phase) {
  if (!trace_ || id < 0) return;
  trace_->free(id, phase);
  id = -1;
}

}  // namespace anvil
