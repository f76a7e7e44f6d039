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

#include "anvil/dtype.hpp"
#include "kernels/cuda/gemm_tuner.hpp"
#include "kernels/dropout.hpp"
#include "kernels/quantization.hpp"
#include "kernels/split_gemm_plan.hpp"
#include "kernels/step_values.hpp"

namespace anvil::cuda {

// Storage types: `DType act` is the compute (activation and weight) type, `DType grad` the parameter
// gradient type; pointers of those types are void*. float* is always fp32. Math is fp32 throughout.

// --- matmul.cu: cuBLASLt GEMMs -----------------------------------------------------------------------

// A row-major, contiguous, optionally strided-batched GEMM:  C[M,N] = alpha * op(A) @ op(B) + beta * C
// (+ bias[N] added to every row). op(A) is [M,K]: A is stored [M,K], or [K,M] when trans_a.
// op(B) is [K,N]: B is stored [K,N], or [N,K] when trans_b. Batch i uses A + i*stride_a, etc.
// A and B share `ab_type`; C (and the bias) are of `c_type`. Supported: all F32 (native fp32, TF32 or
// 3xTF32: Fp32Matmul); BF16/F16 inputs with C of the same type or F32. Accumulation is fp32.
struct GemmArgs {
  const void* a = nullptr;
  bool trans_a = false;
  const void* b = nullptr;
  bool trans_b = false;
  void* c = nullptr;
  int m = 0, n = 0, k = 0;
  float alpha = 1.f, beta = 0.f;
  const void* bias = nullptr;  // [N]; only with batch == 1
  // GELU (tanh approximation) fused into the epilogue, unbatched only. kGeluAux: D = gelu(op(A) op(B) + bias)
  // and aux (shaped like C, of c_type) receives op(A) op(B) + bias. kDGelu: D = (op(A) op(B)) * gelu'(aux).
  enum Gelu { kNoGelu = 0, kGeluAux = 1, kDGelu = 2 } gelu = kNoGelu;
  void* aux = nullptr;
  int batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // in elements
  // Pointer-array batch: device arrays of `batch` matrix addresses for A, B and C (all three or none), read
  // instead of a, b, c and the strides, for batches no single stride describes (every head of every
  // sequence in place). a, b, c and stride_a/b/c then only state the alignment: every matrix starts at its
  // base plus a multiple of the strides' common alignment (pass the OR of the strides that occur).
  const void* const* a_array = nullptr;
  const void* const* b_array = nullptr;
  void* const* c_array = nullptr;
  // Row strides of A, B and C as stored (row-major, in elements); 0: contiguous rows. Lets a GEMM read or
  // write a matrix that is a column block of a wider one (an attention head inside [T, 3C]).
  int64_t lda = 0, ldb = 0, ldc = 0;
  anvil::DType ab_type = anvil::DType::F32;
  anvil::DType c_type = anvil::DType::F32;
  // Under Fp32Matmul::TF32x3, run this fp32 GEMM in native fp32 anyway: attention's per-head GEMMs, whose
  // small inner dimension (the head size) or large operands (the probabilities) make splitting the
  // operands cost more memory traffic than the tensor cores save.
  bool native_fp32 = false;
};

// Owns the cuBLASLt handle and a cache of matmul plans (descriptors + chosen algorithm) by shape, so the
// heuristic query and descriptor set-up run once per distinct GEMM rather than on every call. With
// Fp32Matmul::TF32x3, fp32 GEMMs split their operands into `split_scratch` (gemm_3xtf32.cu; sized by
// split_gemm_scratch_bytes, any size >= kMinSplitScratchBytes works through chunking).
class Gemm {
 public:
  Gemm(Fp32Matmul fp32, void* workspace, size_t workspace_bytes, float* split_scratch = nullptr,
       size_t split_scratch_bytes = 0, const GemmTuningOptions& tuning = {});
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  void run(cudaStream_t stream, const GemmArgs& g);
  Fp32Matmul fp32() const { return fp32_; }
  // The same, but false (nothing run) when cuBLASLt offers no algorithm for a pointer-array batch (g's
  // arrays set), so the caller can run the batch another way.
  bool try_run(cudaStream_t stream, const GemmArgs& g);

