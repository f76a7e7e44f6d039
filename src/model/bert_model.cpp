#include "model/bert_model.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "anvil/rng.hpp"
#include "core/half.hpp"

namespace anvil {
namespace {
constexpr const char* kSavedNames[] = {"qkv",
                                       "attention output",
                                       "attention lse",
                                       "attention residual",
                                       "attention LayerNorm mean/rstd",
                                       "attention LayerNorm output",
                                       "mlp pre-activation",
                                       "mlp activation",
                                       "mlp residual",
                                       "output LayerNorm mean/rstd"};

// n elements of a compute-type device buffer (fp32, bf16 or fp16) -> fp32 on the host.
void copy_widened_to_host(Device& dev, float* dst, const void* src, size_t n, DType compute) {
  if (compute == DType::F32) {
    dev.copy_to_host(dst, src, n * sizeof(float));
    return;
  }
  std::vector<uint16_t> half(n);
  dev.copy_to_host(half.data(), src, n * sizeof(uint16_t));
  const bool bf16 = compute == DType::BF16;
  for (size_t i = 0; i < n; ++i) dst[i] = bf16 ? bf16_to_float(half[i]) : fp16_to_float(half[i]);
}
}  // namespace

BertModel::BertModel(TransformerConfig cfg, int max_batch, int max_seq, bool training,
                     CheckpointPolicy checkpointing, OpsPrecision precision, bool share_grad_memory)
    : cfg_(std::move(cfg)),
      store_(ParamLayout::bert(cfg_), precision, training),
      B_(max_batch),
      T_(max_seq),
      training_(training),
      checkpointing_(checkpointing),
      share_grad_memory_(share_grad_memory && training),
      ae_(dtype_bits(precision.compute) / 8),
      ge_(dtype_bits(precision.grad) / 8) {
  if (training) {
    p_hidden_ = float(cfg_.hidden_dropout_prob), p_attn_ = float(cfg_.attention_probs_dropout_prob);
    p_cls_ = float(cfg_.classifier_dropout_prob());
  }
  ANVIL_REQUIRE(checkpointing.every >= 1, "gradient_checkpointing_every must be >= 1, got {}",
                checkpointing.every);
  cfg_.validate();
  ANVIL_REQUIRE(max_batch >= 1, "batch size must be >= 1, got {}", max_batch);
  ANVIL_REQUIRE(max_seq >= 1 && max_seq <= cfg_.block_size,
                "sequence length {} must be between 1 and the model's max_position_embeddings {}", max_seq,
                cfg_.block_size);
  auto off = [&](const std::string& name) { return store_.layout().get(name).offset; };
  wte_off_ = off("bert.embeddings.word_embeddings.weight");
  wpe_off_ = off("bert.embeddings.position_embeddings.weight");
  wtt_off_ = off("bert.embeddings.token_type_embeddings.weight");
  lnew_off_ = off("bert.embeddings.LayerNorm.weight");
  lneb_off_ = off("bert.embeddings.LayerNorm.bias");
  poolw_off_ = off("bert.pooler.dense.weight");
  poolb_off_ = off("bert.pooler.dense.bias");
  clsw_off_ = off("classifier.weight");
  clsb_off_ = off("classifier.bias");
  const size_t C = cfg_.n_embd;
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const std::string p = "bert.encoder.layer." + std::to_string(l) + ".";
    auto at = [&](const char* name) { return off(p + name); };
    const size_t q = at("attention.self.query.weight"), qb = at("attention.self.query.bias");
    // The fused QKV GEMM reads query, key and value as one [3C, C] matrix and one [3C] bias.
    ANVIL_ASSERT(at("attention.self.key.weight") == q + C * C &&
                     at("attention.self.value.weight") == q + 2 * C * C &&
                     at("attention.self.key.bias") == qb + C && at("attention.self.value.bias") == qb + 2 * C,
                 "layer {}: query, key and value are not contiguous in the parameter layout", l);
    layer_offsets_.push_back({q, qb, at("attention.output.dense.weight"), at("attention.output.dense.bias"),
                              at("attention.output.LayerNorm.weight"), at("attention.output.LayerNorm.bias"),
                              at("intermediate.dense.weight"), at("intermediate.dense.bias"),
                              at("output.dense.weight"), at("output.dense.bias"),
                              at("output.LayerNorm.weight"), at("output.LayerNorm.bias")});
  }
}

