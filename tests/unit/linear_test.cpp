// Linear (src/model/linear.hpp), the one linear layer of every model, on the CPU: its adapter hook and its
// output-row slices. An adapter that adds x M^T (a dense stand-in for LoRA's low-rank term) must make the
// Linear behave exactly like one whose weight is W + M: outputs, input gradients (with and without GELU),
// and the adapter's own gradient equal to that Linear's weight gradient.
#include "model/linear.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "anvil/rng.hpp"
#include "kernels/ops.hpp"
#include "runtime/device.hpp"

namespace anvil {
namespace {

std::vector<float> randn(Rng& rng, size_t n) {
  std::vector<float> v(n);
  for (float& x : v) x = rng.normal();
  return v;
}

// y += x M^T; its gradient dM += dy^T x (when x is given), dx += dy M (when dx is given).
class DenseAdapter final : public LinearAdapter {
 public:
  DenseAdapter(std::vector<float> m, int in, int out)
      : m_(std::move(m)), dm_(m_.size()), in_(in), out_(out) {}
  void forward(Ops& ops, void* y, const void* x, int N) const override {
    std::vector<float> t(size_t(N) * out_);
    ops.matmul_fwd(t.data(), x, m_.data(), nullptr, N, in_, out_);
    ops.residual_fwd(y, y, t.data(), t.size());
  }
  void backward(Ops& ops, void* dx, const void* dy, const void* x, int N) const override {
    std::vector<float> t(size_t(N) * in_);
    ops.matmul_bwd(dx ? t.data() : nullptr, x ? dm_.data() : nullptr, nullptr, dy, x, m_.data(), N, in_,
                   out_);
    if (dx) ops.residual_fwd(dx, dx, t.data(), t.size());
  }
  const std::vector<float>& grad() const { return dm_; }

 private:
  std::vector<float> m_;
  mutable std::vector<float> dm_;
  int in_, out_;
};

void expect_close(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], 1e-4 * (1 + std::abs(b[i]))) << what << " at " << i;
}

class LinearTest : public ::testing::Test {
 protected:
  std::unique_ptr<Device> dev_ = make_cpu_device();
  std::unique_ptr<Ops> ops_ = make_cpu_ops(*dev_);
  Rng rng_{7};
  static constexpr int N = 5, K = 6, OC = 4;
};

TEST_F(LinearTest, AnAdapterActsAsAnAddedWeight) {
  const std::vector<float> w = randn(rng_, OC * K), b = randn(rng_, OC), m = randn(rng_, OC * K);
  const std::vector<float> x = randn(rng_, N * K), dy = randn(rng_, N * OC);
  std::vector<float> sum(w.size());
  for (size_t i = 0; i < w.size(); ++i) sum[i] = w[i] + m[i];
  DenseAdapter adapter(m, K, OC);
  std::vector<float> dw(w.size()), db(OC), dw_sum(w.size()), db_sum(OC);
  const Linear with_adapter =
      Linear(w.data(), b.data(), K, OC, {}).with_grads(dw.data(), db.data()).with_adapter(&adapter);
  const Linear merged = Linear(sum.data(), b.data(), K, OC, {}).with_grads(dw_sum.data(), db_sum.data());

  std::vector<float> y(N * OC), y_ref(N * OC);
  with_adapter.forward(*ops_, y.data(), x.data(), N);
  merged.forward(*ops_, y_ref.data(), x.data(), N);
  expect_close(y, y_ref, "forward");

  std::vector<float> dx(N * K), dx_ref(N * K);
  with_adapter.backward(*ops_, dx.data(), dy.data(), x.data(), N);
  merged.backward(*ops_, dx_ref.data(), dy.data(), x.data(), N);
  expect_close(dx, dx_ref, "input gradient");
  expect_close(adapter.grad(), dw_sum, "the adapter's gradient against the merged weight's");
  expect_close(db, db_sum, "bias gradient");
  // The base weight's gradient is the merged one's too: the adapter changes the output, not dW's formula.
  expect_close(dw, dw_sum, "base weight gradient");
}

TEST_F(LinearTest, GeluPathsWithAnAdapterMatchTheMergedWeight) {
  const std::vector<float> w = randn(rng_, OC * K), m = randn(rng_, OC * K);
  const std::vector<float> x = randn(rng_, N * K);
  std::vector<float> sum(w.size());
  for (size_t i = 0; i < w.size(); ++i) sum[i] = w[i] + m[i];
  DenseAdapter adapter(m, K, OC);
  const Linear with_adapter = Linear(w.data(), nullptr, K, OC, {}).with_adapter(&adapter);
  const Linear merged(sum.data(), nullptr, K, OC, {});
  std::vector<float> y(N * OC), pre(N * OC), y_ref(N * OC), pre_ref(N * OC);
  with_adapter.forward_gelu(*ops_, y.data(), pre.data(), x.data(), N);
  merged.forward_gelu(*ops_, y_ref.data(), pre_ref.data(), x.data(), N);
  expect_close(pre, pre_ref, "GELU input");
  expect_close(y, y_ref, "GELU output");

  // A projection [K2 = OC inputs -> 3 outputs] reading gelu(pre): its input gradient through GELU.
  const int OC2 = 3;
  const std::vector<float> w2 = randn(rng_, OC2 * OC), m2 = randn(rng_, OC2 * OC), dy = randn(rng_, N * OC2);
  std::vector<float> sum2(w2.size());
  for (size_t i = 0; i < w2.size(); ++i) sum2[i] = w2[i] + m2[i];
  DenseAdapter adapter2(m2, OC, OC2);
  std::vector<float> dx(N * OC), dx_ref(N * OC);
  Linear(w2.data(), nullptr, OC, OC2, {})
      .with_adapter(&adapter2)
      .backward_dgelu(*ops_, dx.data(), dy.data(), y.data(), pre.data(), N);
  Linear(sum2.data(), nullptr, OC, OC2, {})
      .backward_dgelu(*ops_, dx_ref.data(), dy.data(), y.data(), pre.data(), N);
  expect_close(dx, dx_ref, "input gradient through GELU");
}

TEST_F(LinearTest, OutRowsIsTheSubLayer) {
  const std::vector<float> w = randn(rng_, OC * K), b = randn(rng_, OC), x = randn(rng_, N * K);
  const std::vector<float> dy = randn(rng_, N * 2);
  std::vector<float> dw(w.size()), db(OC);
  const Linear full = Linear(w.data(), b.data(), K, OC, {}).with_grads(dw.data(), db.data());
  const Linear rows = full.out_rows(1, 2);  // outputs 1 and 2
  EXPECT_EQ(rows.out(), 2);
  EXPECT_EQ(rows.in(), K);
  std::vector<float> y(N * 2), y_full(N * OC);
  rows.forward(*ops_, y.data(), x.data(), N);
  full.forward(*ops_, y_full.data(), x.data(), N);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < 2; ++o) EXPECT_FLOAT_EQ(y[n * 2 + o], y_full[n * OC + 1 + o]);
  std::vector<float> dx(N * K);
  rows.backward(*ops_, dx.data(), dy.data(), x.data(), N);
  // Only rows 1 and 2 of dW and entries 1 and 2 of db receive gradients.
  for (int k = 0; k < K; ++k) {
    EXPECT_EQ(dw[k], 0.0f);
    EXPECT_EQ(dw[3 * K + k], 0.0f);
    EXPECT_NE(dw[1 * K + k], 0.0f);
  }
  EXPECT_EQ(db[0], 0.0f);
  EXPECT_EQ(db[3], 0.0f);
  EXPECT_NE(db[1], 0.0f);
}

}  // namespace
}  // namespace anvil
