// Adafactor (transformers.optimization.Adafactor semantics) on the CPU: several steps on a small GPT-2
// layout against an independent fp64 reference of transformers' formulas, computed per tensor in Hugging
// Face's orientation (Conv1D weights [in, out], the unpadded vocabulary), over a grid of hyper-parameters
// (factored and unfactored tensors, beta1, relative_step, scale_parameter, warmup_init, weight decay, group
// lr multipliers, clip threshold, decay rate, gradient scale, 16-bit gradients); the exact state memory;
// padding rows left alone; a state save/restore round trip; thread-count independence; a training run.
#include "optim/adafactor.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "anvil/model_config.hpp"
#include "anvil/rng.hpp"
#include "anvil/trainer.hpp"
#include "core/half.hpp"
#include "data/byte_corpus.hpp"
#include "kernels/ops.hpp"
#include "model/param_layout.hpp"
#include "runtime/arena.hpp"
#include "runtime/device.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

TransformerConfig tiny_gpt2() {
  TransformerConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.vocab_size = 100;  // padded to 128 in the layout
  c.block_size = 16;
  return c;
}

// --- the reference: transformers' Adafactor, fp64, per tensor in HF's shape ------------------------------

struct RefHyper {
  float lr = 0;  // the scheduled lr (used without relative_step)
  OptimizerHyper h;
};

struct RefTensor {
  const ParamTensor* t = nullptr;
  ParamGroup group = ParamGroup::Decay;
  int64_t rows = 1, cols = 0;  // HF's shape: rows x cols (vectors: 1 x n)
  bool factored = false;
  std::vector<double> p, row, col, v, m;
  // Anvil flat index of HF element (r, c).
  size_t flat(int64_t r, int64_t c) const {
    if (t->hf_transposed) return t->offset + size_t(c * rows + r);  // Anvil [cols, rows]
    return t->offset + size_t(r * cols + c);
  }
};

class Reference {
 public:
  // `vocab_rows`: rows of wte the optimizer sees (0: all, padding included).
  Reference(const ParamLayout& layout, const std::vector<float>& params, int64_t vocab_rows) {
    for (const ParamUnit& u : layout.units())
      for (size_t ti : u.tensors) {
        const ParamTensor& t = layout.tensors()[ti];
        RefTensor r;
        r.t = &t;
        r.group = !t.decay                ? ParamGroup::NoDecay
                  : u.name == "embedding" ? ParamGroup::Embedding
                                          : ParamGroup::Decay;
        if (t.shape.ndim == 2) {
          r.factored = true;
          int64_t a = t.shape[0], b = t.shape[1];
          if (t.name == "transformer.wte.weight" && vocab_rows > 0) a = vocab_rows;
          r.rows = t.hf_transposed ? b : a;
          r.cols = t.hf_transposed ? a : b;
          r.row.assign(size_t(r.rows), 0.0);
          r.col.assign(size_t(r.cols), 0.0);
        } else {
          r.cols = t.shape[0];
          r.v.assign(size_t(r.cols), 0.0);
        }
        r.m.assign(size_t(r.rows * r.cols), 0.0);
        for (int64_t i = 0; i < r.rows; ++i)
          for (int64_t j = 0; j < r.cols; ++j) r.p.push_back(params[r.flat(i, j)]);
        tensors_.push_back(std::move(r));
      }
  }

