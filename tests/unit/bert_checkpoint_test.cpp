// Hugging Face BERT directories (io/bert_checkpoint.hpp): export then import reproduces the model bit for
// bit; BertModel checkpoints (no "bert." prefix, no classifier, old gamma/beta names, 16-bit and sharded
// weights) load; malformed directories fail with messages naming the file, the tensor and the shapes.
#include "io/bert_checkpoint.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bert_harness.hpp"
#include "core/half.hpp"
#include "io/checkpoint.hpp"
#include "io/safetensors.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::BertBatch;
using test::BertHarness;

TransformerConfig small_bert() {
  TransformerConfig c = TransformerConfig::preset("bert-tiny");
  c.n_layer = 2, c.n_embd = 32, c.n_head = 4, c.intermediate_size = 48, c.vocab_size = 50, c.block_size = 16;
  c.num_labels = 3, c.label_names = {"a", "b", "c"};
  return c;
}

BertBatch batch(const TransformerConfig& c) {
  BertBatch b;
  b.B = 2, b.T = 6;
  b.tokens = {2, 7, 9, 11, 3, 0, 2, 40, 41, 3, 0, 0};
  b.types = {0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 0, 0};
  b.lengths = {5, 4};
  b.labels = {1, 2};
  return b;
}

std::vector<float> logits_of(BertHarness& h, const TransformerConfig& c) {
  const BertBatch b = batch(c);
  h.upload(b);
  h.forward(b.B, b.T, 0.0f, false);
  return h.logits(b.B);
}

// Adds an int64 tensor to a safetensors file (SafeTensorsWriter has no int64; Hugging Face BERT checkpoints
// carry their position_ids buffer as one).
void append_i64(const std::string& path, const std::string& name, const std::vector<int64_t>& shape,
                const std::vector<int64_t>& values) {
  const std::string bytes = test::read_file(path);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(bytes[size_t(i)]);
  json header = json::parse(bytes.substr(8, header_len));
  std::string buffer = bytes.substr(8 + header_len);
  header[name] = {{"dtype", "I64"},
                  {"shape", shape},
                  {"data_offsets", {buffer.size(), buffer.size() + values.size() * 8}}};
  buffer.append(reinterpret_cast<const char*>(values.data()), values.size() * 8);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  test::write_file(path, out + text + buffer);
}

// A model directory written tensor by tensor from `model`'s weights, renamed / converted / dropped by `edit`
// (return false to drop a tensor).
template <class Edit>
void write_edited(const std::string& dir, BertHarness& h, Edit edit) {
  fs::create_directories(dir);
  test::write_file(dir + "/config.json", h.model().config().to_hf_json().dump(2));
  const std::vector<float> p = h.params();
  io::SafeTensorsWriter w;
  for (const ParamTensor& t : h.model().layout().tensors()) {
    std::string name = t.name;
    std::vector<int64_t> shape(t.shape.dims.begin(), t.shape.dims.begin() + t.shape.ndim);
    std::vector<float> v(p.begin() + t.offset, p.begin() + t.offset + t.numel());
    DType dtype = DType::F32;
    if (!edit(name, shape, v, dtype)) continue;
    if (dtype == DType::F32) {
      w.add(name, dtype, shape, v.data());
    } else {
      std::vector<uint16_t> h16(v.size());
      for (size_t i = 0; i < v.size(); ++i)
        h16[i] = dtype == DType::BF16 ? float_to_bf16(v[i]) : float_to_fp16(v[i]);
      w.add(name, dtype, shape, h16.data());
    }
  }
  w.write(dir + "/model.safetensors");
  // The int64 buffer older Hugging Face checkpoints carry.
  append_i64(dir + "/model.safetensors", "embeddings.position_ids", {1, 4}, {0, 1, 2, 3});
}

