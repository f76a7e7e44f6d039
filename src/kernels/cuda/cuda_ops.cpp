// CudaOps: the Ops contract on a CUDA device. Everything is queued on the device's compute stream; the
// kernels and cuBLASLt plumbing live in the per-family .cu files (see cuda_kernels.hpp).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string_view>

#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/cudnn_attention.hpp"
#include "kernels/ops.hpp"
#include "runtime/cuda/cuda_check.hpp"
#include "runtime/cuda/cuda_device.hpp"

namespace anvil {
namespace {

// ANVIL_ATTENTION: unset, "" or "auto" (cuDNN flash attention where supported) or "materialized".
bool materialized_attention_forced() {
  const char* v = std::getenv("ANVIL_ATTENTION");
  if (!v || !*v || std::string_view(v) == "auto") return false;
  ANVIL_REQUIRE(std::string_view(v) == "materialized",
                "ANVIL_ATTENTION={}: expected 'auto' or 'materialized'", v);
  return true;
}

bool cudnn_attention_capable(DType compute, int HS) {
  return cuda::CudnnAttention::supports(compute, HS) && !materialized_attention_forced();
}

// cuDNN's SDPA rejects single-token sequences (s_q = s_kv = 1): those take the materialised path, whose
// scratch at T = 1 the planned size covers too.
bool use_cudnn_attention(DType compute, int T, int HS) {
  return T > 1 && cudnn_attention_capable(compute, HS);
}

cuda::AttentionDims attention_dims(const AttentionShape& s) {
  return {s.B, s.T, s.NH, s.NKV, s.HS};
}

// With attention dropout the materialised path runs whatever the shapes (cuDNN draws its own dropout masks,
// not the ones every backend draws): its full scratch, and still cuDNN's workspace where cuDNN is capable, as
// the same buffer also serves the calls without dropout (evaluation).
size_t attention_scratch(DType compute, const AttentionShape& s, bool dropout) {
  const cuda::AttentionDims d = attention_dims(s);
  if (!cudnn_attention_capable(compute, s.HS)) return cuda::materialized_attention_scratch_bytes(compute, d);
  cuda::AttentionDims one = d;
  one.T = dropout ? s.T : 1;
  return std::max(cuda::CudnnAttention::workspace_bytes(d),
                  cuda::materialized_attention_scratch_bytes(compute, one));
}

// The contract's requirements on an attention call's shape and mask (ops.hpp).
void check_attention(const AttentionShape& s, const AttentionMask& mask) {
  ANVIL_REQUIRE(s.B >= 0 && s.T >= 0 && s.NH > 0 && s.NKV > 0 && s.HS > 0 && s.NH % s.NKV == 0,
                "attention: B={} T={} NH={} NKV={} HS={}: NH must be a positive multiple of NKV, HS positive",
                s.B, s.T, s.NH, s.NKV, s.HS);
  ANVIL_REQUIRE(mask.window >= 0 && (mask.window == 0 || mask.causal),
                "attention: sliding window {} needs a causal mask and a window >= 0", mask.window);
}

// A window that reaches every key is no window: the calls without one keep their kernels (and cuDNN graphs).
int effective_window(const AttentionShape& s, const AttentionMask& mask) {
  return mask.window > 0 && mask.window < s.T ? mask.window : 0;
}

cuda::AttentionDropout attention_dropout(const AttentionMask& mask) {
  if (!(mask.dropout > 0)) return {};
  ANVIL_ASSERT(mask.dropout < 1 && mask.dropout_state,
               "attention dropout {} needs 0 <= p < 1 and a DropoutState", mask.dropout);
  return {mask.dropout, mask.dropout_state, mask.dropout_site};
}

// RoPE rotates pairs (x[i], x[i + HS/2]) of every q and k head: HS must be even (the CPU checks the same).
void check_rope_shape(const AttentionShape& s) {
  ANVIL_REQUIRE(s.B >= 0 && s.T >= 0 && s.NH > 0 && s.NKV > 0 && s.HS > 0 && s.HS % 2 == 0,
                "RoPE: bad shape B={} T={} NH={} NKV={} HS={} (HS must be even)", s.B, s.T, s.NH, s.NKV,
                s.HS);
}

class CudaOps final : public Ops {
 public:
  CudaOps(Device& dev, Fp32Matmul fp32, const CudaGemmBuffers& buffers, OpsPrecision precision,
          const GemmTuningOptions& tuning)
      : dev_(dev),
        stream_(cuda_compute_stream(dev)),
        gemm_(fp32, buffers.workspace, buffers.workspace_bytes, buffers.split_scratch,
              buffers.split_scratch_bytes, tuning),
        reduce_scratch_(dev, cuda::kReduceScratchDoubles * sizeof(double)),
        p_(precision),
        act_(precision.compute),
        grad_(precision.grad) {
    validate_ops_precision(precision);
    int device = 0;
    ANVIL_CUDA_CHECK(cudaGetDevice(&device));
    ANVIL_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device));
  }

