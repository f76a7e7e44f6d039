// BERT sequence classification end to end on the CPU, through the trainer, the checkpoints and the CLI:
// a tiny BERT learns a synthetic task (is the word "zebra" in the text?) well above chance and `anvil
// predict` classifies new texts with the trained output; N micro-batches of B give the update of one batch
// of N*B; resume is bit-exact; checkpointing, 16-bit precisions and every optimizer train; the estimate is
// the run's plan; mismatched data and models fail with clear errors and no output.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "anvil/trainer.hpp"
#include "data/classification_shard.hpp"
#include "data/prepare.hpp"
#include "io/safetensors.hpp"
#include "test_util.hpp"
#include "train/memory_fit.hpp"
#include "train/run_model.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
using test::expect_error;

const std::vector<std::string> kWords = {"apple", "river", "stone", "cloud", "green", "table",
                                         "music", "light", "house", "paper", "horse", "water",
                                         "bread", "chair", "glass", "plant", "night", "sugar",
                                         "watch", "train", "tiger", "lemon", "ocean", "piano"};

// A text of 4..20 random words; with `zebra`, one of them is "zebra".
std::string random_text(std::mt19937& rng, bool zebra) {
  const int n = 4 + int(rng() % 17);
  std::vector<std::string> words;
  for (int i = 0; i < n; ++i) words.push_back(kWords[rng() % kWords.size()]);
  if (zebra) words[rng() % size_t(n)] = "zebra";
  std::string text;
  for (const std::string& w : words) text += (text.empty() ? "" : " ") + w;
  return text;
}

// The task's data: vocab.txt (a BERT-style WordPiece vocabulary with [PAD] [UNK] [CLS] [SEP] [MASK]), a CSV
// of `rows` texts labelled yes / no by whether "zebra" occurs, prepared into data/train.cls and data/val.cls
// (15% validation) as `anvil prepare-data` does, and texts.txt: 40 new texts for prediction.
struct ZebraData {
  test::TempDir dir;
  std::string vocab, train, val, texts;
  std::vector<std::string> new_texts;

  explicit ZebraData(int rows = 1000) {
    vocab = dir / "vocab.txt", train = dir / "data/train.cls", val = dir / "data/val.cls";
    texts = dir / "texts.txt";
    std::string v = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nzebra\n";
    for (const std::string& w : kWords) v += w + "\n";
    test::write_file(vocab, v);
    std::mt19937 rng(17);
    std::string csv = "text,label\n";
    for (int i = 0; i < rows; ++i) {
      const bool zebra = rng() % 2;
      csv += random_text(rng, zebra) + "," + (zebra ? "yes" : "no") + "\n";
    }
    test::write_file(dir / "data.csv", csv);
    data::PrepareOptions o;
    o.inputs = {dir / "data.csv"};
    o.output_dir = dir / "data";
    o.tokenizer = vocab;
    o.val_fraction = 0.15;
    o.threads = 1;
    data::prepare_data(o);
    std::string t;
    for (int i = 0; i < 40; ++i) {
      new_texts.push_back(random_text(rng, i % 2 == 0));
      t += new_texts.back() + "\n";
    }
    test::write_file(texts, t);
  }
};

json base_config(const ZebraData& d, const std::string& out) {
  return {{"model", "bert-tiny"},
          {"tokenizer", d.vocab},
          {"train_data", d.train},
          {"val_data", d.val},
          {"per_device_train_batch_size", 16},
          {"max_steps", 150},
          {"learning_rate", 1e-3},
          {"warmup_steps", 10},
          {"logging_steps", 10},
          {"eval_steps", 50},
          {"per_device_eval_batch_size", 4},  // more than 20 batches: the default evaluates all of them
          {"device", "cpu"},
          {"seed", 7},
          {"output_dir", out}};
}

TrainConfig config_of(const json& j) {
  return TrainConfig::from_json(j, "test");
}

