// The SentencePiece-style tokenizers end to end (Llama 2, Mistral, TinyLlama; the committed fixtures of
// tests/data/sp_tokenizers/): prepare-data writes each document as the model's tokenizer encodes it with its
// special tokens (<s> first), whole even where a large file is tokenised in segments; `anvil generate`
// encodes a text prompt with the template and decodes the new tokens after it; checkpoints carry the
// tokenizer_config.json / special_tokens_map.json that decide the template; and examples/llama_tiny.json
// trains a Llama for a few steps, then generates from its checkpoint and fine-tunes from it.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "data/prepare.hpp"
#include "data/token_shard.hpp"
#include "data/tokenizer.hpp"
#include "io/checkpoint.hpp"
#include "test_util.hpp"
#include "train/sampler.hpp"

namespace anvil {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kFixtures = std::string(ANVIL_SOURCE_DIR) + "/tests/data/sp_tokenizers";
constexpr uint32_t kBos = 1, kEos = 2;  // <s>, </s> of the fixtures

std::vector<uint32_t> shard_ids(const std::string& path) {
  data::TokenShard shard(path);
  std::vector<uint32_t> ids(shard.size());
  for (uint64_t i = 0; i < shard.size(); ++i) ids[i] = shard.at(i);
  return ids;
}

// Compares long id sequences, reporting the first difference instead of both sequences.
void expect_same_ids(const std::vector<uint32_t>& got, const std::vector<uint32_t>& want,
                     const std::string& what) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  if (i == got.size() && i == want.size()) return;
  ADD_FAILURE() << what << ": " << got.size() << " ids, expected " << want.size() << "; first difference at "
                << i << ": " << (i < got.size() ? std::to_string(got[i]) : "end") << " vs "
                << (i < want.size() ? std::to_string(want[i]) : "end");
}

// A text over one prepare-data segment (1 MiB) whose only cut points are spaces after a letter or digit
// (`newlines` false: lines end in '.') or newlines after a letter (`newlines` true), so that the later
// segments start with " " or "\n": where Llama 2's normaliser would put another "▁" if they were encoded
// alone.
std::string segmented_document(bool newlines) {
  std::string s;
  for (size_t i = 0; s.size() < (size_t{1} << 20) + 100000; ++i)
    s += newlines ? "Hello world line " + std::to_string(i % 97) + " of the quick fox\n"
                  : "Hello world, line " + std::to_string(i % 89) + " caf\xc3\xa9 jumps.\n";
  return s;
}

std::vector<uint32_t> concat_documents(const data::Tokenizer& tok, const std::vector<std::string>& docs,
                                       bool eos_after) {
  std::vector<uint32_t> ids;
  for (const std::string& doc : docs) {
    if (doc.empty()) continue;  // an empty document adds nothing, not even <s>
    const std::vector<uint32_t> d = tok.encode_with_special(doc);
    ids.insert(ids.end(), d.begin(), d.end());
    if (eos_after) ids.push_back(kEos);
  }
  return ids;
}

// --- prepare-data
// ----------------------------------------------------------------------------------------------

