#include "model/linear.hpp"

#include "anvil/error.hpp"

namespace anvil {
namespace {
const void* offset_or_null(const void* p, size_t bytes) {
  return p ? static_cast<const char*>(p) + bytes : nullptr;
}
void* offset_or_null(void* p, size_t bytes) {
  return p ? static_cast<char*>(p) + bytes : nullptr;
}
}  // namespace

Linear::Linear(const void* w, const void* b, int in, int out, OpsPrecision precision)
    : w_(w),
      b_(b),
      in_(in),
      out_(out),
      w_elem_(dtype_bits(precision.compute) / 8),
      g_elem_(dtype_bits(precision.grad) / 8) {}

Linear::Linear(WeightView w, const void* b, int in, int out, OpsPrecision precision)
    : Linear(w.dense, b, in, out, precision) {
  if (!w.quantized) return;
  ANVIL_ASSERT(!w.dense && w.workspace, "a quantized Linear weight needs a workspace and no dense weight");
  ANVIL_ASSERT(w.quantized->rows == out && w.quantized->cols == in,
               "quantized weight [{}, {}] for a Linear of {} inputs and {} outputs", w.quantized->rows,
               w.quantized->cols, in, out);
  q_ = w.quantized, workspace_ = w.workspace;
}

const void* Linear::gemm_weight(Ops& ops) const {
  if (!q_) return w_;
  ops.dequantize(workspace_, *q_);
  return workspace_;
}

Linear Linear::with_grads(void* dw, void* db) const {
  ANVIL_ASSERT(!q_ || !dw, "a quantized Linear weight has no gradient (it is frozen)");
  Linear l = *this;
  l.dw_ = dw, l.db_ = db;
  return l;
}

Linear Linear::out_rows(int first, int count) const {
  ANVIL_ASSERT(first >= 0 && count >= 1 && first + count <= out_,
               "out_rows [{}, {}) of a Linear with {} outputs", first, first + count, out_);
  ANVIL_ASSERT(!q_, "out_rows of a quantized Linear");
  Linear l = *this;
  const size_t rows = size_t(first) * in_;
  l.w_ = offset_or_null(w_, rows * w_elem_), l.b_ = offset_or_null(b_, size_t(first) * w_elem_);
  l.dw_ = offset_or_null(dw_, rows * g_elem_), l.db_ = offset_or_null(db_, size_t(first) * g_elem_);
  l.out_ = count;
  return l;
}

Linear Linear::with_adapter(const LinearAdapter* adapter) const {
  Linear l = *this;
  l.adapter_ = adapter;
  return l;
}

void Linear::forward(Ops& ops, void* y, const void* x, int N) const {
  // A few rows (decoding): one pass over the codes, no dequantized copy.
  if (q_ && ops.quantized_matmul_preferred(*q_, N))
    ops.quantized_matmul_fwd(y, x, *q_, b_, N);
  else
    ops.matmul_fwd(y, x, gemm_weight(ops), b_, N, in_, out_);
  if (adapter_) adapter_->forward(ops, y, x, N);
}

void Linear::forward_gelu(Ops& ops, void* y, void* pre, const void* x, int N) const {
  if (!adapter_ && !(q_ && ops.quantized_matmul_preferred(*q_, N))) {
    ops.matmul_gelu_fwd(y, pre, x, gemm_weight(ops), b_, N, in_, out_);
    return;
  }
  forward(ops, pre, x, N);
  ops.gelu_fwd(y, pre, size_t(N) * out_);
}

void Linear::backward(Ops& ops, void* dx, const void* dy, const void* x, int N, GradWrite dw_write) const {
  // The weight is read for dx only.
  ops.matmul_bwd(dx, dw_, db_, dy, x, dx ? gemm_weight(ops) : w_, N, in_, out_, dw_write);
  if (adapter_) adapter_->backward(ops, dx, dy, x, N);
}

void Linear::backward_dgelu(Ops& ops, void* dx, const void* dy, const void* x, const void* gelu_pre, int N,
                            GradWrite dw_write) const {
  if (!adapter_) {
    ops.matmul_bwd_dgelu(dx, dw_, db_, dy, x, gemm_weight(ops), gelu_pre, N, in_, out_, dw_write);
    return;
  }
  backward(ops, dx, dy, x, N, dw_write);
  ops.gelu_bwd(dx, gelu_pre, dx, size_t(N) * in_);
}

}  // namespace anvil
