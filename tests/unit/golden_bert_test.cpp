// The CPU backend against Hugging Face transformers: tiny random BertForSequenceClassification models saved
// by transformers (tests/golden/make_bert_golden.py) are loaded directly, and Anvil's logits, loss and every
// parameter gradient on a padded batch with token types must match the fixture to a relative error < 1e-4:
// cross-entropy over 3 labels (one ignored) and, in regression/, mean squared error on one output.
//
// The fixture is made where PyTorch is installed; until it is committed this test FAILS, saying how to make
// it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <vector>

#include "bert_harness.hpp"
#include "io/bert_checkpoint.hpp"
#include "io/checkpoint.hpp"
#include "io/safetensors.hpp"
#include "safetensors_util.hpp"

namespace anvil {
namespace {

const std::string kDir = std::string(ANVIL_SOURCE_DIR) + "/tests/golden/bert_tiny";

// Max absolute difference relative to the reference's max magnitude (absolute when the reference is all 0).
double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_ref = std::max(max_ref, double(std::fabs(want[i])));
    max_diff = std::max(max_diff, double(std::fabs(got[i] - want[i])));
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

void check_fixture(const std::string& dir) {
  ASSERT_TRUE(std::filesystem::exists(dir + "/golden.safetensors"))
      << "the transformers fixture is missing: " << dir
      << "\nmake it where PyTorch + transformers are installed (e.g. the GPU machine), from the repository "
         "root:\n"
         "  python3 tests/golden/make_bert_golden.py tests/golden/bert_tiny\n"
         "and commit tests/golden/bert_tiny/ (config.json, model.safetensors, golden.safetensors, and the "
         "same in "
         "regression/)";
  const io::SafeTensorsReader golden(dir + "/golden.safetensors");
  const TransformerConfig cfg = io::read_model_config(dir);
  ASSERT_TRUE(cfg.is_bert());
  const io::SafeTensorInfo& ids_info = golden.at("input_ids");
  ASSERT_EQ(ids_info.shape.size(), 2u);
  test::BertBatch b;
  b.B = int(ids_info.shape[0]), b.T = int(ids_info.shape[1]);
  b.tokens = test::read_tensor<int32_t>(golden, "input_ids", DType::I32);
  b.types = test::read_tensor<int32_t>(golden, "token_type_ids", DType::I32);
  const std::vector<int32_t> mask = test::read_tensor<int32_t>(golden, "attention_mask", DType::I32);
  for (int s = 0; s < b.B; ++s) {  // Anvil takes lengths: the mask must be a prefix of ones
    int len = 0;
    while (len < b.T && mask[s * b.T + len]) ++len;
    for (int t = len; t < b.T; ++t) ASSERT_EQ(mask[s * b.T + t], 0) << "sequence " << s;
    b.lengths.push_back(len);
  }
  int valid = b.B;
  if (cfg.is_regression()) {
    b.labels_f = test::read_tensor<float>(golden, "labels", DType::F32);
  } else {
    b.labels = test::read_tensor<int32_t>(golden, "labels", DType::I32);
    valid = int(std::count_if(b.labels.begin(), b.labels.end(), [](int32_t l) { return l != kIgnoreIndex; }));
  }

  test::BertHarness h(cfg, b.B, b.T, true);
  const io::BertLoadReport report = io::load_bert_weights(dir, h.model(), h.device());
  EXPECT_TRUE(report.kept.empty());
  h.upload(b);
  const std::vector<float> losses = h.forward(b.B, b.T, 1.0f / float(valid), true);
  EXPECT_LT(rel_error(h.logits(b.B), test::read_tensor<float>(golden, "logits", DType::F32)), 1e-4);
  double loss = 0;
  for (float l : losses) loss += l;
  loss /= valid;
  const float want_loss = test::read_tensor<float>(golden, "loss", DType::F32)[0];
  EXPECT_LT(std::fabs(loss - want_loss) / std::fabs(want_loss), 1e-5) << loss << " vs " << want_loss;

  h.backward(b.B, b.T);
  const std::vector<float> grads = h.grads();
  double grad_scale = 0;  // the largest gradient element of the model
  for (float g : grads) grad_scale = std::max(grad_scale, double(std::fabs(g)));
  for (const ParamTensor& t : h.model().layout().tensors()) {
    const std::vector<float> want = test::read_tensor<float>(golden, "grad." + t.name, DType::F32);
    ASSERT_EQ(want.size(), t.numel()) << t.name;
    const std::vector<float> got(grads.begin() + t.offset, grads.begin() + t.offset + t.numel());
    if (t.name.ends_with("attention.self.key.bias")) {
      // Softmax is invariant to the key bias (it adds the same q.b_k to every score of a query): its true
      // gradient is 0, and both sides hold only rounding noise, which must stay at the fp32 noise level.
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_LT(std::fabs(got[i]), 1e-6 * grad_scale) << t.name << "[" << i << "]";
        EXPECT_LT(std::fabs(want[i]), 1e-6 * grad_scale) << t.name << "[" << i << "] (transformers)";
      }
      continue;
    }
    EXPECT_LT(rel_error(got, want), 1e-4) << "gradient of " << t.name;
  }
}

TEST(GoldenBert, ClassificationMatchesTransformers) {
  check_fixture(kDir);
}

TEST(GoldenBert, RegressionMatchesTransformers) {
  check_fixture(kDir + "/regression");
}

}  // namespace
}  // namespace anvil