void BertModel::plan_memory(MemoryPlan& plan, DeviceKind backend) {
  using M = MemoryCategory;
  const size_t f = sizeof(float), a = ae_;
  const size_t L = cfg_.n_layer, C = cfg_.n_embd, NH = cfg_.n_head, F = cfg_.ffn_size(), NL = cfg_.num_labels;
  const size_t B = B_, BT = size_t(B_) * T_;
  store_.plan_memory(plan, share_grad_memory_);
  // The losses first: the trainer sums them after backward, so they must lie below everything gradients in
  // activation memory may reuse (plan_shared_grads).
  i_losses_ = plan.add("losses", M::Activations, B * f);
  i_emb_sum_ = plan.add("embedding sum", M::Activations, BT * C * a);
  i_emb_stats_ = plan.add("embedding LayerNorm mean/rstd", M::Activations, 2 * BT * f);
  i_encoded_ = plan.add("embedding output", M::Activations, BT * C * a);
  const size_t per_layer[kSavedKinds] = {3 * BT * C * a, BT * C * a, B * NH * T_ * f, BT * C * a, 2 * BT * f,
                                         BT * C * a,     BT * F * a, BT * F * a,      BT * C * a, 2 * BT * f};
  for (int k = 0; k < kSavedKinds; ++k) saved_[k].bytes = per_layer[k];
  // Checkpointed blocks' activations of the recomputed kinds (and every block's GELU output) live in one
  // recompute buffer per kind.
  for (int k = 0; k < kSavedKinds; ++k) {
    bool any = false;
    for (size_t l = 0; l < L; ++l) any = any || recomputed(k, int(l));
    saved_[k].i_recompute =
        any ? plan.add(std::string("recompute: ") + kSavedNames[k], M::Recompute, saved_[k].bytes) : SIZE_MAX;
  }
  i_cls_ = plan.add("first-token rows", M::Activations, B * C * a);
  i_first_rows_ =
      plan.add("last block: [CLS] rows of its input and attention output", M::Activations, 2 * B * C * a);
  i_pooled_ = plan.add("pooler output", M::Activations, B * C * a);
  if (p_cls_ > 0) i_cls_in_ = plan.add("classifier input (after dropout)", M::Activations, B * C * a);
  i_logits_ = plan.add("logits", M::Activations, B * NL * a);
  // Saved activations, layer by layer (one buffer per block: its stored kinds, then its output), last: the
  // blocks backward has finished with form one region at the top, which grows downwards (plan_shared_grads).
  act_offset_.assign(L, {});
  i_block_acts_.assign(L, 0);
  for (size_t l = 0; l < L; ++l) {
    size_t bytes = 0;
    for (int k = 0; k < kSavedKinds; ++k) {
      act_offset_[l][k] = recomputed(k, int(l)) ? SIZE_MAX : bytes;
      if (!recomputed(k, int(l))) bytes += MemoryPlan::aligned(saved_[k].bytes);
    }
    act_offset_[l][kSavedKinds] = bytes;  // the block output
    bytes += BT * C * a;
    i_block_acts_[l] = plan.add("block " + std::to_string(l) + " activations", M::Activations, bytes);
  }
  if (training_ && share_grad_memory_) plan_shared_grads(plan);
  i_attn_scratch_ = plan.add(
      "attention scratch", M::Workspace,
      attention_scratch_bytes(backend, store_.precision().compute, B_, T_, int(C), int(NH), p_attn_ > 0));
  if (has_dropout()) i_dropout_state_ = plan.add("dropout state", M::Workspace, sizeof(DropoutState));
  if (training_) {
    i_dlogits_ = plan.add("logits gradient", M::Workspace, B * NL * a);
    i_dhead_ = plan.add("pooler gradients", M::Workspace, 2 * B * C * a);
    i_d0_ = plan.add("residual gradient", M::Workspace, BT * C * a);
    i_d1_ = plan.add("residual gradient 2", M::Workspace, BT * C * a);
    i_dfc_ = plan.add("mlp gradient", M::Workspace, BT * F * a);
    i_dqkv_ = plan.add("qkv gradient", M::Workspace, 3 * BT * C * a);
  }
}

void BertModel::plan_shared_grads(MemoryPlan& plan) {
  // With one micro-batch per step, a gradient is written first in its unit's backward and read last by the
  // optimizer, before the next forward. Backward runs head, blocks L-1 .. 0, embedding, and frees each
  // block's saved activations as it goes, so the flat gradient buffer (embedding, blocks 0 .. L-1, final)
  // is placed as low as these hold:
  //   - the final unit's gradients (head backward: every activation is live) lie above all activations;
  //   - block l's gradients lie above block l's activations (blocks 0 .. l are live, and below it);
  //   - the embedding's gradients (written last: only the embedding activations are live) lie above them.
  // Block l's gradients then reuse the memory of blocks above l, whose backward is done.
  const auto end_of = [&](size_t i) {
    const PlannedBuffer& b = plan.buffers()[i];
    return b.offset + MemoryPlan::aligned(b.bytes);
  };
  const std::vector<ParamUnit>& units = store_.layout().units();
  const int L = cfg_.n_layer;
  ANVIL_ASSERT(units.size() == size_t(L) + 2 && units.back().name == "final",
               "the BERT layout is not embedding, {} blocks, final", L);
  const auto grad_offset = [&](int unit) { return units[unit].offset * ge_; };  // bytes, in the buffer
  size_t base = end_of(i_encoded_);
  for (int l = 0; l < L; ++l)
    base = std::max(base, end_of(i_block_acts_[l]) - std::min(end_of(i_block_acts_[l]), grad_offset(l + 1)));
  base = std::max(base,
                  end_of(i_block_acts_[L - 1]) - std::min(end_of(i_block_acts_[L - 1]), grad_offset(L + 1)));
  base = MemoryPlan::aligned(base);
  i_shared_grads_ = plan.add_shared("gradients (in activation memory backward is done with)",
                                    MemoryCategory::Gradients, store_.layout().total_numel() * ge_, base);
}

