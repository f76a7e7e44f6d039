// anvil predict: classify texts with a trained BERT sequence classifier (docs/bert.md, "Predicting").
//
// The model is a checkpoint, a training output_dir (its last checkpoint), or any Hugging Face
// BertForSequenceClassification directory; its tokenizer is the one the directory carries (or --tokenizer).
// Texts come from a text file (one per line), a JSONL file (--text_field) or a CSV file (--text_column), as
// prepare-data reads them, and are encoded exactly as prepare-data encodes classification examples
// ([CLS] text [SEP] when the tokenizer has both). The whole input is read and encoded before the model runs
// (so a bad record fails before any output, and the engine is planned for the longest input rather than for
// max_position_embeddings); the predictions are JSON lines, one per input in input order.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.hpp"
#include "data/prepare.hpp"
#include "data/text_sources.hpp"
#include "data/tokenizer.hpp"
#include "io/atomic_dir.hpp"
#include "io/checkpoint.hpp"
#include "train/engine.hpp"

namespace anvil::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;  // output keys in a fixed, readable order

struct PredictArgs {
  std::string model, input, output, tokenizer;
  std::string format = "auto", text_field = "text", text_column = "text";
  std::string device = "auto", precision = "fp32";
  int batch_size = 32;
  int max_length = 0;  // 0: the model's max_position_embeddings
};

// A model directory: `dir` itself when it has config.json, else (a training output_dir) its checkpoint with
// the highest step.
std::string model_directory(const std::string& dir) {
  ANVIL_REQUIRE(fs::is_directory(dir), "--model '{}': no such directory", dir);
  if (fs::exists(fs::path(dir) / "config.json")) return dir;
  long long best_step = -1;
  std::string best;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || !name.starts_with("checkpoint-")) continue;
    const std::string digits = name.substr(11);
    if (digits.empty() ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    const long long step = std::stoll(digits);
    if (step > best_step && fs::exists(entry.path() / "config.json"))
      best_step = step, best = entry.path().string();
  }
  ANVIL_REQUIRE(!best.empty(),
                "--model '{}': no config.json and no checkpoint-<step> directory in it (give a checkpoint, a "
                "training output_dir or a Hugging Face BertForSequenceClassification directory)",
                dir);
  return best;
}

// The texts of the input file, in order, with their UTF-8 repaired (as prepare-data does). Text: one per
// line (every line, empty ones included, so output i is line i + 1); JSONL: the --text_field of each
// non-blank line; CSV: the --text_column of each record after the header. A malformed record is an error
// naming the file and line (predictions must line up with the input, so nothing is skipped).
std::vector<std::string> read_texts(const PredictArgs& a) {
  const std::string path = a.input == "-" ? "/dev/stdin" : a.input;
  ANVIL_REQUIRE(a.input == "-" || fs::is_regular_file(path), "--input '{}': no such file", a.input);
  data::InputFormat format = data::parse_input_format(a.format);
  if (format == data::InputFormat::Auto) format = data::input_format_for_path(path);
  std::vector<std::string> texts;
  if (format == data::InputFormat::Csv) {
    data::CsvReader csv(path);
    std::vector<std::string> fields;
    ANVIL_REQUIRE(csv.next(fields), "{}: empty CSV file (expected a header with a '{}' column)", a.input,
                  a.text_column);
    const std::vector<std::string> header = fields;
    const auto it = std::find(header.begin(), header.end(), a.text_column);
    if (it == header.end()) {
      std::string columns;
      for (const std::string& h : header) columns += (columns.empty() ? "" : ", ") + h;
      ANVIL_THROW("{}: the header has no '{}' column (columns: {}); set --text_column", a.input,
                  a.text_column, columns);
    }
    const size_t column = size_t(it - header.begin());
    while (csv.next(fields)) {
      ANVIL_REQUIRE(fields.size() == header.size(), "{}:{}: {} fields, but the header has {}", a.input,
                    csv.record_line(), fields.size(), header.size());
      texts.push_back(std::move(fields[column]));
    }
  } else {
    data::LineReader lines(path);
    std::string line;
    while (lines.next(line)) {
      if (format == data::InputFormat::Text) {
        texts.push_back(line);
        continue;
      }
      if (line.find_first_not_of(" \t\r") == std::string::npos)
        continue;  // blank JSONL lines, as prepare-data
      json j;
      try {
        j = json::parse(line);
      } catch (const json::parse_error& e) {
        ANVIL_THROW("{}:{}: not valid JSON ({})", a.input, lines.line_number(), e.what());
      }
      ANVIL_REQUIRE(j.is_object() && j.contains(a.text_field) && j[a.text_field].is_string(),
                    "{}:{}: expected a JSON object with a string field '{}' (set --text_field)", a.input,
                    lines.line_number(), a.text_field);
      texts.push_back(j[a.text_field].get<std::string>());
    }
  }
  ANVIL_REQUIRE(!texts.empty(), "--input '{}': no texts to classify", a.input);
  for (std::string& t : texts) data::repair_utf8(t);
  return texts;
}

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::FP32;
  if (name == "bf16") return Precision::BF16;
  if (name == "fp16") return Precision::FP16;
  ANVIL_THROW("--precision must be fp32, bf16 or fp16, got '{}'", name);
}