TEST(PrepareSentencePiece, EachDocumentIsEncodeWithSpecialThenEos) {
  test::TempDir dir;
  const std::string tok_dir = kFixtures + "/llama2";  // tokenizer_config.json: add_bos_token, no eos
  const auto tok = data::load_tokenizer(tok_dir);
  ASSERT_EQ(tok->special_template(), (data::SpecialTokenTemplate{{kBos}, {}}));
  ASSERT_EQ(tok->eos_id(), kEos);

  // Text files in sorted order: small ones, an empty one, two over a segment.
  const std::vector<std::string> docs = {"Hello world\nsecond line\n", "", segmented_document(false),
                                         segmented_document(true), " leading space and a last line"};
  fs::create_directories(dir / "corpus");
  for (size_t i = 0; i < docs.size(); ++i)
    test::write_file(dir / ("corpus/" + std::to_string(i) + ".txt"), docs[i]);
  data::PrepareOptions o;
  o.inputs = {dir / "corpus"};
  o.output_dir = dir / "out";
  o.tokenizer = tok_dir;
  o.val_fraction = 0;
  o.threads = 2;
  const data::PrepareReport r = test::quietly([&] { return data::prepare_data(o); });
  EXPECT_EQ(r.document_prefix, std::vector<uint32_t>{kBos});
  EXPECT_EQ(r.document_suffix, std::vector<uint32_t>{kEos});
  const std::vector<uint32_t> want = concat_documents(*tok, docs, true);
  expect_same_ids(shard_ids(o.output_dir + "/train.bin"), want, "train.bin");
  EXPECT_EQ(r.train.tokens, want.size());
  EXPECT_EQ(r.documents, 5u);
  EXPECT_EQ(r.empty_documents, 1u);
  const json summary = json::parse(test::read_file(o.output_dir + "/prepare_summary.json"));
  EXPECT_EQ(summary["tokenizer"]["document_prefix"], json::array({kBos}));
  EXPECT_EQ(summary["tokenizer"]["document_suffix"], json::array({kEos}));

  // The later segments alone would encode otherwise: the test would notice if they were.
  const std::string& big = docs[2];
  const size_t cut = big.find(' ', size_t{1} << 20);
  ASSERT_NE(cut, std::string::npos);
  const std::vector<uint32_t> alone = tok->encode(big.substr(cut));
  const std::vector<uint32_t> whole = tok->encode(big);
  EXPECT_FALSE(std::equal(alone.rbegin(), alone.rend(), whole.rbegin()));

  // The validation split starts a new document: <s> first there too, and the train part ends with </s>.
  o.output_dir = dir / "split";
  o.val_fraction = 0.2;
  test::quietly([&] { return data::prepare_data(o); });
  const std::vector<uint32_t> train = shard_ids(o.output_dir + "/train.bin"),
                              val = shard_ids(o.output_dir + "/val.bin");
  ASSERT_GT(val.size(), 2u);
  EXPECT_EQ(train.front(), kBos);
  EXPECT_EQ(train.back(), kEos);
  EXPECT_EQ(val.front(), kBos);
  EXPECT_EQ(val.back(), kEos);
}

TEST(PrepareSentencePiece, TemplateSuffixReplacesEosInJsonl) {
  test::TempDir dir;
  // metaspace_first's tokenizer_config.json adds </s> too: <s> text </s>, no second EOS.
  const std::string tok_dir = kFixtures + "/metaspace_first";
  const auto tok = data::load_tokenizer(tok_dir);
  ASSERT_EQ(tok->special_template(), (data::SpecialTokenTemplate{{kBos}, {kEos}}));
  const std::vector<std::string> docs = {"The quick brown fox", "", "[INST] What is 2+2? [/INST] 4",
                                         "\nnew line first", "caf\xc3\xa9 \xf0\x9f\x98\x80"};
  std::string jsonl;
  for (const std::string& d : docs) jsonl += json{{"text", d}}.dump() + "\n";
  test::write_file(dir / "docs.jsonl", jsonl);
  data::PrepareOptions o;
  o.inputs = {dir / "docs.jsonl"};
  o.output_dir = dir / "out";
  o.tokenizer = tok_dir + "/tokenizer.json";  // the config beside the file counts as in a directory
  o.val_fraction = 0;
  o.threads = 1;
  const data::PrepareReport r = test::quietly([&] { return data::prepare_data(o); });
  EXPECT_EQ(r.document_suffix, std::vector<uint32_t>{kEos});
  EXPECT_EQ(shard_ids(o.output_dir + "/train.bin"), concat_documents(*tok, docs, false));
}

TEST(PrepareSentencePiece, CliPrintsTheDocumentTemplate) {
  test::TempDir dir;
  test::write_file(dir / "a.txt", "Hello world\n");
  const test::CommandResult r =
      test::run_anvil("prepare-data --input " + dir / "a.txt" + " --output " + dir / "out" +
                      " --val_fraction 0 --tokenizer " + kFixtures + "/llama2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("each document: 1 + its tokens + 2 (ids)"), std::string::npos) << r.output;
  // Byte data has no template and no EOS: nothing to say.
  const test::CommandResult b = test::run_anvil("prepare-data --input " + dir / "a.txt" + " --output " +
                                                dir / "bytes" + " --val_fraction 0");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(b.output.find("each document"), std::string::npos) << b.output;
}

// --- anvil generate
// -------------------------------------------------------------------------------------------

struct Outputs {
  int exit_code = -1;
  std::string out, err;
};

// Runs the CLI with stdout and stderr apart.
Outputs run_split(const std::string& args, const test::TempDir& dir) {
  const std::string err_file = dir / "stderr.txt";
  const std::string cmd = std::string(ANVIL_BINARY) + " " + args + " 2>" + err_file;
  Outputs r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = test::read_file(err_file);
  return r;
}

// A small Llama of the fixtures' vocabulary, with weights spread widely enough that greedy choices are clear.
TransformerConfig sp_llama_config(uint64_t vocab) {
  TransformerConfig c;
  c.family = "llama";
  c.n_layer = 2, c.n_head = 4, c.n_kv_head = 2, c.n_embd = 32;
  c.intermediate_size = 48, c.vocab_size = int(vocab), c.block_size = 64;
  c.rope_theta = 10000, c.tie_word_embeddings = false, c.hidden_act = "silu";
  c.bos_token_id = int(kBos), c.eos_token_id = int(kEos), c.pad_token_id = -1;
  return c;
}

std::vector<float> random_weights(const ParamLayout& layout, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 0.3f);
  std::vector<float> w(layout.total_numel());
  for (float& x : w) x = dist(rng);
  return w;
}