void BertModel::bind(const Arena& ar) {
  store_.bind(ar);
  if (share_grad_memory_) store_.bind_grads(ar.get<void>(i_shared_grads_));
  emb_sum_ = ar.get<void>(i_emb_sum_), emb_stats_ = ar.get<float>(i_emb_stats_),
  encoded_ = ar.get<void>(i_encoded_);
  block_acts_.assign(cfg_.n_layer, nullptr);
  for (int l = 0; l < cfg_.n_layer; ++l) block_acts_[l] = ar.get<char>(i_block_acts_[l]);
  for (SavedKind& sk : saved_)
    sk.recompute = sk.i_recompute != SIZE_MAX ? ar.get<char>(sk.i_recompute) : nullptr;
  cls_ = ar.get<void>(i_cls_), pooled_ = ar.get<void>(i_pooled_);
  x_first_ = ar.get<void>(i_first_rows_), atty_first_ = at(x_first_, size_t(B_) * cfg_.n_embd);
  cls_in_ = p_cls_ > 0 ? ar.get<void>(i_cls_in_) : nullptr;
  dropout_state_ = has_dropout() ? ar.get<DropoutState>(i_dropout_state_) : nullptr;
  logits_ = ar.get<void>(i_logits_), losses_ = ar.get<float>(i_losses_);
  attn_scratch_ = ar.get<void>(i_attn_scratch_);
  if (training_) {
    dlogits_ = ar.get<void>(i_dlogits_), dhead_ = ar.get<void>(i_dhead_);
    d0_ = ar.get<void>(i_d0_), d1_ = ar.get<void>(i_d1_), dfc_ = ar.get<void>(i_dfc_),
    dqkv_ = ar.get<void>(i_dqkv_);
  }
}

void BertModel::copy_logits_to_host(Device& dev, float* dst, int B) const {
  ANVIL_ASSERT(B >= 0 && B <= B_, "copy_logits_to_host: {} rows of a model planned for {}", B, B_);
  copy_widened_to_host(dev, dst, logits_, size_t(B) * cfg_.num_labels, store_.precision().compute);
}

const void* BertModel::last_hidden_state() const {
  ANVIL_ASSERT(!first_rows_last_,
               "last_hidden_state: the last forward computed the last block's [CLS] rows only "
               "(set_full_last_hidden_state(true) first)");
  return block_out(cfg_.n_layer - 1);
}

void BertModel::copy_last_hidden_state_to_host(Device& dev, float* dst, int B, int T) const {
  ANVIL_ASSERT(B >= 0 && T >= 0 && B <= B_ && T <= T_,
               "copy_last_hidden_state_to_host: {}x{} of a model planned for {}x{}", B, T, B_, T_);
  copy_widened_to_host(dev, dst, last_hidden_state(), size_t(B) * T * cfg_.n_embd,
                       store_.precision().compute);
}

void BertModel::copy_pooled_output_to_host(Device& dev, float* dst, int B) const {
  ANVIL_ASSERT(B >= 0 && B <= B_, "copy_pooled_output_to_host: {} rows of a model planned for {}", B, B_);
  copy_widened_to_host(dev, dst, pooled_, size_t(B) * cfg_.n_embd, store_.precision().compute);
}

void BertModel::init_weights(uint64_t seed, Device& dev) const {
  // nn.Embedding(padding_idx=pad_token_id) starts its padding row at zero.
  const float std = float(cfg_.initializer_range);
  store_.init(seed, ParamInit{.std = std, .residual_std = std, .zero_row = cfg_.pad_token_id}, dev);
}

BertModel::LayerParams BertModel::layer_params(void* base, size_t e, int l) const {
  const LayerTensors<size_t>& o = layer_offsets_[l];
  char* b = static_cast<char*>(base);
  return {b + o.qkvw * e, b + o.qkvb * e, b + o.attow * e, b + o.attob * e, b + o.ln1w * e, b + o.ln1b * e,
          b + o.fcw * e,  b + o.fcb * e,  b + o.projw * e, b + o.projb * e, b + o.ln2w * e, b + o.ln2b * e};
}

BertModel::BlockLinears BertModel::block_linears(int l, bool with_grads) const {
  const LayerParams p = layer_params(store_.weights(), ae_, l);
  const int C = cfg_.n_embd, F = cfg_.ffn_size();
  const OpsPrecision pr = store_.precision();
  BlockLinears lin{Linear(p.qkvw, p.qkvb, C, 3 * C, pr), Linear(p.attow, p.attob, C, C, pr),
                   Linear(p.fcw, p.fcb, C, F, pr), Linear(p.projw, p.projb, F, C, pr)};
  if (!with_grads) return lin;
  const LayerParams g = layer_params(store_.grads(), ge_, l);
  return {lin.qkv.with_grads(g.qkvw, g.qkvb), lin.attn_out.with_grads(g.attow, nullptr),
          lin.fc.with_grads(g.fcw, g.fcb), lin.proj.with_grads(g.projw, nullptr)};
}

