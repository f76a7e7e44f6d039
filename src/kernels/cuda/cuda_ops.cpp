// CudaOps: the Ops contract on a CUDA device. Everything is queued on the device's compute stream; the
// kernels and cuBLASLt plumbing live in the per-family .cu files (see cuda_kernels.hpp).
#include <cmath>
#include <memory>

#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/ops.hpp"
#include "runtime/cuda/cuda_device.hpp"

namespace anvil {
namespace {

class CudaOps final : public Ops {
 public:
  CudaOps(Device& dev, bool tf32, void* workspace, size_t workspace_bytes, OpsPrecision precision)
      : dev_(dev),
        stream_(cuda_compute_stream(dev)),
        gemm_(tf32, workspace, workspace_bytes),
        reduce_scratch_(dev, cuda::kReduceScratchDoubles * sizeof(double)),
        p_(precision),
        act_(precision.compute),
        grad_(precision.grad) {
    validate_ops_precision(precision);
  }

  Device& device() override { return dev_; }
  OpsPrecision precision() const override { return p_; }

  size_t attention_scratch_bytes(int B, int T, int C, int NH) const override {
    return cuda::attention_scratch_bytes(act_, B, T, C, NH);
  }

  void embedding_fwd(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T,
                     int C) override {
    cuda::embedding_fwd(stream_, act_, out, tokens, wte, wpe, B, T, C);
  }
  void embedding_bwd(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                     int C) override {
    cuda::embedding_bwd(stream_, act_, grad_, dwte, dwpe, dout, tokens, B, T, C);
  }