  // One step with the (already widened) flat gradients times grad_scale.
  void step(const RefHyper& hp, int64_t step, const std::vector<double>& grads_flat, double grad_scale) {
    const OptimizerHyper& h = hp.h;
    for (RefTensor& r : tensors_) {
      const size_t n = size_t(r.rows * r.cols);
      std::vector<double> g(n);
      for (int64_t i = 0; i < r.rows; ++i)
        for (int64_t j = 0; j < r.cols; ++j)
          g[size_t(i * r.cols + j)] = grads_flat[r.flat(i, j)] * grad_scale;
      // _get_lr
      const double rms_p = rms(r.p);
      double rel = hp.lr;
      if (h.relative_step) {
        const double min_step = h.warmup_init ? 1e-6 * double(step) : 1e-2;
        rel = std::min(min_step, 1.0 / std::sqrt(double(step)));
      }
      rel *= h.lr_multiplier[int(r.group)];
      const double lr = h.scale_parameter ? std::max(double(h.adafactor_eps2), rms_p) * rel : rel;
      const double beta2t = 1.0 - std::pow(double(step), double(h.decay_rate));
      std::vector<double> u(n);
      for (size_t i = 0; i < n; ++i) u[i] = g[i] * g[i] + double(h.adafactor_eps1);
      if (r.factored) {
        for (int64_t i = 0; i < r.rows; ++i) {
          double s = 0;
          for (int64_t j = 0; j < r.cols; ++j) s += u[size_t(i * r.cols + j)];
          r.row[size_t(i)] = beta2t * r.row[size_t(i)] + (1 - beta2t) * s / double(r.cols);
        }
        for (int64_t j = 0; j < r.cols; ++j) {
          double s = 0;
          for (int64_t i = 0; i < r.rows; ++i) s += u[size_t(i * r.cols + j)];
          r.col[size_t(j)] = beta2t * r.col[size_t(j)] + (1 - beta2t) * s / double(r.rows);
        }
        double row_mean = 0;
        for (double x : r.row) row_mean += x;
        row_mean /= double(r.rows);
        for (int64_t i = 0; i < r.rows; ++i)
          for (int64_t j = 0; j < r.cols; ++j) {
            const size_t k = size_t(i * r.cols + j);
            u[k] = 1.0 / std::sqrt(r.row[size_t(i)] / row_mean) / std::sqrt(r.col[size_t(j)]) * g[k];
          }
      } else {
        for (size_t i = 0; i < n; ++i) {
          r.v[i] = beta2t * r.v[i] + (1 - beta2t) * u[i];
          u[i] = g[i] / std::sqrt(r.v[i]);
        }
      }
      const double clip = std::max(1.0, rms(u) / double(h.clip_threshold));
      for (double& x : u) x = x / clip * lr;
      if (h.adafactor_beta1) {
        const double b1 = *h.adafactor_beta1;
        for (size_t i = 0; i < n; ++i) {
          r.m[i] = b1 * r.m[i] + (1 - b1) * u[i];
          u[i] = r.m[i];
        }
      }
      const double wd = r.group == ParamGroup::NoDecay ? 0.0 : double(h.weight_decay);
      for (size_t i = 0; i < n; ++i) r.p[i] = r.p[i] - wd * lr * r.p[i] - u[i];
    }
  }

  const std::vector<RefTensor>& tensors() const { return tensors_; }

 private:
  static double rms(const std::vector<double>& x) {
    double s = 0;
    for (double v : x) s += v * v;
    return std::sqrt(s / double(x.size()));
  }
  std::vector<RefTensor> tensors_;
};

// --- Anvil's side: the optimizer on the CPU device, with its own arena ------------------------------------

struct Rig {
  TransformerConfig cfg = tiny_gpt2();
  ParamLayout layout = ParamLayout::decoder(cfg);
  std::unique_ptr<Device> dev = make_cpu_device();
  std::unique_ptr<Ops> ops;
  std::unique_ptr<Adafactor> opt;
  std::unique_ptr<Arena> arena;
  float* params = nullptr;
  void* grads = nullptr;
  DType grad_type;

  Rig(const OptimizerHyper& h, DType grad_type_ = DType::F32, int64_t vocab_rows = 100)
      : grad_type(grad_type_) {
    ops = make_cpu_ops(*dev, {grad_type, grad_type});
    opt = std::make_unique<Adafactor>(layout, h, vocab_rows);
    MemoryPlan plan;
    const size_t ip = plan.add("params", MemoryCategory::Weights, n() * sizeof(float));
    const size_t ig = plan.add("grads", MemoryCategory::Gradients, n() * dtype_bits(grad_type) / 8);
    opt->plan_memory(plan);
    arena = std::make_unique<Arena>(*dev, plan);
    params = arena->get<float>(ip);
    grads = arena->get<void>(ig);
    opt->bind(*arena);
    opt->reset(*dev);
  }
  size_t n() const { return layout.total_numel(); }