Linear BertModel::pooler_linear(bool with_grads) const {
  const Linear l(at(store_.weights(), poolw_off_), at(store_.weights(), poolb_off_), cfg_.n_embd, cfg_.n_embd,
                 store_.precision());
  return with_grads ? l.with_grads(store_.grad_at(poolw_off_), store_.grad_at(poolb_off_)) : l;
}

Linear BertModel::classifier_linear(bool with_grads) const {
  const Linear l(at(store_.weights(), clsw_off_), at(store_.weights(), clsb_off_), cfg_.n_embd,
                 cfg_.num_labels, store_.precision());
  return with_grads ? l.with_grads(store_.grad_at(clsw_off_), store_.grad_at(clsb_off_)) : l;
}

bool BertModel::recomputed(int kind, int layer) const {
  // The MLP's GELU output (4C a token, a quarter of a block's saved activations) is never stored: the
  // forward writes it into the recompute buffer for the output projection, and the backward recomputes it
  // from the stored pre-activation (one elementwise pass) for that projection's weight gradient.
  if (kind == kFchGelu) return true;
  if (!checkpointing_.checkpointed(layer)) return false;
  // LayerNorm 2 produced the stored block output: its statistics (2 floats a row) are kept, so the
  // recompute stops at its input.
  if (kind == kLn2Stats) return false;
  if (checkpointing_.mode == CheckpointMode::Full) return true;
  return kind != kQkv && kind != kAtty && kind != kLse;  // selective keeps the attention tensors
}

void* BertModel::act(int kind, int layer) const {
  const size_t offset = act_offset_[layer][kind];
  return offset == SIZE_MAX ? saved_[kind].recompute : block_acts_[layer] + offset;
}

AttentionMask BertModel::layer_mask(const AttentionMask& base, int l) const {
  AttentionMask m = base;
  if (fwd_dropout_ && p_attn_ > 0) {
    m.dropout = p_attn_, m.dropout_state = dropout_state_, m.dropout_site = site(l, 0);
  }
  return m;
}

RowDropout BertModel::hidden_row_dropout(int l, int T, uint32_t s) const {
  // In the [CLS]-rows block row b is position (b, 0): index b * T * C + c of the whole [B, T, C] tensor.
  return {p_hidden_, dropout_state_, s, size_t(first_rows_only(l) ? T : 1) * cfg_.n_embd};
}

void BertModel::hidden_dropout(Ops& ops, void* y, const void* x, int l, int B, int T, uint32_t s) const {
  const RowDropout d = hidden_row_dropout(l, T, s);
  const int C = cfg_.n_embd;
  if (first_rows_only(l))
    ops.dropout_rows(y, x, B, C, d.index_pitch, d.p, d.state, d.site);
  else
    ops.dropout(y, x, size_t(B) * T * C, d.p, d.state, d.site);
}