  void layernorm_fwd(void* out, float* mean, float* rstd, const void* inp, const void* w, const void* b,
                     int N, int C) override {
    cuda::layernorm_fwd(stream_, act_, out, mean, rstd, inp, w, b, N, C, kLayerNormEps);
  }
  void layernorm_bwd(void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                     const float* mean, const float* rstd, int N, int C) override {
    cuda::layernorm_bwd(stream_, act_, grad_, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }

  // out[N,OC] = inp[N,K] @ w[OC,K]^T (+ bias)
  void matmul_fwd(void* out, const void* inp, const void* w, const void* bias, int N, int K,
                  int OC) override {
    gemm_.run(stream_, {.a = inp,
                        .b = w,
                        .trans_b = true,
                        .c = out,
                        .m = N,
                        .n = OC,
                        .k = K,
                        .bias = bias,
                        .ab_type = act_,
                        .c_type = act_});
  }
  void matmul_bwd(void* dinp, void* dw, void* dbias, const void* dout, const void* inp, const void* w, int N,
                  int K, int OC) override {
    // dinp[N,K] = dout[N,OC] @ w[OC,K]
    if (dinp)
      gemm_.run(stream_,
                {.a = dout, .b = w, .c = dinp, .m = N, .n = K, .k = OC, .ab_type = act_, .c_type = act_});
    // dw[OC,K] += dout[N,OC]^T @ inp[N,K], accumulated in the gradient type
    if (dw)
      gemm_.run(stream_, {.a = dout,
                          .trans_a = true,
                          .b = inp,
                          .c = dw,
                          .m = OC,
                          .n = K,
                          .k = N,
                          .beta = 1.f,
                          .ab_type = act_,
                          .c_type = grad_});
    if (dbias) cuda::column_sums_accumulate(stream_, grad_, dbias, act_, dout, N, OC);
  }

  void attention_fwd(void* out, void* probs, const void* qkv, void* scratch, int B, int T, int C,
                     int NH) override {
    check_heads(C, NH);
    cuda::attention_fwd(stream_, gemm_, act_, out, probs, qkv, scratch, B, T, C, NH);
  }
  void attention_bwd(void* dqkv, const void* dout, const void* qkv, const void* probs, void* scratch, int B,
                     int T, int C, int NH) override {
    check_heads(C, NH);
    cuda::attention_bwd(stream_, gemm_, act_, dqkv, dout, qkv, probs, scratch, B, T, C, NH);
  }

  void gelu_fwd(void* out, const void* inp, size_t n) override { cuda::gelu_fwd(stream_, act_, out, inp, n); }
  void gelu_bwd(void* dinp, const void* inp, const void* dout, size_t n) override {
    cuda::gelu_bwd(stream_, act_, dinp, inp, dout, n);
  }
  void residual_fwd(void* out, const void* a, const void* b, size_t n) override {
    cuda::residual_fwd(stream_, act_, out, a, b, n);
  }

  void softmax_xent_fwd_bwd(float* losses, void* logits, const int32_t* targets, int N, int V, int Vp,
                            float grad_scale, bool write_grad) override {
    ANVIL_ASSERT(V > 0 && V <= Vp, "softmax_xent: need 0 < V <= Vp, got V={} Vp={}", V, Vp);
    cuda::softmax_xent_fwd_bwd(stream_, act_, losses, logits, targets, N, V, Vp, grad_scale, write_grad,
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

  void cast_weights(void* out, const float* master, size_t n, uint64_t rounding_seed) override {
    cuda::cast_weights(stream_, act_, out, master, n, rounding_seed);
  }

  void adamw_fused_step(float* param, const void* grad, void* m, void* v, DType moment_dtype, size_t n,
                        const ParamGroupTable& g, const FusedAdamWArgs& a) override {
    const double bias1 = 1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step));
    const double bias2 = 1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(a.step));
    cuda::adamw_fused_step(stream_, grad_, moment_dtype, param, grad, m, v, n,
                           {g.begins, g.groups, g.state_begins, g.count}, a.beta1, a.beta2, a.eps,
                           a.grad_scale, a.lr, a.weight_decay, static_cast<float>(1.0 / bias1),
                           static_cast<float>(std::sqrt(bias2)), a.rounding_seed);
  }
  void sgd_step(float* param, const void* grad, float* momentum_buf, size_t n, const ParamGroupTable& g,
                const SgdArgs& a) override {
    cuda::sgd_step(stream_, grad_, param, grad, momentum_buf, n,
                   {g.begins, g.groups, g.state_begins, g.count}, a.momentum, a.dampening, a.nesterov,
                   a.first_step, a.grad_scale, a.lr, a.weight_decay);
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
    const double bias1 = 1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step));
    const double sqrt_bias2 =
        std::sqrt(1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(a.step)));
    cuda::adamw8bit_step(stream_, grad_, param, grad, m_codes, m_absmax, v_codes, v_absmax, m_map, v_map, n,
                         num_blocks, {g.begins, g.groups, g.state_begins, g.count}, a.beta1, a.beta2,
                         a.grad_scale, a.lr, a.weight_decay, static_cast<float>(sqrt_bias2 / bias1),
                         static_cast<float>(a.eps * sqrt_bias2));
  }

 private:
  static void check_heads(int C, int NH) {
    ANVIL_ASSERT(NH > 0 && C % NH == 0, "attention: C={} is not a multiple of NH={}", C, NH);
  }

  Device& dev_;
  cudaStream_t stream_;
  cuda::Gemm gemm_;
  DeviceBuffer reduce_scratch_;  // kReduceScratchDoubles doubles for sum / sum_squares
  OpsPrecision p_;
  DType act_, grad_;
};

}  // namespace

size_t cuda_attention_scratch_bytes(DType compute, int B, int T, int C, int NH) {
  return cuda::attention_scratch_bytes(compute, B, T, C, NH);
}

std::unique_ptr<Ops> make_cuda_ops(Device& dev, bool tf32, void* workspace, size_t workspace_bytes,
                                   OpsPrecision precision) {
  return std::make_unique<CudaOps>(dev, tf32, workspace, workspace_bytes, precision);
}

}  // namespace anvil
