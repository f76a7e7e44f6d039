// The operator contract shared by the CPU reference backend and the CUDA backend. All pointers are in
// the owning Device's memory; all tensors are row-major and contiguous; all math is fp32 over fp32, bf16 or
// fp16 storage (see OpsPrecision; on CUDA, fp32 GEMMs may use TF32 tensor cores, as TF32 or 3xTF32:
// Fp32Matmul). Work is
// queued in order on the device's compute stream.
//
// Gradient convention: parameter gradients (dw, db, dwte, dwpe) ACCUMULATE (+=), so micro-batches sum
// into one buffer; activation gradients are OVERWRITTEN unless the comment says "accumulates".
//
// Op families: one interface per family under kernels/ops/, each declaring its ops with their contracts
// and the types they take; Ops inherits them all, and cpu/cpu_ops.cpp and cuda/cuda_ops.cpp bind them to
// the kernels (a file or a few per family under cpu/ and cuda/):
//   embedding_ops.hpp   EmbeddingOps: GPT-2's token + position lookup, the lookup with a padding row that
//                       gets no gradient, BERT's sum with token types
//   norm_ops.hpp        NormOps: layernorm, rmsnorm, and their fused residual forms (residual_layernorm_fwd,
//                       residual_rmsnorm_fwd, layernorm_bwd_sum)
//   linear_ops.hpp      LinearOps: matmul and its fused GELU forms; GradWrite
//   attention_ops.hpp   AttentionOps: self-attention (AttentionShape, AttentionMask), rope, first-query
//                       attention, attention scratch sizes and the CUDA attention path
//   kv_cache_ops.hpp    KvCacheOps: generation at per-sequence positions (embedding, rope, KV-cache writes,
//                       attention over the cache); KvCacheLayer
//   activation_ops.hpp  ActivationOps: gelu, exact erf gelu, tanh, swiglu, residual, dropout, first-token
//                       rows
//   loss_ops.hpp        LossOps: softmax cross-entropy; sequence classification
//   reduction_ops.hpp   ReductionOps: sums, sums of squares, the gradient-clipping factor
//   optimizer_ops.hpp   OptimizerOps: AdamW, SGD, Adafactor, 8-bit AdamW and their arguments; weight casts
//   quant_ops.hpp       QuantOps: dequantization of an int8 or NF4 weight (kernels/quantization.hpp)
// A fused op's contract says which plain ops it equals in sequence; the CPU reference composes them.
// What stays here is what crosses the families: the instance's device and storage types, and the factories.
#pragma once
#include <cstddef>
#include <memory>

#include "kernels/gemm_tuning_cache.hpp"
#include "kernels/ops/activation_ops.hpp"
#include "kernels/ops/attention_ops.hpp"
#include "kernels/ops/embedding_ops.hpp"
#include "kernels/ops/kv_cache_ops.hpp"
#include "kernels/ops/linear_ops.hpp"
#include "kernels/ops/loss_ops.hpp"
#include "kernels/ops/norm_ops.hpp"
#include "kernels/ops/optimizer_ops.hpp"
#include "kernels/ops/quant_ops.hpp"
#include "kernels/ops/reduction_ops.hpp"
#include "kernels/split_gemm_plan.hpp"
#include "runtime/device.hpp"

namespace anvil {

// The storage types an Ops instance works in. `compute`: activations, activation gradients and the model's
// weights (F32, BF16 or F16). `grad`: parameter gradients (F32, or the compute type when 16-bit gradients
// are chosen to save memory). Math is fp32 whatever the storage: 16-bit values are widened on load and
// rounded to nearest even on store; GEMMs accumulate in fp32.
struct OpsPrecision {
  DType compute = DType::F32;
  DType grad = DType::F32;
};

// Pointer types: `void*` arguments are in the compute type unless marked [grad] (the gradient type);
// `float*` arguments are always fp32.
class Ops : public EmbeddingOps,
            public NormOps,
            public LinearOps,
            public AttentionOps,
            public KvCacheOps,
            public ActivationOps,
            public LossOps,
            public ReductionOps,
            public OptimizerOps,
            public QuantOps {
 public:
  ~Ops() override = default;
  virtual Device& device() = 0;
  virtual OpsPrecision precision() const = 0;
};

// `precision.compute` must be F32, BF16 or F16 and `precision.grad` F32 or the compute type.
void validate_ops_precision(OpsPrecision p);

std::unique_ptr<Ops> make_cpu_ops(Device& dev, OpsPrecision precision = {});
// `tf32`: allow TF32 tensor cores in fp32 GEMMs. `workspace` is a device buffer of `workspace_bytes` for
// cuBLASLt.
std::unique_ptr<Ops> make_cuda_ops(Device& dev, bool tf32, void* workspace, size_t workspace_bytes,
                                   OpsPrecision precision = {});
// The device buffers of CUDA GEMMs: cuBLASLt's workspace, and for Fp32Matmul::TF32x3 the split scratch
// (split_gemm_scratch_bytes; ignored otherwise).
struct CudaGemmBuffers {
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  float* split_scratch = nullptr;
  size_t split_scratch_bytes = 0;
};
// fp32 GEMMs as `fp32` says (split_gemm_plan.hpp); 16-bit GEMMs are unaffected.
// `tuning`: GEMM algorithm tuning (kernels/cuda/gemm_tuner.hpp).
std::unique_ptr<Ops> make_cuda_ops(Device& dev, Fp32Matmul fp32, const CudaGemmBuffers& buffers,
                                   OpsPrecision precision = {}, const GemmTuningOptions& tuning = {});
constexpr size_t kCudaGemmWorkspaceBytes = 32ull << 20;

}  // namespace anvil