std::vector<json> metrics_lines(const std::string& out) {
  std::vector<json> lines;
  std::istringstream in(test::read_file(out + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  return lines;
}

std::vector<double> losses(const std::string& out) {
  std::vector<double> l;
  for (const json& j : metrics_lines(out))
    if (j.contains("loss")) l.push_back(j["loss"].get<double>());
  return l;
}

// Every tensor of a model.safetensors, as floats.
std::map<std::string, std::vector<float>> tensors(const std::string& path) {
  const io::SafeTensorsReader r(path);
  std::map<std::string, std::vector<float>> out;
  for (const io::SafeTensorInfo& t : r.tensors()) {
    std::vector<float>& v = out[t.name];
    v.resize(size_t(t.numel()));
    std::memcpy(v.data(), r.data(t), v.size() * sizeof(float));
  }
  return out;
}

std::vector<json> json_lines(const std::string& text) {
  std::vector<json> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line.front() == '{') out.push_back(json::parse(line));
  return out;
}

// One trained classifier shared by the checks that need a trained model (training is the slow part, and
// ctest runs every test in its own process, so the checks are grouped into two tests).
class TrainedClassifier : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    data_ = new ZebraData();
    out_ = data_->dir / "run";
    summary_ = new TrainSummary(train(config_of(base_config(*data_, out_))));
  }
  static void TearDownTestSuite() {
    delete summary_;
    delete data_;
    summary_ = nullptr, data_ = nullptr;
  }
  static ZebraData* data_;
  static std::string out_;
  static TrainSummary* summary_;
};
ZebraData* TrainedClassifier::data_ = nullptr;
std::string TrainedClassifier::out_;
TrainSummary* TrainedClassifier::summary_ = nullptr;

void LearnsTheTaskWellAboveChance() {
  const std::string& out_ = TrainedClassifier::out_;
  const TrainSummary* summary_ = TrainedClassifier::summary_;
  const TrainSummary& s = *summary_;
  EXPECT_EQ(s.global_step, 150);
  EXPECT_GE(s.eval_accuracy, 0.9) << "chance is 0.5";
  EXPECT_GT(s.eval_loss, 0);
  EXPECT_LT(s.eval_loss, 0.3);
  EXPECT_GT(s.train_samples_per_second, 0);
  const std::vector<double> l = losses(out_);
  ASSERT_EQ(l.size(), 16u);  // steps 1, 10, 20, ..., 150
  EXPECT_NEAR(l.front(), std::log(2.0), 0.1);
  // The metrics: eval_loss and eval_accuracy at steps 50, 100, 150; accuracy rises well above chance.
  std::vector<json> evals;
  for (const json& j : metrics_lines(out_))
    if (j.contains("eval_accuracy")) evals.push_back(j);
  ASSERT_EQ(evals.size(), 3u);
  EXPECT_EQ(evals.back()["step"], 150);
  EXPECT_DOUBLE_EQ(evals.back()["eval_accuracy"].get<double>(), s.eval_accuracy);
  // Every validation example is evaluated by default (max_eval_batches 0), as HF Trainer does: the count of
  // examples is the shard's (its header's uint64 at offset 16).
  uint64_t val_examples = 0;
  {
    std::ifstream f(TrainedClassifier::data_->val, std::ios::binary);
    f.seekg(16);
    f.read(reinterpret_cast<char*>(&val_examples), sizeof(val_examples));
  }
  EXPECT_GT(val_examples, 20u * 4u);
  EXPECT_EQ(evals.back()["eval_examples"].get<uint64_t>(), val_examples);
  EXPECT_TRUE(evals.back().contains("eval_loss"));
  for (const json& j : metrics_lines(out_))
    if (j.contains("loss")) {
      EXPECT_TRUE(j.contains("samples_per_second")) << j.dump();
    }

  const json summary = json::parse(test::read_file(out_ + "/summary.json"));
  for (const char* k : {"train_runtime", "train_samples_per_second", "eval_loss", "eval_accuracy",
                        "peak_memory_bytes", "train_tokens_per_second"})
    EXPECT_TRUE(summary.contains(k)) << k;
  // The checkpoint: a Hugging Face BertForSequenceClassification directory with the data's labels, the
  // tokenizer, and the trainer's state.
  const std::string ck = out_ + "/checkpoint-150";
  for (const char* f :
       {"model.safetensors", "config.json", "optimizer.safetensors", "trainer_state.json", "vocab.txt"})
    EXPECT_TRUE(fs::exists(ck + "/" + f)) << f;
  const json hf = json::parse(test::read_file(ck + "/config.json"));
  EXPECT_EQ(hf["model_type"], "bert");
  EXPECT_EQ(hf["architectures"][0], "BertForSequenceClassification");
  EXPECT_EQ(hf["id2label"], json({{"0", "no"}, {"1", "yes"}}));
  EXPECT_EQ(hf["vocab_size"], 30);  // the tokenizer's
  const auto w = tensors(ck + "/model.safetensors");
  EXPECT_EQ(w.at("classifier.weight").size(), 2u * 64u);
  EXPECT_TRUE(w.count("bert.encoder.layer.1.output.LayerNorm.bias"));
  // train_config.json records the sequence length the data fixed (longest example 22 -> 24).
  const json tc = json::parse(test::read_file(out_ + "/train_config.json"));
  EXPECT_EQ(tc["max_seq_length"], 24);
}

