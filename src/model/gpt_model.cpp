#include "model/gpt_model.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "anvil/rng.hpp"
#include "core/half.hpp"

namespace anvil {
namespace {
constexpr const char* kSavedNames[] = {"ln_1 output",      "ln_1 mean/rstd", "qkv",
                                       "attention output", "attention lse",  "residual after attn",
                                       "ln_2 output",      "ln_2 mean/rstd", "mlp pre-activation",
                                       "mlp activation"};
}  // namespace

GptModel::GptModel(TransformerConfig cfg, int max_batch, int max_seq, bool training,
                   CheckpointPolicy checkpointing, OpsPrecision precision)
    : cfg_(std::move(cfg)),
      layout_(ParamLayout::gpt2(cfg_)),
      B_(max_batch),
      T_(max_seq),
      training_(training),
      // A training model computes the LM head and loss in row chunks (forward()); only inference keeps all
      // rows.
      logits_rows_(training ? std::min(size_t(max_batch) * max_seq, kLossChunkRows)
                            : size_t(max_batch) * max_seq),
      checkpointing_(checkpointing),
      precision_(precision),
      ae_(dtype_bits(precision.compute) / 8),
      ge_(dtype_bits(precision.grad) / 8) {
  validate_ops_precision(precision);
  ANVIL_REQUIRE(checkpointing.every >= 1, "gradient_checkpointing_every must be >= 1, got {}",
                checkpointing.every);
  cfg_.validate();
  wte_off_ = layout_.get("transformer.wte.weight").offset;
  wpe_off_ = layout_.get("transformer.wpe.weight").offset;
  lnfw_off_ = layout_.get("transformer.ln_f.weight").offset;
  lnfb_off_ = layout_.get("transformer.ln_f.bias").offset;
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    auto at = [&](const char* name) { return layout_.get(p + name).offset; };
    layer_offsets_.push_back({at("ln_1.weight"), at("ln_1.bias"), at("attn.c_attn.weight"),
                              at("attn.c_attn.bias"), at("attn.c_proj.weight"), at("attn.c_proj.bias"),
                              at("ln_2.weight"), at("ln_2.bias"), at("mlp.c_fc.weight"), at("mlp.c_fc.bias"),
                              at("mlp.c_proj.weight"), at("mlp.c_proj.bias")});
  }
  ANVIL_REQUIRE(max_batch >= 1, "batch size must be >= 1, got {}", max_batch);
  ANVIL_REQUIRE(max_seq >= 1 && max_seq <= cfg_.block_size,
                "sequence length {} must be between 1 and the model's block_size {}", max_seq,
                cfg_.block_size);
}

void GptModel::plan_memory(MemoryPlan& plan, DeviceKind backend) {
  using M = MemoryCategory;
  const size_t f = sizeof(float), a = ae_;
  const size_t L = cfg_.n_layer, C = cfg_.n_embd, NH = cfg_.n_head, BT = size_t(B_) * T_;
  const size_t P = layout_.total_numel();
  const bool mixed = precision_.compute != DType::F32;
  if (mixed) {
    i_master_ = plan.add("master weights (fp32)", M::MasterWeights, P * f);
    i_weights_ = plan.add(std::string("weights (") + std::string(dtype_name(precision_.compute)) + ")",
                          M::Weights, P * a);
  } else {
    i_weights_ = plan.add("parameters", M::Weights, P * f);
  }
  if (training_) i_grads_ = plan.add("gradients", M::Gradients, P * ge_);
  i_encoded_ = plan.add("embedding output", M::Activations, BT * C * a);
  // Per-layer saved activations: stored per layer, or (checkpointed blocks) in one recompute buffer.
  const size_t per_layer[kSavedKinds] = {
      BT * C * a, 2 * BT * f, 3 * BT * C * a, BT * C * a,     size_t(B_) * NH * T_ * f,
      BT * C * a, BT * C * a, 2 * BT * f,     4 * BT * C * a, 4 * BT * C * a};
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
  i_lnf_stats_ = plan.add("ln_f mean/rstd", M::Activations, 2 * BT * f);
  i_logits_ = plan.add(training_ ? "logits (one chunk of rows)" : "logits", M::Activations,
                       logits_rows_ * cfg_.padded_vocab_size() * a);
  i_losses_ = plan.add("losses", M::Activations, BT * f);
  i_tmp_c_ = plan.add("projection scratch", M::Workspace, BT * C * a);
  i_attn_scratch_ = plan.add("attention scratch", M::Workspace,
                             attention_scratch_bytes(backend, precision_.compute, B_, T_, int(C), int(NH)));
  if (training_) {
    i_dres_ = plan.add("residual gradient", M::Workspace, BT * C * a);
    i_d4c_ = plan.add("mlp gradient", M::Workspace, BT * 4 * C * a);
    i_dqkv_ = plan.add("qkv gradient", M::Workspace, BT * 3 * C * a);
  }
}