  Device& device() override { return dev_; }
  OpsPrecision precision() const override { return p_; }

  using Ops::attention_bwd;
  using Ops::attention_fwd;
  using Ops::attention_scratch_bytes;
  size_t attention_scratch_bytes(const AttentionShape& s, bool dropout) const override {
    return attention_scratch(act_, s, dropout);
  }

  void embedding_fwd(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T,
                     int C) override {
    cuda::embedding_fwd(stream_, act_, out, tokens, wte, wpe, B, T, C);
  }
  void embedding_bwd(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                     int C) override {
    cuda::embedding_bwd(stream_, act_, grad_, dwte, dwpe, dout, tokens, B, T, C);
  }
  void embedding_bwd_skip(void* dwte, const void* dout, const int32_t* tokens, int B, int T, int C,
                          int32_t skip_token) override {
    cuda::embedding_bwd_skip(stream_, act_, grad_, dwte, dout, tokens, B, T, C, skip_token);
  }
  void bert_embedding_fwd(void* out, const int32_t* tokens, const int32_t* types, const void* wte,
                          const void* wpe, const void* wtt, int B, int T, int C) override {
    cuda::bert_embedding_fwd(stream_, act_, out, tokens, types, wte, wpe, wtt, B, T, C);
  }
  void bert_embedding_bwd(void* dwte, void* dwpe, void* dwtt, const void* dout, const int32_t* tokens,
                          const int32_t* types, int B, int T, int C, int32_t skip_token) override {
    cuda::bert_embedding_bwd(stream_, act_, grad_, dwte, dwpe, dwtt, dout, tokens, types, B, T, C,
                             skip_token);
  }

