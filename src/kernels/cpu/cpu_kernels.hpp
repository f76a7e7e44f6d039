// CPU reference kernels: fp32 math, OpenMP, OpenBLAS for GEMMs. Semantics are those of kernels/ops.hpp.
// Every reduction runs in a fixed order independent of the thread count, so a CPU run is bit-for-bit
// reproducible (the resume test relies on it).
//
// 16-bit storage is emulated: BF16/F16 tensors really hold uint16_t bit patterns, every value is widened
// to fp32 on load and rounded to nearest even on store (core/half.hpp), as a CUDA kernel writing bf16 or
// fp16 would. Accumulating outputs (parameter gradients, layernorm's dinp) are read, added to in fp32 and
// rounded once. The kernels are templates over the storage types; with F32 storage the loads and stores
// are the identity and the arithmetic is exactly that of the fp32-only backend.
//
// Scratch outside the arena: GEMMs on 16-bit storage widen their operands into fp32 buffers, and 16-bit
// attention and embedding backward keep fp32 accumulators. Those buffers are grow-only, per thread
// (thread_scratch below), and are not part of the MemoryPlan: they are an artefact of emulating 16-bit
// storage with an fp32 BLAS, allocated on the first step only. The fp32 path uses none of them.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "anvil/dtype.hpp"
#include "anvil/error.hpp"
#include "core/half.hpp"
#include "kernels/ops.hpp"