void GptModel::bind(const Arena& ar) {
  weights_ = ar.get<void>(i_weights_);
  master_ = precision_.compute == DType::F32 ? static_cast<float*>(weights_) : ar.get<float>(i_master_);
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
  if (training_) {
    grads_ = ar.get<void>(i_grads_), dres_ = ar.get<void>(i_dres_), d4c_ = ar.get<void>(i_d4c_),
    dqkv_ = ar.get<void>(i_dqkv_);
  }
}

float* GptModel::grads() const {
  ANVIL_ASSERT(precision_.grad == DType::F32, "grads(): the gradients are {}, not F32",
               dtype_name(precision_.grad));
  return static_cast<float*>(grads_);
}

void GptModel::upload_weights(Device& dev, const float* host) const {
  const size_t n = layout_.total_numel();
  dev.copy_to_device(master_, host, n * sizeof(float));
  if (precision_.compute == DType::F32) return;
  std::vector<uint16_t> half(n);
  const bool bf16 = precision_.compute == DType::BF16;
  for (size_t i = 0; i < n; ++i) half[i] = bf16 ? float_to_bf16(host[i]) : float_to_fp16(host[i]);
  dev.copy_to_device(weights_, half.data(), n * sizeof(uint16_t));
}

void GptModel::sync_weights(Ops& ops, uint64_t rounding_seed, const StepValues* step_values) const {
  if (precision_.compute == DType::F32) return;
  ops.cast_weights(weights_, master_, layout_.total_numel(), rounding_seed, step_values);
}

void GptModel::copy_logits_to_host(Device& dev, float* dst, size_t first_row, size_t rows) const {
  const size_t Vp = cfg_.padded_vocab_size(), n = rows * Vp;
  const char* src = static_cast<const char*>(logits_) + first_row * Vp * ae_;
  if (precision_.compute == DType::F32) {
    dev.copy_to_host(dst, src, n * sizeof(float));
    return;
  }
  std::vector<uint16_t> half(n);
  dev.copy_to_host(half.data(), src, n * sizeof(uint16_t));
  const bool bf16 = precision_.compute == DType::BF16;
  for (size_t i = 0; i < n; ++i) dst[i] = bf16 ? bf16_to_float(half[i]) : fp16_to_float(half[i]);
}

void GptModel::init_weights(uint64_t seed, Device& dev) const {
  std::vector<float> host(layout_.total_numel(), 0.0f);
  Rng rng(seed);
  const float std_resid = 0.02f / std::sqrt(2.0f * cfg_.n_layer);
  for (const ParamTensor& t : layout_.tensors()) {
    float* p = host.data() + t.offset;
    size_t n = t.numel();
    if (t.name == "transformer.wte.weight") n = size_t(cfg_.vocab_size) * cfg_.n_embd;  // padded rows stay 0
    switch (t.init) {
      case ParamTensor::Init::Normal:
        for (size_t i = 0; i < n; ++i) p[i] = 0.02f * rng.normal();
        break;
      case ParamTensor::Init::NormalResidual:
        for (size_t i = 0; i < n; ++i) p[i] = std_resid * rng.normal();
        break;
      case ParamTensor::Init::Ones:
        for (size_t i = 0; i < n; ++i) p[i] = 1.0f;
        break;
      case ParamTensor::Init::Zeros:
        break;
    }
  }
  upload_weights(dev, host.data());
}

GptModel::LayerParams GptModel::layer_params(void* base, size_t e, int l) const {
  const LayerTensors<size_t>& o = layer_offsets_[l];
  char* b = static_cast<char*>(base);
  return {b + o.ln1w * e,     b + o.ln1b * e,     b + o.qkvw * e,    b + o.qkvb * e,
          b + o.attprojw * e, b + o.attprojb * e, b + o.ln2w * e,    b + o.ln2b * e,
          b + o.fcw * e,      b + o.fcb * e,      b + o.fcprojw * e, b + o.fcprojb * e};
}