  // Stores fp32 gradients in the gradient type; returns what the optimizer will read (widened).
  std::vector<double> set_grads(const std::vector<float>& g) {
    std::vector<double> widened(g.size());
    if (grad_type == DType::F32) {
      std::memcpy(grads, g.data(), g.size() * sizeof(float));
      for (size_t i = 0; i < g.size(); ++i) widened[i] = g[i];
    } else {
      auto* dst = static_cast<uint16_t*>(grads);
      for (size_t i = 0; i < g.size(); ++i) {
        dst[i] = grad_type == DType::BF16 ? float_to_bf16(g[i]) : float_to_fp16(g[i]);
        widened[i] = grad_type == DType::BF16 ? bf16_to_float(dst[i]) : fp16_to_float(dst[i]);
      }
    }
    return widened;
  }
  std::vector<float> host_params() const { return {params, params + n()}; }
  std::vector<float> state(const std::string& name) const {
    for (const OptimizerStateTensor& s : opt->state_tensors())
      if (s.name == name) {
        const float* p = static_cast<const float*>(s.data);
        return {p, p + s.count};
      }
    ADD_FAILURE() << "no state " << name;
    return {};
  }
};

// Initial weights like GPT-2's (N(0, 0.02) matrices, LayerNorm ~1, small biases), padding rows 0.
std::vector<float> initial_params(const ParamLayout& layout, const TransformerConfig& cfg, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> p(layout.total_numel(), 0.0f);
  for (const ParamTensor& t : layout.tensors()) {
    size_t n = t.numel();
    if (t.name == "transformer.wte.weight") n = size_t(cfg.vocab_size) * cfg.n_embd;
    const bool ln_weight = t.init == ParamTensor::Init::Ones;
    for (size_t i = 0; i < n; ++i)
      p[t.offset + i] =
          t.shape.ndim == 2 ? 0.02f * rng.normal() : (ln_weight ? 1.0f : 0.0f) + 0.05f * rng.normal();
  }
  return p;
}

// Gradients with row and column structure (so the factored statistics matter), zero on padding rows.
std::vector<float> random_grads(const ParamLayout& layout, const TransformerConfig& cfg, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> g(layout.total_numel(), 0.0f);
  for (const ParamTensor& t : layout.tensors()) {
    int64_t rows = t.shape.ndim == 2 ? t.shape[0] : 1, cols = t.shape.ndim == 2 ? t.shape[1] : t.shape[0];
    if (t.name == "transformer.wte.weight") rows = cfg.vocab_size;
    std::vector<float> rs(static_cast<size_t>(rows)), cs(static_cast<size_t>(cols));
    for (float& x : rs) x = std::exp(0.7f * rng.normal());
    for (float& x : cs) x = std::exp(0.7f * rng.normal());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        g[t.offset + size_t(r * cols + c)] = 1e-2f * rs[r] * cs[c] * rng.normal();
  }
  return g;
}

// Max |got - want| over the tensor must be within rel * (max |want - before|) + abs_rel * max |want|.
void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                  const std::vector<double>& before, double rel, double abs_rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double max_diff = 0, max_delta = 0, max_want = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(got[i] - want[i]));
    max_delta = std::max(max_delta, std::fabs(want[i] - (before.empty() ? 0.0 : before[i])));
    max_want = std::max(max_want, std::fabs(want[i]));
  }
  EXPECT_LE(max_diff, rel * max_delta + abs_rel * max_want)
      << what << ": max diff " << max_diff << ", max change " << max_delta << ", max value " << max_want;
}

struct Case {
  std::string name;
  OptimizerHyper h;
  float lr = 1e-3f;
  float grad_scale = 1.0f;
  DType grad_type = DType::F32;
  int64_t vocab_rows = 100;
};

