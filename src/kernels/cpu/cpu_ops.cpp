// Binds the CPU reference kernels to the Ops contract.
#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil {
namespace {

class CpuOps final : public Ops {
 public:
  explicit CpuOps(Device& dev) : dev_(dev) {
    ANVIL_ASSERT(dev.kind() == DeviceKind::CPU, "CPU ops need the CPU device");
  }
  Device& device() override { return dev_; }
  size_t attention_scratch_floats(int B, int T, int C, int NH) const override {
    return cpu::attention_scratch_floats(B, T, C, NH);
  }
  void embedding_fwd(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                     int C) override {
    cpu::embedding_fwd(out, tokens, wte, wpe, B, T, C);
  }
  void embedding_bwd(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                     int C) override {
    cpu::embedding_bwd(dwte, dwpe, dout, tokens, B, T, C);
  }
  void layernorm_fwd(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                     int N, int C) override {
    cpu::layernorm_fwd(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_bwd(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                     const float* mean, const float* rstd, int N, int C) override {
    cpu::layernorm_bwd(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void matmul_fwd(float* out, const float* inp, const float* w, const float* bias, int N, int K,
                  int OC) override {
    cpu::matmul_fwd(out, inp, w, bias, N, K, OC);
  }
  void matmul_bwd(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                  int N, int K, int OC) override {
    cpu::matmul_bwd(dinp, dw, dbias, dout, inp, w, N, K, OC);
  }
  void attention_fwd(float* out, float* probs, const float* qkv, float*, int B, int T, int C,
                     int NH) override {
    cpu::attention_fwd(out, probs, qkv, B, T, C, NH);
  }
  void attention_bwd(float* dqkv, const float* dout, const float* qkv, const float* probs, float* scratch,
                     int B, int T, int C, int NH) override {
    cpu::attention_bwd(dqkv, dout, qkv, probs, scratch, B, T, C, NH);
  }
  void gelu_fwd(float* out, const float* inp, size_t n) override { cpu::gelu_fwd(out, inp, n); }
  void gelu_bwd(float* dinp, const float* inp, const float* dout, size_t n) override {
    cpu::gelu_bwd(dinp, inp, dout, n);
  }
  void residual_fwd(float* out, const float* a, const float* b, size_t n) override {
    cpu::residual_fwd(out, a, b, n);
  }
  void softmax_xent_fwd_bwd(float* losses, float* logits, const int32_t* targets, int N, int V, int Vp,
                            float grad_scale, bool write_grad) override {
    cpu::softmax_xent_fwd_bwd(losses, logits, targets, N, V, Vp, grad_scale, write_grad);
  }
  double sum_squares(const float* x, size_t n) override { return cpu::sum_squares(x, n); }
  double sum(const float* x, size_t n) override { return cpu::sum(x, n); }
  void adamw_step(float* param, const float* grad, float* m, float* v, size_t n,
                  const AdamWArgs& a) override {
    cpu::adamw_step(param, grad, m, v, n, a);
  }

 private:
  Device& dev_;
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops(Device& dev) {
  return std::make_unique<CpuOps>(dev);
}

size_t attention_scratch_floats(DeviceKind backend, int B, int T, int C, int NH) {
  return backend == DeviceKind::CUDA ? cuda_attention_scratch_floats(B, T, C, NH)
                                     : cpu::attention_scratch_floats(B, T, C, NH);
}

}  // namespace anvil