bool GptModel::recomputed(int kind, int layer) const {
  if (!checkpointing_.checkpointed(layer)) return false;
  if (checkpointing_.mode == CheckpointMode::Full) return true;
  return kind != kQkv && kind != kAtty && kind != kLse;  // selective keeps the attention tensors
}

void* GptModel::act(int kind, int layer) const {
  const SavedKind& sk = saved_[kind];
  const int slot = sk.slot[layer];
  return slot < 0 ? sk.recompute : sk.stored + size_t(slot) * sk.bytes;
}

void GptModel::block_forward(Ops& ops, int l, int B, int T, bool only_recomputed) {
  const int C = cfg_.n_embd, NH = cfg_.n_head, N = B * T;
  const size_t sBTC = size_t(B_) * T_ * C, sBT = size_t(B_) * T_;
  const LayerParams p = layer_params(weights_, ae_, l);
  const void* x = l == 0 ? encoded_ : at(res3_, (l - 1) * sBTC);
  void *ln1 = act(kLn1, l), *qkv = act(kQkv, l), *atty = act(kAtty, l);
  void *res2 = act(kRes2, l), *ln2 = act(kLn2, l), *fch = act(kFch, l), *fch_gelu = act(kFchGelu, l);
  float *ln1_stats = stats(kLn1Stats, l), *ln2_stats = stats(kLn2Stats, l);
  auto run = [&](int kind) { return !only_recomputed || recomputed(kind, l); };
  // In the full forward pass the previous block's output step already wrote this LayerNorm (fused with its
  // residual add); a recompute pass rebuilds it here.
  if (run(kLn1) && (only_recomputed || l == 0))
    ops.layernorm_fwd(ln1, ln1_stats, ln1_stats + sBT, x, p.ln1w, p.ln1b, N, C);
  if (run(kQkv)) ops.matmul_fwd(qkv, ln1, p.qkvw, p.qkvb, N, C, 3 * C);
  if (run(kAtty)) ops.attention_fwd(atty, stats(kLse, l), qkv, attn_scratch_, B, T, C, NH, AttentionMask{});
  if (run(kRes2)) {
    ops.matmul_fwd(tmp_c_, atty, p.attprojw, p.attprojb, N, C, C);
    if (run(kLn2))  // the residual add and the next LayerNorm in one pass
      ops.residual_layernorm_fwd(res2, ln2, ln2_stats, ln2_stats + sBT, x, tmp_c_, p.ln2w, p.ln2b, N, C,
                                 kLayerNormEps);
    else
      ops.residual_fwd(res2, x, tmp_c_, size_t(N) * C);
  } else if (run(kLn2)) {
    ops.layernorm_fwd(ln2, ln2_stats, ln2_stats + sBT, res2, p.ln2w, p.ln2b, N, C);
  }
  // One fused GEMM + GELU. (Checkpointing recomputes the pre-activation and its GELU together; should only
  // the GELU output be missing, it is recomputed alone.)
  if (run(kFch))
    ops.matmul_gelu_fwd(fch_gelu, fch, ln2, p.fcw, p.fcb, N, C, 4 * C);
  else if (run(kFchGelu))
    ops.gelu_fwd(fch_gelu, fch, size_t(N) * 4 * C);
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
  ops.matmul_fwd(tmp_c_, fch_gelu, p.fcprojw, p.fcprojb, N, 4 * C, C);
  // The block output and the LayerNorm that reads it next, in one pass: the next block's ln_1 (into its
  // stored or recompute buffer, which nothing else writes before that block runs), or ln_f after the last.
  void* out = at(res3_, l * sBTC);
  if (l + 1 < cfg_.n_layer) {
    const LayerParams pn = layer_params(weights_, ae_, l + 1);
    float* next_stats = stats(kLn1Stats, l + 1);
    ops.residual_layernorm_fwd(out, act(kLn1, l + 1), next_stats, next_stats + sBT, res2, tmp_c_, pn.ln1w,
                               pn.ln1b, N, C, kLayerNormEps);
  } else {
    ops.residual_layernorm_fwd(out, lnf_, lnf_stats_, lnf_stats_ + sBT, res2, tmp_c_, at(weights_, lnfw_off_),
                               at(weights_, lnfb_off_), N, C, kLayerNormEps);
  }
  trace_alloc(trace_block_out_[l], "block output", MemoryCategory::Activations, size_t(B_) * T_ * C * ae_, l,
              "forward");
}