std::vector<Case> cases() {
  std::vector<Case> cs;
  const auto add = [&](std::string name, auto&& edit) {
    Case c;
    c.name = std::move(name);
    edit(c);
    cs.push_back(c);
  };
  add("defaults", [](Case&) {});
  add("beta1", [](Case& c) { c.h.adafactor_beta1 = 0.9f; });
  add("external_lr", [](Case& c) {
    c.h.relative_step = false, c.h.scale_parameter = false, c.h.adafactor_beta1 = 0.9f;
    c.h.weight_decay = 0.01f, c.lr = 1e-3f;
  });
  add("external_lr_scaled", [](Case& c) { c.h.relative_step = false, c.lr = 3e-2f; });
  add("relative_unscaled", [](Case& c) { c.h.scale_parameter = false; });
  add("warmup_init", [](Case& c) { c.h.warmup_init = true, c.h.adafactor_beta1 = 0.5f; });
  add("decay_and_multipliers", [](Case& c) {
    c.h.weight_decay = 0.1f, c.h.adafactor_beta1 = 0.8f;
    c.h.lr_multiplier[int(ParamGroup::NoDecay)] = 2.0f, c.h.lr_multiplier[int(ParamGroup::Embedding)] = 0.5f;
  });
  add("decay_and_multipliers_external_lr", [](Case& c) {
    c.h.relative_step = false, c.lr = 5e-3f, c.h.weight_decay = 0.05f;
    c.h.lr_multiplier[int(ParamGroup::Decay)] = 0.7f, c.h.lr_multiplier[int(ParamGroup::NoDecay)] = 3.0f;
    c.h.lr_multiplier[int(ParamGroup::Embedding)] = 0.25f;
  });
  add("clip_decay_rate_eps_scale", [](Case& c) {
    c.h.clip_threshold = 0.5f, c.h.decay_rate = -0.5f, c.h.adafactor_eps2 = 3e-2f,
    c.h.adafactor_eps1 = 1e-20f;
    c.grad_scale = 0.25f;
  });
  add("no_clipping_large_threshold", [](Case& c) { c.h.clip_threshold = 100.0f; });
  add("bf16_grads",
      [](Case& c) { c.grad_type = DType::BF16, c.grad_scale = 2.0f, c.h.adafactor_beta1 = 0.9f; });
  add("f16_grads", [](Case& c) { c.grad_type = DType::F16, c.grad_scale = 0.5f; });
  add("padding_rows_included", [](Case& c) { c.vocab_rows = 0; });
  return cs;
}

TEST(Adafactor, MatchesAnFp64ReferenceOfTransformersFormulas) {
  constexpr int kSteps = 4;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    Rig s(c.h, c.grad_type, c.vocab_rows);
    const std::vector<float> p0 = initial_params(s.layout, s.cfg, 11);
    std::memcpy(s.params, p0.data(), p0.size() * sizeof(float));
    Reference ref(s.layout, p0, c.vocab_rows);
    const std::vector<RefTensor> before = ref.tensors();
    for (int step = 1; step <= kSteps; ++step) {
      const std::vector<double> g = s.set_grads(random_grads(s.layout, s.cfg, 100 + step));
      s.opt->step(*s.ops, s.params, s.grads, c.lr, step, c.grad_scale);
      ref.step({c.lr, c.h}, step, g, c.grad_scale);
    }
    const std::vector<float> got = s.host_params();
    const std::vector<float> rows = s.state("adafactor.exp_avg_sq_row"),
                             cols = s.state("adafactor.exp_avg_sq_col"),
                             vecs = s.state("adafactor.exp_avg_sq");
    const std::vector<float> m = c.h.adafactor_beta1 ? s.state("adafactor.exp_avg") : std::vector<float>{};
    for (size_t k = 0; k < ref.tensors().size(); ++k) {
      const RefTensor& r = ref.tensors()[k];
      const AdafactorTensor& d = s.opt->tensor_table()[k];
      const std::string& name = r.t->name;
      std::vector<double> got_p, got_m;
      for (int64_t i = 0; i < r.rows; ++i)
        for (int64_t j = 0; j < r.cols; ++j) {
          got_p.push_back(got[r.flat(i, j)]);
          if (!m.empty()) got_m.push_back(m[r.flat(i, j)]);
        }
      // Parameters to ~1e-6 of their size, and their change over the steps to 1e-5 where fp32 can resolve it.
      expect_close(got_p, r.p, before[k].p, 1e-5, 1e-6, "param " + name);
      if (!m.empty()) expect_close(got_m, r.m, {}, 1e-5, 0, "exp_avg " + name);
      if (r.factored) {
        // Anvil's rows are HF's columns for the Conv1D weights (stored transposed).
        const std::vector<double>& want_rows = r.t->hf_transposed ? r.col : r.row;
        const std::vector<double>& want_cols = r.t->hf_transposed ? r.row : r.col;
        ASSERT_EQ(d.rows, want_rows.size()) << name;
        ASSERT_EQ(d.cols, want_cols.size()) << name;
        const std::vector<double> got_rows(rows.begin() + d.row_state, rows.begin() + d.row_state + d.rows);
        const std::vector<double> got_cols(cols.begin() + (d.col_state - rows.size()),
                                           cols.begin() + (d.col_state - rows.size()) + d.cols);
        expect_close(got_rows, want_rows, {}, 1e-5, 0, "exp_avg_sq_row " + name);
        expect_close(got_cols, want_cols, {}, 1e-5, 0, "exp_avg_sq_col " + name);
      } else {
        const size_t off = d.row_state - rows.size() - cols.size();
        const std::vector<double> got_v(vecs.begin() + off, vecs.begin() + off + d.cols);
        expect_close(got_v, r.v, {}, 1e-5, 0, "exp_avg_sq " + name);
      }
    }
  }
}