void BertModel::block_forward(Ops& ops, int l, int B, int T, const AttentionMask& mask,
                              bool only_recomputed) {
  const int C = cfg_.n_embd, NH = cfg_.n_head, F = cfg_.ffn_size();
  const float eps = float(cfg_.layer_norm_eps);
  const size_t sBT = size_t(B_) * T_;
  const LayerParams p = layer_params(store_.weights(), ae_, l);
  const BlockLinears lin = block_linears(l, false);
  const void* x = l == 0 ? encoded_ : block_out(l - 1);
  void *qkv = act(kQkv, l), *atty = act(kAtty, l), *res1 = act(kRes1, l), *h1 = act(kH1, l);
  void *fch = act(kFch, l), *fch_gelu = act(kFchGelu, l), *res2 = act(kRes2, l);
  float *ln1_stats = stats(kLn1Stats, l), *ln2_stats = stats(kLn2Stats, l);
  auto run = [&](int kind) { return !only_recomputed || recomputed(kind, l); };
  // After the attention, N rows: all B x T, or the B [CLS] rows (kept in their own buffers: a recompute of
  // the attention gives the same values).
  const int N = first_rows_only(l) ? B : B * T;
  const void *xr = x, *attyr = atty;
  if (first_rows_only(l)) {
    // Only query 0 of each sequence is needed: the keys and values of every token ([B*T, 2C] in the QKV
    // buffer), the query of the [CLS] rows ([B, C] after them), and their attention alone.
    if (!only_recomputed) ops.first_token_fwd(x_first_, x, B, T, C);
    const FirstQueryQkv f = first_query_qkv(qkv, B, T);
    if (run(kQkv)) {
      lin.qkv.out_rows(C, 2 * C).forward(ops, f.kv, x, B * T);
      lin.qkv.out_rows(0, C).forward(ops, f.q, x_first_, B);
    }
    if (run(kAtty))
      ops.attention_first_query_fwd(atty_first_, stats(kLse, l), f.q, f.kv, B, T, C, NH, layer_mask(mask, l));
    xr = x_first_, attyr = atty_first_;
  } else {
    if (run(kQkv)) lin.qkv.forward(ops, qkv, x, B * T);
    if (run(kAtty))
      ops.attention_fwd(atty, stats(kLse, l), qkv, attn_scratch_, B, T, C, NH, layer_mask(mask, l));
  }
  const bool drop = fwd_dropout_ && p_hidden_ > 0;
  // The hidden dropout of a site, for the fused ops (none without dropout).
  const auto row_dropout = [&](uint32_t s) { return drop ? hidden_row_dropout(l, T, s) : RowDropout{}; };
  // res1 = x + the attention output projection (after dropout), the projection written in place; h1 its
  // LayerNorm, in one pass with the dropout and the residual (exactly the three ops in sequence).
  if (run(kRes1)) lin.attn_out.forward(ops, res1, attyr, N);
  if (run(kRes1) && run(kH1)) {
    ops.residual_layernorm_fwd(res1, h1, ln1_stats, ln1_stats + sBT, res1, xr, p.ln1w, p.ln1b, N, C, eps,
                               row_dropout(site(l, 1)));
  } else if (run(kRes1)) {
    if (drop) hidden_dropout(ops, res1, res1, l, B, T, site(l, 1));
    ops.residual_fwd(res1, res1, xr, size_t(N) * C);
  } else if (run(kH1)) {
    ops.layernorm_fwd(h1, ln1_stats, ln1_stats + sBT, res1, p.ln1w, p.ln1b, N, C, eps);
  }
  if (cfg_.exact_gelu()) {
    if (run(kFch)) lin.fc.forward(ops, fch, h1, N);
    if (run(kFchGelu)) ops.gelu_erf_fwd(fch_gelu, fch, size_t(N) * F);
  } else if (run(kFch)) {
    lin.fc.forward_gelu(ops, fch_gelu, fch, h1, N);  // GELU in the GEMM's epilogue
  } else if (run(kFchGelu)) {
    ops.gelu_fwd(fch_gelu, fch, size_t(N) * F);
  }
  // res2 = h1 + the MLP output (after dropout); the block output is its LayerNorm, fused with them unless
  // this is a checkpoint recompute (which rebuilds res2 only: the output is stored).
  if (run(kRes2)) {
    lin.proj.forward(ops, res2, fch_gelu, N);
    if (only_recomputed) {
      if (drop) hidden_dropout(ops, res2, res2, l, B, T, site(l, 2));
      ops.residual_fwd(res2, res2, h1, size_t(N) * C);
    }
  }
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
  ops.residual_layernorm_fwd(res2, block_out(l), ln2_stats, ln2_stats + sBT, res2, h1, p.ln2w, p.ln2b, N, C,
                             eps, row_dropout(site(l, 2)));
  trace_alloc(trace_block_out_[l], "block output", MemoryCategory::Activations, sBT * C * ae_, l, "forward");
}

void BertModel::forward(Ops& ops, const int32_t* tokens, const int32_t* token_types, const int32_t* lengths,
                        const void* labels, int B, int T, float grad_scale, bool write_grad) {
  ANVIL_ASSERT(B >= 1 && T >= 1 && B <= B_ && T <= T_, "forward shape {}x{} outside the planned {}x{}", B, T,
               B_, T_);
  ANVIL_ASSERT(!write_grad || (training_ && labels), "write_grad needs a training model and labels");
  ANVIL_ASSERT(ops.precision().compute == store_.precision().compute &&
                   ops.precision().grad == store_.precision().grad,
               "the ops' precision does not match the model's");
  const int C = cfg_.n_embd, L = cfg_.n_layer, NL = cfg_.num_labels, N = B * T;
  const size_t sBT = size_t(B_) * T_;
  const AttentionMask mask{false, lengths};
  head_grad_ready_ = false;
  first_rows_last_ = !full_last_hidden_state_;
  // Dropout in a training forward only; each draws the masks of the next micro-batch.
  fwd_dropout_ = write_grad && has_dropout();
  if (fwd_dropout_) ops.dropout_next_micro(dropout_state_);
  trace_phase("forward", -1);
  store_.acquire(0);
  ops.bert_embedding_fwd(emb_sum_, tokens, token_types, at(store_.weights(), wte_off_),
                         at(store_.weights(), wpe_off_), at(store_.weights(), wtt_off_), B, T, C);
  ops.layernorm_fwd(encoded_, emb_stats_, emb_stats_ + sBT, emb_sum_, at(store_.weights(), lnew_off_),
                    at(store_.weights(), lneb_off_), N, C, float(cfg_.layer_norm_eps));
  if (fwd_dropout_ && p_hidden_ > 0)
    ops.dropout(encoded_, encoded_, size_t(N) * C, p_hidden_, dropout_state_, site(L, 0));
  store_.release(0);
  trace_alloc(trace_embedding_, "embedding sum + LayerNorm output + mean/rstd", MemoryCategory::Activations,
              2 * sBT * C * ae_ + 2 * sBT * sizeof(float), -1, "forward");
  for (int l = 0; l < L; ++l) {
    trace_phase("forward", l);
    store_.acquire(1 + l);
    block_forward(ops, l, B, T, mask, false);
    store_.release(1 + l);
  }
  trace_phase("forward head", -1);
  store_.acquire(L + 1);
  // Pooler: tanh(dense(first token)), the tanh in place; then the classifier.
  ops.first_token_fwd(cls_, block_out(L - 1), B, first_rows_last_ ? 1 : T, C);
  pooler_linear(false).forward(ops, pooled_, cls_, B);
  ops.tanh_fwd(pooled_, pooled_, size_t(B) * C);
  const void* cls_input = pooled_;
  if (fwd_dropout_ && p_cls_ > 0) {
    ops.dropout(cls_in_, pooled_, size_t(B) * C, p_cls_, dropout_state_, site(L, 1));
    cls_input = cls_in_;
  }
  classifier_linear(false).forward(ops, logits_, cls_input, B);
  store_.release(L + 1);
  trace_alloc(trace_head_, "pooler input/output + logits + losses", MemoryCategory::Activations,
              (2 * size_t(B_) * C + size_t(B_) * NL) * ae_ + size_t(B_) * sizeof(float), -1, "forward");
  if (!labels) return;
  ops.classification_loss(losses_, write_grad ? dlogits_ : nullptr, logits_, labels, B, NL, grad_scale);
  head_grad_ready_ = write_grad;
  fwd_B_ = B, fwd_T_ = T;
}