// Where the JSON lines go: stdout, or --output written under a temporary name and renamed when complete (an
// error leaves no partial file).
class Output {
 public:
  explicit Output(const std::string& path) : path_(path) {
    if (!path_.empty()) file_ = std::make_unique<io::SyncedFileWriter>(path_ + ".tmp");
  }
  ~Output() {
    if (file_) {
      file_.reset();
      std::error_code ec;
      fs::remove(path_ + ".tmp", ec);
    }
  }
  void line(const std::string& text) {
    if (file_) {
      file_->write(text + "\n");
    } else {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fputc('\n', stdout);
    }
  }
  void commit() {
    if (!file_) return std::fflush(stdout), void();
    file_->finish();
    file_.reset();
    fs::rename(path_ + ".tmp", path_);
  }

 private:
  std::string path_;
  std::unique_ptr<io::SyncedFileWriter> file_;
};

int run_predict(const PredictArgs& a) {
  ANVIL_REQUIRE(a.batch_size >= 1, "--batch_size must be >= 1, got {}", a.batch_size);
  const std::string dir = model_directory(a.model);
  const TransformerConfig cfg = io::read_model_config(dir);
  ANVIL_REQUIRE(cfg.is_bert(),
                "{}: the model is a {} language model, not a sequence classifier (anvil predict needs a BERT "
                "classifier; generate text with `anvil generate --checkpoint {}`)",
                dir, cfg.family, dir);
  const int max_length = a.max_length > 0 ? a.max_length : cfg.block_size;
  ANVIL_REQUIRE(max_length <= cfg.block_size,
                "--max_length {} exceeds the model's max_position_embeddings {}", max_length, cfg.block_size);
  std::string tok_spec = a.tokenizer;
  if (tok_spec.empty()) tok_spec = io::find_tokenizer_file(dir);
  ANVIL_REQUIRE(
      !tok_spec.empty(),
      "{}: no tokenizer.json or vocab.txt in the model directory; pass --tokenizer FILE (the tokenizer "
      "the training data was prepared with, or bytes)",
      dir);
  const std::unique_ptr<data::Tokenizer> tokenizer = data::load_tokenizer(tok_spec);
  ANVIL_REQUIRE(tokenizer->vocab_size() <= uint64_t(cfg.vocab_size),
                "tokenizer '{}' has {} tokens but the model's vocab_size is {}: not this model's tokenizer",
                tok_spec, tokenizer->vocab_size(), cfg.vocab_size);

  // Read and encode everything first: bad input fails before any output, and the engine is planned for the
  // longest example.
  const std::vector<std::string> texts = read_texts(a);
  const data::ClassificationEncoder encoder(*tokenizer, uint32_t(max_length), "predict");
  std::vector<std::vector<uint32_t>> examples;
  examples.reserve(texts.size());
  size_t longest = 1, truncated = 0;
  for (const std::string& t : texts) {
    bool cut = false;
    examples.push_back(encoder.encode(t, &cut));
    truncated += cut ? 1 : 0;
    longest = std::max(longest, examples.back().size());
  }
  const auto round8 = [](size_t n) { return (n + 7) / 8 * 8; };
  const int seq_len = int(std::min(round8(longest), size_t(max_length)));
  const int B = int(std::min(texts.size(), size_t(a.batch_size)));

  EngineOptions o;
  o.device = resolve_device(a.device);
  o.batch_size = B;
  o.seq_len = seq_len;
  o.precision = parse_precision(a.precision);
  Engine engine(cfg, o);
  BertModel& model = engine.bert();
  engine.model().init_weights(0, engine.device());  // a head the directory lacks would show as initialised
  const io::BertLoadReport report = io::load_model_weights(dir, engine.model(), engine.device());
  ANVIL_REQUIRE(report.kept.empty(),
                "{}: the weights have no {} (a BertModel checkpoint, not a trained classifier); fine-tune it "
                "first (anvil train --model_name_or_path {})",
                dir, report.kept.front(), dir);
  std::fprintf(stderr, "anvil predict: %s (%d labels) on %s, %zu texts, batch %d x %d tokens%s\n",
               dir.c_str(), cfg.num_labels, engine.device().name().c_str(), texts.size(), B, seq_len,
               truncated ? fmt::format(" ({} truncated to {} tokens)", truncated, max_length).c_str() : "");

  Output out(a.output);
  const int NL = cfg.num_labels;
  const int32_t pad = std::max(0, cfg.pad_token_id);
  std::vector<int32_t> ids, lengths;
  std::vector<float> logits;
  for (size_t first = 0; first < examples.size(); first += size_t(B)) {
    const int n = int(std::min(examples.size() - first, size_t(B)));
    size_t batch_longest = 1;
    for (int r = 0; r < n; ++r) batch_longest = std::max(batch_longest, examples[first + size_t(r)].size());
    const int L = int(std::min(round8(batch_longest), size_t(seq_len)));
    ids.assign(size_t(n) * size_t(L), pad);
    lengths.resize(size_t(n));
    for (int r = 0; r < n; ++r) {
      const std::vector<uint32_t>& ex = examples[first + size_t(r)];
      std::copy(ex.begin(), ex.end(), ids.begin() + ptrdiff_t(size_t(r) * size_t(L)));
      // An empty example ([CLS][SEP]-less tokenizers and an empty line) still needs one attended position.
      lengths[size_t(r)] = std::max<int32_t>(1, int32_t(ex.size()));
    }
    engine.device().copy_to_device(engine.tokens(0), ids.data(), ids.size() * sizeof(int32_t));
    engine.device().copy_to_device(engine.lengths(0), lengths.data(), lengths.size() * sizeof(int32_t));
    model.forward(engine.ops(), engine.inputs(0, n, L, false), 0.0f, false);
    logits.resize(size_t(n) * size_t(NL));
    model.copy_logits_to_host(engine.device(), logits.data(), n);
    for (int r = 0; r < n; ++r) {
      const size_t index = first + size_t(r);
      const float* row = logits.data() + size_t(r) * size_t(NL);
      ordered_json j = {{"index", index}, {"text", texts[index]}};
      if (cfg.is_regression()) {
        j["score"] = row[0];
      } else {
        // Softmax in double: probabilities that sum to 1 to printing precision.
        const double mx = *std::max_element(row, row + NL);
        std::vector<double> p(static_cast<size_t>(NL));
        double total = 0;
        for (int k = 0; k < NL; ++k) total += p[size_t(k)] = std::exp(double(row[k]) - mx);
        const int best = int(std::max_element(row, row + NL) - row);
        ordered_json probabilities = ordered_json::object();
        for (int k = 0; k < NL; ++k) probabilities[cfg.label_name(k)] = p[size_t(k)] / total;
        j["label"] = cfg.label_name(best);
        j["label_id"] = best;
        j["score"] = p[size_t(best)] / total;
        j["probabilities"] = probabilities;
      }
      out.line(j.dump(-1, ' ', false, ordered_json::error_handler_t::replace));
    }
  }
  out.commit();
  if (!a.output.empty()) std::fprintf(stderr, "predictions -> %s\n", a.output.c_str());
  return 0;
}