TEST(Adafactor, StateIsExactlyRowsPlusColumnsPerMatrixAndNumelPerVector) {
  for (const bool beta1 : {false, true}) {
    OptimizerHyper h;
    if (beta1) h.adafactor_beta1 = 0.9f;
    const TransformerConfig cfg = tiny_gpt2();
    const ParamLayout layout = ParamLayout::decoder(cfg);
    const Adafactor opt(layout, h, cfg.vocab_size);
    size_t rows = 0, cols = 0, vecs = 0;
    for (const ParamTensor& t : layout.tensors()) {
      if (t.shape.ndim == 2) {
        rows += t.name == "transformer.wte.weight" ? size_t(cfg.vocab_size) : size_t(t.shape[0]);
        cols += size_t(t.shape[1]);
      } else {
        vecs += t.numel();
      }
    }
    EXPECT_EQ(opt.row_state_floats(), rows);
    EXPECT_EQ(opt.col_state_floats(), cols);
    EXPECT_EQ(opt.vector_state_floats(), vecs);
    EXPECT_EQ(opt.first_moment_floats(), beta1 ? layout.total_numel() : 0u);
    // GPT-2 small's factored state is tiny next to its parameter count.
    EXPECT_LT(rows + cols + vecs, layout.total_numel() / 4);

    MemoryPlan plan;
    Adafactor planned(layout, h, cfg.vocab_size);
    planned.plan_memory(plan);
    const size_t tensors = layout.tensors().size();
    const size_t want = (rows + cols + vecs) * 4 + (beta1 ? layout.total_numel() * 4 : 0) +
                        tensors * sizeof(AdafactorTensor) + tensors * kAdafactorScratchBytesPerTensor +
                        ParamRangeTable::from_layout(layout).device_bytes();
    EXPECT_EQ(plan.requested_bytes(MemoryCategory::OptimizerState), want);
    EXPECT_EQ(plan.bytes(MemoryCategory::OptimizerState), planned.state_bytes());

    std::vector<std::string> names;
    for (const auto& s : planned.state_tensors()) {
      names.push_back(s.name);
      EXPECT_EQ(s.dtype, DType::F32);
    }
    std::vector<std::string> want_names = {"adafactor.exp_avg_sq_row", "adafactor.exp_avg_sq_col",
                                           "adafactor.exp_avg_sq"};
    if (beta1) want_names.push_back("adafactor.exp_avg");
    EXPECT_EQ(names, want_names);
    EXPECT_EQ(planned.kind(), OptimizerKind::Adafactor);
  }
}