void BertModel::block_backward(Ops& ops, int l, int B, int T, const AttentionMask& mask) {
  const int C = cfg_.n_embd, NH = cfg_.n_head, F = cfg_.ffn_size();
  const bool first_rows = first_rows_only(l);
  const int N = first_rows ? B : B * T;  // rows after the attention (block_forward)
  const size_t sBT = size_t(B_) * T_;
  const LayerParams p = layer_params(store_.weights(), ae_, l);
  const LayerParams g = layer_params(store_.grads(), ge_, l);
  const BlockLinears lin = block_linears(l, true);
  const void* x = l == 0 ? encoded_ : block_out(l - 1);
  const float* ln1_stats = stats(kLn1Stats, l);
  const float* ln2_stats = stats(kLn2Stats, l);
  // A block's output gradient arrives as a pair, d0_ + carry, never added up in memory: the LayerNorm that
  // reads it sums it (layernorm_bwd_sum). The carry is the residual path the block above left (see the end
  // of this function): none for the top block, dfc_ below the [CLS]-rows block, else d1_. Nothing writes it
  // in between (a checkpoint recompute writes activations and recompute buffers only).
  const void* carry = l == cfg_.n_layer - 1 ? nullptr : first_rows_only(l + 1) ? dfc_ : d1_;
  // With dropout, a projection's output gradient is the LayerNorm's input gradient through the mask (here in
  // a free buffer), while the residual path keeps the unmasked one. The LayerNorm backward writes both and
  // the projection's bias gradient (its column sums) in one pass.
  const bool drop = fwd_dropout_ && p_hidden_ > 0;
  const auto branch = [&](void* masked, void* dbias, uint32_t s) {
    return drop ? BranchGrad{masked, dbias, hidden_row_dropout(l, T, s)} : BranchGrad{nullptr, dbias, {}};
  };
  // Output LayerNorm: d1_ = d(res2), res2 = h1 + f Wout^T + bout (overwriting a carry in d1_); the output
  // projection's output gradient dproj (masked: in the free QKV-gradient buffer) and its bias gradient.
  ops.layernorm_bwd_sum(d1_, g.ln2w, g.ln2b, d0_, carry, act(kRes2, l), p.ln2w, ln2_stats, ln2_stats + sBT, N,
                        C, branch(dqkv_, g.projb, site(l, 2)));
  const void* dproj = drop ? dqkv_ : d1_;
  // MLP: dfc_ = d(pre-activation); then d0_ = its path's part of d(h1), which with d(res2) in d1_ is d(h1).
  // The output projection's weight gradient needs the GELU output, which is rebuilt from the pre-activation
  // (a checkpointed block's recompute already did; with exact GELU, in one pass with GELU's backward and the
  // MLP input projection's bias gradient, between the output projection's input and weight gradients).
  const bool rebuild_gelu = !checkpointing_.checkpointed(l);
  if (rebuild_gelu && !cfg_.exact_gelu()) ops.gelu_fwd(act(kFchGelu, l), act(kFch, l), size_t(N) * F);
  void* fcb_grad = g.fcb;  // null once a fused op has added it
  if (cfg_.exact_gelu() && rebuild_gelu) {
    lin.proj.with_grads(nullptr, nullptr).backward(ops, dfc_, dproj, nullptr, N);
    ops.gelu_erf_fwd_bwd_bias(act(kFchGelu, l), dfc_, g.fcb, act(kFch, l), dfc_, N, F);
    fcb_grad = nullptr;
    lin.proj.backward(ops, nullptr, dproj, act(kFchGelu, l), N, dw_write());
  } else if (cfg_.exact_gelu()) {
    lin.proj.backward(ops, dfc_, dproj, act(kFchGelu, l), N, dw_write());
    ops.gelu_erf_bwd(dfc_, act(kFch, l), dfc_, size_t(N) * F);
  } else {
    lin.proj.backward_dgelu(ops, dfc_, dproj, act(kFchGelu, l), act(kFch, l), N, dw_write());
  }
  lin.fc.with_grads(g.fcw, fcb_grad).backward(ops, d0_, dfc_, act(kH1, l), N, dw_write());
  // Attention LayerNorm of d(h1) = d0_ + d1_: d1_ = d(res1), res1 = x + a Wo^T + bo (in place of d(res2));
  // the attention projection's output gradient (masked: in the free MLP-gradient buffer) and bias gradient.
  ops.layernorm_bwd_sum(d1_, g.ln1w, g.ln1b, d0_, d1_, act(kRes1, l), p.ln1w, ln1_stats, ln1_stats + sBT, N,
                        C, branch(dfc_, g.attob, site(l, 1)));
  const void* dattn_proj = drop ? dfc_ : d1_;
  lin.attn_out.backward(ops, d0_, dattn_proj, first_rows ? atty_first_ : act(kAtty, l), N, dw_write());
  if (!first_rows) {
    ops.attention_bwd(dqkv_, d0_, act(kQkv, l), act(kAtty, l), stats(kLse, l), attn_scratch_, B, T, C, NH,
                      layer_mask(mask, l));
    lin.qkv.backward(ops, d0_, dqkv_, x, B * T, dw_write());
    return;  // d(x) = d0_ (the attention path) + the carry d(res1) in d1_: the block below sums them
  }
  // The [CLS]-rows block: the attention's output gradient is d0_'s B rows; the gradients of the keys and
  // values ([B*T, 2C]) and of the [CLS] queries ([B, C]) go into the QKV-gradient buffer laid out as the
  // forward's QKV buffer, and through the two halves of the QKV projection: d(x) from the keys and values
  // into d0_, from the queries (B rows, in the MLP-gradient buffer dfc_, free since the attention
  // projection's backward read it: dqkv_ has no room for them when T is 1) added to the [CLS] rows of
  // d(res1).
  const FirstQueryQkv f = first_query_qkv(act(kQkv, l), B, T);
  const FirstQueryQkv df = first_query_qkv(dqkv_, B, T);
  ops.attention_first_query_bwd(df.q, df.kv, d0_, f.q, f.kv, atty_first_, stats(kLse, l), B, T, C, NH,
                                layer_mask(mask, l));
  void* dx_first = dfc_;
  lin.qkv.out_rows(C, 2 * C).backward(ops, d0_, df.kv, x, B * T, dw_write());
  lin.qkv.out_rows(0, C).backward(ops, dx_first, df.q, x_first_, B, dw_write());
  ops.residual_fwd(d1_, d1_, dx_first, size_t(B) * C);
  // d(x) = d0_ + the carry: d(res1) plus the queries' part at positions (b, 0) and zero elsewhere, in dfc_
  // (read into d1_ above, so free again). The block below sums them.
  ops.first_token_bwd(dfc_, d1_, B, T, C);
}