void PredictClassifiesNewTexts() {
  const ZebraData* data_ = TrainedClassifier::data_;
  const std::string& out_ = TrainedClassifier::out_;
  // From the output_dir (its last checkpoint), a text file one per line, to a file.
  const std::string preds = data_->dir / "preds.jsonl";
  const test::CommandResult r =
      test::run_anvil("predict --model " + out_ + " --input " + data_->texts + " --output " + preds);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("checkpoint-150"), std::string::npos) << r.output;
  const std::vector<json> lines = json_lines(test::read_file(preds));
  ASSERT_EQ(lines.size(), data_->new_texts.size());
  int right = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const json& j = lines[i];
    EXPECT_EQ(j["index"], i);
    EXPECT_EQ(j["text"], data_->new_texts[i]);
    const double p_no = j["probabilities"]["no"], p_yes = j["probabilities"]["yes"];
    EXPECT_NEAR(p_no + p_yes, 1.0, 1e-9);
    EXPECT_EQ(j["label"], p_yes > p_no ? "yes" : "no");
    EXPECT_EQ(j["label_id"], p_yes > p_no ? 1 : 0);
    EXPECT_DOUBLE_EQ(j["score"].get<double>(), std::max(p_no, p_yes));
    const bool zebra = data_->new_texts[i].find("zebra") != std::string::npos;
    right += (j["label"] == "yes") == zebra ? 1 : 0;
  }
  EXPECT_GE(right, 36) << "of 40";

  // CSV and JSONL inputs with the texts give the same predictions (stdout; the batch size changes nothing).
  std::string csv = "id,sentence\n", jsonl;
  for (size_t i = 0; i < data_->new_texts.size(); ++i) {
    csv += std::to_string(i) + ",\"" + data_->new_texts[i] + "\"\n";
    jsonl += json({{"content", data_->new_texts[i]}}).dump() + "\n\n";  // blank lines are skipped
  }
  test::write_file(data_->dir / "texts.csv", csv);
  test::write_file(data_->dir / "texts.jsonl", jsonl);
  const std::string ck = out_ + "/checkpoint-150";
  for (const std::string& args : {"--input " + (data_->dir / "texts.csv") + " --text_column sentence",
                                  "--input " + (data_->dir / "texts.jsonl") + " --text_field content"}) {
    const test::CommandResult c = test::run_anvil("predict --model " + ck + " --batch_size 7 " + args);
    ASSERT_EQ(c.exit_code, 0) << c.output;
    const std::vector<json> got = json_lines(c.output);
    ASSERT_EQ(got.size(), lines.size()) << c.output;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i]["label"], lines[i]["label"]) << args << " " << i;
      EXPECT_NEAR(got[i]["score"].get<double>(), lines[i]["score"].get<double>(), 1e-5) << args << " " << i;
    }
  }
}