TEST(Adafactor, LeavesVocabularyPaddingRowsAlone) {
  OptimizerHyper h;
  h.weight_decay = 0.1f;
  Rig s(h);
  std::vector<float> p0 = initial_params(s.layout, s.cfg, 3);
  const ParamTensor& wte = s.layout.get("transformer.wte.weight");
  const size_t real = size_t(s.cfg.vocab_size) * s.cfg.n_embd;
  for (size_t i = real; i < wte.numel(); ++i) p0[wte.offset + i] = 0.5f;  // recognisable
  std::memcpy(s.params, p0.data(), p0.size() * sizeof(float));
  std::vector<float> g = random_grads(s.layout, s.cfg, 4);
  for (size_t i = real; i < wte.numel(); ++i) g[wte.offset + i] = 1.0f;  // would move them if read
  s.set_grads(g);
  for (int step = 1; step <= 3; ++step) s.opt->step(*s.ops, s.params, s.grads, 0.0f, step, 1.0f);
  for (size_t i = real; i < wte.numel(); ++i) ASSERT_EQ(s.params[wte.offset + i], 0.5f) << i;
  EXPECT_NE(s.params[wte.offset], p0[wte.offset]);
}

TEST(Adafactor, StateRoundTripContinuesBitForBit) {
  OptimizerHyper h;
  h.adafactor_beta1 = 0.9f;
  h.weight_decay = 0.01f;
  Rig a(h), b(h);
  const std::vector<float> p0 = initial_params(a.layout, a.cfg, 7);
  std::memcpy(a.params, p0.data(), p0.size() * sizeof(float));
  for (int step = 1; step <= 2; ++step) {
    a.set_grads(random_grads(a.layout, a.cfg, 50 + step));
    a.opt->step(*a.ops, a.params, a.grads, 0.0f, step, 1.0f);
  }
  // Save a's state and weights through host copies (what a checkpoint does), restore into b.
  std::memcpy(b.params, a.params, a.n() * sizeof(float));
  const auto sa = a.opt->state_tensors(), sb = b.opt->state_tensors();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    ASSERT_EQ(sa[i].name, sb[i].name);
    ASSERT_EQ(sa[i].count, sb[i].count);
    std::vector<float> host(sa[i].count);
    a.dev->copy_to_host(host.data(), sa[i].data, host.size() * sizeof(float));
    b.dev->copy_to_device(sb[i].data, host.data(), host.size() * sizeof(float));
  }
  for (int step = 3; step <= 4; ++step) {
    const std::vector<float> g = random_grads(a.layout, a.cfg, 50 + step);
    a.set_grads(g);
    b.set_grads(g);
    a.opt->step(*a.ops, a.params, a.grads, 0.0f, step, 1.0f);
    b.opt->step(*b.ops, b.params, b.grads, 0.0f, step, 1.0f);
  }
  EXPECT_EQ(0, std::memcmp(a.params, b.params, a.n() * sizeof(float)));
  for (size_t i = 0; i < sa.size(); ++i)
    EXPECT_EQ(0, std::memcmp(sa[i].data, sb[i].data, sa[i].count * sizeof(float))) << sa[i].name;
}

TEST(Adafactor, ResultDoesNotDependOnTheThreadCount) {
  OptimizerHyper h;
  h.adafactor_beta1 = 0.9f;
  std::vector<std::vector<float>> results;
  const int threads = omp_get_max_threads();
  for (const int t : {1, 3}) {
    omp_set_num_threads(t);
    Rig s(h);
    const std::vector<float> p0 = initial_params(s.layout, s.cfg, 9);
    std::memcpy(s.params, p0.data(), p0.size() * sizeof(float));
    for (int step = 1; step <= 3; ++step) {
      s.set_grads(random_grads(s.layout, s.cfg, 70 + step));
      s.opt->step(*s.ops, s.params, s.grads, 0.0f, step, 1.0f);
    }
    results.push_back(s.host_params());
  }
  omp_set_num_threads(threads);
  EXPECT_EQ(0, std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)));
}