void GptModel::forward(Ops& ops, const int32_t* tokens, const int32_t* targets, int B, int T,
                       float grad_scale, bool write_grad) {
  ANVIL_ASSERT(B <= B_ && T <= T_, "forward shape {}x{} exceeds planned {}x{}", B, T, B_, T_);
  ANVIL_ASSERT(!write_grad || (training_ && targets), "write_grad needs a training model and targets");
  ANVIL_ASSERT(ops.precision().compute == precision_.compute && ops.precision().grad == precision_.grad,
               "the ops' precision does not match the model's");
  const int C = cfg_.n_embd, L = cfg_.n_layer, V = cfg_.vocab_size, Vp = cfg_.padded_vocab_size();
  const int N = B * T;
  const size_t sBTC = size_t(B_) * T_ * C, sBT = size_t(B_) * T_;
  trace_phase("forward", -1);
  ops.embedding_fwd(encoded_, tokens, at(weights_, wte_off_), at(weights_, wpe_off_), B, T, C);
  trace_alloc(trace_encoded_, "embedding output", MemoryCategory::Activations, sBTC * ae_, -1, "forward");
  for (int l = 0; l < L; ++l) {
    trace_phase("forward", l);
    block_forward(ops, l, B, T, false);
  }
  trace_phase("forward head", -1);  // ln_f was computed by the last block (fused with its residual add)
  trace_alloc(trace_lnf_, "ln_f output + mean/rstd", MemoryCategory::Activations, sBTC * ae_ + 2 * sBT * 4,
              -1, "forward");
  const void* wte = at(weights_, wte_off_);
  head_grad_ready_ = false;
  if (!targets) {
    ANVIL_REQUIRE(
        size_t(N) <= logits_rows_,
        "the logits of {} rows do not fit this model's {}-row logits buffer (a training model keeps "
        "one loss chunk; ask for fewer rows)",
        N, logits_rows_);
    ops.matmul_fwd(logits_, lnf_, wte, nullptr, N, C, Vp);
    trace_alloc(trace_logits_, "logits", MemoryCategory::Activations, logits_rows_ * Vp * ae_, -1, "forward");
    return;
  }
  // LM head + loss (+ the head's backward) one chunk of rows at a time: the logits of a chunk are
  // overwritten by their gradient, which immediately gives the chunk's d(ln_f output) rows (into tmp_c_,
  // where backward() picks them up) and its share of the tied wte gradient.
  trace_alloc(trace_logits_, "logits (one chunk of rows)", MemoryCategory::Activations,
              logits_rows_ * Vp * ae_, -1, "forward");
  char* g0 = static_cast<char*>(grads_);
  for (size_t r0 = 0; r0 < size_t(N); r0 += logits_rows_) {
    const int n = int(std::min(logits_rows_, size_t(N) - r0));
    const void* x = at(lnf_, r0 * C);
    ops.matmul_fwd(logits_, x, wte, nullptr, n, C, Vp);
    ops.softmax_xent_fwd_bwd(losses_ + r0, logits_, targets + r0, n, V, Vp, grad_scale, write_grad);
    if (write_grad)
      ops.matmul_bwd(at(tmp_c_, r0 * C), g0 + wte_off_ * ge_, nullptr, logits_, x, wte, n, C, Vp);
  }
  head_grad_ready_ = write_grad;
  trace_free(trace_logits_, "forward");
  trace_alloc(trace_losses_, "losses", MemoryCategory::Activations, sBT * 4, -1, "forward");
}

