// Binds the CPU reference kernels to the Ops contract, in the instance's storage types.
#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil {
namespace {

class CpuOps final : public Ops {
 public:
  CpuOps(Device& dev, OpsPrecision p) : dev_(dev), p_(p) {
    ANVIL_ASSERT(dev.kind() == DeviceKind::CPU, "CPU ops need the CPU device");
    validate_ops_precision(p);
  }
  Device& device() override { return dev_; }
  OpsPrecision precision() const override { return p_; }
  using Ops::attention_bwd;
  using Ops::attention_fwd;
  using Ops::attention_scratch_bytes;
  size_t attention_scratch_bytes(const AttentionShape& s, bool /*dropout: the same*/) const override {
    return cpu::attention_scratch_bytes(p_.compute, s);
  }
  void embedding_fwd(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T,
                     int C) override {
    cpu::embedding_fwd(p_.compute, out, tokens, wte, wpe, B, T, C);
  }
  void embedding_bwd(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                     int C) override {
    cpu::embedding_bwd(p_.compute, p_.grad, dwte, dwpe, dout, tokens, B, T, C);
  }
  void embedding_bwd_skip(void* dwte, const void* dout, const int32_t* tokens, int B, int T, int C,
                          int32_t skip_token) override {
    cpu::embedding_bwd_skip(p_.compute, p_.grad, dwte, dout, tokens, B, T, C, skip_token);
  }
  void bert_embedding_fwd(void* out, const int32_t* tokens, const int32_t* types, const void* wte,
                          const void* wpe, const void* wtt, int B, int T, int C) override {
    cpu::bert_embedding_fwd(p_.compute, out, tokens, types, wte, wpe, wtt, B, T, C);
  }
  void bert_embedding_bwd(void* dwte, void* dwpe, void* dwtt, const void* dout, const int32_t* tokens,
                          const int32_t* types, int B, int T, int C, int32_t skip_token) override {
    cpu::bert_embedding_bwd(p_.compute, p_.grad, dwte, dwpe, dwtt, dout, tokens, types, B, T, C, skip_token);
  }
  using Ops::layernorm_fwd;
  void layernorm_fwd(void* out, float* mean, float* rstd, const void* inp, const void* w, const void* b,
                     int N, int C, float eps) override {
    cpu::layernorm_fwd(p_.compute, out, mean, rstd, inp, w, b, N, C, eps);
  }
  void layernorm_bwd(void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                     const float* mean, const float* rstd, int N, int C) override {
    cpu::layernorm_bwd(p_.compute, p_.grad, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  using Ops::layernorm_bwd_sum;
  void layernorm_bwd_sum(void* dinp, void* dw, void* db, const void* dout, const void* dout2, const void* inp,
                         const void* w, const float* mean, const float* rstd, int N, int C,
                         const BranchGrad& branch) override {
    validate_branch_grad(branch, C, dinp);
    cpu::layernorm_bwd_sum(p_.compute, p_.grad, dinp, dw, db, dout, dout2, inp, w, mean, rstd, N, C);
    // The reference: the ops in sequence.
    const RowDropout& d = branch.drop;
    if (d.p > 0)
      cpu::dropout_rows(p_.compute, branch.dbranch, dinp, N, C, d.index_pitch, d.p, d.state, d.site);
    if (branch.dbias)
      cpu::matmul_bwd(p_.compute, p_.grad, nullptr, nullptr, branch.dbias, d.p > 0 ? branch.dbranch : dinp,
                      nullptr, nullptr, N, 1, C, false);
  }
  void matmul_fwd(void* out, const void* inp, const void* w, const void* bias, int N, int K,
                  int OC) override {
    cpu::matmul_fwd(p_.compute, out, inp, w, bias, N, K, OC);
  }
  void matmul_bwd(void* dinp, void* dw, void* dbias, const void* dout, const void* inp, const void* w, int N,
                  int K, int OC, GradWrite dw_write) override {
    cpu::matmul_bwd(p_.compute, p_.grad, dinp, dw, dbias, dout, inp, w, N, K, OC,
                    dw_write == GradWrite::Overwrite);
  }
  void gemm(const GemmSpec& g) override { cpu::gemm(p_.compute, p_.grad, g); }
  // The CPU composes the unfused ops (bit-identical to running them one after the other).
  void matmul_gelu_fwd(void* out, void* pre, const void* inp, const void* w, const void* bias, int N, int K,
                       int OC) override {
    cpu::matmul_fwd(p_.compute, pre, inp, w, bias, N, K, OC);
    cpu::gelu_fwd(p_.compute, out, pre, size_t(N) * OC);
  }
  void matmul_bwd_dgelu(void* dinp, void* dw, void* dbias, const void* dout, const void* inp, const void* w,
                        const void* gelu_pre, int N, int K, int OC, GradWrite dw_write) override {
    ANVIL_ASSERT(dinp, "matmul_bwd_dgelu needs dinp");
    cpu::matmul_bwd(p_.compute, p_.grad, dinp, dw, dbias, dout, inp, w, N, K, OC,
                    dw_write == GradWrite::Overwrite);
    cpu::gelu_bwd(p_.compute, dinp, gelu_pre, dinp, size_t(N) * K);
  }
  void attention_fwd(void* out, float* lse, const void* qkv, void* scratch, const AttentionShape& s,
                     const AttentionMask& mask) override {
    cpu::attention_fwd(p_.compute, out, lse, qkv, scratch, s, mask);
  }
  void attention_bwd(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                     void* scratch, const AttentionShape& s, const AttentionMask& mask) override {
    cpu::attention_bwd(p_.compute, dqkv, dout, qkv, out, lse, scratch, s, mask);
  }
  void rmsnorm_fwd(void* out, float* rstd, const void* inp, const void* w, int N, int C, float eps) override {
    cpu::rmsnorm_fwd(p_.compute, out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_bwd(void* dinp, void* dw, const void* dout, const void* inp, const void* w, const float* rstd,
                   int N, int C) override {
    cpu::rmsnorm_bwd(p_.compute, p_.grad, dinp, dw, dout, inp, w, rstd, N, C);
  }
  // The reference: the ops in sequence.
  void residual_rmsnorm_fwd(void* out, void* ln, float* rstd, const void* a, const void* b, const void* w,
                            int N, int C, float eps) override {
    cpu::residual_fwd(p_.compute, out, a, b, size_t(N) * C);
    cpu::rmsnorm_fwd(p_.compute, ln, rstd, out, w, N, C, eps);
  }
  void rope_fwd(void* qkv, const float* inv_freq, const AttentionShape& s, int pos_offset) override {
    cpu::rope_fwd(p_.compute, qkv, inv_freq, s, pos_offset);
  }
  void rope_bwd(void* dqkv, const float* inv_freq, const AttentionShape& s, int pos_offset) override {
    cpu::rope_bwd(p_.compute, dqkv, inv_freq, s, pos_offset);
  }
  void embedding_fwd_at(void* out, const int32_t* tokens, const void* wte, const void* wpe,
                        const int32_t* pos, int B, int Tn, int C) override {
    cpu::embedding_fwd_at(p_.compute, out, tokens, wte, wpe, pos, B, Tn, C);
  }
  void rope_fwd_at(void* qkv, const float* inv_freq, const AttentionShape& s, const int32_t* pos) override {
    cpu::rope_fwd_at(p_.compute, qkv, inv_freq, s, pos);
  }
  void dequantize(void* out, const QuantizedMatrix& m) override { cpu::dequantize(p_.compute, out, m); }
  void quantized_matmul_fwd(void* y, const void* x, const QuantizedMatrix& m, const void* bias,
                            int N) override {
    cpu::quantized_matmul_fwd(p_.compute, y, x, m, bias, N);
  }
  bool quantized_matmul_preferred(const QuantizedMatrix&, int) const override { return false; }
  void kv_cache_write(const KvCacheLayer& cache, const void* qkv, const int32_t* pos,
                      const AttentionShape& s) override {
    cpu::kv_cache_write(p_.compute, cache, qkv, pos, s);
  }
  void cached_attention_fwd(void* out, const void* qkv, const KvCacheLayer& cache, const int32_t* pos,
                            int max_keys, int window, void* /*scratch: none*/, size_t /*scratch_bytes*/,
                            const AttentionShape& s) override {
    cpu::cached_attention_fwd(p_.compute, out, qkv, cache, pos, max_keys, window, s);
  }
  void swiglu_fwd(void* out, const void* inp, int N, int I) override {
    cpu::swiglu_fwd(p_.compute, out, inp, N, I);
  }
  void swiglu_bwd(void* dinp, const void* inp, const void* dout, int N, int I) override {
    cpu::swiglu_bwd(p_.compute, dinp, inp, dout, N, I);
  }
  void attention_first_query_fwd(void* out, float* lse, const void* q, const void* kv, int B, int T, int C,
                                 int NH, const AttentionMask& mask) override {
    cpu::attention_first_query_fwd(p_.compute, out, lse, q, kv, B, T, C, NH, mask);
  }
  void attention_first_query_bwd(void* dq, void* dkv, const void* dout, const void* q, const void* kv,
                                 const void* out, const float* lse, int B, int T, int C, int NH,
                                 const AttentionMask& mask) override {
    cpu::attention_first_query_bwd(p_.compute, dq, dkv, dout, q, kv, out, lse, B, T, C, NH, mask);
  }
  void gelu_fwd(void* out, const void* inp, size_t n) override { cpu::gelu_fwd(p_.compute, out, inp, n); }
  void gelu_bwd(void* dinp, const void* inp, const void* dout, size_t n) override {
    cpu::gelu_bwd(p_.compute, dinp, inp, dout, n);
  }
  void residual_fwd(void* out, const void* a, const void* b, size_t n) override {
    cpu::residual_fwd(p_.compute, out, a, b, n);
  }
  void dropout(void* y, const void* x, size_t n, float p, const DropoutState* state, uint32_t site) override {
    cpu::dropout(p_.compute, y, x, n, p, state, site);
  }
  void dropout_rows(void* y, const void* x, int rows, int cols, size_t index_pitch, float p,
                    const DropoutState* state, uint32_t site) override {
    cpu::dropout_rows(p_.compute, y, x, rows, cols, index_pitch, p, state, site);
  }
  void dropout_next_micro(DropoutState* state) override { ++state->micro; }
  using Ops::residual_layernorm_fwd;
  void residual_layernorm_fwd(void* out, void* ln, float* mean, float* rstd, const void* a, const void* b,
                              const void* w, const void* bias, int N, int C, float eps,
                              const RowDropout& drop) override {
    // The reference: the ops in sequence (the dropped `a` in `out`, unless that is b).
    if (drop.p > 0) {
      ANVIL_ASSERT(out != b, "residual_layernorm_fwd with dropout: out must not alias b");
      cpu::dropout_rows(p_.compute, out, a, N, C, drop.index_pitch, drop.p, drop.state, drop.site);
      a = out;
    }
    cpu::residual_fwd(p_.compute, out, a, b, size_t(N) * C);
    cpu::layernorm_fwd(p_.compute, ln, mean, rstd, out, w, bias, N, C, eps);
  }
  void gelu_erf_fwd(void* out, const void* inp, size_t n) override {
    cpu::gelu_erf_fwd(p_.compute, out, inp, n);
  }
  void gelu_erf_bwd(void* dinp, const void* inp, const void* dout, size_t n) override {
    cpu::gelu_erf_bwd(p_.compute, dinp, inp, dout, n);
  }
  void gelu_erf_fwd_bwd(void* out, void* dinp, const void* inp, const void* dout, size_t n) override {
    cpu::gelu_erf_fwd(p_.compute, out, inp, n);  // the reference: the two ops
    cpu::gelu_erf_bwd(p_.compute, dinp, inp, dout, n);
  }
  void gelu_erf_fwd_bwd_bias(void* out, void* dinp, void* dbias, const void* inp, const void* dout, int N,
                             int cols) override {
    gelu_erf_fwd_bwd(out, dinp, inp, dout, size_t(N) * cols);  // the reference: the ops in sequence
    cpu::matmul_bwd(p_.compute, p_.grad, nullptr, nullptr, dbias, dinp, nullptr, nullptr, N, 1, cols, false);
  }
  void tanh_fwd(void* out, const void* inp, size_t n) override { cpu::tanh_fwd(p_.compute, out, inp, n); }
  void tanh_bwd(void* dinp, const void* out, const void* dout, size_t n) override {
    cpu::tanh_bwd(p_.compute, dinp, out, dout, n);
  }
  void first_token_fwd(void* out, const void* inp, int B, int T, int C) override {
    cpu::first_token_fwd(p_.compute, out, inp, B, T, C);
  }
  void first_token_bwd(void* dinp, const void* dout, int B, int T, int C) override {
    cpu::first_token_bwd(p_.compute, dinp, dout, B, T, C);
  }
  void softmax_xent_fwd_bwd(float* losses, void* logits, const int32_t* targets, int N, int V, int Vp,
                            float grad_scale, bool write_grad) override {
    cpu::softmax_xent_fwd_bwd(p_.compute, losses, logits, targets, N, V, Vp, grad_scale, write_grad);
  }
  void classification_loss(float* losses, void* dlogits, const void* logits, const void* labels, int N,
                           int NL, float grad_scale) override {
    cpu::classification_loss(p_.compute, losses, dlogits, logits, labels, N, NL, grad_scale);
  }
  double sum_squares(const void* x, DType dtype, size_t n) override { return cpu::sum_squares(dtype, x, n); }
  double sum(const float* x, size_t n) override { return cpu::sum(x, n); }
  void accumulate_sum(double* out, const float* x, size_t n) override { cpu::accumulate_sum(out, x, n); }
  void sum_squares_to(double* out, const void* x, DType dtype, size_t n) override {
    cpu::sum_squares_to(dtype, out, x, n);
  }
  void grad_clip_scale(float* scale_out, double* norm_out, const double* sum_squares, double unscale,
                       double max_norm, const StepValues* step_values) override {
    cpu::grad_clip_scale(scale_out, norm_out, sum_squares, step_values ? step_values->unscale : unscale,
                         max_norm);
  }
  void convert_grads(void* dst, DType dst_type, const void* src, DType src_type, size_t n,
                     bool accumulate) override {
    cpu::convert(dst_type, dst, src_type, src, n, accumulate);
  }
  // The reference: the conversion, then the sum of squares of what it wrote.
  void convert_grads_sum_squares(void* dst, DType dst_type, const void* src, DType src_type, size_t n,
                                 bool accumulate, double* sum_squares) override {
    cpu::convert(dst_type, dst, src_type, src, n, accumulate);
    *sum_squares += cpu::sum_squares(dst_type, dst, n);
  }
  void cast_weights(void* out, const float* master, size_t n, uint64_t rounding_seed,
                    const StepValues* step_values) override {
    cpu::cast_weights(p_.compute, out, master, n,
                      rounding_seed && step_values ? step_values->cast_seed : rounding_seed);
  }

  void adamw_fused_step(float* param, const void* grad, void* m, void* v, DType moment_dtype, size_t n,
                        const ParamGroupTable& g, const FusedAdamWArgs& a) override {
    cpu::adamw_fused_step(p_.grad, param, grad, m, v, moment_dtype, n, g, a);
  }
  void sgd_step(float* param, const void* grad, float* momentum_buf, size_t n, const ParamGroupTable& g,
                const SgdArgs& a) override {
    cpu::sgd_step(p_.grad, param, grad, momentum_buf, n, g, a);
  }
  // [adafactor ops]
  void adafactor_step(float* param, const void* grad, float* sq, float* exp_avg,
                      const AdafactorTensor* tensors, int num_tensors, void* /*scratch*/,
                      const AdafactorArgs& a) override {
    cpu::adafactor_step(p_.grad, param, grad, sq, exp_avg, tensors, num_tensors, a);
  }
  // [adamw8bit ops]
  void adamw8bit_step(float* param, const void* grad, uint8_t* m_codes, float* m_absmax, uint8_t* v_codes,
                      float* v_absmax, const float* m_map, const float* v_map, size_t n, size_t num_blocks,
                      const ParamGroupTable& g, const AdamW8bitArgs& a) override {
    cpu::adamw8bit_step(p_.grad, param, grad, m_codes, m_absmax, v_codes, v_absmax, m_map, v_map, n,
                        num_blocks, g, a);
  }

 private:
  Device& dev_;
  const OpsPrecision p_;
};

bool is_float_dtype(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16;
}

}  // namespace

void validate_ops_precision(OpsPrecision p) {
  ANVIL_REQUIRE(is_float_dtype(p.compute), "compute dtype {} is not supported: it must be F32, BF16 or F16",
                dtype_name(p.compute));
  ANVIL_REQUIRE(p.grad == DType::F32 || p.grad == p.compute,
                "gradient dtype {} with compute dtype {}: gradients must be F32 or the compute dtype",
                dtype_name(p.grad), dtype_name(p.compute));
}

void validate_branch_grad(const BranchGrad& branch, int C, const void* dinp) {
  const RowDropout& d = branch.drop;
  ANVIL_REQUIRE(d.p >= 0 && d.p < 1, "layernorm_bwd_sum: branch dropout p = {} needs 0 <= p < 1", d.p);
  if (d.p > 0) {
    ANVIL_REQUIRE(d.state && d.index_pitch >= size_t(C),
                  "layernorm_bwd_sum: branch dropout needs a DropoutState and an index pitch >= {} columns",
                  C);
    ANVIL_REQUIRE(branch.dbranch && branch.dbranch != dinp,
                  "layernorm_bwd_sum: branch dropout needs its own dbranch buffer (not dinp)");
  } else {
    ANVIL_REQUIRE(!branch.dbranch,
                  "layernorm_bwd_sum: dbranch without branch dropout (the gradient is dinp)");
  }
}

std::unique_ptr<Ops> make_cpu_ops(Device& dev, OpsPrecision precision) {
  return std::make_unique<CpuOps>(dev, precision);
}

size_t attention_scratch_bytes(DeviceKind backend, DType compute, const AttentionShape& s, bool dropout) {
  return backend == DeviceKind::CUDA ? cuda_attention_scratch_bytes(compute, s, dropout)
                                     : cpu::attention_scratch_bytes(compute, s);
}

}  // namespace anvil
