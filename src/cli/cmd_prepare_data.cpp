// anvil prepare-data: corpora (text, JSONL, CSV) -> train/validation shards. See docs/data.md.
#include <fmt/ranges.h>

#include <memory>
#include <string>
#include <vector>

#include "cli/command.hpp"
#include "data/prepare.hpp"

namespace anvil::cli {
namespace {

struct PrepareArgs {
  data::PrepareOptions options;
  std::string format = "auto";
};

std::string mb(uint64_t bytes) {
  return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6);
}

Command make_prepare_data(CLI::App& parent) {
  auto a = std::make_shared<PrepareArgs>();
  data::PrepareOptions& o = a->options;
  CLI::App* app = parent.add_subcommand(
      "prepare-data",
      "tokenise text files/directories, JSONL or CSV into train/val shards (see docs/data.md)");
  app->add_option("--input", o.inputs, "text files, directories, .jsonl or .csv files")->required();
  app->add_option("--output", o.output_dir, "output directory (train.bin/val.bin or train.cls/val.cls)")
      ->required();
  app->add_option("--tokenizer", o.tokenizer,
                  "\"bytes\", a tokenizer.json / vocab.txt file, or a model directory holding one (its "
                  "tokenizer_config.json decides BOS/EOS around documents)")
      ->capture_default_str();
  app->add_option("--format", a->format, "auto (by extension), text, jsonl or csv")->capture_default_str();
  app->add_option("--text_field", o.text_field, "JSONL: the field holding the text")->capture_default_str();
  app->add_option("--text_column", o.text_column, "CSV: the text column")->capture_default_str();
  app->add_option("--label_column", o.label_column, "CSV: the label column")->capture_default_str();
  app->add_option("--labels", o.labels,
                  "CSV: the label set in id order, e.g. neg,pos (default: collected, sorted)")
      ->delimiter(',');
  app->add_option("--val_fraction", o.val_fraction, "fraction kept for validation, in [0, 0.5]")
      ->capture_default_str();
  app->add_option("--seed", o.seed, "seed of the document/example split")->capture_default_str();
  app->add_option("--threads", o.threads, "tokenising threads (default: all cores)");
  app->add_flag("--strict", o.strict, "a bad record is an error (default: skipped and counted)");
  app->add_option("--max_length", o.max_length, "CSV: tokens per example, [CLS]/[SEP] included")
      ->capture_default_str();
  return {app, [a] {
            data::PrepareOptions options = a->options;
            options.format = data::parse_input_format(a->format);
            options.progress = true;
            const data::PrepareReport r = data::prepare_data(options);
            const char* unit = r.task == "lm" ? "documents" : "examples";
            fmt::print("prepared {} from {} file(s) in {:.2f} s ({:.1f} MB/s, {} threads)\n", mb(r.bytes),
                       r.files, r.seconds,
                       r.seconds > 0 ? static_cast<double>(r.bytes) / 1e6 / r.seconds : 0.0, r.threads);
            fmt::print("  train: {} {}, {} tokens -> {}\n", r.train.documents, unit, r.train.tokens,
                       r.train.path);
            fmt::print("  val:   {} {}, {} tokens -> {}\n", r.val.documents, unit, r.val.tokens, r.val.path);
            if (r.task == "lm" && (!r.document_prefix.empty() || !r.document_suffix.empty()))
              fmt::print(
                  "  each document: {}its tokens{} (ids)\n",
                  r.document_prefix.empty() ? "" : fmt::format("{} + ", fmt::join(r.document_prefix, " ")),
                  r.document_suffix.empty() ? "" : fmt::format(" + {}", fmt::join(r.document_suffix, " ")));
            if (!r.labels.empty()) {
              std::string labels;
              for (const std::string& l : r.labels) labels += (labels.empty() ? "" : ", ") + l;
              fmt::print("  labels: {}{}\n", labels,
                         r.truncated ? fmt::format(" ({} examples truncated to {} tokens)", r.truncated,
                                                   options.max_length)
                                     : "");
            }
            if (r.skipped > 0) {
              fmt::print("  skipped {} record(s):", r.skipped);
              for (const auto& [reason, n] : r.skipped_by_reason) fmt::print(" {} x {};", n, reason);
              fmt::print(" first: {}\n", r.skipped_examples.front());
            }
            if (r.utf8_replacements > 0)
              fmt::print("  replaced {} invalid UTF-8 sequence(s) with U+FFFD\n", r.utf8_replacements);
            fmt::print("  summary -> {}\n", r.summary_path);
            return 0;
          }};
}

}  // namespace

ANVIL_REGISTER_COMMAND(30, make_prepare_data);

}  // namespace anvil::cli