namespace anvil::cpu {

// Sum of term(i) over [0, n) in kChunks fixed chunks, each summed in order (in parallel), then combined in
// order: the result does not depend on the number of threads.
template <int kChunks, class F>
double fixed_order_sum(size_t n, F&& term) {
  std::array<double, kChunks> partial{};
  const size_t chunk = (n + kChunks - 1) / kChunks;
#pragma omp parallel for schedule(static)
  for (int c = 0; c < kChunks; ++c) {
    const size_t begin = std::min(n, c * chunk), end = std::min(n, begin + chunk);
    double s = 0;
    for (size_t i = begin; i < end; ++i) s += term(i);
    partial[c] = s;
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

// --- storage types -------------------------------------------------------------------------------------

// Storage<D>::type is what a tensor of dtype D holds per element; load widens it to fp32, store rounds
// an fp32 value into it (to nearest even).
template <DType D>
struct Storage;
template <>
struct Storage<DType::F32> {
  using type = float;
  static float load(float x) { return x; }
  static float store(float x) { return x; }
};
template <>
struct Storage<DType::BF16> {
  using type = uint16_t;
  static float load(uint16_t x) { return bf16_to_float(x); }
  static uint16_t store(float x) { return float_to_bf16(x); }
};
template <>
struct Storage<DType::F16> {
  using type = uint16_t;
  static float load(uint16_t x) { return fp16_to_float(x); }
  static uint16_t store(float x) { return float_to_fp16(x); }
};
template <DType D>
using storage_t = typename Storage<D>::type;

template <DType D>
using DTypeTag = std::integral_constant<DType, D>;

// Calls f(DTypeTag<D>{}) for the floating storage type `t` (F32, BF16 or F16).
template <class F>
decltype(auto) dispatch_float(DType t, F&& f) {
  switch (t) {
    case DType::F32:
      return f(DTypeTag<DType::F32>{});
    case DType::BF16:
      return f(DTypeTag<DType::BF16>{});
    case DType::F16:
      return f(DTypeTag<DType::F16>{});
    default:
      break;
  }
  ANVIL_THROW("the CPU kernels have no {} storage (F32, BF16 or F16)", dtype_name(t));
}

// Calls f(DTypeTag<Act>{}, DTypeTag<Grad>{}) for a valid (compute, gradient) pair: the gradient type is
// F32 or the compute type (validate_ops_precision).
template <class F>
decltype(auto) dispatch_act_grad(DType act, DType grad, F&& f) {
  if (grad == DType::F32) return dispatch_float(act, [&](auto a) { return f(a, DTypeTag<DType::F32>{}); });
  ANVIL_ASSERT(grad == act, "gradient dtype {} with compute dtype {}", dtype_name(grad), dtype_name(act));
  return dispatch_float(act, [&](auto a) { return f(a, a); });
}

// A grow-only buffer of `n` elements of the calling thread, one per `slot` (callers use distinct slots for
// buffers alive at the same time). Contents are unspecified on return.
enum ScratchSlot { kScratchA, kScratchB, kScratchC, kScratchD, kScratchE, kScratchSlots };
template <class T>
T* thread_scratch(ScratchSlot slot, size_t n) {
  thread_local std::vector<T> buffers[kScratchSlots];
  std::vector<T>& b = buffers[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

// --- kernels -------------------------------------------------------------------------------------------
// `act` is the compute (activation and weight) dtype of the void* arguments, `grad` the dtype of those
// ops.hpp marks [grad]. float* arguments are fp32.

void embedding_fwd(DType act, void* out, const int32_t* tokens, const void* wte, const void* wpe, int B,
                   int T, int C);
void embedding_bwd(DType act, DType grad, void* dwte, void* dwpe, const void* dout, const int32_t* tokens,
                   int B, int T, int C);
void bert_embedding_fwd(DType act, void* out, const int32_t* tokens, const int32_t* types, const void* wte,
                        const void* wpe, const void* wtt, int B, int T, int C);
// Ops::embedding_bwd_skip.
void embedding_bwd_skip(DType act, DType grad, void* dwte, const void* dout, const int32_t* tokens, int B,
                        int T, int C, int32_t skip_token);
void bert_embedding_bwd(DType act, DType grad, void* dwte, void* dwpe, void* dwtt, const void* dout,
                        const int32_t* tokens, const int32_t* types, int B, int T, int C, int32_t skip_token);

void layernorm_fwd(DType act, void* out, float* mean, float* rstd, const void* inp, const void* w,
                   const void* b, int N, int C, float eps = kLayerNormEps);
void layernorm_bwd(DType act, DType grad, void* dinp, void* dw, void* db, const void* dout, const void* inp,
                   const void* w, const float* mean, const float* rstd, int N, int C);
void layernorm_bwd_sum(DType act, DType grad, void* dinp, void* dw, void* db, const void* dout,
                       const void* dout2, const void* inp, const void* w, const float* mean,
                       const float* rstd, int N, int C);

// rmsnorm.cpp: Ops::rmsnorm_fwd / rmsnorm_bwd (rstd may be null in the forward). The backward's dw sums
// dout times the normalised input as the forward rounded it to the compute type (what Hugging Face's weight
// gradient sees); its dinp differentiates the fp32 math.
void rmsnorm_fwd(DType act, void* out, float* rstd, const void* inp, const void* w, int N, int C, float eps);
void rmsnorm_bwd(DType act, DType grad, void* dinp, void* dw, const void* dout, const void* inp,
                 const void* w, const float* rstd, int N, int C);

// rope.cpp: Ops::rope_fwd / rope_bwd (throw anvil::Error for an odd or empty head size).
void rope_fwd(DType act, void* qkv, const float* inv_freq, const AttentionShape& s, int pos_offset);
void rope_bwd(DType act, void* dqkv, const float* inv_freq, const AttentionShape& s, int pos_offset);

// kv_cache.cpp: the generation ops (Ops::embedding_fwd_at, rope_fwd_at, kv_cache_write,
// cached_attention_fwd); they check the positions (pos is host memory here) and throw anvil::Error naming the
// one out of range.
void embedding_fwd_at(DType act, void* out, const int32_t* tokens, const void* wte, const void* wpe,
                      const int32_t* pos, int B, int Tn, int C);
void rope_fwd_at(DType act, void* qkv, const float* inv_freq, const AttentionShape& s, const int32_t* pos);
void kv_cache_write(DType act, const KvCacheLayer& cache, const void* qkv, const int32_t* pos,
                    const AttentionShape& s);
void cached_attention_fwd(DType act, void* out, const void* qkv, const KvCacheLayer& cache,
                          const int32_t* pos, int max_keys, int window, const AttentionShape& s);

// quantize.cpp: Ops::dequantize, Ops::quantized_matmul_fwd.
void dequantize(DType act, void* out, const QuantizedMatrix& m);
void quantized_matmul_fwd(DType act, void* y, const void* x, const QuantizedMatrix& m, const void* bias,
                          int N);

void matmul_fwd(DType act, void* out, const void* inp, const void* w, const void* bias, int N, int K, int OC);
// Ops::gemm: C in `act`, or in `grad` with g.c_grad.
void gemm(DType act, DType grad, const GemmSpec& g);
// dw_overwrite: dw = dout^T inp instead of dw += dout^T inp (dbias always accumulates).
void matmul_bwd(DType act, DType grad, void* dinp, void* dw, void* dbias, const void* dout, const void* inp,
                const void* w, int N, int K, int OC, bool dw_overwrite = false);

// Ops::attention_fwd / _bwd (any head counts and head size, sliding window); they check the shape and mask.
size_t attention_scratch_bytes(DType act, const AttentionShape& s);
void attention_fwd(DType act, void* out, float* lse, const void* qkv, void* scratch, const AttentionShape& s,
                   const AttentionMask& mask);
void attention_bwd(DType act, void* dqkv, const void* dout, const void* qkv, const void* out,
                   const float* lse, void* scratch, const AttentionShape& s, const AttentionMask& mask);
// Ops::attention_first_query_fwd / _bwd.
void attention_first_query_fwd(DType act, void* out, float* lse, const void* q, const void* kv, int B, int T,
                               int C, int NH, const AttentionMask& mask);
void attention_first_query_bwd(DType act, void* dq, void* dkv, const void* dout, const void* q,
                               const void* kv, const void* out, const float* lse, int B, int T, int C, int NH,
                               const AttentionMask& mask);

void gelu_fwd(DType act, void* out, const void* inp, size_t n);
void gelu_bwd(DType act, void* dinp, const void* inp, const void* dout, size_t n);
void residual_fwd(DType act, void* out, const void* a, const void* b, size_t n);
// Ops::swiglu_fwd / swiglu_bwd (activation.cpp).
void swiglu_fwd(DType act, void* out, const void* inp, int N, int I);
void swiglu_bwd(DType act, void* dinp, const void* inp, const void* dout, int N, int I);
void dropout(DType act, void* y, const void* x, size_t n, float p, const DropoutState* state, uint32_t site);
void dropout_rows(DType act, void* y, const void* x, int rows, int cols, size_t index_pitch, float p,
                  const DropoutState* state, uint32_t site);
void gelu_erf_fwd(DType act, void* out, const void* inp, size_t n);
void gelu_erf_bwd(DType act, void* dinp, const void* inp, const void* dout, size_t n);
void tanh_fwd(DType act, void* out, const void* inp, size_t n);
void tanh_bwd(DType act, void* dinp, const void* out, const void* dout, size_t n);
void first_token_fwd(DType act, void* out, const void* inp, int B, int T, int C);
void first_token_bwd(DType act, void* dinp, const void* dout, int B, int T, int C);

void softmax_xent_fwd_bwd(DType act, float* losses, void* logits, const int32_t* targets, int N, int V,
                          int Vp, float grad_scale, bool write_grad);
void classification_loss(DType act, float* losses, void* dlogits, const void* logits, const void* labels,
                         int N, int NL, float grad_scale);

double sum_squares(DType dtype, const void* x, size_t n);
double sum(const float* x, size_t n);
// The device-result forms (Ops::accumulate_sum, sum_squares_to, grad_clip_scale); "device" memory is host
// memory here.
void accumulate_sum(double* out, const float* x, size_t n);
void sum_squares_to(DType dtype, double* out, const void* x, size_t n);
void grad_clip_scale(float* scale_out, double* norm_out, const double* sum_squares, double unscale,
                     double max_norm);
// Ops::convert_grads: dst[i] (+)= src[i] across float types (in fp32, rounded once into dst_type).
void convert(DType dst_type, void* dst, DType src_type, const void* src, size_t n, bool accumulate);

void cast_weights(DType out_type, void* out, const float* master, size_t n, uint64_t rounding_seed);

// The step's values an optimizer op runs with: *a.step_values when set (the trainer's copy, refreshed each
// step), else those of the by-value arguments.
template <class Args>
StepValues step_values_for(const Args& a) {
  if (a.step_values) return *a.step_values;
  StepValues sv;
  fill_step_values(a, sv);
  return sv;
}

// The gradient multiplier of an optimizer step: grad_scale times *grad_scale_device when set (see the
// optimizer args in kernels/ops.hpp). 1 * x == x exactly, so a factor moved from the host to the device
// gives the same updates bit for bit.
template <class Args>
float effective_grad_scale(const Args& a) {
  return a.grad_scale_device ? a.grad_scale * *a.grad_scale_device : a.grad_scale;
}

void adamw_fused_step(DType grad_type, float* param, const void* grad, void* m, void* v, DType moment_dtype,
                      size_t n, const ParamGroupTable& g, const FusedAdamWArgs& a);
void sgd_step(DType grad_type, float* param, const void* grad, float* momentum_buf, size_t n,
              const ParamGroupTable& g, const SgdArgs& a);
// [adafactor kernels]
void adafactor_step(DType grad_type, float* param, const void* grad, float* sq, float* exp_avg,
                    const AdafactorTensor* tensors, int num_tensors, const AdafactorArgs& a);
// [adamw8bit kernels]
void adamw8bit_step(DType grad_type, float* param, const void* grad, uint8_t* m_codes, float* m_absmax,
                    uint8_t* v_codes, float* v_absmax, const float* m_map, const float* v_map, size_t n,
                    size_t num_blocks, const ParamGroupTable& g, const AdamW8bitArgs& a);
// The code of the value of a sorted 256-entry map nearest x (ties to the lower code): what the 8-bit AdamW
// kernels requantise with.
uint8_t quantize_to_map(const float* map, float x);
// The same code through a bucket index of the map (built once per map; what the CPU 8-bit AdamW kernel
// uses): equal to quantize_to_map for every float.
uint8_t quantize_to_map_indexed(const float* map, float x);

}  // namespace anvil::cpu