void GptModel::backward(Ops& ops, const int32_t* tokens, int B, int T) {
  ANVIL_ASSERT(training_, "backward on a model planned without gradients");
  const int C = cfg_.n_embd, NH = cfg_.n_head, L = cfg_.n_layer;
  const int N = B * T;
  const size_t sBTC = size_t(B_) * T_ * C, sBT = size_t(B_) * T_;
  char* g0 = static_cast<char*>(grads_);
  ANVIL_ASSERT(head_grad_ready_, "backward() needs the preceding forward() with targets and write_grad");
  head_grad_ready_ = false;

  // The head's backward ran chunk by chunk in forward(): tmp_c_ holds d(ln_f output). Final norm next.
  trace_phase("backward head", -1);
  ops.device().fill_zero(dres_, size_t(N) * C * ae_);
  ops.layernorm_bwd(dres_, g0 + lnfw_off_ * ge_, g0 + lnfb_off_ * ge_, tmp_c_, at(res3_, (L - 1) * sBTC),
                    at(weights_, lnfw_off_), lnf_stats_, lnf_stats_ + sBT, N, C);
  trace_free(trace_lnf_, "backward");
  trace_free(trace_block_out_[L - 1], "backward");

  for (int l = L - 1; l >= 0; --l) {
    if (checkpointing_.checkpointed(l)) {
      trace_phase("recompute", l);
      block_forward(ops, l, B, T, true);
    }
    trace_phase("backward", l);
    const LayerParams p = layer_params(weights_, ae_, l);
    const LayerParams g = layer_params(grads_, ge_, l);
    const void* x = l == 0 ? encoded_ : at(res3_, (l - 1) * sBTC);
    const float* ln1_stats = stats(kLn1Stats, l);
    const float* ln2_stats = stats(kLn2Stats, l);
    // MLP: out = res2 + gelu(ln2 Wfc^T + bfc) Wproj^T + bproj; dres_ holds dout.
    ops.matmul_bwd_dgelu(d4c_, g.fcprojw, g.fcprojb, dres_, act(kFchGelu, l), p.fcprojw, act(kFch, l), N,
                         4 * C, C);
    ops.matmul_bwd(tmp_c_, g.fcw, g.fcb, d4c_, act(kLn2, l), p.fcw, N, C, 4 * C);
    ops.layernorm_bwd(dres_, g.ln2w, g.ln2b, tmp_c_, act(kRes2, l), p.ln2w, ln2_stats, ln2_stats + sBT, N, C);
    // Attention: res2 = x + attn(ln1(x)) Wo^T + bo; dres_ now holds d(res2).
    ops.matmul_bwd(tmp_c_, g.attprojw, g.attprojb, dres_, act(kAtty, l), p.attprojw, N, C, C);
    ops.attention_bwd(dqkv_, tmp_c_, act(kQkv, l), act(kAtty, l), stats(kLse, l), attn_scratch_, B, T, C, NH,
                      AttentionMask{});
    ops.matmul_bwd(tmp_c_, g.qkvw, g.qkvb, dqkv_, act(kLn1, l), p.qkvw, N, C, 3 * C);
    ops.layernorm_bwd(dres_, g.ln1w, g.ln1b, tmp_c_, x, p.ln1w, ln1_stats, ln1_stats + sBT, N, C);
    if (trace_) {
      for (int& id : trace_saved_[l]) trace_free(id, "backward");
      trace_free(l == 0 ? trace_encoded_ : trace_block_out_[l - 1], "backward");
    }
  }
  trace_phase("backward embedding", -1);
  ops.embedding_bwd(g0 + wte_off_ * ge_, g0 + wpe_off_ * ge_, dres_, tokens, B, T, C);
  trace_free(trace_losses_, "backward");
}

void GptModel::set_memory_trace(MemoryTrace* trace) {
  trace_ = trace;
  trace_saved_.assign(cfg_.n_layer, {});
  for (auto& ids : trace_saved_) ids.fill(-1);
  trace_block_out_.assign(cfg_.n_layer, -1);
  trace_encoded_ = trace_lnf_ = trace_logits_ = trace_losses_ = -1;
}

void GptModel::trace_phase(const char* name, int layer) {
  if (trace_) trace_->phase(name, layer);
  if (profiler_) profiler_->phase(name, layer);
}

void GptModel::trace_alloc(int& id, const char* name, MemoryCategory c, size_t bytes, int layer,
                           const char* phase) {
  if (!trace_) return;
  if (id >= 0) trace_->free(id, phase);  // overwritten (e.g. the next micro-batch)
  id = trace_->alloc(name, c, bytes, layer, phase);
}

void GptModel::trace_free(int& id, const char* phase) {
  if (!trace_ || id < 0) return;
  trace_->free(id, phase);
  id = -1;
}

}  // namespace anvil