void BertModel::backward(Ops& ops, const int32_t* tokens, const int32_t* token_types, const int32_t* lengths,
                         int B, int T) {
  ANVIL_ASSERT(training_, "backward on a model planned without gradients");
  ANVIL_ASSERT(head_grad_ready_, "backward() needs the preceding forward() with labels and write_grad");
  ANVIL_ASSERT(B == fwd_B_ && T == fwd_T_, "backward shape {}x{} differs from the forward's {}x{}", B, T,
               fwd_B_, fwd_T_);
  head_grad_ready_ = false;
  const int C = cfg_.n_embd, L = cfg_.n_layer, N = B * T;
  const size_t sBT = size_t(B_) * T_;
  const AttentionMask mask{false, lengths};
  char* g0 = static_cast<char*>(store_.grads());
  auto grad = [&](size_t off) { return g0 + off * ge_; };
  // Gradients in activation memory (plan_shared_grads) hold activations until their unit's backward: each
  // unit's are zeroed just before it. The matrices of the blocks and the head (their decay part) are written
  // once, by weight-gradient GEMMs that overwrite (dw_write()), so only the rest (biases and LayerNorm
  // parameters, which accumulate) needs zeroing; the embedding tables accumulate, so that unit is zeroed
  // whole.
  const auto zero_unit_grads = [&](int unit) {
    if (!share_grad_memory_) return;
    const ParamUnit& u = store_.layout().units()[unit];
    const size_t skip = unit == 0 ? 0 : u.decay_numel;
    ops.device().fill_zero(grad(u.offset + skip), (u.numel - skip) * ge_);
  };

  // Head: classifier, tanh (in place), pooler, then the first-token rows into d0_ (zero elsewhere).
  trace_phase("backward head", -1);
  store_.acquire(L + 1);
  zero_unit_grads(L + 1);
  void* dpooled = dhead_;
  void* dcls = at(dhead_, size_t(B_) * C);
  const bool cls_drop = fwd_dropout_ && p_cls_ > 0;
  classifier_linear(true).backward(ops, dpooled, dlogits_, cls_drop ? cls_in_ : pooled_, B, dw_write());
  if (cls_drop) ops.dropout(dpooled, dpooled, size_t(B) * C, p_cls_, dropout_state_, site(L, 1));
  ops.tanh_bwd(dpooled, pooled_, dpooled, size_t(B) * C);
  pooler_linear(true).backward(ops, dcls, dpooled, cls_, B, dw_write());
  ops.first_token_bwd(d0_, dcls, B, first_rows_last_ ? 1 : T, C);
  store_.release(L + 1);
  store_.grads_ready(L + 1);
  trace_free(trace_head_, "backward");
  trace_free(trace_block_out_[L - 1], "backward");

  // Below the first unit with a trainable tensor (freeze_parameters: a frozen encoder) no gradient is
  // needed: those units' backward is skipped; their hooks still run, and the step zeroes their (frozen)
  // gradient memory before the norm.
  const int first = store_.layout().first_trainable_unit();
  for (int l = L - 1; l >= 0; --l) {
    if (1 + l < first) {
      store_.grads_ready(1 + l);
      if (trace_) {
        for (int& id : trace_saved_[l]) trace_free(id, "backward");
        if (l > 0) trace_free(trace_block_out_[l - 1], "backward");
      }
      continue;
    }
    store_.acquire(1 + l);
    if (checkpointing_.checkpointed(l)) {
      trace_phase("recompute", l);
      block_forward(ops, l, B, T, mask, true);
    }
    trace_phase("backward", l);
    zero_unit_grads(l + 1);
    block_backward(ops, l, B, T, mask);
    store_.release(1 + l);
    store_.grads_ready(1 + l);
    if (trace_) {
      for (int& id : trace_saved_[l]) trace_free(id, "backward");
      if (l > 0) trace_free(trace_block_out_[l - 1], "backward");  // this block's input
    }
  }

  // Embedding: its LayerNorm, then the three tables (the pad token's word row gets nothing, as in HF). Its
  // output gradient is d0_ + block 0's carry (block_backward); the dropout needs it materialised first.
  trace_phase("backward embedding", -1);
  if (first > 0) {
    store_.grads_ready(0);
    trace_free(trace_embedding_, "backward");
    return;
  }
  store_.acquire(0);
  zero_unit_grads(0);
  const void* carry = first_rows_only(0) ? dfc_ : d1_;
  if (fwd_dropout_ && p_hidden_ > 0) {
    ops.residual_fwd(d0_, d0_, carry, size_t(N) * C);
    ops.dropout(d0_, d0_, size_t(N) * C, p_hidden_, dropout_state_, site(L, 0));
    carry = nullptr;
  }
  ops.layernorm_bwd_sum(d1_, grad(lnew_off_), grad(lneb_off_), d0_, carry, emb_sum_,
                        at(store_.weights(), lnew_off_), emb_stats_, emb_stats_ + sBT, N, C);
  ops.bert_embedding_bwd(grad(wte_off_), grad(wpe_off_), grad(wtt_off_), d1_, tokens, token_types, B, T, C,
                         cfg_.pad_token_id);
  store_.release(0);
  store_.grads_ready(0);
  trace_free(trace_embedding_, "backward");
}