void PredictErrors() {
  const ZebraData* data_ = TrainedClassifier::data_;
  const std::string& out_ = TrainedClassifier::out_;
  const std::string ck = out_ + "/checkpoint-150", out = data_->dir / "predictions.jsonl";
  auto expect_failure = [&](const std::string& args, const std::string& needle) {
    const test::CommandResult r = test::run_anvil("predict " + args + " --output " + out);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << "expected '" << needle << "' in:\n" << r.output;
    EXPECT_FALSE(fs::exists(out)) << args;
    EXPECT_FALSE(fs::exists(out + ".tmp")) << args;
  };
  expect_failure("--model " + ck + " --input " + (data_->dir / "none.txt"), "none.txt");
  test::write_file(data_->dir / "bad.jsonl", "{\"text\": \"apple\"}\nnot json\n");
  expect_failure("--model " + ck + " --input " + (data_->dir / "bad.jsonl"), "bad.jsonl:2: not valid JSON");
  test::write_file(data_->dir / "nofield.jsonl", "{\"body\": \"apple\"}\n");
  expect_failure("--model " + ck + " --input " + (data_->dir / "nofield.jsonl"), "string field 'text'");
  test::write_file(data_->dir / "bad.csv", "id,sentence\n1,apple\n");
  expect_failure("--model " + ck + " --input " + (data_->dir / "bad.csv"),
                 "no 'text' column (columns: id, sentence)");
  expect_failure("--model " + (data_->dir / "nowhere") + " --input " + data_->texts, "no such directory");
  // A model directory without a tokenizer.
  const std::string bare = data_->dir / "bare";
  fs::create_directories(bare);
  fs::copy_file(ck + "/config.json", bare + "/config.json");
  fs::copy_file(ck + "/model.safetensors", bare + "/model.safetensors");
  expect_failure("--model " + bare + " --input " + data_->texts, "no tokenizer.json or vocab.txt");
  // ... which --tokenizer supplies.
  const test::CommandResult ok = test::run_anvil("predict --model " + bare + " --tokenizer " + data_->vocab +
                                                 " --input " + data_->texts);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_EQ(json_lines(ok.output).size(), data_->new_texts.size());
  // A GPT-2 model is not a classifier.
  test::ByteCorpus corpus(20000);
  const std::string gpt = corpus.dir / "gpt";
  TrainConfig g =
      TrainConfig::from_json({{"model", {{"n_layer", 1}, {"n_head", 2}, {"n_embd", 16}, {"block_size", 16}}},
                              {"train_data", corpus.dir / "data/train.bin"},
                              {"per_device_train_batch_size", 2},
                              {"max_steps", 1},
                              {"device", "cpu"},
                              {"output_dir", gpt}},
                             "test");
  train(g);
  expect_failure("--model " + gpt + "/checkpoint-1 --tokenizer bytes --input " + data_->texts,
                 "not a sequence classifier");
  // And a BERT classifier generates no text.
  const test::CommandResult gen = test::run_anvil("generate --checkpoint " + ck + " --prompt apple");
  EXPECT_NE(gen.exit_code, 0);
  EXPECT_NE(gen.output.find("anvil predict"), std::string::npos) << gen.output;
}

void ConvertWritesAHuggingFaceDirectory() {
  const ZebraData* data_ = TrainedClassifier::data_;
  const std::string& out_ = TrainedClassifier::out_;
  const std::string ck = out_ + "/checkpoint-150", hf = data_->dir / "hf";
  const test::CommandResult r = test::run_anvil("convert --input " + ck + " --output " + hf);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(tensors(hf + "/model.safetensors"), tensors(ck + "/model.safetensors"));
  EXPECT_EQ(json::parse(test::read_file(hf + "/config.json")),
            json::parse(test::read_file(ck + "/config.json")));
  EXPECT_TRUE(fs::exists(hf + "/vocab.txt"));
  EXPECT_FALSE(fs::exists(hf + "/optimizer.safetensors"));
}

// A BERT encoder without a classifier (a BertModel directory: no "bert." prefix, no pooler or classifier,
// no id2label) fine-tunes from its weights: the head is newly initialised and the labels come from the data.
void FineTunesFromAnEncoderWithoutHead() {
  const ZebraData* data_ = TrainedClassifier::data_;
  const std::string& out_ = TrainedClassifier::out_;
  const std::string ck = out_ + "/checkpoint-150", enc = data_->dir / "encoder";
  fs::create_directories(enc);
  io::SafeTensorsWriter w;
  std::map<std::string, std::vector<float>> kept;
  for (auto& [name, v] : tensors(ck + "/model.safetensors")) {
    if (name.starts_with("classifier.") || name.starts_with("bert.pooler.")) continue;
    kept[name.substr(5)] = v;
  }
  const io::SafeTensorsReader r(ck + "/model.safetensors");
  for (auto& [name, v] : kept) w.add(name, DType::F32, r.at("bert." + name).shape, v.data());
  w.write(enc + "/model.safetensors");
  json cfg = json::parse(test::read_file(ck + "/config.json"));
  for (const char* k : {"id2label", "label2id", "architectures"}) cfg.erase(k);
  test::write_file(enc + "/config.json", cfg.dump());
  fs::copy_file(data_->vocab, enc + "/vocab.txt");

  json j = base_config(*data_, data_->dir / "from_encoder");
  j.erase("model"), j.erase("tokenizer");
  j["model_name_or_path"] = enc;
  j["max_steps"] = 1, j["eval_steps"] = 0, j["learning_rate"] = 0.0;
  // One step at learning rate 0: the saved encoder is the loaded one, the head is new.
  const TrainSummary s0 = train(config_of(j));
  const auto w0 = tensors(s0.last_checkpoint + "/model.safetensors");
  for (const auto& [name, v] : kept) EXPECT_EQ(w0.at("bert." + name), v) << name;
  EXPECT_TRUE(w0.count("classifier.weight") && w0.count("bert.pooler.dense.weight"));
  const json hf = json::parse(test::read_file(s0.last_checkpoint + "/config.json"));
  EXPECT_EQ(hf["id2label"], json({{"0", "no"}, {"1", "yes"}}));  // the data's labels
  // The encoder already separates the classes: a fresh head learns fast.
  j["max_steps"] = 40, j["learning_rate"] = 1e-3, j["output_dir"] = data_->dir / "from_encoder_40";
  EXPECT_GE(train(config_of(j)).eval_accuracy, 0.9);
}