std::vector<int32_t> greedy(const TransformerConfig& cfg, const std::vector<float>& w,
                            const std::vector<uint32_t>& prompt, int n) {
  GeneratorOptions o;
  o.max_batch = 1;
  Generator gen(cfg, o);
  gen.decoder().upload_weights(gen.device(), w.data());
  SampleOptions so;
  so.max_new_tokens = n, so.temperature = 0;
  Rng rng(0);
  return gen.generate({std::vector<int32_t>(prompt.begin(), prompt.end())}, so, rng)[0];
}

TEST(GenerateSentencePiece, TextPromptTakesBosAndTheContinuationKeepsItsSpace) {
  test::TempDir dir;
  const auto tok = data::load_tokenizer(kFixtures + "/llama2");
  const TransformerConfig cfg = sp_llama_config(tok->vocab_size());
  const std::string text = "The quick brown fox";
  const std::vector<uint32_t> prompt = tok->encode_prompt(text);
  ASSERT_EQ(prompt.front(), kBos);

  // Random weights under which the greedy continuation starts a new word ("▁..."), which decoded alone
  // would lose its space, and differs without <s>: the first seed that gives both.
  std::vector<float> w;
  std::vector<int32_t> out;
  std::string continuation;
  for (uint32_t seed = 1; seed <= 100 && continuation.empty(); ++seed) {
    w = random_weights(ParamLayout::decoder(cfg), seed);
    out = greedy(cfg, w, prompt, 8);
    const std::vector<uint32_t> ids(out.begin(), out.end());
    const std::string c = tok->decode_continuation(prompt, ids);
    if (c.starts_with(" ") && tok->decode(ids) != c && greedy(cfg, w, tok->encode(text), 8) != out)
      continuation = c;
  }
  ASSERT_FALSE(continuation.empty()) << "no seed in 1..100 gives a continuation that starts a word";

  const std::string model = dir / "model";
  fs::create_directories(model);
  {
    Engine e(cfg, EngineOptions{});
    e.decoder().upload_weights(e.device(), w.data());
    io::save_model(model, e.decoder(), e.device());
  }
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(kFixtures + "/llama2/" + f, model + "/" + f);

  const Outputs r = run_split("generate --device cpu --checkpoint " + model +
                                  " --temperature 0 --max_new_tokens 8 --prompt '" + text + "'",
                              dir);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.out, text + continuation + "\n");
  EXPECT_NE(r.err.find(fmt::format("prefill of {} prompt tokens", prompt.size())), std::string::npos)
      << r.err;

  // An empty prompt is <s> alone: the model starts a document.
  const Outputs empty = run_split(
      "generate --device cpu --checkpoint " + model + " --temperature 0 --max_new_tokens 4 --prompt ''", dir);
  ASSERT_EQ(empty.exit_code, 0) << empty.out << empty.err;
  const std::vector<int32_t> from_bos = greedy(cfg, w, {kBos}, 4);
  EXPECT_EQ(empty.out, tok->decode_continuation(std::vector<uint32_t>{kBos},
                                                std::vector<uint32_t>(from_bos.begin(), from_bos.end())) +
                           "\n");
}

// --- checkpoints
// -----------------------------------------------------------------------------------------------