std::string load_error(const std::string& dir, const TransformerConfig& c) {
  BertHarness h(c, 2, 6, false);
  try {
    io::load_bert_weights(dir, h.model(), h.device());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(BertCheckpoint, ExportImportRoundTrip) {
  test::TempDir tmp;
  const TransformerConfig c = small_bert();
  BertHarness a(c, 2, 6, false);
  a.model().init_weights(5, a.device());
  io::save_bert_model(tmp.str(), a.model(), a.device());

  // The files transformers expects: its names and shapes, fp32; a config.json that reads back the same.
  const io::SafeTensorsReader r(tmp / "model.safetensors");
  EXPECT_EQ(r.tensors().size(), a.model().layout().tensors().size());
  const ParamTensor& q = a.model().layout().get("bert.encoder.layer.1.attention.self.query.weight");
  EXPECT_EQ(r.at(q.name).shape, (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(r.at("classifier.weight").shape, (std::vector<int64_t>{3, 32}));
  EXPECT_EQ(r.at("bert.encoder.layer.0.intermediate.dense.weight").shape, (std::vector<int64_t>{48, 32}));
  const TransformerConfig back = io::read_model_config(tmp.str());
  EXPECT_EQ(back.to_hf_json(), c.to_hf_json());

  BertHarness b(back, 2, 6, false);
  const io::BertLoadReport report = io::load_bert_weights(tmp.str(), b.model(), b.device());
  EXPECT_TRUE(report.kept.empty());
  EXPECT_TRUE(report.ignored.empty());
  EXPECT_EQ(b.params(), a.params());
  EXPECT_EQ(logits_of(b, c), logits_of(a, c));
}

// A BertModel checkpoint (sentence-transformers style): no "bert." prefix, no classifier, LayerNorm as
// gamma/beta here and there, bf16 weights, a position_ids buffer and a pre-training head to skip. The encoder
// loads; the classifier keeps its initial values and is reported.
TEST(BertCheckpoint, LoadsBertModelCheckpoints) {
  test::TempDir tmp;
  const TransformerConfig c = small_bert();
  BertHarness src(c, 2, 6, false);
  src.model().init_weights(8, src.device());
  write_edited(tmp / "m", src,
               [](std::string& name, std::vector<int64_t>&, std::vector<float>&, DType& dtype) {
                 if (name.starts_with("classifier.")) return false;
                 if (name.starts_with("bert.")) name = name.substr(5);
                 if (name == "embeddings.LayerNorm.weight") name = "embeddings.LayerNorm.gamma";
                 if (name == "encoder.layer.1.output.LayerNorm.bias")
                   name = "encoder.layer.1.output.LayerNorm.beta";
                 if (name.find("intermediate") != std::string::npos) dtype = DType::BF16;
                 return true;
               });
  {  // plus a masked-LM head tensor to ignore: rewrite the file with it added
    const io::SafeTensorsReader r(tmp / "m/model.safetensors");
    io::SafeTensorsWriter w;
    for (const io::SafeTensorInfo& t : r.tensors()) w.add(t.name, t.dtype, t.shape, r.data(t));
    const float bias[3] = {1, 2, 3};
    w.add("cls.predictions.bias", DType::F32, {3}, bias);
    w.write(tmp / "m/model.safetensors");
    ASSERT_EQ(r.unsupported().count("embeddings.position_ids"), 1u);  // int64: not copied above
    append_i64(tmp / "m/model.safetensors", "embeddings.position_ids", {1, 4}, {0, 1, 2, 3});
  }
  BertHarness dst(c, 2, 6, false);
  dst.model().init_weights(9, dst.device());
  const std::vector<float> before = dst.params();
  const io::BertLoadReport report = io::load_bert_weights(tmp / "m", dst.model(), dst.device());
  EXPECT_EQ(report.kept, (std::vector<std::string>{"classifier.weight", "classifier.bias"}));
  EXPECT_EQ(report.ignored, (std::vector<std::string>{"cls.predictions.bias", "embeddings.position_ids"}));
  const std::vector<float> got = dst.params(), want = src.params();
  for (const ParamTensor& t : dst.model().layout().tensors()) {
    const bool classifier = t.name.starts_with("classifier.");
    const bool bf16 = t.name.find("intermediate") != std::string::npos;
    for (size_t i = t.offset; i < t.offset + t.numel(); ++i) {
      const float expect = classifier ? before[i] : bf16 ? bf16_to_float(float_to_bf16(want[i])) : want[i];
      ASSERT_EQ(got[i], expect) << t.name;
    }
  }
}

TEST(BertCheckpoint, ShardedAndFp16Weights) {
  test::TempDir tmp;
  const TransformerConfig c = small_bert();
  BertHarness src(c, 2, 6, false);
  src.model().init_weights(3, src.device());
  io::save_bert_model(tmp.str(), src.model(), src.device());
  // Two shards, fp16, with an index.
  fs::create_directories(tmp / "s");
  fs::copy_file(tmp / "config.json", tmp / "s/config.json");
  const io::SafeTensorsReader r(tmp / "model.safetensors");
  io::SafeTensorsWriter shards[2];
  json map = json::object();
  for (size_t i = 0; i < r.tensors().size(); ++i) {
    const io::SafeTensorInfo& t = r.tensors()[i];
    std::vector<float> f(size_t(t.numel()));
    std::memcpy(f.data(), r.data(t), f.size() * 4);
    std::vector<uint16_t> h(f.size());
    for (size_t k = 0; k < f.size(); ++k) h[k] = float_to_fp16(f[k]);
    shards[i % 2].add(t.name, DType::F16, t.shape, h.data());
    map[t.name] = i % 2 ? "b.safetensors" : "a.safetensors";
  }
  shards[0].write(tmp / "s/a.safetensors");
  shards[1].write(tmp / "s/b.safetensors");
  test::write_file(tmp / "s/model.safetensors.index.json", json{{"weight_map", map}}.dump());
  BertHarness dst(c, 2, 6, false);
  io::load_bert_weights(tmp / "s", dst.model(), dst.device());
  const std::vector<float> got = dst.params(), want = src.params();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], fp16_to_float(float_to_fp16(want[i]))) << i;
}

TEST(BertCheckpoint, MalformedDirectoriesAreNamed) {
  test::TempDir tmp;
  const TransformerConfig c = small_bert();
  BertHarness src(c, 2, 6, false);
  src.model().init_weights(1, src.device());

  // A missing encoder tensor.
  write_edited(tmp / "missing", src, [](std::string& n, auto&, auto&, auto&) {
    return n != "bert.encoder.layer.1.attention.self.key.bias";
  });
  std::string e = load_error(tmp / "missing", c);
  EXPECT_NE(e.find("tensor 'bert.encoder.layer.1.attention.self.key.bias' is missing"), std::string::npos)
      << e;

  // A tensor of the wrong shape (the checkpoint's intermediate size is not the config's).
  write_edited(tmp / "shape", src,
               [](std::string& n, std::vector<int64_t>& shape, std::vector<float>& v, auto&) {
                 if (n == "bert.encoder.layer.0.intermediate.dense.weight") shape = {24, 64};
                 return true;
               });
  e = load_error(tmp / "shape", c);
  EXPECT_NE(e.find("'bert.encoder.layer.0.intermediate.dense.weight' has shape [24, 64] but the model config "
                   "(config.json) needs [48, 32]"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;

  // A tensor that belongs to no BERT part (e.g. another architecture's weights).
  write_edited(tmp / "extra", src, [](std::string& n, auto&, auto&, auto&) {
    if (n == "classifier.bias") n = "classifier.out_proj.bias";
    return true;
  });
  e = load_error(tmp / "extra", c);
  EXPECT_NE(e.find("unexpected tensor 'classifier.out_proj.bias'"), std::string::npos) << e;

  // A weight stored as integers.
  {
    fs::create_directories(tmp / "int");
    test::write_file(tmp / "int/config.json", c.to_hf_json().dump());
    io::SafeTensorsWriter w;
    const std::vector<float> p = src.params();
    for (const ParamTensor& t : src.model().layout().tensors()) {
      std::vector<int64_t> shape(t.shape.dims.begin(), t.shape.dims.begin() + t.shape.ndim);
      if (t.name == "bert.pooler.dense.bias") {
        const std::vector<int32_t> ints(t.numel(), 1);
        w.add(t.name, DType::I32, shape, ints.data());
      } else {
        w.add(t.name, DType::F32, shape, p.data() + t.offset);
      }
    }
    w.write(tmp / "int/model.safetensors");
  }
  e = load_error(tmp / "int", c);
  EXPECT_NE(e.find("'bert.pooler.dense.bias' has dtype I32"), std::string::npos) << e;
  // ... or as int64, a dtype Anvil cannot hold at all.
  write_edited(tmp / "i64", src,
               [](std::string& n, auto&, auto&, auto&) { return n != "bert.pooler.dense.bias"; });
  append_i64(tmp / "i64/model.safetensors", "bert.pooler.dense.bias", {32}, std::vector<int64_t>(32, 1));
  e = load_error(tmp / "i64", c);
  EXPECT_NE(e.find("tensor 'bert.pooler.dense.bias' has dtype I64, which cannot be loaded"),
            std::string::npos)
      << e;

  // No weights at all; a truncated file.
  fs::create_directories(tmp / "empty");
  e = load_error(tmp / "empty", c);
  EXPECT_NE(e.find("no model.safetensors"), std::string::npos) << e;
  fs::create_directories(tmp / "trunc");
  const std::string whole = test::read_file(tmp / "missing/model.safetensors");
  test::write_file(tmp / "trunc/model.safetensors", whole.substr(0, whole.size() / 2));
  e = load_error(tmp / "trunc", c);
  EXPECT_NE(e.find("trunc/model.safetensors"), std::string::npos) << e;

  // A config.json that is not BERT's or GPT-2's.
  fs::create_directories(tmp / "cfg");
  test::write_file(tmp / "cfg/config.json", R"({"model_type": "bert", "hidden_size": 32})");
  test::expect_error([&] { io::read_model_config(tmp / "cfg"); }, {"cfg/config.json", "num_hidden_layers"});
}

}  // namespace
}  // namespace anvil
