#include "peft/lora_adapter.hpp"

#include "anvil/error.hpp"

namespace anvil {
namespace {
const void* at(const void* p, size_t bytes) {
  return static_cast<const char*>(p) + bytes;
}
void* at(void* p, size_t bytes) {
  return static_cast<char*>(p) + bytes;
}
}  // namespace

LoraAdapter::LoraAdapter(std::span<const LoraPart> parts, int in, int out, int r, float scale, void* scratch,
                         OpsPrecision precision, LoraDropout dropout)
    : parts_(parts),
      in_(in),
      out_(out),
      r_(r),
      scale_(scale),
      scratch_(scratch),
      elem_(dtype_bits(precision.compute) / 8),
      drop_(dropout) {
  ANVIL_ASSERT(r >= 1 && (parts_.empty() || scratch), "LoRA adapter of rank {} without scratch", r);
  ANVIL_ASSERT(drop_.p == 0 || (drop_.p > 0 && drop_.p < 1 && drop_.state && drop_.scratch),
               "LoRA dropout {} without its state and scratch", drop_.p);
  for (const LoraPart& p : parts_)
    ANVIL_ASSERT(p.first >= 0 && p.rows >= 1 && p.first + p.rows <= out && p.a && p.b,
                 "LoRA part [{}, {}) of a Linear with {} outputs", p.first, p.first + p.rows, out);
}

const void* LoraAdapter::part_input(Ops& ops, const void* x, int N, size_t i) const {
  if (drop_.p == 0) return x;
  ops.dropout(drop_.scratch, x, size_t(N) * in_, drop_.p, drop_.state, drop_.first_site + uint32_t(i));
  return drop_.scratch;
}

void LoraAdapter::forward(Ops& ops, void* y, const void* x_in, int N) const {
  void* t = scratch_;
  for (size_t i = 0; i < parts_.size(); ++i) {
    const LoraPart& p = parts_[i];
    const void* x = part_input(ops, x_in, N, i);
    // t [N, r] = x A^T
    ops.gemm({.a = x, .b = p.a, .trans_b = true, .c = t, .m = N, .n = r_, .k = in_});
    // y[:, part] += s t B^T
    ops.gemm({.a = t,
              .b = p.b,
              .trans_b = true,
              .c = at(y, size_t(p.first) * elem_),
              .m = N,
              .n = p.rows,
              .k = r_,
              .ldc = out_,
              .alpha = scale_,
              .beta = 1.f});
  }
}

void LoraAdapter::backward(Ops& ops, void* dx, const void* dy, const void* x_in, int N) const {
  void* t = scratch_;
  void* u = at(scratch_, size_t(N) * r_ * elem_);
  for (size_t i = 0; i < parts_.size(); ++i) {
    const LoraPart& p = parts_[i];
    const void* x = part_input(ops, x_in, N, i);
    const void* dy_part = at(dy, size_t(p.first) * elem_);
    // u [N, r] = s dy[:, part] B
    ops.gemm({.a = dy_part, .b = p.b, .c = u, .m = N, .n = r_, .k = p.rows, .lda = out_, .alpha = scale_});
    if (p.db) {
      // t = x A^T; dB [rows, r] += s dy[:, part]^T t
      ops.gemm({.a = x, .b = p.a, .trans_b = true, .c = t, .m = N, .n = r_, .k = in_});
      ops.gemm({.a = dy_part,
                .trans_a = true,
                .b = t,
                .c = p.db,
                .c_grad = true,
                .m = p.rows,
                .n = r_,
                .k = N,
                .lda = out_,
                .alpha = scale_,
                .beta = 1.f});
    }
    // dA [r, in] += u^T x
    if (p.da)
      ops.gemm({.a = u,
                .trans_a = true,
                .b = x,
                .c = p.da,
                .c_grad = true,
                .m = r_,
                .n = in_,
                .k = N,
                .beta = 1.f});
    // dx [N, in] += u A; with dropout, through the part's mask: dx += dropout(u A) (the dropped input is no
    // longer needed, so its scratch takes u A).
    if (!dx) continue;
    if (drop_.p == 0) {
      ops.gemm({.a = u, .b = p.a, .c = dx, .m = N, .n = in_, .k = r_, .beta = 1.f});
      continue;
    }
    ops.gemm({.a = u, .b = p.a, .c = drop_.scratch, .m = N, .n = in_, .k = r_});
    ops.dropout(drop_.scratch, drop_.scratch, size_t(N) * in_, drop_.p, drop_.state,
                drop_.first_site + uint32_t(i));
    ops.residual_fwd(dx, dx, drop_.scratch, size_t(N) * in_);
  }
}

}  // namespace anvil