TEST(Adafactor, RefusesInvalidHyperParameters) {
  const TransformerConfig cfg = tiny_gpt2();
  const ParamLayout layout = ParamLayout::decoder(cfg);
  OptimizerHyper h;
  h.relative_step = false, h.warmup_init = true;
  EXPECT_THROW(Adafactor(layout, h), Error);
  h = {};
  h.clip_threshold = 0;
  EXPECT_THROW(Adafactor(layout, h), Error);
  h = {};
  h.adafactor_beta1 = 1.0f;
  EXPECT_THROW(Adafactor(layout, h), Error);
  h = {};
  EXPECT_THROW(Adafactor(layout, h, 129), Error);  // more rows than wte has
}

TEST(Adafactor, StepSizeFollowsTransformersGetLr) {
  const TransformerConfig cfg = tiny_gpt2();
  const ParamLayout layout = ParamLayout::decoder(cfg);
  OptimizerHyper h;
  h.lr_multiplier[int(ParamGroup::Embedding)] = 0.5f;
  const Adafactor rel(layout, h);
  EXPECT_FLOAT_EQ(rel.step_size(123.f, 1, ParamGroup::Decay), 1e-2f);  // min(1e-2, 1/sqrt(1)); lr ignored
  EXPECT_FLOAT_EQ(rel.step_size(123.f, 40000, ParamGroup::Decay), 1.0f / 200.0f);
  EXPECT_FLOAT_EQ(rel.step_size(123.f, 1, ParamGroup::Embedding), 0.5e-2f);
  h.warmup_init = true;
  const Adafactor warm(layout, h);
  EXPECT_FLOAT_EQ(warm.step_size(0.f, 10, ParamGroup::Decay), 1e-5f);
  h.warmup_init = false, h.relative_step = false;
  const Adafactor ext(layout, h);
  EXPECT_FLOAT_EQ(ext.step_size(3e-4f, 7, ParamGroup::Decay), 3e-4f);
  EXPECT_FLOAT_EQ(ext.step_size(3e-4f, 7, ParamGroup::Embedding), 1.5e-4f);
}

// --- training ------------------------------------------------------------------------------------------

std::vector<double> losses_of(const std::string& metrics_path) {
  std::vector<double> out;
  std::istringstream in(test::read_file(metrics_path));
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

TEST(Adafactor, TinyTrainingRunLossFalls) {
  test::TempDir dir;
  test::write_file(dir / "corpus.txt", test::small_corpus(60000));
  data::prepare_byte_corpus({dir / "corpus.txt"}, dir / "data", 0.1);
  for (const bool relative : {false, true}) {
    SCOPED_TRACE(relative ? "relative_step" : "external lr");
    const std::string out = dir / (relative ? "relative" : "external");
    nlohmann::json j = {
        {"model", {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 256}, {"block_size", 32}}},
        {"train_data", dir / "data/train.bin"},
        {"per_device_train_batch_size", 4},
        {"max_steps", 40},
        {"learning_rate", 1e-2},
        {"warmup_steps", 5},
        {"lr_scheduler_type", "cosine"},
        {"weight_decay", 0.01},
        {"logging_steps", 1},
        {"device", "cpu"},
        {"seed", 5},
        {"optim", "adafactor"},
        {"output_dir", out}};
    if (relative) j["adafactor_scale_parameter"] = true, j["adafactor_relative_step"] = true;
    train(TrainConfig::from_json(j, "test"));
    const std::vector<double> losses = losses_of(out + "/metrics.jsonl");
    ASSERT_EQ(losses.size(), 40u);
    EXPECT_GT(losses.front(), 5.0);  // ~ln(256) at initialisation
    // With relative_step the step size is 1e-2 * RMS(p) (~2e-4 for these 0.02-scale matrices): slower.
    EXPECT_LT(losses.back(), losses.front() - (relative ? 0.5 : 1.5)) << "loss did not fall";
  }
}

}  // namespace
}  // namespace anvil