double BertModel::skipped_backward_flops_per_token(int seq_len) const {
  // The blocks below the first trainable unit skip their backward: 4 FLOPs per token per weight and bias of
  // their six Linears (training_flops_per_token's 6, less the forward's 2) and attention's 8 C T.
  const int skipped = std::clamp(store_.layout().first_trainable_unit() - 1, 0, cfg_.n_layer);
  const double C = cfg_.n_embd, F = cfg_.ffn_size();
  const double block_matmul = 4 * C * C + 4 * C + 2 * C * F + F + C;
  return skipped * (4.0 * block_matmul + 8.0 * C * seq_len);
}

void BertModel::set_memory_trace(MemoryTrace* trace) {
  trace_ = trace;
  trace_saved_.assign(cfg_.n_layer, {});
  for (auto& ids : trace_saved_) ids.fill(-1);
  trace_block_out_.assign(cfg_.n_layer, -1);
  trace_embedding_ = trace_head_ = -1;
}

void BertModel::trace_phase(const char* name, int layer) {
  if (trace_) trace_->phase(name, layer);
  if (profiler_) profiler_->phase(name, layer);
}

void BertModel::trace_alloc(int& id, const char* name, MemoryCategory c, size_t bytes, int layer,
                            const char* phase) {
  if (!trace_) return;
  if (id >= 0) trace_->free(id, phase);  // overwritten (e.g. the next micro-batch)
  id = trace_->alloc(name, c, bytes, layer, phase);
}

void BertModel::trace_free(int& id, const char* phase) {
  if (!trace_ || id < 0) return;
  trace_->free(id, phase);
  id = -1;
}

}  // namespace anvil