TEST(CheckpointTokenizerFiles, ConfigAndSpecialTokensMapGoWithTheTokenizer) {
  test::TempDir dir;
  using Files = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(io::tokenizer_side_files(""), Files{});
  // A tokenizer.json alone.
  const std::string always = kFixtures + "/metaspace_always";
  EXPECT_EQ(io::tokenizer_side_files(always + "/tokenizer.json"),
            (Files{{always + "/tokenizer.json", "tokenizer.json"}}));
  // With tokenizer_config.json and special_tokens_map.json beside it, named by the file or the directory.
  const std::string tok = dir / "tok";
  fs::create_directories(tok);
  fs::copy_file(kFixtures + "/llama2/tokenizer.json", tok + "/my_tokenizer.json");
  fs::copy_file(kFixtures + "/llama2/tokenizer_config.json", tok + "/tokenizer_config.json");
  test::write_file(tok + "/special_tokens_map.json", R"({"bos_token": "<s>", "eos_token": "</s>"})");
  EXPECT_EQ(io::tokenizer_side_files(tok + "/my_tokenizer.json"),
            (Files{{tok + "/my_tokenizer.json", "tokenizer.json"},
                   {tok + "/tokenizer_config.json", "tokenizer_config.json"},
                   {tok + "/special_tokens_map.json", "special_tokens_map.json"}}));
  fs::rename(tok + "/my_tokenizer.json", tok + "/tokenizer.json");
  EXPECT_EQ(io::tokenizer_side_files(tok).size(), 3u);
  EXPECT_EQ(io::tokenizer_side_files(tok)[0].first, tok + "/tokenizer.json");
  fs::create_directories(dir / "empty");
  test::expect_error([&] { io::tokenizer_side_files(dir / "empty"); },
                     {dir / "empty", "neither tokenizer.json nor vocab.txt"});
}

// --- examples/llama_tiny.json
// -----------------------------------------------------------------------------------

// The example's config with the data, tokenizer and length of a test: a Llama 2-style SentencePiece
// tokenizer (its tokenizer_config.json and a special_tokens_map.json beside it) on a small corpus.
TEST(LlamaExample, TrainsAFewStepsThenGeneratesAndFineTunesFromTheCheckpoint) {
  test::TempDir dir;
  const std::string tok = dir / "tok";
  fs::create_directories(tok);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(kFixtures + "/llama2/" + f, tok + "/" + f);
  test::write_file(tok + "/special_tokens_map.json",
                   R"({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})");
  test::write_file(dir / "corpus.txt", test::small_corpus(60000));
  const test::CommandResult prep =
      test::run_anvil("prepare-data --input " + dir / "corpus.txt" + " --output " + dir / "data" +
                      " --tokenizer " + tok + " --threads 2");
  ASSERT_EQ(prep.exit_code, 0) << prep.output;
  EXPECT_EQ(shard_ids(dir / "data/train.bin").front(), kBos);

  const std::string data_flags =
      " --train_data " + dir / "data/train.bin" + " --val_data " + dir / "data/val.bin" + " --device cpu";
  const test::CommandResult train =
      test::run_anvil("train --config " + std::string(ANVIL_SOURCE_DIR) +
                      "/examples/llama_tiny.json --tokenizer " + tok + "/tokenizer.json" + data_flags +
                      " --max_steps 8 --warmup_steps 2 --logging_steps 4 --eval_steps 8 --output_dir " +
                      dir / "run" + " --sample_prompt 'To be' --sample_max_new_tokens 8");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  EXPECT_NE(train.output.find("To be"), std::string::npos) << train.output;  // the end-of-run sample
  const std::string ck = dir / "run/checkpoint-8";
  for (const char* f : {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
                        "special_tokens_map.json"})
    EXPECT_TRUE(fs::exists(ck + "/" + f)) << f << "\n" << train.output;
  const json config = json::parse(test::read_file(ck + "/config.json"));
  EXPECT_EQ(config["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(config["vocab_size"], 956);
  // The checkpoint's tokenizer still puts <s> first.
  EXPECT_EQ(data::load_tokenizer(ck)->special_template(), (data::SpecialTokenTemplate{{kBos}, {}}));

  const test::CommandResult gen = test::run_anvil("generate --device cpu --checkpoint " + ck +
                                                  " --prompt 'To be' --max_new_tokens 20 --seed 3");
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  EXPECT_TRUE(gen.output.starts_with("To be")) << gen.output;
  const size_t prompt_tokens = data::load_tokenizer(tok)->encode_prompt("To be").size();  // <s> first
  EXPECT_NE(gen.output.find(fmt::format("prefill of {} prompt tokens", prompt_tokens)), std::string::npos)
      << gen.output;

  // Fine-tuning from the checkpoint as from a Hugging Face directory: its tokenizer files come along.
  const test::CommandResult tune =
      test::run_anvil("train --model_name_or_path " + ck + data_flags +
                      " --max_steps 2 --max_seq_length 64 --output_dir " + dir / "tuned" + " --save_steps 2");
  ASSERT_EQ(tune.exit_code, 0) << tune.output;
  EXPECT_EQ(test::read_file(dir / "tuned/checkpoint-2/tokenizer_config.json"),
            test::read_file(tok + "/tokenizer_config.json"));
  EXPECT_TRUE(fs::exists(dir / "tuned/checkpoint-2/special_tokens_map.json"));
}

}  // namespace
}  // namespace anvil
