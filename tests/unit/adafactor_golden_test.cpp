// Anvil's CPU Adafactor against transformers.optimization.Adafactor: the fixture
// (tests/golden/make_adafactor_golden.py) holds a tiny GPT-2's weights, STEPS steps of synthetic gradients,
// and the weights and optimizer states transformers produced from them under several hyper-parameter
// settings. Anvil must reproduce the weights to ~1e-6 of their size (and their change over the steps to
// 1e-4), and the states, compared in Hugging Face's orientation: Conv1D weights are [in, out] there and
// [out, in] in Anvil, so Anvil's row statistics of those are transformers' column statistics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/model_config.hpp"
#include "io/safetensors.hpp"
#include "kernels/ops.hpp"
#include "model/param_layout.hpp"
#include "optim/adafactor.hpp"
#include "runtime/arena.hpp"
#include "runtime/device.hpp"
#include "safetensors_util.hpp"

namespace anvil {
namespace {

const std::string kFixture = std::string(ANVIL_SOURCE_DIR) + "/tests/golden/adafactor_golden.safetensors";

using test::read_f32;

// The rows of Anvil's tensor that transformers has (wte: the real vocabulary), and its HF shape.
struct HfShape {
  int64_t rows = 1, cols = 0;  // HF's [rows, cols] (vectors: 1 x n)
};
HfShape hf_shape(const ParamTensor& t, const TransformerConfig& cfg) {
  if (t.shape.ndim == 1) return {1, t.shape[0]};
  int64_t a = t.shape[0];
  if (t.name == "transformer.wte.weight") a = cfg.vocab_size;
  return t.hf_transposed ? HfShape{t.shape[1], a} : HfShape{a, t.shape[1]};
}

// Flat index of HF element (r, c).
size_t flat_index(const ParamTensor& t, const HfShape& s, int64_t r, int64_t c) {
  return t.offset + size_t(t.hf_transposed ? c * s.rows + r : r * s.cols + c);
}

std::vector<float> hf_view(const float* flat, const ParamTensor& t, const TransformerConfig& cfg) {
  const HfShape s = hf_shape(t, cfg);
  std::vector<float> v;
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t c = 0; c < s.cols; ++c) v.push_back(flat[flat_index(t, s, r, c)]);
  return v;
}

void from_hf(float* flat, const std::vector<float>& hf, const ParamTensor& t, const TransformerConfig& cfg) {
  const HfShape s = hf_shape(t, cfg);
  ASSERT_EQ(hf.size(), size_t(s.rows * s.cols)) << t.name;
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t c = 0; c < s.cols; ++c) flat[flat_index(t, s, r, c)] = hf[size_t(r * s.cols + c)];
}

struct Diff {
  double max_diff = 0, max_want = 0, max_delta = 0;
};
Diff diff(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>* before) {
  Diff d;
  for (size_t i = 0; i < want.size(); ++i) {
    d.max_diff = std::max(d.max_diff, double(std::fabs(got[i] - want[i])));
    d.max_want = std::max(d.max_want, double(std::fabs(want[i])));
    if (before) d.max_delta = std::max(d.max_delta, double(std::fabs(want[i] - (*before)[i])));
  }
  return d;
}

OptimizerHyper hyper_of(const nlohmann::json& s, float* lr) {
  const nlohmann::json& a = s.at("adafactor");
  OptimizerHyper h;
  h.adafactor_eps1 = a.at("eps").at(0).get<float>();
  h.adafactor_eps2 = a.at("eps").at(1).get<float>();
  h.clip_threshold = a.at("clip_threshold").get<float>();
  h.decay_rate = a.at("decay_rate").get<float>();
  if (!a.at("beta1").is_null()) h.adafactor_beta1 = a.at("beta1").get<float>();
  h.weight_decay = a.at("weight_decay").get<float>();
  h.scale_parameter = a.at("scale_parameter").get<bool>();
  h.relative_step = a.at("relative_step").get<bool>();
  h.warmup_init = a.at("warmup_init").get<bool>();
  const nlohmann::json& m = s.at("lr_multiplier");
  h.lr_multiplier[int(ParamGroup::Decay)] = m.at("decay").get<float>();
  h.lr_multiplier[int(ParamGroup::NoDecay)] = m.at("no_decay").get<float>();
  h.lr_multiplier[int(ParamGroup::Embedding)] = m.at("embedding").get<float>();
  *lr = a.at("lr").is_null() ? 0.0f : a.at("lr").get<float>();  // ignored with relative_step
  return h;
}

