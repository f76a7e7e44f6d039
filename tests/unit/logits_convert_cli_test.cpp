// `anvil logits` and `anvil convert` for every family, through the CLI, against the fixtures transformers
// wrote (tests/golden/{gpt2,llama,qwen2,mistral}_tiny, bert_tiny and bert_tiny/regression):
//   logits: the decoders' per-token logits and BERT's class logits (padded rows, token types) equal
//     golden.safetensors' `logits` to a relative error < 1e-4; I64 inputs; right-padded decoder rows equal
//     the rows alone; malformed masks and ids are errors naming the file, row and position.
//   convert: the output holds exactly the input's tensor names and shapes (less the tensors the layout table
//     ignores), identical fp32 weights and identical logits; --dtype bf16 / fp16 write the
//     round-to-nearest-even values and say so in config.json; fp16 overflow, an unknown --dtype, an
//     unsupported rope_scaling and a missing tensor are errors naming what is wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "io/checkpoint.hpp"
#include "io/safetensors.hpp"
#include "safetensors_util.hpp"
#include "test_util.hpp"
#include "train/engine.hpp"

namespace anvil {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string fixture(const std::string& name) {
  return std::string(ANVIL_SOURCE_DIR) + "/tests/golden/" + name;
}

// Max absolute difference relative to the reference's max magnitude.
double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_ref = std::max(max_ref, double(std::fabs(want[i])));
    max_diff = std::max(max_diff, double(std::fabs(got[i] - want[i])));
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

// A safetensors file of I64 tensors (SafeTensorsWriter has no I64: Anvil does not hold them), written by hand
// as the format defines it: header length, JSON header, data.
void write_i64_file(
    const std::string& path,
    const std::map<std::string, std::pair<std::vector<int64_t>, std::vector<int64_t>>>& tensors) {
  json header = json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    const size_t begin = data.size();
    data.append(reinterpret_cast<const char*>(t.second.data()), t.second.size() * 8);
    header[name] = {{"dtype", "I64"}, {"shape", t.first}, {"data_offsets", {begin, data.size()}}};
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  const uint64_t n = h.size();
  std::string file(reinterpret_cast<const char*>(&n), 8);
  test::write_file(path, file + h + data);
}

// golden.safetensors' inputs (input_ids, and attention_mask / token_type_ids where it has them) as `path`.
void write_golden_inputs(const io::SafeTensorsReader& golden, const std::string& path) {
  io::SafeTensorsWriter w;
  for (const char* name : {"input_ids", "attention_mask", "token_type_ids"})
    if (const io::SafeTensorInfo* t = golden.find(name)) w.add(name, t->dtype, t->shape, golden.data(*t));
  w.write(path);
}

test::CommandResult run_logits(const std::string& model, const std::string& inputs,
                               const std::string& output) {
  return test::run_anvil("logits --checkpoint " + model + " --input_ids " + inputs + " --output " + output);
}

std::vector<float> read_logits(const std::string& path, std::vector<int64_t>* shape = nullptr) {
  const io::SafeTensorsReader r(path);
  if (shape) *shape = r.at("logits").shape;
  return test::read_f32(r, "logits");
}

// Every tensor of a model.safetensors: name -> (dtype, shape, bytes).
struct StoredTensor {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<char> bytes;
};
std::map<std::string, StoredTensor> read_tensors(const std::string& path) {
  const io::SafeTensorsReader r(path);
  std::map<std::string, StoredTensor> out;
  for (const io::SafeTensorInfo& t : r.tensors()) {
    const char* p = static_cast<const char*>(r.data(t));
    out[t.name] = {t.dtype, t.shape, std::vector<char>(p, p + t.nbytes)};
  }
  return out;
}

std::vector<float> as_floats(const StoredTensor& t) {
  std::vector<float> v(t.bytes.size() / 4);
  std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}

// The model's fp32 parameters (flat layout) after loading `dir`.
std::vector<float> load_params(const std::string& dir) {
  const TransformerConfig cfg = io::read_model_config(dir);
  Engine e(cfg, EngineOptions{});
  if (cfg.is_bert()) e.model().init_weights(0, e.device());
  io::load_model_weights(dir, e.model(), e.device());
  std::vector<float> p(e.model().layout().total_numel());
  e.device().copy_to_host(p.data(), e.model().params(), p.size() * sizeof(float));
  return p;
}

// A copy of a fixture's config.json and model.safetensors in `dir`, with `edit` applied to its tensors.
void copy_model(const std::string& from, const std::string& dir,
                const std::function<void(std::map<std::string, StoredTensor>&)>& edit = {}) {
  fs::create_directories(dir);
  fs::copy_file(from + "/config.json", dir + "/config.json");
  std::map<std::string, StoredTensor> t = read_tensors(from + "/model.safetensors");
  if (edit) edit(t);
  io::SafeTensorsWriter w;
  w.set_metadata("format", "pt");
  for (const auto& [name, s] : t) w.add(name, s.dtype, s.shape, s.bytes.data());
  w.write(dir + "/model.safetensors");
}

// ---- logits ----

class LogitsCliGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(LogitsCliGolden, MatchesTransformers) {
  const std::string dir = fixture(GetParam());
  ASSERT_TRUE(fs::exists(dir + "/golden.safetensors")) << "fixture missing: " << dir;
  test::TempDir tmp;
  const io::SafeTensorsReader golden(dir + "/golden.safetensors");
  write_golden_inputs(golden, tmp / "in.safetensors");
  const test::CommandResult r = run_logits(dir, tmp / "in.safetensors", tmp / "out.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<int64_t> shape;
  const std::vector<float> got = read_logits(tmp / "out.safetensors", &shape);
  EXPECT_EQ(shape, golden.at("logits").shape);
  EXPECT_LT(rel_error(got, test::read_f32(golden, "logits")), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Families, LogitsCliGolden,
                         ::testing::Values("gpt2_tiny", "llama_tiny", "qwen2_tiny", "mistral_tiny",
                                           "bert_tiny", "bert_tiny/regression"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '/', '_');
                           return n;
                         });

// I64 inputs (what a PyTorch tokenizer returns), BERT: the same class logits as the I32 file.
TEST(LogitsCli, BertI64InputsEqualI32) {
  const std::string dir = fixture("bert_tiny");
  test::TempDir tmp;
  const io::SafeTensorsReader golden(dir + "/golden.safetensors");
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<int64_t>>> t;
  for (const char* name : {"input_ids", "attention_mask", "token_type_ids"}) {
    const std::vector<int32_t> v = test::read_tensor<int32_t>(golden, name, DType::I32);
    t[name] = {golden.at(name).shape, std::vector<int64_t>(v.begin(), v.end())};
  }
  write_i64_file(tmp / "in64.safetensors", t);
  write_golden_inputs(golden, tmp / "in32.safetensors");
  test::CommandResult r = run_logits(dir, tmp / "in64.safetensors", tmp / "o64.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_logits(dir, tmp / "in32.safetensors", tmp / "o32.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_logits(tmp / "o64.safetensors"), read_logits(tmp / "o32.safetensors"));
}

// A BERT batch without a mask or token types: every position attended, all types 0 (what `anvil predict` runs
// for texts that fill the batch). Compared with the model run directly.
TEST(LogitsCli, BertWithoutMaskEqualsModelForward) {
  const std::string dir = fixture("bert_tiny");
  test::TempDir tmp;
  const io::SafeTensorsReader golden(dir + "/golden.safetensors");
  const io::SafeTensorInfo& ids = golden.at("input_ids");
  io::SafeTensorsWriter w;
  w.add("input_ids", DType::I32, ids.shape, golden.data(ids));
  w.write(tmp / "in.safetensors");
  const test::CommandResult r = run_logits(dir, tmp / "in.safetensors", tmp / "out.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const TransformerConfig cfg = io::read_model_config(dir);
  const int B = int(ids.shape[0]), T = int(ids.shape[1]);
  EngineOptions o;
  o.batch_size = B, o.seq_len = T;
  Engine e(cfg, o);
  io::load_model_weights(dir, e.model(), e.device());
  e.device().copy_to_device(e.tokens(0), golden.data(ids), size_t(B) * T * sizeof(int32_t));
  e.bert().forward(e.ops(), e.tokens(0), nullptr, nullptr, nullptr, B, T, 0.0f, false);
  std::vector<float> want(size_t(B) * cfg.num_labels);
  e.bert().copy_logits_to_host(e.device(), want.data(), B);
  EXPECT_LT(rel_error(read_logits(tmp / "out.safetensors"), want), 1e-6);
}

// Right padding on a decoder: the real positions' logits equal the unpadded rows' (the model is causal), the
// padded positions are 0, and the padded ids are not read (-100 there). Mask and ids as I64.
TEST(LogitsCli, DecoderRightPaddingEqualsRowsAlone) {
  const std::string dir = fixture("llama_tiny");
  test::TempDir tmp;
  const io::SafeTensorsReader golden(dir + "/golden.safetensors");
  const std::vector<int64_t> shape = golden.at("input_ids").shape;
  const int B = int(shape[0]), T = int(shape[1]);
  const std::vector<int32_t> ids32 = test::read_tensor<int32_t>(golden, "input_ids", DType::I32);
  std::vector<int64_t> ids(ids32.begin(), ids32.end()), mask(ids.size(), 1);
  const int len1 = T - 5;  // row 1 keeps its first T - 5 tokens
  for (int t = len1; t < T; ++t) ids[size_t(T + t)] = -100, mask[size_t(T + t)] = 0;
  write_i64_file(tmp / "in.safetensors", {{"input_ids", {shape, ids}}, {"attention_mask", {shape, mask}}});
  const test::CommandResult r = run_logits(dir, tmp / "in.safetensors", tmp / "out.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<float> got = read_logits(tmp / "out.safetensors"),
                           want = test::read_f32(golden, "logits");
  const size_t V = want.size() / size_t(B * T);
  std::vector<float> got_real, want_real;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < (b == 1 ? len1 : T); ++t)
      for (size_t v = 0; v < V; ++v) {
        got_real.push_back(got[(size_t(b) * T + t) * V + v]);
        want_real.push_back(want[(size_t(b) * T + t) * V + v]);
      }
  EXPECT_LT(rel_error(got_real, want_real), 1e-4);
  for (int t = len1; t < T; ++t)
    for (size_t v = 0; v < V; ++v) ASSERT_EQ(got[(size_t(T) + t) * V + v], 0.0f) << t;
}

// Malformed inputs: errors naming the file, the tensor, the row and the position; nothing is written.
TEST(LogitsCli, RejectsMalformedMasksAndInputs) {
  test::TempDir tmp;
  const std::string llama = fixture("llama_tiny"), bert = fixture("bert_tiny");
  const std::vector<int64_t> shape{2, 4};
  const std::vector<int64_t> ids{1, 2, 3, 4, 5, 6, 7, 8};
  const auto expect_error =
      [&](const std::string& model,
          const std::map<std::string, std::pair<std::vector<int64_t>, std::vector<int64_t>>>& t,
          std::initializer_list<std::string> needles) {
        write_i64_file(tmp / "in.safetensors", t);
        const test::CommandResult r = run_logits(model, tmp / "in.safetensors", tmp / "out.safetensors");
        EXPECT_NE(r.exit_code, 0) << r.output;
        for (const std::string& n : needles)
          EXPECT_NE(r.output.find(n), std::string::npos) << n << "\n" << r.output;
        EXPECT_FALSE(fs::exists(tmp / "out.safetensors"));
      };
  const std::string file = tmp / "in.safetensors";
  // Left padding (a 1 after a 0), for either family.
  for (const std::string& model : {llama, bert})
    expect_error(
        model, {{"input_ids", {shape, ids}}, {"attention_mask", {shape, {1, 1, 1, 1, 0, 1, 1, 1}}}},
        {file, "attention_mask row 1 has a 1 at position 1 after a 0 at position 0", "right padding"});
  expect_error(llama, {{"input_ids", {shape, ids}}, {"attention_mask", {shape, {1, 1, 2, 0, 1, 1, 1, 1}}}},
               {file, "attention_mask[0, 2] = 2", "0 or 1"});
  expect_error(llama, {{"input_ids", {shape, ids}}, {"attention_mask", {shape, {1, 1, 1, 1, 0, 0, 0, 0}}}},
               {file, "attention_mask row 1 is all zeros"});
  expect_error(llama, {{"input_ids", {shape, ids}}, {"attention_mask", {{2, 3}, {1, 1, 1, 1, 1, 1}}}},
               {file, "attention_mask has shape [2, 3] but input_ids has [2, 4]"});
  expect_error(llama, {{"input_ids", {shape, {1, 2, 3, 4, 5, 100, 7, 8}}}},
               {file, "input_ids[5] = 100 (row 1, position 1) is outside the vocabulary (size 100)"});
  expect_error(llama, {{"input_ids", {shape, ids}}, {"token_type_ids", {shape, std::vector<int64_t>(8, 0)}}},
               {file, "token_type_ids is read only for BERT models"});
  expect_error(bert, {{"input_ids", {shape, ids}}, {"token_type_ids", {shape, {0, 0, 0, 0, 0, 0, 2, 0}}}},
               {file, "token_type_ids[1, 2] = 2 is outside 0..1"});
  expect_error(llama, {{"ids", {shape, ids}}}, {file, "no tensor 'input_ids'"});
  io::SafeTensorsWriter w;  // a float tensor
  const float f[2] = {1, 2};
  w.add("input_ids", DType::F32, {1, 2}, f);
  w.write(file);
  const test::CommandResult r = run_logits(llama, file, tmp / "out.safetensors");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("'input_ids' must be an I32 or I64 tensor [batch, seq], got F32"),
            std::string::npos)
      << r.output;
}

// A BertModel checkpoint (no classifier) has no class logits: an error pointing to fine-tuning.
TEST(LogitsCli, BertWithoutClassifierIsAnError) {
  test::TempDir tmp;
  copy_model(fixture("bert_tiny"), tmp / "m", [](std::map<std::string, StoredTensor>& t) {
    t.erase("classifier.weight");
    t.erase("classifier.bias");
  });
  write_i64_file(tmp / "in.safetensors", {{"input_ids", {{1, 3}, {1, 2, 3}}}});
  const test::CommandResult r = run_logits(tmp / "m", tmp / "in.safetensors", tmp / "out.safetensors");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("the weights have no classifier"), std::string::npos) << r.output;
}

// ---- convert ----

class ConvertCliFamily : public ::testing::TestWithParam<std::string> {};

// fp32: the same tensor names, shapes and bytes as the input, the same logits, and "dtype": "float32".
TEST_P(ConvertCliFamily, Fp32RoundTripIsExact) {
  const std::string dir = fixture(GetParam());
  test::TempDir tmp;
  const test::CommandResult r = test::run_anvil("convert --input " + dir + " --output " + (tmp / "out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto in = read_tensors(dir + "/model.safetensors"), out = read_tensors(tmp / "out/model.safetensors");
  std::set<std::string> in_names, out_names;
  for (const auto& [n, _] : in) in_names.insert(n);
  for (const auto& [n, _] : out) out_names.insert(n);
  EXPECT_EQ(out_names, in_names);
  for (const auto& [name, t] : out) {
    if (!in.count(name)) continue;
    EXPECT_EQ(t.dtype, DType::F32) << name;
    EXPECT_EQ(t.shape, in.at(name).shape) << name;
    EXPECT_TRUE(t.bytes == in.at(name).bytes) << name;
  }
  const json config = json::parse(test::read_file(tmp / "out/config.json"));
  EXPECT_EQ(config.value("dtype", ""), "float32");
  EXPECT_FALSE(config.contains("torch_dtype"));
  EXPECT_EQ(load_params(tmp / "out"), load_params(dir));

  const io::SafeTensorsReader golden(dir + "/golden.safetensors");
  write_golden_inputs(golden, tmp / "in.safetensors");
  ASSERT_EQ(run_logits(dir, tmp / "in.safetensors", tmp / "a.safetensors").exit_code, 0);
  ASSERT_EQ(run_logits(tmp / "out", tmp / "in.safetensors", tmp / "b.safetensors").exit_code, 0);
  EXPECT_EQ(read_logits(tmp / "b.safetensors"), read_logits(tmp / "a.safetensors"));
}

// bf16 / fp16: every tensor in the 16-bit type holding exactly the round-to-nearest-even value of the
// input's, config.json saying so, and the reloaded model's weights equal to the rounded originals.
TEST_P(ConvertCliFamily, HalfDtypesWriteRoundedWeights) {
  const std::string dir = fixture(GetParam());
  const auto in = read_tensors(dir + "/model.safetensors");
  const std::vector<float> params = load_params(dir);
  for (const std::string dtype : {"bf16", "fp16"}) {
    SCOPED_TRACE(dtype);
    const bool bf16 = dtype == "bf16";
    test::TempDir tmp;
    const test::CommandResult r =
        test::run_anvil("convert --input " + dir + " --output " + (tmp / "out") + " --dtype " + dtype);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto out = read_tensors(tmp / "out/model.safetensors");
    ASSERT_EQ(out.size(), in.size());
    for (const auto& [name, t] : out) {
      ASSERT_TRUE(in.count(name)) << name;
      EXPECT_EQ(t.dtype, bf16 ? DType::BF16 : DType::F16) << name;
      EXPECT_EQ(t.shape, in.at(name).shape) << name;
      const std::vector<float> src = as_floats(in.at(name));
      ASSERT_EQ(t.bytes.size(), src.size() * 2) << name;
      std::vector<uint16_t> half(src.size());
      std::memcpy(half.data(), t.bytes.data(), t.bytes.size());
      for (size_t i = 0; i < src.size(); ++i)
        ASSERT_EQ(half[i], bf16 ? float_to_bf16(src[i]) : float_to_fp16(src[i])) << name << "[" << i << "]";
    }
    const json config = json::parse(test::read_file(tmp / "out/config.json"));
    EXPECT_EQ(config.value("dtype", ""), bf16 ? "bfloat16" : "float16");
    const std::vector<float> reloaded = load_params(tmp / "out");
    ASSERT_EQ(reloaded.size(), params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      const float want =
          bf16 ? bf16_to_float(float_to_bf16(params[i])) : fp16_to_float(float_to_fp16(params[i]));
      ASSERT_EQ(reloaded[i], want) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ConvertCliFamily,
                         ::testing::Values("gpt2_tiny", "llama_tiny", "qwen2_tiny", "mistral_tiny",
                                           "bert_tiny"),
                         [](const auto& info) { return std::string(info.param); });

// Tensors the layout table ignores (Llama's rotary inv_freq buffers) are not written; everything else is.
TEST(ConvertCli, DropsOnlyIgnoredTensors) {
  test::TempDir tmp;
  const std::string dir = fixture("llama_tiny");
  copy_model(dir, tmp / "in", [](std::map<std::string, StoredTensor>& t) {
    std::vector<char> bytes(6 * 4, 0);
    t["model.layers.0.self_attn.rotary_emb.inv_freq"] = {DType::F32, {6}, bytes};
  });
  const test::CommandResult r =
      test::run_anvil("convert --input " + (tmp / "in") + " --output " + (tmp / "out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto out = read_tensors(tmp / "out/model.safetensors");
  const auto original = read_tensors(dir + "/model.safetensors");
  EXPECT_EQ(out.size(), original.size());
  for (const auto& [name, _] : original) EXPECT_TRUE(out.count(name)) << name;
  EXPECT_FALSE(out.count("model.layers.0.self_attn.rotary_emb.inv_freq"));
}

// A finite weight beyond fp16's range: --dtype fp16 fails naming the tensor (no output directory); bf16 holds
// it.
TEST(ConvertCli, Fp16OverflowNamesTheTensor) {
  test::TempDir tmp;
  copy_model(fixture("llama_tiny"), tmp / "in", [](std::map<std::string, StoredTensor>& t) {
    const float big = 1.0e5f;
    std::memcpy(t.at("model.layers.1.mlp.up_proj.weight").bytes.data() + 12, &big, 4);
  });
  test::CommandResult r =
      test::run_anvil("convert --input " + (tmp / "in") + " --output " + (tmp / "out") + " --dtype fp16");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("tensor 'model.layers.1.mlp.up_proj.weight' element 3 = 100000 overflows fp16"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("--dtype bf16"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(tmp / "out"));
  r = test::run_anvil("convert --input " + (tmp / "in") + " --output " + (tmp / "out") + " --dtype bf16");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(ConvertCli, RejectsUnknownDtypeAndMalformedInput) {
  test::TempDir tmp;
  const std::string llama = fixture("llama_tiny");
  test::CommandResult r =
      test::run_anvil("convert --input " + llama + " --output " + (tmp / "out") + " --dtype float8");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--dtype must be one of fp32, bf16, fp16"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("'float8'"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(tmp / "out"));

  // An unsupported rope_scaling type: names config.json, the field and the type.
  copy_model(llama, tmp / "yarn");
  json config = json::parse(test::read_file(tmp / "yarn/config.json"));
  config.erase("rope_parameters");
  config["rope_theta"] = 10000.0;
  config["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  test::write_file(tmp / "yarn/config.json", config.dump(2));
  r = test::run_anvil("convert --input " + (tmp / "yarn") + " --output " + (tmp / "out"));
  EXPECT_NE(r.exit_code, 0);
  for (const std::string& n :
       {std::string("yarn/config.json"), std::string("rope_scaling"), std::string("'yarn'")})
    EXPECT_NE(r.output.find(n), std::string::npos) << n << "\n" << r.output;

  // A missing tensor: names the directory and the tensor.
  copy_model(llama, tmp / "missing", [](std::map<std::string, StoredTensor>& t) {
    t.erase("model.layers.0.self_attn.k_proj.weight");
  });
  r = test::run_anvil("convert --input " + (tmp / "missing") + " --output " + (tmp / "out"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("tensor 'model.layers.0.self_attn.k_proj.weight' is missing"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

}  // namespace
}  // namespace anvil