  using Ops::layernorm_fwd;
  void layernorm_fwd(void* out, float* mean, float* rstd, const void* inp, const void* w, const void* b,
                     int N, int C, float eps) override {
    cuda::layernorm_fwd(stream_, act_, out, mean, rstd, inp, w, b, N, C, eps);
  }
  void layernorm_bwd(void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                     const float* mean, const float* rstd, int N, int C) override {
    cuda::layernorm_bwd(stream_, act_, grad_, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  using Ops::layernorm_bwd_sum;
  void layernorm_bwd_sum(void* dinp, void* dw, void* db, const void* dout, const void* dout2, const void* inp,
                         const void* w, const float* mean, const float* rstd, int N, int C,
                         const BranchGrad& branch) override {
    validate_branch_grad(branch, C, dinp);
    cuda::layernorm_bwd_sum(stream_, act_, grad_, dinp, dw, db, dout, dout2, inp, w, mean, rstd, N, C,
                            branch);
  }

  // out[N,OC] = inp[N,K] @ w[OC,K]^T (+ bias)
  void matmul_fwd(void* out, const void* inp, const void* w, const void* bias, int N, int K,
                  int OC) override {
    const int first = split_outputs(N, OC);
    for (const auto& [c0, cols] : {std::pair{0, first}, std::pair{first, OC - first}}) {
      if (cols == 0) continue;
      gemm_.run(stream_, {.a = inp,
                          .b = offset(w, size_t(c0) * K),
                          .trans_b = true,
                          .c = offset(out, c0),
                          .m = N,
                          .n = cols,
                          .k = K,
                          .bias = bias ? offset(bias, c0) : nullptr,
                          .ldc = cols == OC ? 0 : OC,
                          .ab_type = act_,
                          .c_type = act_});
    }
  }
  void matmul_bwd(void* dinp, void* dw, void* dbias, const void* dout, const void* inp, const void* w, int N,
                  int K, int OC, GradWrite dw_write) override {
    matmul_bwd_impl(dinp, dw, dbias, dout, inp, w, nullptr, N, K, OC, dw_write);
  }
  void gemm(const GemmSpec& s) override {
    if (s.m == 0 || s.n == 0) return;
    cuda::GemmArgs g;
    g.a = s.a, g.trans_a = s.trans_a, g.b = s.b, g.trans_b = s.trans_b, g.c = s.c;
    g.m = s.m, g.n = s.n, g.k = s.k, g.alpha = s.alpha, g.beta = s.beta;
    g.lda = s.lda, g.ldb = s.ldb, g.ldc = s.ldc;
    g.ab_type = act_, g.c_type = s.c_grad ? grad_ : act_;
    gemm_.run(stream_, g);
  }
  void matmul_gelu_fwd(void* out, void* pre, const void* inp, const void* w, const void* bias, int N, int K,
                       int OC) override {
    cuda::GemmArgs g;
    g.a = inp, g.b = w, g.trans_b = true, g.c = out, g.m = N, g.n = OC, g.k = K, g.bias = bias;
    g.ab_type = act_, g.c_type = act_, g.gelu = cuda::GemmArgs::kGeluAux, g.aux = pre;
    gemm_.run(stream_, g);
  }
  void matmul_bwd_dgelu(void* dinp, void* dw, void* dbias, const void* dout, const void* inp, const void* w,
                        const void* gelu_pre, int N, int K, int OC, GradWrite dw_write) override {
    ANVIL_ASSERT(dinp && gelu_pre, "matmul_bwd_dgelu needs dinp and gelu_pre");
    matmul_bwd_impl(dinp, dw, dbias, dout, inp, w, gelu_pre, N, K, OC, dw_write);
  }

  // `scratch` holds attention_scratch_bytes(s, mask.dropout > 0), whichever path runs. With dropout the
  // materialised path runs (its masks are those of kernels/dropout.hpp).
  void attention_fwd(void* out, float* lse, const void* qkv, void* scratch, const AttentionShape& s,
                     const AttentionMask& mask) override {
    check_attention(s, mask);
    const cuda::AttentionDims d = attention_dims(s);
    const int window = effective_window(s, mask);
    const cuda::AttentionDropout dropout = attention_dropout(mask);
    if (dropout.p == 0 && use_cudnn_attention(act_, s.T, s.HS)) {
      flash_.fwd(stream_, act_, out, lse, qkv, scratch, cuda::CudnnAttention::workspace_bytes(d), d,
                 mask.causal, window, mask.lengths);
      cuda::zero_attention_padding(stream_, act_, out, s.q_width(), lse, s.B, s.T, s.NH, mask.lengths);
    } else {
      cuda::materialized_attention_fwd(stream_, gemm_, act_, out, lse, qkv, scratch, d, mask.causal, window,
                                       mask.lengths, dropout);
    }
  }
  void attention_bwd(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                     void* scratch, const AttentionShape& s, const AttentionMask& mask) override {
    check_attention(s, mask);
    const cuda::AttentionDims d = attention_dims(s);
    const int window = effective_window(s, mask);
    const cuda::AttentionDropout dropout = attention_dropout(mask);
    if (dropout.p == 0 && use_cudnn_attention(act_, s.T, s.HS)) {
      flash_.bwd(stream_, act_, dqkv, dout, qkv, out, lse, scratch, cuda::CudnnAttention::workspace_bytes(d),
                 d, mask.causal, window, mask.lengths);
      cuda::zero_attention_padding(stream_, act_, dqkv, s.qkv_width(), nullptr, s.B, s.T, s.NH, mask.lengths);
    } else {
      cuda::materialized_attention_bwd(stream_, gemm_, act_, dqkv, dout, qkv, out, lse, scratch, d,
                                       mask.causal, window, mask.lengths, dropout);
    }
  }

  void rmsnorm_fwd(void* out, float* rstd, const void* inp, const void* w, int N, int C, float eps) override {
    cuda::rmsnorm_fwd(stream_, act_, out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_bwd(void* dinp, void* dw, const void* dout, const void* inp, const void* w, const float* rstd,
                   int N, int C) override {
    cuda::rmsnorm_bwd(stream_, act_, grad_, dinp, dw, dout, inp, w, rstd, N, C);
  }
  void residual_rmsnorm_fwd(void* out, void* ln, float* rstd, const void* a, const void* b, const void* w,
                            int N, int C, float eps) override {
    cuda::residual_rmsnorm_fwd(stream_, act_, out, ln, rstd, a, b, w, N, C, eps);
  }
  void rope_fwd(void* qkv, const float* inv_freq, const AttentionShape& s, int pos_offset) override {
    check_rope_shape(s);
    cuda::rope(stream_, act_, qkv, inv_freq, s.B, s.T, s.NH, s.NKV, s.HS, pos_offset, false);
  }
  void rope_bwd(void* dqkv, const float* inv_freq, const AttentionShape& s, int pos_offset) override {
    check_rope_shape(s);
    cuda::rope(stream_, act_, dqkv, inv_freq, s.B, s.T, s.NH, s.NKV, s.HS, pos_offset, true);
  }
  // Generation (KV cache). The positions are device values: the kernels skip what lies outside the buffers.
  void embedding_fwd_at(void* out, const int32_t* tokens, const void* wte, const void* wpe,
                        const int32_t* pos, int B, int Tn, int C) override {
    cuda::embedding_fwd_at(stream_, act_, out, tokens, wte, wpe, pos, B, Tn, C);
  }
  void rope_fwd_at(void* qkv, const float* inv_freq, const AttentionShape& s, const int32_t* pos) override {
    check_rope_shape(s);
    cuda::rope_fwd_at(stream_, act_, qkv, inv_freq, pos, attention_dims(s));
  }
  void dequantize(void* out, const QuantizedMatrix& m) override {
    ANVIL_REQUIRE(m.storage != WeightStorage::Compute, "dequantize: a {} matrix is not quantized",
                  weight_storage_name(m.storage));
    cuda::dequantize(stream_, act_, out, m);
  }
  void quantized_matmul_fwd(void* y, const void* x, const QuantizedMatrix& m, const void* bias,
                            int N) override {
    ANVIL_REQUIRE(m.storage != WeightStorage::Compute, "quantized_matmul_fwd: a {} matrix is not quantized",
                  weight_storage_name(m.storage));
    ANVIL_REQUIRE(cuda::quantized_gemv_supported(m, x),
                  "quantized_matmul_fwd: {} columns (a multiple of {} is needed) or an unaligned input",
                  m.cols, cuda::kQuantizedGemvColumns);
    cuda::quantized_gemv(stream_, act_, y, x, m, bias, N);
  }
  bool quantized_matmul_preferred(const QuantizedMatrix& m, int N) const override {
    return N <= cuda::kQuantizedGemvMaxRows && m.cols % cuda::kQuantizedGemvColumns == 0;
  }
  void kv_cache_write(const KvCacheLayer& cache, const void* qkv, const int32_t* pos,
                      const AttentionShape& s) override {
    check_attention(s, AttentionMask{});
    cuda::kv_cache_write(stream_, act_, cache.k, cache.v, cache.S, qkv, pos, attention_dims(s));
  }
  void cached_attention_fwd(void* out, const void* qkv, const KvCacheLayer& cache, const int32_t* pos,
                            int max_keys, int window, void* scratch, size_t scratch_bytes,
                            const AttentionShape& s) override {
    check_attention(s, AttentionMask{});
    ANVIL_REQUIRE(s.HS <= cuda::kCachedAttentionMaxHeadSize,
                  "cached attention: head size {} is larger than the {} the CUDA kernel takes", s.HS,
                  cuda::kCachedAttentionMaxHeadSize);
    ANVIL_REQUIRE(
        max_keys >= 1 && max_keys <= cache.S && window >= 0,
        "cached_attention_fwd: max_keys {} must be in [1, the cache capacity {}] and window {} >= 0",
        max_keys, cache.S, window);
    cuda::cached_attention_fwd(stream_, act_, out, qkv, cache.k, cache.v, cache.S, pos, max_keys, window,
                               scratch, scratch_bytes, attention_dims(s));
  }
  void swiglu_fwd(void* out, const void* inp, int N, int I) override {
    cuda::swiglu_fwd(stream_, act_, out, inp, N, I);
  }
  void swiglu_bwd(void* dinp, const void* inp, const void* dout, int N, int I) override {
    cuda::swiglu_bwd(stream_, act_, dinp, inp, dout, N, I);
  }

  void attention_first_query_fwd(void* out, float* lse, const void* q, const void* kv, int B, int T, int C,
                                 int NH, const AttentionMask& mask) override {
    check_heads(C, NH);
    cuda::attention_first_query_fwd(stream_, act_, out, lse, q, kv, B, T, C, NH, mask.causal, mask.lengths,
                                    attention_dropout(mask));
  }
  void attention_first_query_bwd(void* dq, void* dkv, const void* dout, const void* q, const void* kv,
                                 const void* out, const float* lse, int B, int T, int C, int NH,
                                 const AttentionMask& mask) override {
    check_heads(C, NH);
    cuda::attention_first_query_bwd(stream_, act_, dq, dkv, dout, q, kv, out, lse, B, T, C, NH, mask.causal,
                                    mask.lengths, attention_dropout(mask));
  }

  void gelu_fwd(void* out, const void* inp, size_t n) override { cuda::gelu_fwd(stream_, act_, out, inp, n); }
  void gelu_bwd(void* dinp, const void* inp, const void* dout, size_t n) override {
    cuda::gelu_bwd(stream_, act_, dinp, inp, dout, n);
  }
  void residual_fwd(void* out, const void* a, const void* b, size_t n) override {
    cuda::residual_fwd(stream_, act_, out, a, b, n);
  }
  void dropout(void* y, const void* x, size_t n, float p, const DropoutState* state, uint32_t site) override {
    ANVIL_ASSERT(p >= 0 && p < 1 && (p == 0 || state), "dropout: p = {} needs 0 <= p < 1 and a DropoutState",
                 p);
    cuda::dropout(stream_, act_, y, x, n, p, state, site);
  }
  void dropout_rows(void* y, const void* x, int rows, int cols, size_t index_pitch, float p,
                    const DropoutState* state, uint32_t site) override {
    ANVIL_ASSERT(p >= 0 && p < 1 && (p == 0 || state),
                 "dropout_rows: p = {} needs 0 <= p < 1 and a DropoutState", p);
    ANVIL_ASSERT(index_pitch >= size_t(cols), "dropout_rows: index pitch {} < {} columns", index_pitch, cols);
    cuda::dropout_rows(stream_, act_, y, x, rows, cols, index_pitch, p, state, site);
  }
  void dropout_next_micro(DropoutState* state) override { cuda::dropout_next_micro(stream_, state); }
  using Ops::residual_layernorm_fwd;
  void residual_layernorm_fwd(void* out, void* ln, float* mean, float* rstd, const void* a, const void* b,
                              const void* w, const void* bias, int N, int C, float eps,
                              const RowDropout& drop) override {
    ANVIL_ASSERT(drop.p >= 0 && drop.p < 1 && (drop.p == 0 || (drop.state && drop.index_pitch >= size_t(C))),
                 "residual_layernorm_fwd: dropout p = {} needs 0 <= p < 1, a DropoutState and an index pitch "
                 ">= {} columns",
                 drop.p, C);
    cuda::residual_layernorm_fwd(stream_, act_, out, ln, mean, rstd, a, b, w, bias, N, C, eps, drop);
  }
  void gelu_erf_fwd(void* out, const void* inp, size_t n) override {
    cuda::gelu_erf_fwd(stream_, act_, out, inp, n);
  }
  void gelu_erf_bwd(void* dinp, const void* inp, const void* dout, size_t n) override {
    cuda::gelu_erf_bwd(stream_, act_, dinp, inp, dout, n);
  }
  void gelu_erf_fwd_bwd(void* out, void* dinp, const void* inp, const void* dout, size_t n) override {
    cuda::gelu_erf_fwd_bwd(stream_, act_, out, dinp, inp, dout, n);
  }
  void gelu_erf_fwd_bwd_bias(void* out, void* dinp, void* dbias, const void* inp, const void* dout, int N,
                             int cols) override {
    cuda::gelu_erf_fwd_bwd_bias(stream_, act_, grad_, out, dinp, dbias, inp, dout, N, cols);
  }
  void tanh_fwd(void* out, const void* inp, size_t n) override { cuda::tanh_fwd(stream_, act_, out, inp, n); }
  void tanh_bwd(void* dinp, const void* out, const void* dout, size_t n) override {
    cuda::tanh_bwd(stream_, act_, dinp, out, dout, n);
  }
  void first_token_fwd(void* out, const void* inp, int B, int T, int C) override {
    cuda::first_token_fwd(stream_, act_, out, inp, B, T, C);
  }
  void first_token_bwd(void* dinp, const void* dout, int B, int T, int C) override {
    cuda::first_token_bwd(stream_, act_, dinp, dout, B, T, C);
  }

  void softmax_xent_fwd_bwd(float* losses, void* logits, const int32_t* targets, int N, int V, int Vp,
                            float grad_scale, bool write_grad) override {
    ANVIL_ASSERT(V > 0 && V <= Vp, "softmax_xent: need 0 < V <= Vp, got V={} Vp={}", V, Vp);
    cuda::softmax_xent_fwd_bwd(stream_, act_, losses, logits, targets, N, V, Vp, grad_scale, write_grad,
                               kIgnoreIndex);
  }
  void classification_loss(float* losses, void* dlogits, const void* logits, const void* labels, int N,
                           int NL, float grad_scale) override {
    ANVIL_ASSERT(NL >= 1, "classification_loss: num_labels must be >= 1, got {}", NL);
    cuda::classification_loss(stream_, act_, losses, dlogits, logits, labels, N, NL, grad_scale,
                              kIgnoreIndex);
  }

  double sum_squares(const void* x, DType dtype, size_t n) override {
    return cuda::reduce_sum(stream_, dtype, x, n, /*square=*/true,
                            static_cast<double*>(reduce_scratch_.get()));
  }
  double sum(const float* x, size_t n) override {
    return cuda::reduce_sum(stream_, DType::F32, x, n, /*square=*/false,
                            static_cast<double*>(reduce_scratch_.get()));
  }
  // The device-result forms share the scratch with the forms above: everything is ordered on stream_.
  void accumulate_sum(double* out, const float* x, size_t n) override {
    cuda::reduce_sum_to(stream_, DType::F32, x, n, /*square=*/false,
                        static_cast<double*>(reduce_scratch_.get()), out, /*accumulate=*/true);
  }
  void sum_squares_to(double* out, const void* x, DType dtype, size_t n) override {
    auto* scratch = static_cast<double*>(reduce_scratch_.get());
    cuda::reduce_sum_to(stream_, dtype, x, n, /*square=*/true, scratch, out, /*accumulate=*/false);
  }
  void grad_clip_scale(float* scale_out, double* norm_out, const double* sum_squares, double unscale,
                       double max_norm, const StepValues* step_values) override {
    cuda::grad_clip_scale(stream_, scale_out, norm_out, sum_squares, unscale,
                          step_values ? &step_values->unscale : nullptr, max_norm);
  }
  void convert_grads(void* dst, DType dst_type, const void* src, DType src_type, size_t n,
                     bool accumulate) override {
    cuda::convert(stream_, dst_type, dst, src_type, src, n, accumulate);
  }
  void convert_grads_sum_squares(void* dst, DType dst_type, const void* src, DType src_type, size_t n,
                                 bool accumulate, double* sum_squares) override {
    cuda::convert_sum_squares(stream_, dst_type, dst, src_type, src, n, accumulate,
                              static_cast<double*>(reduce_scratch_.get()), sum_squares);
  }

  void cast_weights(void* out, const float* master, size_t n, uint64_t rounding_seed,
                    const StepValues* step_values) override {
    cuda::cast_weights(stream_, act_, out, master, n, rounding_seed,
                       step_values ? &step_values->cast_seed : nullptr);
  }

  void adamw_fused_step(float* param, const void* grad, void* m, void* v, DType moment_dtype, size_t n,
                        const ParamGroupTable& g, const FusedAdamWArgs& a) override {
    StepValues sv;
    fill_step_values(a, sv);
    cuda::adamw_fused_step(stream_, grad_, moment_dtype, param, grad, m, v, n,
                           {g.begins, g.groups, g.state_begins, g.count}, a.beta1, a.beta2, a.eps,
                           a.grad_scale, a.grad_scale_device, a.weight_decay, sv, a.step_values);
  }
  void sgd_step(float* param, const void* grad, float* momentum_buf, size_t n, const ParamGroupTable& g,
                const SgdArgs& a) override {
    StepValues sv;
    fill_step_values(a, sv);
    cuda::sgd_step(stream_, grad_, param, grad, momentum_buf, n,
                   {g.begins, g.groups, g.state_begins, g.count}, a.momentum, a.dampening, a.nesterov,
                   a.grad_scale, a.grad_scale_device, a.weight_decay, sv, a.step_values);
  }
  // [adafactor ops]
  void adafactor_step(float* param, const void* grad, float* sq, float* exp_avg,
                      const AdafactorTensor* tensors, int num_tensors, void* scratch,
                      const AdafactorArgs& a) override {
    static_assert(sizeof(cuda::AdafactorTensorDesc) == sizeof(AdafactorTensor) &&
                  offsetof(cuda::AdafactorTensorDesc, col_state) == offsetof(AdafactorTensor, col_state) &&
                  offsetof(cuda::AdafactorTensorDesc, group) == offsetof(AdafactorTensor, group));
    static_assert(kMaxParamGroups == 4);
    cuda::AdafactorParams p{};
    p.grad_scale_device = a.grad_scale_device;
    p.sv_device = a.step_values;
    p.grad_scale = a.grad_scale, p.eps1 = a.eps1, p.eps2 = a.eps2, p.clip_threshold = a.clip_threshold;
    p.beta2t = a.beta2t, p.beta1 = a.beta1, p.first_moment = a.first_moment;
    p.scale_parameter = a.scale_parameter;
    for (int g = 0; g < kMaxParamGroups; ++g)
      p.step_size[g] = a.step_size[g], p.weight_decay[g] = a.weight_decay[g];
    cuda::adafactor_step(stream_, grad_, param, grad, sq, exp_avg,
                         reinterpret_cast<const cuda::AdafactorTensorDesc*>(tensors), num_tensors, scratch,
                         p);
  }
  // [adamw8bit ops]
  void adamw8bit_step(float* param, const void* grad, uint8_t* m_codes, float* m_absmax, uint8_t* v_codes,
                      float* v_absmax, const float* m_map, const float* v_map, size_t n, size_t num_blocks,
                      const ParamGroupTable& g, const AdamW8bitArgs& a) override {
    StepValues sv;
    fill_step_values(a, sv);
    cuda::adamw8bit_step(stream_, grad_, param, grad, m_codes, m_absmax, v_codes, v_absmax, m_map, v_map, n,
                         num_blocks, {g.begins, g.groups, g.state_begins, g.count}, a.beta1, a.beta2, a.eps,
                         a.grad_scale, a.grad_scale_device, a.weight_decay, sv, a.step_values);
  }

 private:
  // dinp (optionally times gelu'(gelu_pre), fused into the GEMM's epilogue), dw and dbias of matmul_bwd.
  void matmul_bwd_impl(void* dinp, void* dw, void* dbias, const void* dout, const void* inp, const void* w,
                       const void* gelu_pre, int N, int K, int OC, GradWrite dw_write) {
    // dinp[N,K] = dout[N,OC] @ w[OC,K] (* gelu'(gelu_pre))
    if (dinp)
      gemm_.run(stream_, {.a = dout,
                          .b = w,
                          .c = dinp,
                          .m = N,
                          .n = K,
                          .k = OC,
                          .gelu = gelu_pre ? cuda::GemmArgs::kDGelu : cuda::GemmArgs::kNoGelu,
                          .aux = const_cast<void*>(gelu_pre),
                          .ab_type = act_,
                          .c_type = act_});
    // dw[OC,K] += dout[N,OC]^T @ inp[N,K], accumulated in the gradient type (in row blocks of dw, from
    // column blocks of dout, where split_outputs says so)
    const int first = split_outputs(N, OC);
    if (dw)
      for (const auto& [r0, rows] : {std::pair{0, first}, std::pair{first, OC - first}}) {
        if (rows == 0) continue;
        gemm_.run(stream_, {.a = offset(dout, r0),
                            .trans_a = true,
                            .b = inp,
                            .c = static_cast<char*>(dw) + size_t(r0) * K * dtype_bytes(grad_, 1),
                            .m = rows,
                            .n = K,
                            .k = N,
                            .beta = dw_write == GradWrite::Overwrite ? 0.f : 1.f,
                            .lda = rows == OC ? 0 : OC,
                            .ab_type = act_,
                            .c_type = grad_});
      }
    if (dbias) cuda::column_sums_accumulate(stream_, grad_, dbias, act_, dout, N, OC);
  }
  // How many of a Linear's OC outputs its first GEMM computes (OC: one GEMM), for the forward and the
  // weight gradient. cuBLAS's strict-fp32 (SIMT) kernels for large outputs take tiles of 256 x 128, one
  // CTA per SM at a time, so a GEMM runs in waves of `sms` tiles; one whose last wave is less than half full
  // leaves most SMs idle for that wave. The fused query-key-value projection of bert-large (batch 4 x 512,
  // [2048 x 3072]: 1.45 waves on an H100) runs at 40 TF/s against ~49 for the MLP's GEMMs. As [Q|K] plus V
  // (the first two thirds of the outputs, then the last) each part fills its waves: the forward 319 -> 275
  // us and the weight gradient 312 -> 271 us (bench/probes/gemm_qkv_split.cu). Only for native fp32
  // (tensor-core GEMMs tile differently) and outputs a multiple of 3; the input gradient would split its
  // inner dimension instead, which measured slower (+4%), so it stays one GEMM.
  int split_outputs(int N, int OC) const {
    const bool simt_fp32 = act_ == DType::F32 && gemm_.fp32() == Fp32Matmul::Native;
    if (!simt_fp32 || OC % 3 != 0 || OC < 3 * 128 || sms_ <= 0) return OC;
    const double waves = double(N) * OC / (256.0 * 128.0 * sms_);
    return waves > 1.0 && waves < 1.5 ? OC / 3 * 2 : OC;
  }
  const void* offset(const void* p, size_t elements) const {
    return static_cast<const char*>(p) + elements * dtype_bytes(act_, 1);
  }
  void* offset(void* p, size_t elements) const {
    return static_cast<char*>(p) + elements * dtype_bytes(act_, 1);
  }
  static void check_heads(int C, int NH) {
    ANVIL_ASSERT(NH > 0 && C % NH == 0, "attention: C={} is not a multiple of NH={}", C, NH);
  }

  Device& dev_;
  cudaStream_t stream_;
  cuda::Gemm gemm_;
  cuda::CudnnAttention flash_;   // its cuDNN handle is created on first use
  DeviceBuffer reduce_scratch_;  // kReduceScratchDoubles doubles for the reductions
  OpsPrecision p_;
  DType act_, grad_;
  int sms_ = 0;  // streaming multiprocessors (split_outputs)
};

}  // namespace

size_t cuda_attention_scratch_bytes(DType compute, const AttentionShape& s, bool dropout) {
  return attention_scratch(compute, s, dropout);
}

const char* cuda_attention_path(DType compute, int HS, bool dropout) {
  if (!cudnn_attention_capable(compute, HS)) return "materialized attention";
  return dropout ? "materialized attention (attention dropout)" : "cudnn flash attention";
}

std::unique_ptr<Ops> make_cuda_ops(Device& dev, bool tf32, void* workspace, size_t workspace_bytes,
                                   OpsPrecision precision) {
  return make_cuda_ops(dev, tf32 ? Fp32Matmul::TF32 : Fp32Matmul::Native, {workspace, workspace_bytes},
                       precision);
}

std::unique_ptr<Ops> make_cuda_ops(Device& dev, Fp32Matmul fp32, const CudaGemmBuffers& buffers,
                                   OpsPrecision precision, const GemmTuningOptions& tuning) {
  if (fp32 == Fp32Matmul::TF32x3 && precision.compute == DType::F32)
    ANVIL_REQUIRE(buffers.split_scratch && buffers.split_scratch_bytes >= kMinSplitScratchBytes,
                  "3xTF32 GEMMs need a split scratch buffer of at least {} bytes, got {}",
                  kMinSplitScratchBytes, buffers.split_scratch_bytes);
  return std::make_unique<CudaOps>(dev, fp32, buffers, precision, tuning);
}

}  // namespace anvil