// The arena `anvil estimate` plans for a classification config is the one the run allocates.
void EstimateIsTheRunsPlan() {
  const ZebraData* data_ = TrainedClassifier::data_;
  const std::string& out_ = TrainedClassifier::out_;
  const TrainSummary* summary_ = TrainedClassifier::summary_;
  TrainConfig cfg = config_of(base_config(*data_, out_));
  RunModel rm = resolve_run_model(cfg);
  open_run_data(cfg, rm);
  EXPECT_EQ(cfg.max_seq_length, 24);
  EXPECT_EQ(rm.config.num_labels, 2);
  const MemoryEstimate e = estimate_memory(rm.config, cfg, DeviceKind::CPU, 0);
  EXPECT_EQ(e.arena, summary_->planned_memory_bytes);
  const test::CommandResult r = test::run_anvil(
      "estimate --json --model bert-tiny --tokenizer " + data_->vocab + " --train_data " + data_->train +
      " --val_data " + data_->val + " --per_device_train_batch_size 16 --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json::parse(r.output)["arena"].get<size_t>(), summary_->planned_memory_bytes);
  EXPECT_EQ(json::parse(r.output)["seq_len"], 24);
}

TEST_F(TrainedClassifier, LearnsPredictsConvertsAndEstimates) {
  {
    SCOPED_TRACE("learning");
    LearnsTheTaskWellAboveChance();
  }
  {
    SCOPED_TRACE("predict");
    PredictClassifiesNewTexts();
  }
  {
    SCOPED_TRACE("convert");
    ConvertWritesAHuggingFaceDirectory();
  }
  {
    SCOPED_TRACE("estimate");
    EstimateIsTheRunsPlan();
  }
}

TEST_F(TrainedClassifier, PredictErrorsAndFineTuningFromAnEncoder) {
  {
    SCOPED_TRACE("predict errors");
    PredictErrors();
  }
  {
    SCOPED_TRACE("fine-tuning from an encoder without head");
    FineTunesFromAnEncoderWithoutHead();
  }
}

TEST(BertTrain, GradientAccumulationMatchesOneLargeBatch) {
  ZebraData d(400);
  json j = base_config(d, d.dir / "accum");
  // Without dropout: masks are drawn per micro-batch, so 4 x 4 and 1 x 16 would drop different elements.
  j["model"] = {{"family", "bert"}, {"hidden_dropout_prob", 0}, {"attention_probs_dropout_prob", 0}};
  j["per_device_train_batch_size"] = 4, j["gradient_accumulation_steps"] = 4, j["max_steps"] = 6;
  j["logging_steps"] = 1, j["eval_steps"] = 0;
  const TrainSummary a = train(config_of(j));
  j["per_device_train_batch_size"] = 16, j["gradient_accumulation_steps"] = 1,
  j["output_dir"] = d.dir / "one";
  const TrainSummary b = train(config_of(j));
  // The same 16 examples per step, padded per micro-batch (to other lengths) or per batch: the same losses
  // and weights within fp32 rounding.
  const std::vector<double> la = losses(d.dir / "accum"), lb = losses(d.dir / "one");
  ASSERT_EQ(la.size(), 6u);
  ASSERT_EQ(lb.size(), 6u);
  for (size_t i = 0; i < la.size(); ++i)
    EXPECT_NEAR(la[i], lb[i], 1e-5 * std::abs(lb[i])) << "step " << i + 1;
  const auto wa = tensors(a.last_checkpoint + "/model.safetensors");
  const auto wb = tensors(b.last_checkpoint + "/model.safetensors");
  double max_diff = 0;
  for (const auto& [name, v] : wb)
    for (size_t i = 0; i < v.size(); ++i)
      max_diff = std::max(max_diff, double(std::abs(v[i] - wa.at(name)[i])));
  EXPECT_LT(max_diff, 1e-5);
}

// freeze_parameters on BERT (gradients in dead activation memory, computed for every tensor and zeroed for
// the frozen ones before the norm): the encoder and pooler stay as they are, the classifier trains.
TEST(BertTrain, FrozenEncoderTrainsTheClassifierOnly) {
  ZebraData d(200);
  json j = base_config(d, d.dir / "frozen");
  j["max_steps"] = 6, j["save_steps"] = 3, j["eval_steps"] = 0, j["weight_decay"] = 0.1;
  j["freeze_parameters"] = "bert.*";
  train(config_of(j));
  const auto at3 = tensors(d.dir / "frozen/checkpoint-3/model.safetensors");
  const auto at6 = tensors(d.dir / "frozen/checkpoint-6/model.safetensors");
  ASSERT_FALSE(at3.empty());
  for (const auto& [name, v] : at6) {
    const bool frozen = name.starts_with("bert.");
    EXPECT_EQ(v == at3.at(name), frozen) << name << (frozen ? " moved" : " did not train");
  }
  // The encoder's backward is skipped (no gradient is needed below the classifier), and the classifier's
  // first unclipped update is the one it gets with nothing frozen.
  j["max_steps"] = 1, j["save_steps"] = 0, j["max_grad_norm"] = 0.0, j["warmup_steps"] = 0;
  j["output_dir"] = d.dir / "frozen1";
  const TrainSummary f = train(config_of(j));
  j["freeze_parameters"] = "", j["output_dir"] = d.dir / "open1";
  const TrainSummary o = train(config_of(j));
  const auto wf = tensors(f.last_checkpoint + "/model.safetensors");
  const auto wo = tensors(o.last_checkpoint + "/model.safetensors");
  for (const char* name : {"classifier.weight", "classifier.bias"})
    EXPECT_TRUE(wf.at(name) == wo.at(name)) << name;
  EXPECT_FALSE(wf.at("bert.pooler.dense.weight") == wo.at("bert.pooler.dense.weight"));
}

TEST(BertTrain, ResumeIsBitExact) {
  ZebraData d(300);  // 255 training examples: 15 batches of 16 per epoch, so the run crosses an epoch
  json j = base_config(d, d.dir / "full");
  j["max_steps"] = 24, j["save_steps"] = 12, j["eval_steps"] = 12, j["logging_steps"] = 1;
  j["dataloader_num_workers"] = 2;
  train(config_of(j));
  json r = j;
  r["output_dir"] = d.dir / "resumed";
  r["resume_from_checkpoint"] = d.dir / "full/checkpoint-12";
  train(config_of(r));
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(test::read_file(d.dir / ("full/checkpoint-24/" + std::string(f))),
              test::read_file(d.dir / ("resumed/checkpoint-24/" + std::string(f))))
        << f;
  const std::vector<double> full = losses(d.dir / "full"), resumed = losses(d.dir / "resumed");
  ASSERT_EQ(resumed.size(), 12u);
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(resumed[i], full[12 + i]) << "step " << 13 + i;
  const json a = json::parse(test::read_file(d.dir / "full/checkpoint-24/trainer_state.json"));
  const json b = json::parse(test::read_file(d.dir / "resumed/checkpoint-24/trainer_state.json"));
  EXPECT_EQ(a["loader"], b["loader"]);
  EXPECT_EQ(a["loader"]["epoch"], 1);
}

// Activation checkpointing gives the same run bit for bit; bf16, fp16 (with the loss scaler) and every
// optimizer train a classifier.
TEST(BertTrain, CheckpointingPrecisionsAndOptimizers) {
  ZebraData d(300);
  json j = base_config(d, d.dir / "plain");
  j["max_steps"] = 8, j["eval_steps"] = 0, j["logging_steps"] = 1;
  train(config_of(j));
  json c = j;
  c["output_dir"] = d.dir / "ckpt", c["gradient_checkpointing"] = true;
  train(config_of(c));
  EXPECT_EQ(losses(d.dir / "plain"), losses(d.dir / "ckpt"));
  c["output_dir"] = d.dir / "selective", c["gradient_checkpointing_mode"] = "selective";
  train(config_of(c));
  EXPECT_EQ(losses(d.dir / "plain"), losses(d.dir / "selective"));

  const std::vector<std::pair<std::string, json>> variants = {
      {"bf16", {{"bf16", true}}},
      {"fp16", {{"fp16", true}, {"initial_scale_power", 8}}},
      {"adafactor", {{"optim", "adafactor"}}},
      {"adamw_8bit", {{"optim", "adamw_8bit"}}}};
  for (const auto& [name, extra] : variants) {
    json v = j;
    v["output_dir"] = d.dir / name, v["max_steps"] = 60, v["logging_steps"] = 60, v["eval_steps"] = 60;
    v.update(extra);
    const TrainSummary s = train(config_of(v));
    EXPECT_GE(s.eval_accuracy, 0.9) << name;
    const io::SafeTensorsReader opt(s.last_checkpoint + "/optimizer.safetensors");
    EXPECT_EQ(opt.metadata().at("optimizer"),
              name.find("16") != std::string::npos ? "adamw_torch_fused" : name);
  }
  // SGD (PyTorch's, with momentum) trains a post-LayerNorm BERT slowly: it runs, and saves its state.
  json v = j;
  v["output_dir"] = d.dir / "sgd", v["optim"] = "sgd", v["momentum"] = 0.9, v["learning_rate"] = 0.05;
  const TrainSummary s = train(config_of(v));
  EXPECT_TRUE(std::isfinite(s.train_loss));
  const io::SafeTensorsReader opt(s.last_checkpoint + "/optimizer.safetensors");
  EXPECT_EQ(opt.metadata().at("optimizer"), "sgd");
  EXPECT_NE(losses(d.dir / "sgd").back(), losses(d.dir / "plain").back());
}

TEST(BertTrain, DataAndModelMismatchesAreClearErrors) {
  ZebraData d(200);
  test::ByteCorpus corpus(20000);
  const std::string out = d.dir / "out";
  auto fails = [&](json j, std::initializer_list<std::string> needles) {
    j["output_dir"] = out;
    expect_error([&] { train(config_of(j)); }, needles);
    EXPECT_FALSE(fs::exists(out)) << j.dump();
  };
  const json base = base_config(d, out);
  json j = base;
  j["train_data"] = corpus.dir / "data/train.bin";
  fails(j, {"train_data", "train.bin", "not a classification shard", "BERT", "prepare-data"});
  j = base;
  j["val_data"] = corpus.dir / "data/val.bin";
  fails(j, {"val_data", "val.bin", "not a classification shard"});
  j = base;
  j["model"] = {{"n_layer", 1}, {"n_head", 2}, {"n_embd", 16}, {"block_size", 32}};
  j.erase("tokenizer");
  fails(j, {"train_data", "train.cls", "is a classification shard", "GPT-2", "BERT"});
  j = base;
  j["model"] = {{"family", "bert"}, {"num_labels", 3}};
  fails(j, {"label count mismatch", "2 labels (no, yes)", "num_labels is 3"});
  j = base;
  j["model"] = {{"family", "bert"}, {"label_names", {"yes", "no"}}};
  fails(j, {"label mismatch", "(no, yes)", "(yes, no)", "--labels yes,no"});
  j = base;
  j["model"] = {{"family", "bert"}, {"num_labels", 1}};
  fails(j, {"regression"});
  j = base;
  j["max_seq_length"] = 16;
  fails(j, {"train.cls", "more than the sequence length 16", "--max_length 16"});
  j = base;
  j["sample_prompt"] = "apple";
  fails(j, {"sample_prompt", "GPT-2"});
  // Validation data with another label set.
  std::vector<std::vector<uint32_t>> ex = {{2, 6, 3}};
  data::write_classification_shard(d.dir / "other.cls", 30, 8, {"no", "maybe", "yes"}, ex, {1});
  j = base;
  j["val_data"] = d.dir / "other.cls";
  fails(j, {"val_data", "other.cls", "(no, maybe, yes)", "(no, yes)"});
}

TEST(BertTrainConfig, ModelKeysRoundTrip) {
  const json model = {{"family", "bert"},
                      {"n_layer", 3},
                      {"n_head", 2},
                      {"n_embd", 32},
                      {"vocab_size", 500},
                      {"block_size", 64},
                      {"intermediate_size", 80},
                      {"layer_norm_eps", 1e-7},
                      {"hidden_act", "gelu_new"},
                      {"type_vocab_size", 3},
                      {"pad_token_id", 1},
                      {"num_labels", 3},
                      {"label_names", {"a", "b", "c"}},
                      {"problem_type", "single_label_classification"},
                      {"initializer_range", 0.05},
                      {"hidden_dropout_prob", 0.2},
                      {"attention_probs_dropout_prob", 0.3}};
  const TrainConfig c = config_of({{"model", model}});
  const TransformerConfig& m = c.model;
  EXPECT_TRUE(m.is_bert());
  EXPECT_EQ(m.ffn_size(), 80);
  EXPECT_EQ(m.layer_norm_eps, 1e-7);
  EXPECT_EQ(m.hidden_act, "gelu_new");
  EXPECT_EQ(m.type_vocab_size, 3);
  EXPECT_EQ(m.pad_token_id, 1);
  EXPECT_EQ(m.label_names, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_FALSE(c.labels_from_data);
  EXPECT_FALSE(c.vocab_from_tokenizer);
  // train_config.json's model section reads back into the same model.
  const TrainConfig back = config_of(c.to_json());
  EXPECT_EQ(back.model.to_hf_json(), m.to_hf_json());
  EXPECT_EQ(back.to_json()["model"], c.to_json()["model"]);
  // Missing fields take bert-tiny's; the labels then follow the data.
  const TrainConfig small = config_of({{"model", {{"family", "bert"}, {"n_layer", 1}}}});
  EXPECT_EQ(small.model.n_embd, 64);
  EXPECT_EQ(small.model.layer_norm_eps, 1e-12);
  EXPECT_EQ(small.model.hidden_act, "gelu");
  EXPECT_TRUE(small.labels_from_data);
  EXPECT_FALSE(small.to_json()["model"].contains("num_labels"));
  EXPECT_TRUE(config_of(small.to_json()).labels_from_data);
  // Names alone fix the count.
  EXPECT_EQ(config_of({{"model", {{"family", "bert"}, {"label_names", {"x", "y", "z"}}}}}).model.num_labels,
            3);
  // Presets.
  for (const char* p : {"bert-tiny", "bert-base", "bert-large"}) {
    const TrainConfig pc = config_of({{"model", p}});
    EXPECT_TRUE(pc.model.is_bert()) << p;
    EXPECT_EQ(pc.to_json()["model"], p);
  }
  expect_error(
      [&] {
        config_of({{"model", {{"family", "bert"}, {"num_lables", 2}}}});
      },
      {"unknown key 'model.num_lables'", "model.num_labels"});
  expect_error(
      [&] {
        config_of({{"model", {{"family", "gpt2"}, {"num_labels", 2}, {"layer_norm_eps", 1e-12}}}});
      },
      {"layer_norm_eps", "gpt2"});
  expect_error([&] { config_of({{"model", {{"family", "t5"}}}}); }, {"model.family", "t5"});
  expect_error(
      [&] {
        config_of({{"model", "bert-huge"}});
      },
      {"unknown model preset 'bert-huge'", "bert-large"});
}

TEST(BertTrainConfig, HuggingFaceConfigJsonAndModelNameOrPath) {
  test::TempDir dir;
  TransformerConfig m = TransformerConfig::preset("bert-tiny");
  m.num_labels = 3;
  m.label_names = {"a", "b", "c"};
  test::write_file(dir / "config.json", m.to_hf_json().dump());
  // "model": a config.json (the file or its directory): the shape, with the labels it fixes.
  for (const std::string& path : {dir / "config.json", dir.str()}) {
    const TrainConfig c = config_of({{"model", path}});
    EXPECT_EQ(c.model.to_hf_json(), m.to_hf_json()) << path;
    EXPECT_FALSE(c.labels_from_data);
    EXPECT_TRUE(c.model_preset.empty());
    // Written back as an object with every field.
    EXPECT_EQ(config_of(c.to_json()).model.to_hf_json(), m.to_hf_json());
  }
  // A pre-training config (no id2label / num_labels) leaves the labels to the data.
  json pre = m.to_hf_json();
  pre.erase("id2label"), pre.erase("label2id");
  test::write_file(dir / "pre.json", pre.dump());
  EXPECT_TRUE(config_of({{"model", dir / "pre.json"}}).labels_from_data);
  // model_name_or_path is init_from.
  EXPECT_EQ(config_of({{"model_name_or_path", dir.str()}}).init_from, dir.str());
  expect_error(
      [&] {
        config_of({{"model_name_or_path", dir.str()}, {"init_from", "elsewhere"}});
      },
      {"'model_name_or_path'", "'init_from'", "name the same setting"});
  expect_error(
      [&] {
        config_of({{"model", dir / "missing.json"}});
      },
      {"unknown model preset", "missing.json"});
}

}  // namespace
}  // namespace anvil
