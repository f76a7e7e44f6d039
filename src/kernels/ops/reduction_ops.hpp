// Reduction ops: sums and sums of squares (the non-finite check rides on them), returned to the host or
// left in device memory, the gradient-clipping factor computed on the device, and the conversion (or
// addition) of one gradient buffer into another of any float type.
//
// Part of the Ops contract (kernels/ops.hpp: memory, storage types, the `[grad]` pointer marks, and the
// gradient convention: parameter gradients accumulate, activation gradients are overwritten unless a
// comment says otherwise). Ops inherits this interface; CpuOps and CudaOps implement it.
#pragma once
#include <cstddef>

#include "anvil/dtype.hpp"
#include "kernels/step_values.hpp"

namespace anvil {

class ReductionOps {
 public:
  virtual ~ReductionOps() = default;

  // --- reduction -------------------------------------------------------------------------------------
  // Sum over x[0..n) of x^2 (x of type `dtype`: F32, BF16 or F16), accumulated in at least fp32 with a
  // deterministic order on the CPU; returned to the host (synchronises). Inf or NaN anywhere in x gives a
  // non-finite result (the fp16 overflow check relies on it).
  virtual double sum_squares(const void* x, DType dtype, size_t n) = 0;
  // Sum of x[0..n) (fp32), returned to the host (synchronises).
  virtual double sum(const float* x, size_t n) = 0;

  // The same reductions with the result left in device memory (`double*`: one fp64 value in the backend's
  // memory), queued on the compute stream without synchronising: a training step keeps its loss and
  // gradient norm on the device and reads them once, at its end. Each computes exactly the value (same
  // order, same fp64 accumulation) that the host-returning form above returns, so moving a caller from one
  // to the other changes no result.
  // out[0] += sum of x[0..n) (fp32 x): the step's loss, summed over its micro-batches.
  virtual void accumulate_sum(double* out, const float* x, size_t n) = 0;
  // out[0] = sum of x[i]^2 over x[0..n) (as sum_squares: non-finite when any x[i] is).
  virtual void sum_squares_to(double* out, const void* x, DType dtype, size_t n) = 0;
  // The optimizer's gradient multiplier from the squared norm of the stored gradients, on the device (the
  // trainer's clipping by global norm, torch.nn.utils.clip_grad_norm_ semantics). In fp64, as the host
  // computation it replaces, with the clip factor rounded to fp32:
  //   norm_out[0]  = sqrt(sum_squares[0]) * unscale      (the norm of the true gradient, for logging)
  //   clip         = max_norm > 0 && norm > max_norm ? fp32(max_norm / (norm + 1e-6)) : 1
  //   scale_out[0] = fp32(clip * unscale)                (for the optimizer's grad_scale_device)
  // `unscale` turns stored gradients into true ones (1 / (loss scale x tokens) and the like). A NaN norm
  // gives clip 1 and an infinite one clip 0: the caller must check norm_out before it trusts the step.
  // With `step_values` set, unscale is step_values->unscale, read when the op runs (a graph-safe step).
  virtual void grad_clip_scale(float* scale_out, double* norm_out, const double* sum_squares, double unscale,
                               double max_norm, const StepValues* step_values) = 0;

  // --- conversion and accumulation -------------------------------------------------------------------
  // For i < n: dst[i] = src[i] (accumulate false: OVERWRITES) or dst[i] += src[i] (true: ACCUMULATES), dst
  // of `dst_type` and src of `src_type` (F32, BF16 or F16, in any pairing), computed in fp32 and rounded to
  // nearest even once into dst_type. Data parallelism moves gradients into and out of the communication
  // type with it (communication_data_type) and sums a reduced piece into the gradients kept for the
  // optimizer (ZeRO stage 2). dst and src must not overlap unless they are the same memory and type.
  virtual void convert_grads(void* dst, DType dst_type, const void* src, DType src_type, size_t n,
                             bool accumulate) = 0;
  // convert_grads, then sum_squares[0] += the sum of dst[i]^2 over the values it wrote (fp64, as
  // sum_squares over dst; ACCUMULATES into one fp64 value in the backend's memory; deterministic for a given
  // n, in another order than sum_squares_to). Offloaded gradients (ParamStore::grads_on_host) get their
  // norm's squares as each piece is written, so the norm never reads them back over the bus.
  virtual void convert_grads_sum_squares(void* dst, DType dst_type, const void* src, DType src_type, size_t n,
                                         bool accumulate, double* sum_squares) = 0;
};

}  // namespace anvil
