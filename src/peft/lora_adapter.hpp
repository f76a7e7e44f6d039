// The LoRA term of one Linear (model/linear.hpp's adapter hook): for each adapted part of the Linear's
// output (the whole of it, or a module inside a fused matrix: q, k, v inside QKV; gate, up inside the
// SwiGLU input), y[:, part] += s (x A^T) B^T with A [r, in], B [part rows, r] (peft/lora_config.hpp).
//
// Backward, per part (t = x A^T is recomputed, [N, r]: cheaper than keeping it): u = s dy[:, part] B;
// dB += s dy[:, part]^T t; dA += u^T x; dx += u A. Everything runs through Ops::gemm, on whatever backend
// the ops are: no kernel of its own.
//
// With dropout (lora_dropout, training forwards only), x is replaced by dropout(x) in each part's term, with
// a mask of its own per part (PEFT's nn.Dropout per module): drawn from the DropoutState by site
// (kernels/dropout.hpp), so backward and recomputation draw the forward's mask again, and the part's input
// gradient passes through the same mask (dx += dropout(u A)).
#pragma once
#include <span>

#include "model/linear.hpp"

namespace anvil {

struct LoraPart {
  int first = 0, rows = 0;  // output features [first, first + rows) of the Linear
  const void* a = nullptr;  // A [r, in], compute type
  const void* b = nullptr;  // B [rows, r], compute type
  void* da = nullptr;       // [grad] dA, dB (null: no gradients: a forward-only use)
  void* db = nullptr;
};

// Dropout on the adapters' input: probability p (0: none), the state its masks are drawn from, the site of
// the first part (part i uses first_site + i), and a [N, in] compute-type scratch for the dropped input.
struct LoraDropout {
  float p = 0.f;
  const DropoutState* state = nullptr;
  uint32_t first_site = 0;
  void* scratch = nullptr;
};

class LoraAdapter final : public LinearAdapter {
 public:
  LoraAdapter() = default;
  // `parts` (kept by view: they must outlive the adapter's uses) are the Linear's adapted output blocks.
  // `scratch` holds two [N, r] matrices of the compute type for the largest N the Linear sees
  // (scratch_elements).
  LoraAdapter(std::span<const LoraPart> parts, int in, int out, int r, float scale, void* scratch,
              OpsPrecision precision, LoraDropout dropout = {});
  static size_t scratch_elements(int max_rows, int r) { return 2 * size_t(max_rows) * size_t(r); }

  bool empty() const { return parts_.empty(); }
  void forward(Ops& ops, void* y, const void* x, int N) const override;
  void backward(Ops& ops, void* dx, const void* dy, const void* x, int N) const override;

 private:
  std::span<const LoraPart> parts_;
  int in_ = 0, out_ = 0, r_ = 0;
  float scale_ = 1;
  void* scratch_ = nullptr;
  size_t elem_ = 4;  // bytes per compute-type element
  LoraDropout drop_;
  // Part i's input: x, or dropout(x) written into the dropout scratch.
  const void* part_input(Ops& ops, const void* x, int N, size_t i) const;
};

}  // namespace anvil
