// One linear layer, y[N, out] = x[N, in] W^T + b, over views of a model's ParamStore: the weight W [out, in]
// and bias b [out] (null: none) in the compute type, their gradients (null: not computed), and the hook of
// an adapter. Every matmul of the Decoder and of BertModel goes through a Linear, so that what changes a
// linear layer for all models (a LoRA adapter beside a frozen weight, a quantized weight) changes this one
// place.
//
// A Linear is a small value made per use from the store's views (Decoder::block_linears, BertModel's
// layers): it owns nothing.
#pragma once
#include "kernels/ops.hpp"

namespace anvil {

// A Linear's weight as the store keeps it: dense in the compute type, or a quantized matrix (int8 / NF4,
// model/quantized_weights.hpp) that the Linear dequantizes into `workspace` (the compute type, at least the
// matrix's size; shared by a model's Linears, which run one at a time on the device's queue) before each
// GEMM that reads it.
struct WeightView {
  const void* dense = nullptr;
  const QuantizedMatrix* quantized = nullptr;
  void* workspace = nullptr;
};

// What an adapter adds to a Linear's output (LoRA: y += s (x A^T) B^T). The Linear calls it after its own
// GEMM in the forward, and after its own input gradient in the backward.
class LinearAdapter {
 public:
  virtual ~LinearAdapter() = default;
  // Adds the adapter's term for the input x [N, in] into y [N, out].
  virtual void forward(Ops& ops, void* y, const void* x, int N) const = 0;
  // From dy [N, out] and the forward's x [N, in]: adds the term's input gradient into dx [N, in] (when dx is
  // not null) and accumulates the adapter's own parameter gradients.
  virtual void backward(Ops& ops, void* dx, const void* dy, const void* x, int N) const = 0;
};

class Linear {
 public:
  // `w` [out, in] and `b` [out] (may be null) in the compute type of `precision`; no gradients until
  // with_grads.
  Linear(const void* w, const void* b, int in, int out, OpsPrecision precision);
  // The same with the store's view of the weight (quantized: no weight gradient, no out_rows).
  Linear(WeightView w, const void* b, int in, int out, OpsPrecision precision);

  // The same layer with gradients: dw [out, in] and db [out] in the gradient type (either may be null: not
  // computed).
  Linear with_grads(void* dw, void* db) const;
  // Output features [first, first + count) alone (a slice of a fused QKV): the rows of W, b and their
  // gradients.
  Linear out_rows(int first, int count) const;
  // Attaches an adapter (null: none). The adapter must outlive the Linear's uses.
  Linear with_adapter(const LinearAdapter* adapter) const;

  int in() const { return in_; }
  int out() const { return out_; }
  // The dense weight (null for a quantized one).
  const void* weight() const { return w_; }
  bool quantized() const { return q_ != nullptr; }
  void* weight_grad() const { return dw_; }

  // y = x W^T + b (+ the adapter's term). A quantized weight is dequantized into the workspace first, or,
  // for the few rows the ops prefer (Ops::quantized_matmul_preferred: decoding), read by
  // Ops::quantized_matmul_fwd directly.
  void forward(Ops& ops, void* y, const void* x, int N) const;
  // pre = x W^T + b (+ the adapter's term), y = gelu(pre) (tanh approximation): one GEMM with the GELU
  // epilogue on CUDA when there is no adapter.
  void forward_gelu(Ops& ops, void* y, void* pre, const void* x, int N) const;
  // dx = dy W (overwritten; skipped when dx is null), plus the adapter's input gradient; dw (+)= dy^T x as
  // `dw_write` says and db += column sums of dy, when this Linear has them (with_grads); x is needed only
  // for dw and the adapter.
  void backward(Ops& ops, void* dx, const void* dy, const void* x, int N,
                GradWrite dw_write = GradWrite::Accumulate) const;
  // backward of a Linear whose input x was gelu(gelu_pre): dx = (dy W + the adapter's term) * gelu'(gelu_pre)
  // (dx required), the parameter gradients as in backward.
  void backward_dgelu(Ops& ops, void* dx, const void* dy, const void* x, const void* gelu_pre, int N,
                      GradWrite dw_write = GradWrite::Accumulate) const;

 private:
  // The weight the GEMM reads: w_, or q_ dequantized into workspace_ (queued on ops).
  const void* gemm_weight(Ops& ops) const;
  const void* w_;
  const QuantizedMatrix* q_ = nullptr;
  void* workspace_ = nullptr;
  const void* b_;
  void* dw_ = nullptr;
  void* db_ = nullptr;
  int in_, out_;
  size_t w_elem_, g_elem_;  // bytes per element of the compute and gradient types
  const LinearAdapter* adapter_ = nullptr;
};

}  // namespace anvil
