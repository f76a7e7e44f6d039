// Host-side launchers of the CUDA kernels, one group per op family (.cu file), all queued on the given
// stream. This header stays free of Anvil's fmt-based headers so nvcc can compile the .cu files; the
// CudaOps adapter (cuda_ops.cpp) maps the Ops contract onto these.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <type_traits>

namespace anvil::cuda {

// --- matmul.cu: cuBLASLt GEMMs -----------------------------------------------------------------------

// A row-major, contiguous, optionally strided-batched GEMM:  C[M,N] = alpha * op(A) @ op(B) + beta * C
// (+ bias[N] added to every row). op(A) is [M,K]: A is stored [M,K], or [K,M] when trans_a.
// op(B) is [K,N]: B is stored [K,N], or [N,K] when trans_b. Batch i uses A + i*stride_a, etc.
struct GemmArgs {
  const float* a = nullptr;
  bool trans_a = false;
  const float* b = nullptr;
  bool trans_b = false;
  float* c = nullptr;
  int m = 0, n = 0, k = 0;
  float alpha = 1.f, beta = 0.f;
  const float* bias = nullptr;  // [N]; only with batch == 1
  int batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // in elements
};

// Owns the cuBLASLt handle and a cache of matmul plans (descriptors + chosen algorithm) by shape, so the
// heuristic query and descriptor set-up run once per distinct GEMM rather than on every call.
class Gemm {
 public:
  Gemm(bool tf32, void* workspace, size_t workspace_bytes);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  void run(cudaStream_t stream, const GemmArgs& g);

 private:
  struct Plan;
  using PlanKey = std::array<int64_t, 20>;
  struct HandleDestroyer {
    void operator()(cublasLtHandle_t h) const noexcept;
  };

  Plan& plan_for(const GemmArgs& g);

  bool tf32_;
  void* workspace_;
  size_t workspace_bytes_;
  std::unique_ptr<std::remove_pointer_t<cublasLtHandle_t>, HandleDestroyer> handle_;
  std::map<PlanKey, std::unique_ptr<Plan>> plans_;
};

// dst[c] += sum over rows r of src[r, c], src [rows, cols] (matmul's dbias).
void column_sums_accumulate(cudaStream_t stream, float* dst, const float* src, int rows, int cols);

// --- embedding.cu ------------------------------------------------------------------------------------
void embedding_fwd(cudaStream_t stream, float* out, const int32_t* tokens, const float* wte, const float* wpe,
                   int B, int T, int C);
void embedding_bwd(cudaStream_t stream, float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                   int B, int T, int C);

// --- layernorm.cu ------------------------------------------------------------------------------------
void layernorm_fwd(cudaStream_t stream, float* out, float* mean, float* rstd, const float* inp,
                   const float* w, const float* b, int N, int C, float eps);
void layernorm_bwd(cudaStream_t stream, float* dinp, float* dw, float* db, const float* dout,
                   const float* inp, const float* w, const float* mean, const float* rstd, int N, int C);

// --- attention.cu ------------------------------------------------------------------------------------
size_t attention_scratch_floats(int B, int T, int C, int NH);
void attention_fwd(cudaStream_t stream, Gemm& gemm, float* out, float* probs, const float* qkv,
                   float* scratch, int B, int T, int C, int NH);
void attention_bwd(cudaStream_t stream, Gemm& gemm, float* dqkv, const float* dout, const float* qkv,
                   const float* probs, float* scratch, int B, int T, int C, int NH);

// --- activation.cu -----------------------------------------------------------------------------------
void gelu_fwd(cudaStream_t stream, float* out, const float* inp, size_t n);
void gelu_bwd(cudaStream_t stream, float* dinp, const float* inp, const float* dout, size_t n);
void residual_fwd(cudaStream_t stream, float* out, const float* a, const float* b, size_t n);

// --- loss.cu -----------------------------------------------------------------------------------------
void softmax_xent_fwd_bwd(cudaStream_t stream, float* losses, float* logits, const int32_t* targets, int N,
                          int V, int Vp, float grad_scale, bool write_grad, int32_t ignore_index);

// --- reduction.cu ------------------------------------------------------------------------------------
// Device scratch the reductions need: kReducePartials per-block partial sums plus the final result.
constexpr int kReducePartials = 1024;
constexpr size_t kReduceScratchDoubles = kReducePartials + 1;
// Sum of x (or of x^2 when `square`), accumulated in fp64; copies the result back (synchronises).
double reduce_sum(cudaStream_t stream, const float* x, size_t n, bool square, double* scratch);

// --- optimizer.cu ------------------------------------------------------------------------------------
// `step_size` = lr / (1 - b1^step) and `sqrt_bias2` = sqrt(1 - b2^step), computed on the host in fp64.
void adamw_step(cudaStream_t stream, float* param, const float* grad, float* m, float* v, size_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, float step_size, float sqrt_bias2,
                float grad_scale);

}  // namespace anvil::cuda