 private:
  struct Plan;
  using PlanKey = std::array<int64_t, 24>;
  struct HandleDestroyer {
    void operator()(cublasLtHandle_t h) const noexcept;
  };

  // `tensor_tf32`: fp32 operands on the TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32).
  // nullptr: no algorithm for a pointer-array batch (any other GEMM without one is an error). With tuning
  // on, a GEMM new to this process is timed on `stream` (its operands are ready there).
  Plan* plan_for(const GemmArgs& g, bool tensor_tf32, cudaStream_t stream);
  bool run_plain(cudaStream_t stream, const GemmArgs& g, bool tensor_tf32);
  // gemm_3xtf32.cu: an fp32 GEMM as 3xTF32, chunked through the split scratch.
  void run_3xtf32(cudaStream_t stream, const GemmArgs& g);
  void run_3xtf32_chunk(cudaStream_t stream, const GemmArgs& g, const SplitGemmChunks& c, int b0, int nb,
                        int m0, int mc, int n0, int nc, int k0, int kc);

  Fp32Matmul fp32_;
  void* workspace_;
  size_t workspace_bytes_;
  float* split_scratch_;
  size_t split_scratch_floats_;
  std::unique_ptr<std::remove_pointer_t<cublasLtHandle_t>, HandleDestroyer> handle_;
  std::map<PlanKey, std::unique_ptr<Plan>> plans_;
  std::unique_ptr<GemmTuner> tuner_;  // null: cuBLASLt's heuristic choice for every GEMM
};

// dst[c] += sum over rows r of src[r, c], src [rows, cols] of type src_type, dst of dst_type (matmul's
// dbias).
void column_sums_accumulate(cudaStream_t stream, anvil::DType dst_type, void* dst, anvil::DType src_type,
                            const void* src, int rows, int cols);

// --- embedding.cu ------------------------------------------------------------------------------------
void embedding_fwd(cudaStream_t stream, anvil::DType act, void* out, const int32_t* tokens, const void* wte,
                   const void* wpe, int B, int T, int C);
void embedding_bwd(cudaStream_t stream, anvil::DType act, anvil::DType grad, void* dwte, void* dwpe,
                   const void* dout, const int32_t* tokens, int B, int T, int C);
// BERT's word + position + token-type embedding sum and its backward (Ops::bert_embedding_fwd/bwd; types
// may be null = all 0; tokens equal to skip_token give no word-embedding gradient).
void bert_embedding_fwd(cudaStream_t stream, anvil::DType act, void* out, const int32_t* tokens,
                        const int32_t* types, const void* wte, const void* wpe, const void* wtt, int B, int T,
                        int C);
// Ops::embedding_bwd_skip.
void embedding_bwd_skip(cudaStream_t stream, anvil::DType act, anvil::DType grad, void* dwte,
                        const void* dout, const int32_t* tokens, int B, int T, int C, int32_t skip_token);
void bert_embedding_bwd(cudaStream_t stream, anvil::DType act, anvil::DType grad, void* dwte, void* dwpe,
                        void* dwtt, const void* dout, const int32_t* tokens, const int32_t* types, int B,
                        int T, int C, int32_t skip_token);

// --- layernorm.cu ------------------------------------------------------------------------------------
void layernorm_fwd(cudaStream_t stream, anvil::DType act, void* out, float* mean, float* rstd,
                   const void* inp, const void* w, const void* b, int N, int C, float eps);
void residual_layernorm_fwd(cudaStream_t stream, anvil::DType act, void* out, void* ln, float* mean,
                            float* rstd, const void* a, const void* b, const void* w, const void* bias, int N,
                            int C, float eps, const anvil::RowDropout& drop);
void layernorm_bwd(cudaStream_t stream, anvil::DType act, anvil::DType grad, void* dinp, void* dw, void* db,
                   const void* dout, const void* inp, const void* w, const float* mean, const float* rstd,
                   int N, int C);
// Ops::layernorm_bwd_sum: the parameter-gradient kernel runs first (dinp may alias dout2). fp32 rows of at
// most 1024 columns run one kernel, the branch's gradient included; otherwise dropout_rows and
// column_sums_accumulate follow.
void layernorm_bwd_sum(cudaStream_t stream, anvil::DType act, anvil::DType grad, void* dinp, void* dw,
                       void* db, const void* dout, const void* dout2, const void* inp, const void* w,
                       const float* mean, const float* rstd, int N, int C, const anvil::BranchGrad& branch);

// --- rmsnorm.cu -------------------------------------------------------------------------------------
// Ops::rmsnorm_fwd / residual_rmsnorm_fwd (one kernel; out may alias a or b) / rmsnorm_bwd. One block per row
// with the row in registers (rows up to 16k elements); rstd may be null in the forwards. The backward with
// fp32 gradients is one pass for dinp and dw; with 16-bit gradients dw takes a column-tiled kernel that
// rounds once per chunk of >= 256 rows (as layernorm_bwd), then the input gradient.
void rmsnorm_fwd(cudaStream_t stream, anvil::DType act, void* out, float* rstd, const void* inp,
                 const void* w, int N, int C, float eps);
void residual_rmsnorm_fwd(cudaStream_t stream, anvil::DType act, void* out, void* ln, float* rstd,
                          const void* a, const void* b, const void* w, int N, int C, float eps);
void rmsnorm_bwd(cudaStream_t stream, anvil::DType act, anvil::DType grad, void* dinp, void* dw,
                 const void* dout, const void* inp, const void* w, const float* rstd, int N, int C);

// --- rope.cu -----------------------------------------------------------------------------------------
// Ops::rope_fwd (inverse = false) / rope_bwd (inverse = true) on qkv [B, T, (NH + 2 NKV) HS], HS even.
void rope(cudaStream_t stream, anvil::DType act, void* qkv, const float* inv_freq, int B, int T, int NH,
          int NKV, int HS, int pos_offset, bool inverse);

// --- attention.cu: materialised attention (fp32, and the 16-bit fallback) -------------------------------
// The Ops attention contract (kernels/ops.hpp) with AttentionMask unpacked into causal / window / lengths /
// dropout. Attention-probability dropout (AttentionMask::dropout, dropout_state, dropout_site): p == 0 runs
// exactly the kernels without dropout; otherwise the key is read from `state` (device memory) when the
// kernels run.
struct AttentionDropout {
  float p = 0;
  const anvil::DropoutState* state = nullptr;
  uint32_t site = 0;
};
// anvil::AttentionShape (ops.hpp is beyond nvcc's reach): NH query heads, NKV key/value heads (NH a multiple
// of NKV), HS elements each; qkv rows [NH q | NKV k | NKV v] heads, out rows NH heads.
struct AttentionDims {
  int B = 0, T = 0, NH = 0, NKV = 0, HS = 0;
  int q_width() const { return NH * HS; }
  int qkv_width() const { return (NH + 2 * NKV) * HS; }
  bool grouped() const { return NKV < NH; }
};
// `window`: AttentionMask::window (> 0: query t sees keys t2 with t - t2 < window; causal only).
size_t materialized_attention_scratch_bytes(anvil::DType act, const AttentionDims& s);
void materialized_attention_fwd(cudaStream_t stream, Gemm& gemm, anvil::DType act, void* out, float* lse,
                                const void* qkv, void* scratch, const AttentionDims& s, bool causal,
                                int window, const int32_t* lengths, const AttentionDropout& dropout);
void materialized_attention_bwd(cudaStream_t stream, Gemm& gemm, anvil::DType act, void* dqkv,
                                const void* dout, const void* qkv, const void* out, const float* lse,
                                void* scratch, const AttentionDims& s, bool causal, int window,
                                const int32_t* lengths, const AttentionDropout& dropout);
// attention_first_query.cu: Ops::attention_first_query_fwd / _bwd (any storage type, any head size up to
// about 4000).
void attention_first_query_fwd(cudaStream_t stream, anvil::DType act, void* out, float* lse, const void* q,
                               const void* kv, int B, int T, int C, int NH, bool causal,
                               const int32_t* lengths, const AttentionDropout& dropout);
void attention_first_query_bwd(cudaStream_t stream, anvil::DType act, void* dq, void* dkv, const void* dout,
                               const void* q, const void* kv, const void* out, const float* lse, int B, int T,
                               int C, int NH, bool causal, const int32_t* lengths,
                               const AttentionDropout& dropout);
// Zeroes the padding rows (t >= lengths[b]) of x [B,T,width], and of lse [B,NH,T] when not null.
void zero_attention_padding(cudaStream_t stream, anvil::DType act, void* x, int width, float* lse, int B,
                            int T, int NH, const int32_t* lengths);

// --- quantize.cu: Ops::dequantize (codes and scales in device memory) -----------------------------------
void dequantize(cudaStream_t stream, anvil::DType act, void* out, const anvil::QuantizedMatrix& m);
// Ops::quantized_matmul_fwd: one warp per output feature reads its codes once for up to 8 input rows (more
// rows: again per 8). Needs m.cols % kQuantizedGemvColumns == 0 and x 16-byte aligned
// (quantized_gemv_supported); preferred up to kQuantizedGemvMaxRows rows, above which dequantize + GEMM wins.
constexpr int kQuantizedGemvColumns = 64;
constexpr int kQuantizedGemvMaxRows = 16;
bool quantized_gemv_supported(const anvil::QuantizedMatrix& m, const void* x);
void quantized_gemv(cudaStream_t stream, anvil::DType act, void* y, const void* x,
                    const anvil::QuantizedMatrix& m, const void* bias, int N);

// --- kv_cache.cu: generation (the "generation (KV cache)" ops of kernels/ops.hpp) ----------------------
// d.T is Tn, the new tokens per sequence; pos [B] (device) their first position; k and v [B, S, NKV, HS].
void embedding_fwd_at(cudaStream_t stream, anvil::DType act, void* out, const int32_t* tokens,
                      const void* wte, const void* wpe, const int32_t* pos, int B, int Tn, int C);
void rope_fwd_at(cudaStream_t stream, anvil::DType act, void* qkv, const float* inv_freq, const int32_t* pos,
                 const AttentionDims& d);
void kv_cache_write(cudaStream_t stream, anvil::DType act, void* k, void* v, int S, const void* qkv,
                    const int32_t* pos, const AttentionDims& d);
// The largest head size cached_attention_fwd takes.
constexpr int kCachedAttentionMaxHeadSize = 512;
// Split-key ("flash-decoding") attention over the cache: a one-token step of a few sequences spreads each
// sequence's keys over enough thread blocks to fill the GPU, as far as `scratch_bytes` holds their partial
// results (fp32 [B, Tn, NH, splits, HS + 2]); a second kernel combines them.
void cached_attention_fwd(cudaStream_t stream, anvil::DType act, void* out, const void* qkv, const void* k,
                          const void* v, int S, const int32_t* pos, int max_keys, int window, void* scratch,
                          size_t scratch_bytes, const AttentionDims& d);

// --- activation.cu -----------------------------------------------------------------------------------
void gelu_fwd(cudaStream_t stream, anvil::DType act, void* out, const void* inp, size_t n);
void gelu_bwd(cudaStream_t stream, anvil::DType act, void* dinp, const void* inp, const void* dout, size_t n);
void residual_fwd(cudaStream_t stream, anvil::DType act, void* out, const void* a, const void* b, size_t n);
// Ops::swiglu_fwd / swiglu_bwd: inp [N, 2I] = [gate | up].
void swiglu_fwd(cudaStream_t stream, anvil::DType act, void* out, const void* inp, int N, int I);
void swiglu_bwd(cudaStream_t stream, anvil::DType act, void* dinp, const void* inp, const void* dout, int N,
                int I);
// Exact (erf) GELU, tanh, and the first-token rows of [B,T,C] (Ops::gelu_erf_*, tanh_*, first_token_*).
void gelu_erf_fwd(cudaStream_t stream, anvil::DType act, void* out, const void* inp, size_t n);
void gelu_erf_bwd(cudaStream_t stream, anvil::DType act, void* dinp, const void* inp, const void* dout,
                  size_t n);
// Ops::gelu_erf_fwd_bwd: both in one pass over inp.
void gelu_erf_fwd_bwd(cudaStream_t stream, anvil::DType act, void* out, void* dinp, const void* inp,
                      const void* dout, size_t n);
// Ops::gelu_erf_fwd_bwd_bias: one pass with the column sums for fp32 rows of 4k columns, else the two ops.
void gelu_erf_fwd_bwd_bias(cudaStream_t stream, anvil::DType act, anvil::DType grad, void* out, void* dinp,
                           void* dbias, const void* inp, const void* dout, int N, int cols);
void tanh_fwd(cudaStream_t stream, anvil::DType act, void* out, const void* inp, size_t n);
void tanh_bwd(cudaStream_t stream, anvil::DType act, void* dinp, const void* out, const void* dout, size_t n);
void first_token_fwd(cudaStream_t stream, anvil::DType act, void* out, const void* inp, int B, int T, int C);
void first_token_bwd(cudaStream_t stream, anvil::DType act, void* dinp, const void* dout, int B, int T,
                     int C);

// --- dropout.cu --------------------------------------------------------------------------------------
// Ops::dropout: y[i] = dropout_keep(key, i, dropout_threshold(p)) ? x[i] * dropout_scale(p) : 0 with key =
// dropout_key(state->seed, state->micro, site) read on the device when the kernel runs (kernels/dropout.hpp).
// y may alias x.
void dropout(cudaStream_t stream, anvil::DType act, void* y, const void* x, size_t n, float p,
             const anvil::DropoutState* state, uint32_t site);
// Ops::dropout_rows: the same masks, element (r, c) of the rows drawing index r * index_pitch + c.
void dropout_rows(cudaStream_t stream, anvil::DType act, void* y, const void* x, int rows, int cols,
                  size_t index_pitch, float p, const anvil::DropoutState* state, uint32_t site);
// Ops::dropout_next_micro: state->micro += 1 (one thread, in stream order).
void dropout_next_micro(cudaStream_t stream, anvil::DropoutState* state);

// --- loss.cu -----------------------------------------------------------------------------------------
void softmax_xent_fwd_bwd(cudaStream_t stream, anvil::DType act, float* losses, void* logits,
                          const int32_t* targets, int N, int V, int Vp, float grad_scale, bool write_grad,
                          int32_t ignore_index);
// Ops::classification_loss: cross-entropy over NL >= 2 classes (int32 labels, ignore_index rows give 0; an
// out-of-range label gives a NaN loss and gradient) or, for NL == 1, squared error against fp32 labels.
void classification_loss(cudaStream_t stream, anvil::DType act, float* losses, void* dlogits,
                         const void* logits, const void* labels, int N, int NL, float grad_scale,
                         int32_t ignore_index);

// --- reduction.cu ------------------------------------------------------------------------------------
// Device scratch the reductions need: kReducePartials per-block partial sums plus the final result.
constexpr int kReducePartials = 1024;
constexpr size_t kReduceScratchDoubles = kReducePartials + 1;
// Sum of x (or of x^2 when `square`), x of type `dtype`, accumulated in fp64; copies the result back
// (synchronises).
double reduce_sum(cudaStream_t stream, anvil::DType dtype, const void* x, size_t n, bool square,
                  double* scratch);
// The same sum (the same kernels, so the same value) left in device memory, without synchronising:
// *out = sum, or *out += sum when `accumulate`. `scratch` holds kReducePartials doubles.
void reduce_sum_to(cudaStream_t stream, anvil::DType dtype, const void* x, size_t n, bool square,
                   double* scratch, double* out, bool accumulate);
// Ops::grad_clip_scale: one thread, fp64 with explicitly rounded operations (the host's arithmetic).
// `unscale_device`: null, or the unscale factor in device memory (read when the kernel runs).
void grad_clip_scale(cudaStream_t stream, float* scale_out, double* norm_out, const double* sum_squares,
                     double unscale, const double* unscale_device, double max_norm);
// Ops::convert_grads: dst[i] (+)= src[i] across float types (in fp32, rounded once into dst_type).
void convert(cudaStream_t stream, anvil::DType dst_type, void* dst, anvil::DType src_type, const void* src,
             size_t n, bool accumulate);
// Ops::convert_grads_sum_squares: convert, each block summing the squares of what it wrote into
// scratch[block] (kReducePartials at most, a fixed grid for a given n), then *sum_squares += their sum.
void convert_sum_squares(cudaStream_t stream, anvil::DType dst_type, void* dst, anvil::DType src_type,
                         const void* src, size_t n, bool accumulate, double* scratch, double* sum_squares);

// --- precision.cu ------------------------------------------------------------------------------------
// out[i] = master[i] in `out_type`; BF16 with a nonzero seed rounds stochastically (core/half.hpp).
// `seed_device`: null, or the seed in device memory (read when the kernel runs; `rounding_seed` then only
// selects stochastic rounding when nonzero).
void cast_weights(cudaStream_t stream, anvil::DType out_type, void* out, const float* master, size_t n,
                  uint64_t rounding_seed, const uint64_t* seed_device);

// --- optimizer.cu ------------------------------------------------------------------------------------
// Every optimizer launcher takes `grad_scale` and `grad_scale_device` (null, or one fp32 value in device
// memory that the kernels multiply into grad_scale: the optimizer args of kernels/ops.hpp), and the step's
// values (learning rates, step, bias corrections, seeds: kernels/step_values.hpp) as `sv`, or from device
// memory when `sv_device` is set.
//
// Fused AdamW / SGD over the ranges of a parameter-group table (see ParamGroupTable in kernels/ops.hpp;
// per-group weight decay arrays of kMaxParamGroups = 4 entries).
struct GroupTable {
  const uint64_t* begins;
  const uint8_t* groups;
  const uint64_t* state_begins;
  int count;
};
void adamw_fused_step(cudaStream_t stream, anvil::DType grad_type, anvil::DType moment_type, float* param,
                      const void* grad, void* m, void* v, size_t n, const GroupTable& g, float beta1,
                      float beta2, float eps, float grad_scale, const float* grad_scale_device,
                      const float* wd4, const anvil::StepValues& sv, const anvil::StepValues* sv_device);
void sgd_step(cudaStream_t stream, anvil::DType grad_type, float* param, const void* grad,
              float* momentum_buf, size_t n, const GroupTable& g, float momentum, float dampening,
              bool nesterov, float grad_scale, const float* grad_scale_device, const float* wd4,
              const anvil::StepValues& sv, const anvil::StepValues* sv_device);
// [adafactor kernels]
// adafactor.cu: one Adafactor step over a tensor table (AdafactorTensor and AdafactorArgs in kernels/ops.hpp,
// mirrored here for nvcc; cuda_ops.cpp checks the layouts agree), in five launches whatever the tensor count.
struct AdafactorTensorDesc {
  uint64_t offset, rows, cols, row_state, col_state;
  uint32_t factored, group;
};
struct AdafactorParams {
  const float* grad_scale_device;      // null, or multiplies grad_scale (read by the kernels)
  const anvil::StepValues* sv_device;  // null, or step_size and beta2t from device memory
  float grad_scale, eps1, eps2, clip_threshold, beta2t, beta1;
  bool first_moment, scale_parameter;
  float step_size[4], weight_decay[4];
};
void adafactor_step(cudaStream_t stream, anvil::DType grad_type, float* param, const void* grad, float* sq,
                    float* exp_avg, const AdafactorTensorDesc* tensors, int num_tensors, void* scratch,
                    const AdafactorParams& p);
// [adamw8bit kernels]
// 8-bit AdamW (AdamW8bitArgs in kernels/ops.hpp), one 256-thread block per quantisation block of 256 state
// elements. wd4: per-group weight decays (kMaxParamGroups = 4 entries); the kernel derives its step factor
// sqrt(1-b2^t) / (1-b1^t) (times the group's lr: the step size) and eps * sqrt(1-b2^t) from sv's bias terms.
void adamw8bit_step(cudaStream_t stream, anvil::DType grad_type, float* param, const void* grad,
                    uint8_t* m_codes, float* m_absmax, uint8_t* v_codes, float* v_absmax, const float* m_map,
                    const float* v_map, size_t n, size_t num_blocks, const GroupTable& g, float beta1,
                    float beta2, float eps, float grad_scale, const float* grad_scale_device,
                    const float* wd4, const anvil::StepValues& sv, const anvil::StepValues* sv_device);

}  // namespace anvil::cuda