Command make_predict(CLI::App& parent) {
  auto a = std::make_shared<PredictArgs>();
  CLI::App* app = parent.add_subcommand(
      "predict", "classify texts with a trained BERT classifier (JSON lines: label and class probabilities)");
  app->add_option("--model", a->model,
                  "checkpoint, training output_dir (its last checkpoint) or Hugging Face "
                  "BertForSequenceClassification directory")
      ->required();
  app->add_option("--input", a->input, "texts: a text file (one per line), .jsonl or .csv; - for stdin lines")
      ->required();
  app->add_option("--output", a->output, "JSON-lines file to write (default: stdout)");
  app->add_option("--format", a->format, "auto (by extension), text, jsonl or csv")->capture_default_str();
  app->add_option("--text_field", a->text_field, "JSONL: the field holding the text")->capture_default_str();
  app->add_option("--text_column", a->text_column, "CSV: the text column")->capture_default_str();
  app->add_option("--tokenizer", a->tokenizer,
                  "bytes, or a tokenizer.json / vocab.txt (default: the one in the model directory)");
  app->add_option("--batch_size", a->batch_size, "texts per forward pass")->capture_default_str();
  app->add_option("--max_length", a->max_length,
                  "tokens per text, [CLS]/[SEP] included; longer texts are cut (default: the model's "
                  "max_position_embeddings)");
  app->add_option("--device", a->device, "auto | cpu | cuda")->capture_default_str();
  app->add_option("--precision", a->precision, "fp32 | bf16 | fp16 (weights and activations)")
      ->capture_default_str();
  return {app, [a] { return run_predict(*a); }};
}

}  // namespace

ANVIL_REGISTER_COMMAND(45, make_predict);

}  // namespace anvil::cli