TEST(AdafactorGolden, MatchesTransformers) {
  ASSERT_TRUE(std::filesystem::exists(kFixture))
      << "fixture missing: " << kFixture
      << "\nmake it where PyTorch + transformers are installed, from the repository root:\n"
         "    python3 tests/golden/make_adafactor_golden.py tests/golden/adafactor_golden.safetensors";
  const io::SafeTensorsReader golden(kFixture);
  const auto& meta = golden.metadata();
  const nlohmann::json model = nlohmann::json::parse(meta.at("config"));
  TransformerConfig cfg;
  cfg.vocab_size = model.at("vocab_size").get<int>();
  cfg.block_size = model.at("n_positions").get<int>();
  cfg.n_embd = model.at("n_embd").get<int>();
  cfg.n_layer = model.at("n_layer").get<int>();
  cfg.n_head = model.at("n_head").get<int>();
  const ParamLayout layout = ParamLayout::decoder(cfg);
  const int steps = std::stoi(meta.at("steps"));
  const nlohmann::json settings = nlohmann::json::parse(meta.at("settings"));
  ASSERT_GE(settings.size(), 3u);

  const size_t n = layout.total_numel();
  std::vector<float> init(n, 0.0f);  // padding rows of wte stay 0
  for (const ParamTensor& t : layout.tensors())
    from_hf(init.data(), read_f32(golden, "init." + t.name), t, cfg);
  std::vector<std::vector<float>> grads(size_t(steps), std::vector<float>(n, 0.0f));
  for (int s = 0; s < steps; ++s)
    for (const ParamTensor& t : layout.tensors())
      from_hf(grads[size_t(s)].data(), read_f32(golden, "grad." + std::to_string(s + 1) + "." + t.name), t,
              cfg);

  for (const nlohmann::json& setting : settings) {
    const std::string name = setting.at("name").get<std::string>();
    SCOPED_TRACE("setting " + name + ": " + setting.dump());
    float lr = 0;
    const OptimizerHyper h = hyper_of(setting, &lr);

    std::unique_ptr<Device> dev = make_cpu_device();
    std::unique_ptr<Ops> ops = make_cpu_ops(*dev);
    Adafactor opt(layout, h, cfg.vocab_size);
    MemoryPlan plan;
    const size_t ip = plan.add("params", MemoryCategory::Weights, n * sizeof(float));
    const size_t ig = plan.add("grads", MemoryCategory::Gradients, n * sizeof(float));
    opt.plan_memory(plan);
    Arena arena(*dev, plan);
    float* params = arena.get<float>(ip);
    float* g = arena.get<float>(ig);
    opt.bind(arena);
    opt.reset(*dev);
    std::memcpy(params, init.data(), n * sizeof(float));
    for (int s = 0; s < steps; ++s) {
      std::memcpy(g, grads[size_t(s)].data(), n * sizeof(float));
      opt.step(*ops, params, g, lr, s + 1, 1.0f);
    }

    std::vector<float> state_row, state_col, state_vec, state_m;
    for (const OptimizerStateTensor& st : opt.state_tensors()) {
      const float* p = static_cast<const float*>(st.data);
      std::vector<float>* dst = st.name == "adafactor.exp_avg_sq_row"   ? &state_row
                                : st.name == "adafactor.exp_avg_sq_col" ? &state_col
                                : st.name == "adafactor.exp_avg_sq"     ? &state_vec
                                                                        : &state_m;
      dst->assign(p, p + st.count);
    }
    EXPECT_EQ(!state_m.empty(), h.adafactor_beta1.has_value());

    for (size_t k = 0; k < layout.tensors().size(); ++k) {
      const ParamTensor& t = layout.tensors()[k];
      const AdafactorTensor& d = opt.tensor_table()[k];
      const std::string key = name + ".param." + t.name;
      const std::vector<float> want = read_f32(golden, key);
      const std::vector<float> before = hf_view(init.data(), t, cfg);
      const std::vector<float> got = hf_view(params, t, cfg);
      const Diff p = diff(got, want, &before);
      EXPECT_LE(p.max_diff, 1e-6 * p.max_want) << key << ": max diff " << p.max_diff << " of " << p.max_want;
      // The change itself, where fp32 weights can resolve it (a few ulps of the weights allowed).
      EXPECT_LE(p.max_diff, 1e-4 * p.max_delta + 5e-7 * p.max_want)
          << key << ": max diff " << p.max_diff << ", max change " << p.max_delta;

      const auto expect_state = [&](const std::string& state, const std::vector<float>& got_state) {
        const std::string skey = name + "." + state + "." + t.name;
        ASSERT_NE(golden.find(skey), nullptr) << skey;
        const std::vector<float> want_state = read_f32(golden, skey);
        ASSERT_EQ(got_state.size(), want_state.size()) << skey;
        const Diff s = diff(got_state, want_state, nullptr);
        EXPECT_LE(s.max_diff, 1e-5 * s.max_want)
            << skey << ": max diff " << s.max_diff << " of " << s.max_want;
      };
      if (d.factored) {
        const std::vector<float> rows(state_row.begin() + d.row_state,
                                      state_row.begin() + d.row_state + d.rows);
        const size_t c0 = d.col_state - state_row.size();
        const std::vector<float> cols(state_col.begin() + c0, state_col.begin() + c0 + d.cols);
        // transformers' rows are the first dimension of its shape: Anvil's columns for Conv1D weights.
        expect_state("exp_avg_sq_row", t.hf_transposed ? cols : rows);
        expect_state("exp_avg_sq_col", t.hf_transposed ? rows : cols);
      } else {
        const size_t v0 = d.row_state - state_row.size() - state_col.size();
        expect_state("exp_avg_sq",
                     std::vector<float>(state_vec.begin() + v0, state_vec.begin() + v0 + d.cols));
      }
      if (!state_m.empty()) expect_state("exp_avg", hf_view(state_m.data(), t, cfg));
    }
  }
}

}  // namespace
}  // namespace anvil
