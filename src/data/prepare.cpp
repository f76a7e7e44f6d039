#include "data/prepare.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <unordered_map>

#include "anvil/error.hpp"
#include "anvil/rng.hpp"
#include "data/classification_shard.hpp"
#include "data/token_shard.hpp"

namespace anvil::data {

namespace fs = std::filesystem;
using nlohmann::json;                  // parsing JSONL records
using ojson = nlohmann::ordered_json;  // the summary, whose keys keep a readable order

namespace {

constexpr size_t kBatchBytes = size_t{1} << 20;  // input bytes per unit of work
constexpr size_t kBatchRecords = 16384;
constexpr size_t kSkippedExamples = 10;  // "file:line: problem" lines kept for the summary

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// ---------------------------------------------------------------------------------------------------
// Records and batches

struct Record {
  uint32_t file = 0;
  uint64_t line = 0;      // 1-based line of a JSONL or CSV record (0 for text segments)
  std::string text;       // a text segment, a JSONL line, or a CSV row's text field
  std::string label;      // CSV
  bool doc_end = true;    // text: this segment ends a document
  bool tail_val = false;  // text: this segment lies after the train/validation cut
  std::string context;    // text: the last character before this segment when it continues a document
  std::string problem, problem_detail;  // found by the reader (a CSV row of the wrong width)
};

struct Output {
  std::vector<uint32_t> ids;
  uint64_t replacements = 0;  // invalid UTF-8 sequences replaced
  std::string skip_reason;    // empty: keep the record
  std::string skip_detail;
  bool truncated = false;
};

struct Batch {
  std::vector<Record> records;
  std::vector<Output> outputs;
  uint64_t bytes = 0;        // input bytes the reader consumed for this batch
  std::exception_ptr error;  // a failure, raised when this batch's turn to be written comes
};

// Reader thread -> N workers -> the caller, in input order. At most max_in_flight batches exist
// between reading and writing, which bounds memory however fast the reader is. Errors travel inside
// batches, so the first error in input order is the one reported, whatever the thread count.
class OrderedPipeline {
 public:
  using ReadFn = std::function<bool(Batch&)>;  // fills a batch; false once the input is exhausted
  using WorkFn = std::function<void(Batch&)>;

  OrderedPipeline(unsigned workers, ReadFn read, WorkFn work)
      : read_(std::move(read)), work_(std::move(work)), max_in_flight_(2 * size_t{workers} + 2) {
    threads_.emplace_back([this] { read_loop(); });
    for (unsigned i = 0; i < workers; ++i) threads_.emplace_back([this] { work_loop(); });
  }
  ~OrderedPipeline() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  OrderedPipeline(const OrderedPipeline&) = delete;
  OrderedPipeline& operator=(const OrderedPipeline&) = delete;

  // The next batch in input order; false at the end.
  bool next(Batch& out) {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return done_.count(consumed_) > 0 || (reader_done_ && consumed_ == produced_); });
    auto it = done_.find(consumed_);
    if (it == done_.end()) return false;
    out = std::move(it->second);
    done_.erase(it);
    ++consumed_;
    cv_.notify_all();
    return true;
  }

 private:
  void read_loop() {
    for (bool more = true; more;) {
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || produced_ - consumed_ < max_in_flight_; });
        if (stop_) break;
      }
      Batch batch;
      try {
        more = read_(batch);
      } catch (...) {
        batch.error = std::current_exception();
        more = false;
      }
      std::lock_guard lock(mutex_);
      if (!batch.records.empty() || batch.error) todo_.emplace_back(produced_++, std::move(batch));
      cv_.notify_all();
    }
    std::lock_guard lock(mutex_);
    reader_done_ = true;
    cv_.notify_all();
  }
  void work_loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !todo_.empty() || reader_done_; });
      if (stop_ || todo_.empty()) return;
      auto [index, batch] = std::move(todo_.front());
      todo_.pop_front();
      lock.unlock();
      if (!batch.error) {
        try {
          work_(batch);
        } catch (...) {
          batch.error = std::current_exception();
        }
      }
      lock.lock();
      done_.emplace(index, std::move(batch));
      cv_.notify_all();
    }
  }

  ReadFn read_;
  WorkFn work_;
  size_t max_in_flight_;
  std::mutex mutex_;
  std::condition_variable cv_;  // one for all conditions: wake-ups happen once per ~1 MiB batch
  std::deque<std::pair<uint64_t, Batch>> todo_;
  std::map<uint64_t, Batch> done_;
  uint64_t produced_ = 0, consumed_ = 0;
  bool reader_done_ = false, stop_ = false;
  std::vector<std::thread> threads_;
};

// ---------------------------------------------------------------------------------------------------
// Readers: the input files -> batches of records (run on the reader thread)

bool is_blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

// Text files and JSONL. Text bytes before `text_cut` (counted over all text files, in order) are
// training data, the rest validation; the segmenter cuts exactly there.
class LmReader {
 public:
  LmReader(const std::vector<SourceFile>& files, uint64_t text_cut) : files_(files), text_cut_(text_cut) {}

  bool fill(Batch& batch) {
    while (batch.bytes < kBatchBytes && batch.records.size() < kBatchRecords) {
      if (!text_ && !lines_) {
        if (next_file_ == files_.size()) return false;
        open(static_cast<uint32_t>(next_file_++));
      }
      Record record;
      record.file = current_;
      bool got;
      if (text_) {
        TextSegmenter::Segment segment;
        got = text_->next(segment);
        record.text = std::move(segment.text);
        record.tail_val = !segment.before_cut;
        record.doc_end = segment.last || segment.ends_at_cut;
        if (continues_) record.context = last_char_;
        if (got && !record.text.empty()) last_char_ = last_character(record.text);
        continues_ = got && !record.doc_end;
      } else {
        do {
          got = lines_->next(record.text);
        } while (got && is_blank(record.text));  // blank lines are not records
        record.line = lines_->line_number();
      }
      const BufferedFile& in = text_ ? static_cast<const BufferedFile&>(*text_) : *lines_;
      batch.bytes += in.consumed() - counted_;
      counted_ = in.consumed();
      if (got) {
        batch.records.push_back(std::move(record));
        continue;
      }
      const SourceFile& f = files_[current_];
      ANVIL_REQUIRE(in.consumed() == f.bytes,
                    "prepare: input '{}' changed while being read ({} bytes listed, {} read)", f.path,
                    f.bytes, in.consumed());
      if (text_) text_offset_ += f.bytes;
      text_.reset();
      lines_.reset();
    }
    return true;
  }

 private:
  // The last UTF-8 character of a non-empty text (its last byte and the continuation bytes before it).
  static std::string last_character(const std::string& text) {
    size_t begin = text.size() - 1;
    for (int k = 0; k < 3 && begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80; ++k)
      --begin;
    return text.substr(begin);
  }

  void open(uint32_t index) {
    current_ = index;
    counted_ = 0;
    continues_ = false;
    const SourceFile& f = files_[index];
    if (f.format == InputFormat::Text) {
      std::optional<uint64_t> cut;  // none: the whole file is before the cut
      if (text_cut_ < text_offset_ + f.bytes) cut = text_cut_ > text_offset_ ? text_cut_ - text_offset_ : 0;
      text_ = std::make_unique<TextSegmenter>(f.path, cut);
    } else {
      lines_ = std::make_unique<LineReader>(f.path);
    }
  }

  const std::vector<SourceFile>& files_;
  uint64_t text_cut_;
  size_t next_file_ = 0;
  uint32_t current_ = 0;
  uint64_t text_offset_ = 0;  // bytes of the text files before the current one
  uint64_t counted_ = 0;      // bytes of the current file already added to a batch
  bool continues_ = false;    // the next text segment continues the document of the previous one
  std::string last_char_;     // the last character of the text segments read so far
  std::unique_ptr<TextSegmenter> text_;
  std::unique_ptr<LineReader> lines_;
};

std::string join(const std::vector<std::string>& items, std::string_view sep = ", ") {
  std::string s;
  for (const std::string& item : items) s += (s.empty() ? "" : std::string(sep)) + item;
  return s;
}

class CsvRowReader {
 public:
  CsvRowReader(const std::vector<SourceFile>& files, const PrepareOptions& options)
      : files_(files), options_(options) {}

  bool fill(Batch& batch) {
    std::vector<std::string> fields;
    while (batch.bytes < kBatchBytes && batch.records.size() < kBatchRecords) {
      if (!csv_) {
        if (next_file_ == files_.size()) return false;
        open(static_cast<uint32_t>(next_file_++));
      }
      const bool got = has_header_ && csv_->next(fields);
      batch.bytes += csv_->consumed() - counted_;
      counted_ = csv_->consumed();
      if (got) {
        Record record;
        record.file = current_;
        record.line = csv_->record_line();
        if (fields.size() != width_) {
          record.problem = "wrong number of fields";
          record.problem_detail = fmt::format("the row has {} fields, the header {}", fields.size(), width_);
        } else {
          record.text = std::move(fields[text_index_]);
          record.label = std::move(fields[label_index_]);
        }
        batch.records.push_back(std::move(record));
        continue;
      }
      const SourceFile& f = files_[current_];
      ANVIL_REQUIRE(csv_->consumed() == f.bytes,
                    "prepare: input '{}' changed while being read ({} bytes listed, {} read)", f.path,
                    f.bytes, csv_->consumed());
      csv_.reset();
    }
    return true;
  }

 private:
  // Opens a file and reads its header (none in an empty file), resolving the two columns.
  void open(uint32_t index) {
    current_ = index;
    counted_ = 0;
    csv_ = std::make_unique<CsvReader>(files_[index].path);
    std::vector<std::string> header;
    has_header_ = csv_->next(header);
    if (!has_header_) return;
    auto column = [&](const std::string& name, const char* flag) {
      const auto it = std::find(header.begin(), header.end(), name);
      ANVIL_REQUIRE(it != header.end(),
                    "prepare: CSV '{}' has no column '{}' (its header: {}); choose columns with {}",
                    files_[current_].path, name, join(header), flag);
      return static_cast<size_t>(it - header.begin());
    };
    text_index_ = column(options_.text_column, "--text_column");
    label_index_ = column(options_.label_column, "--label_column");
    width_ = header.size();
  }

  const std::vector<SourceFile>& files_;
  const PrepareOptions& options_;
  size_t next_file_ = 0;
  uint32_t current_ = 0;
  uint64_t counted_ = 0;
  std::unique_ptr<CsvReader> csv_;
  bool has_header_ = false;
  size_t text_index_ = 0, label_index_ = 0, width_ = 0;
};

// ---------------------------------------------------------------------------------------------------
// Progress on stderr: redrawn in place on a terminal, a line every few seconds otherwise (logs).

std::string human_count(uint64_t n) {
  if (n < 10000) return std::to_string(n);
  const double v = static_cast<double>(n);
  if (n < 1'000'000) return fmt::format("{:.1f}K", v / 1e3);
  if (n < 1'000'000'000) return fmt::format("{:.1f}M", v / 1e6);
  return fmt::format("{:.1f}B", v / 1e9);
}

class ProgressBar {
 public:
  ProgressBar(bool enabled, uint64_t total_bytes)
      : enabled_(enabled), tty_(enabled && ::isatty(STDERR_FILENO)), total_(total_bytes) {}

  void update(uint64_t bytes, uint64_t docs, uint64_t tokens) {
    if (!enabled_) return;
    const auto now = Clock::now();
    if (now - last_ < (tty_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(5000))) return;
    last_ = now;
    draw(bytes, docs, tokens);
  }
  void finish(uint64_t bytes, uint64_t docs, uint64_t tokens) {
    if (!enabled_ || (!tty_ && !drawn_)) return;  // quick runs print nothing to logs
    draw(bytes, docs, tokens);
    if (tty_) fmt::print(stderr, "\n");
  }

 private:
  void draw(uint64_t bytes, uint64_t docs, uint64_t tokens) {
    drawn_ = true;
    const double secs = seconds_since(start_);
    const double mb = static_cast<double>(bytes) / 1e6, total_mb = static_cast<double>(total_) / 1e6;
    const double rate = secs > 0 ? mb / secs : 0.0;
    const double frac =
        total_ ? std::min(1.0, static_cast<double>(bytes) / static_cast<double>(total_)) : 1.0;
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(frac * kWidth);
    std::string eta = "--:--:--";
    if (rate > 0) {
      const auto left = static_cast<uint64_t>(std::max(0.0, (total_mb - mb) / rate));
      eta = fmt::format("{}:{:02}:{:02}", left / 3600, left / 60 % 60, left % 60);
    }
    const std::string line = fmt::format(
        "prepare-data [{}{}] {:5.1f}% {:.1f}/{:.1f} MB | {} docs | {} tokens | {:.1f} MB/s | ETA {}",
        std::string(filled, '#'), std::string(kWidth - filled, '.'), 100 * frac, mb, total_mb,
        human_count(docs), human_count(tokens), rate, eta);
    if (tty_) {
      fmt::print(stderr, "\r{}\x1b[K", line);
    } else {
      fmt::print(stderr, "{}\n", line);
    }
    std::fflush(stderr);
  }

  bool enabled_, tty_, drawn_ = false;
  uint64_t total_;
  Clock::time_point start_ = Clock::now(), last_ = start_;
};

// ---------------------------------------------------------------------------------------------------
// Output directory: everything is written under temporary names; on failure the committed outputs
// and the directories this run created are removed again.

class OutputDir {
 public:
  explicit OutputDir(const std::string& dir) {
    for (fs::path p = fs::path(dir).lexically_normal(); !p.empty() && !fs::exists(p); p = p.parent_path())
      created_.push_back(p);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) ANVIL_THROW("prepare: cannot create output directory '{}': {}", dir, ec.message());
    ANVIL_REQUIRE(fs::is_directory(dir), "prepare: output '{}' is not a directory", dir);
  }
  void committed(const std::string& path) { committed_.push_back(path); }
  void discard() {
    std::error_code ec;
    for (const std::string& p : committed_) fs::remove(p, ec);
    for (const fs::path& p : created_) fs::remove(p, ec);  // deepest first; only if empty
  }

 private:
  std::vector<fs::path> created_;
  std::vector<std::string> committed_;
};

// The summary quotes user bytes (file names, nlohmann's parse messages, which can end inside a repaired
// character); strict dumping would throw on any that are not UTF-8, so those become U+FFFD instead.
std::string summary_text(const ojson& summary) {
  return summary.dump(2, ' ', false, ojson::error_handler_t::replace) + "\n";
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.flush();
  ANVIL_REQUIRE(f.good(), "prepare: cannot write '{}'", path);
}

// ---------------------------------------------------------------------------------------------------
// The run

struct Context {
  const PrepareOptions& options;
  const Tokenizer& tokenizer;
  const std::vector<SourceFile>& files;
  unsigned threads;
  Clock::time_point start;
  OutputDir& out;
  PrepareReport& report;
  ProgressBar progress;
};

// A bad record: skipped and counted, or with --strict an error naming file:line.
void handle_skip(Context& ctx, const Record& record, const Output& output) {
  const std::string where = fmt::format("{}:{}", ctx.files[record.file].path, record.line);
  ANVIL_REQUIRE(!ctx.options.strict,
                "prepare: {}: {} (--strict; without it such records are skipped and counted)", where,
                output.skip_detail);
  ++ctx.report.skipped;
  ++ctx.report.skipped_by_reason[output.skip_reason];
  if (ctx.report.skipped_examples.size() < kSkippedExamples)
    ctx.report.skipped_examples.push_back(where + ": " + output.skip_detail);
}

// Drains the pipeline in input order: rethrows a batch's error, counts UTF-8 repairs, sends bad records to
// handle_skip and the others to `on_record`, then adds each batch's bytes and calls `after_batch`.
template <class OnRecord, class AfterBatch>
void for_each_kept_record(Context& ctx, OrderedPipeline& pipeline, OnRecord on_record,
                          AfterBatch after_batch) {
  Batch batch;
  while (pipeline.next(batch)) {
    if (batch.error) std::rethrow_exception(batch.error);
    for (size_t i = 0; i < batch.records.size(); ++i) {
      const Output& out = batch.outputs[i];
      ctx.report.utf8_replacements += out.replacements;
      if (!out.skip_reason.empty()) {
        handle_skip(ctx, batch.records[i], out);
        continue;
      }
      on_record(batch.records[i], out);
    }
    ctx.report.bytes += batch.bytes;
    after_batch();
  }
}

void skip(Output& out, std::string reason, std::string detail) {
  out.skip_reason = std::move(reason);
  out.skip_detail = std::move(detail);
}

// nlohmann's messages start with "[json.exception.parse_error.101] "; the rest is the useful part.
std::string json_error_text(const std::exception& e) {
  const std::string what = e.what();
  const size_t pos = what.find("] ");
  return pos == std::string::npos ? what : what.substr(pos + 2);
}

// Whether `tok` adds something at the start of every encode() call, so that a text encoded alone differs
// from the same text encoded after other text: SentencePiece's prepended "▁" (Llama 2's Prepend
// normalizer, Metaspace), a byte-level pre-tokenizer with add_prefix_space. Byte-level BPE as GPT-2 and
// Llama 3 use it, WordPiece and bytes do not.
bool encodes_text_start(const Tokenizer& tok) {
  for (const std::string_view rest : {" b", "\nb"}) {
    std::vector<uint32_t> apart = tok.encode("a");
    const std::vector<uint32_t> tail = tok.encode(rest);
    apart.insert(apart.end(), tail.begin(), tail.end());
    if (apart != tok.encode("a" + std::string(rest))) return true;
  }
  return false;
}

// The ids `text` has inside a document, right after `context` (the character before it): encode(context +
// text) without the ids of encode(context). Segment cuts follow an ASCII letter or digit, which no
// pre-tokenizer or vocabulary in use joins with the whitespace after it; should the ids of context + text
// not start with those of context, the text is encoded alone.
std::vector<uint32_t> encode_after(const Tokenizer& tok, std::string_view context, std::string_view text) {
  const std::vector<uint32_t> head = tok.encode(context);
  std::string joined(context);
  joined += text;
  std::vector<uint32_t> ids = tok.encode(joined);
  if (ids.size() < head.size() || !std::equal(head.begin(), head.end(), ids.begin())) return tok.encode(text);
  ids.erase(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(head.size()));
  return ids;
}

// `in_context`: encodes_text_start(ctx.tokenizer); a text segment that continues a document is then encoded
// after the character before it, so that the document's ids are those of encoding it whole.
void tokenize_lm_batch(const Context& ctx, Batch& batch, bool in_context) {
  const std::string& field = ctx.options.text_field;
  batch.outputs.resize(batch.records.size());
  for (size_t i = 0; i < batch.records.size(); ++i) {
    Record& r = batch.records[i];
    Output& o = batch.outputs[i];
    o.replacements = repair_utf8(r.text);
    if (ctx.files[r.file].format == InputFormat::Text) {
      if (in_context && !r.context.empty()) {
        repair_utf8(r.context);  // counted with the segment it ends
        o.ids = encode_after(ctx.tokenizer, r.context, r.text);
      } else {
        o.ids = ctx.tokenizer.encode(r.text);
      }
      continue;
    }
    json doc;
    try {
      doc = json::parse(r.text);
    } catch (const json::exception& e) {
      skip(o, "not valid JSON", "not valid JSON: " + json_error_text(e));
      continue;
    }
    if (!doc.is_object()) {
      skip(o, "not a JSON object", fmt::format("the line is a JSON {}, not an object", doc.type_name()));
      continue;
    }
    const auto it = doc.find(field);
    if (it == doc.end()) {
      skip(o, fmt::format("missing field '{}'", field),
           fmt::format("no field '{}' (see --text_field)", field));
    } else if (!it->is_string()) {
      const std::string type = it->type_name();
      skip(o, fmt::format("field '{}' is not a string", field),
           fmt::format("field '{}' is {} {}, not a string", field,
                       type == "array" || type == "object" ? "an" : "a", type));
    } else {
      o.ids = ctx.tokenizer.encode(it->get_ref<const std::string&>());
    }
  }
}

// The train/validation rule (see docs/data.md): the last val_fraction of the text bytes, cut at a
// character boundary; JSONL documents and CSV examples by assign_to_validation().
std::string split_rule_text() {
  return "text: the last val_fraction of the text bytes (in input order) is validation; jsonl/csv: record i "
         "is "
         "validation when splitmix64(splitmix64(seed) ^ i) / 2^64 < val_fraction";
}

// The ids before each language-model document: the special-token template's prefix (<s> for Llama 2).
std::vector<uint32_t> document_prefix(const Tokenizer& tok) {
  return tok.special_template().prefix;
}

// The ids after each language-model document: the template's suffix when it has one (</s> for a tokenizer
// with add_eos_token), else EOS (if the tokenizer has one).
std::vector<uint32_t> document_suffix(const Tokenizer& tok) {
  if (!tok.special_template().suffix.empty()) return tok.special_template().suffix;
  if (const std::optional<uint32_t> eos = tok.eos_id()) return {*eos};
  return {};
}

ojson tokenizer_json(const Context& ctx) {
  ojson t = {{"spec", ctx.options.tokenizer},
             {"kind", ctx.tokenizer.kind()},
             {"vocab_size", ctx.tokenizer.vocab_size()},
             {"eos_id", nullptr}};
  if (const auto eos = ctx.tokenizer.eos_id()) t["eos_id"] = *eos;
  if (ctx.report.task == "lm") {
    t["document_prefix"] = document_prefix(ctx.tokenizer);
    t["document_suffix"] = document_suffix(ctx.tokenizer);
  }
  return t;
}

ojson base_summary(const Context& ctx) {
  const PrepareReport& r = ctx.report;
  ojson by_format = ojson::object();
  for (const SourceFile& f : ctx.files) {
    auto& n = by_format[std::string(input_format_name(f.format))];
    n = n.is_null() ? 1 : n.get<uint64_t>() + 1;
  }
  ojson skipped = {
      {"total", r.skipped}, {"by_reason", r.skipped_by_reason}, {"examples", r.skipped_examples}};
  return {{"task", r.task},
          {"inputs", ctx.options.inputs},
          {"files", r.files},
          {"files_by_format", by_format},
          {"empty_files", r.empty_files},
          {"tokenizer", tokenizer_json(ctx)},
          {"format", std::string(input_format_name(ctx.options.format))},
          {"val_fraction", ctx.options.val_fraction},
          {"seed", ctx.options.seed},
          {"split_rule", split_rule_text()},
          {"threads", ctx.threads},
          {"strict", ctx.options.strict},
          {"bytes", r.bytes},
          {"seconds", r.seconds},
          {"mb_per_second", r.seconds > 0 ? static_cast<double>(r.bytes) / 1e6 / r.seconds : 0.0},
          {"skipped", skipped},
          {"invalid_utf8_replacements", r.utf8_replacements}};
}

ojson split_json(const SplitReport& s, const char* unit) {
  ojson j = {{"path", s.path}, {unit, s.documents}, {"tokens", s.tokens}};
  if (!s.label_counts.empty()) j["label_counts"] = s.label_counts;
  return j;
}

std::string empty_corpus_message(const Context& ctx) {
  std::string why =
      fmt::format("prepare: empty corpus: the inputs '{}' give no tokens", join(ctx.options.inputs, "', '"));
  if (ctx.report.skipped > 0) {
    std::vector<std::string> reasons;
    for (const auto& [reason, n] : ctx.report.skipped_by_reason)
      reasons.push_back(fmt::format("{} x {}", n, reason));
    why += fmt::format(" ({} records skipped: {}; first: {})", ctx.report.skipped, join(reasons),
                       ctx.report.skipped_examples.front());
  }
  return why;
}

void run_lm(Context& ctx) {
  PrepareReport& report = ctx.report;
  const PrepareOptions& o = ctx.options;
  uint64_t text_bytes = 0;
  for (const SourceFile& f : ctx.files)
    if (f.format == InputFormat::Text) text_bytes += f.bytes;
  const uint64_t text_cut =
      text_bytes - static_cast<uint64_t>(static_cast<double>(text_bytes) * o.val_fraction);

  struct Split {
    TokenShardWriter writer;
    SplitReport& report;
    uint64_t doc_tokens = 0;  // tokens of the current document so far
  };
  const fs::path dir(o.output_dir);
  report.train.path = (dir / "train.bin").string();
  report.val.path = (dir / "val.bin").string();
  Split train{TokenShardWriter(report.train.path, ctx.tokenizer.vocab_size()), report.train};
  Split val{TokenShardWriter(report.val.path, ctx.tokenizer.vocab_size()), report.val};
  // Around each document: what the model's tokenizer adds (encode_with_special: <s> first for Llama 2),
  // and after it EOS when the template adds nothing there.
  report.document_prefix = document_prefix(ctx.tokenizer);
  report.document_suffix = document_suffix(ctx.tokenizer);
  const std::vector<uint32_t>& prefix = report.document_prefix;
  const std::vector<uint32_t>& suffix = report.document_suffix;
  const bool in_context = encodes_text_start(ctx.tokenizer);

  LmReader reader(ctx.files, text_cut);
  OrderedPipeline pipeline(
      ctx.threads, [&](Batch& b) { return reader.fill(b); },
      [&](Batch& b) { tokenize_lm_batch(ctx, b, in_context); });
  uint64_t doc_index = 0;  // JSONL documents kept so far: the index the split hashes
  for_each_kept_record(
      ctx, pipeline,
      [&](const Record& r, const Output& out) {
        const bool to_val = ctx.files[r.file].format == InputFormat::Text
                                ? r.tail_val
                                : assign_to_validation(o.seed, doc_index++, o.val_fraction);
        Split& s = to_val ? val : train;
        if (s.doc_tokens == 0 && !out.ids.empty()) {  // the document's first tokens
          s.writer.append(prefix);
          s.report.tokens += prefix.size();
        }
        s.writer.append(out.ids);
        s.doc_tokens += out.ids.size();
        s.report.tokens += out.ids.size();
        if (!r.doc_end) return;
        if (s.doc_tokens > 0) {
          s.writer.append(suffix);
          s.report.tokens += suffix.size();
        }
        if (s.doc_tokens == 0) ++report.empty_documents;
        ++s.report.documents;
        ++report.documents;
        s.doc_tokens = 0;
      },
      [&] { ctx.progress.update(report.bytes, report.documents, train.report.tokens + val.report.tokens); });
  ctx.progress.finish(report.bytes, report.documents, train.report.tokens + val.report.tokens);

  ANVIL_REQUIRE(train.report.tokens + val.report.tokens > 0, "{}", empty_corpus_message(ctx));
  if (o.val_fraction > 0) {
    ANVIL_REQUIRE(
        train.report.tokens >= 2 && val.report.tokens >= 2,
        "prepare: val_fraction {} splits the {}-byte corpus into {} train and {} validation tokens; "
        "each side needs at least 2 (use more data, another val_fraction, or val_fraction 0)",
        o.val_fraction, report.bytes, train.report.tokens, val.report.tokens);
  }
  report.seconds = seconds_since(ctx.start);

  ojson summary = base_summary(ctx);
  if (std::any_of(ctx.files.begin(), ctx.files.end(),
                  [](const SourceFile& f) { return f.format == InputFormat::Jsonl; }))
    summary["text_field"] = o.text_field;
  summary["documents"] = report.documents;
  summary["empty_documents"] = report.empty_documents;
  summary["train"] = split_json(report.train, "documents");
  summary["val"] = split_json(report.val, "documents");
  ctx.out.committed(report.summary_path + ".tmp");
  write_text_file(report.summary_path + ".tmp", summary_text(summary));
  train.writer.commit();
  ctx.out.committed(report.train.path);
  val.writer.commit();
  ctx.out.committed(report.val.path);
}

}  // namespace

ClassificationEncoder::ClassificationEncoder(const Tokenizer& tokenizer, uint32_t max_length,
                                             const std::string& what)
    : tokenizer_(tokenizer), cls_(tokenizer.token_to_id("[CLS]")), sep_(tokenizer.token_to_id("[SEP]")) {
  ANVIL_REQUIRE(max_length >= (wraps() ? 3u : 1u), "{}: --max_length {} is too small (at least {}{})", what,
                max_length, wraps() ? 3 : 1, wraps() ? ": [CLS], one token and [SEP]" : "");
  content_max_ = max_length - (wraps() ? 2 : 0);
}

std::vector<uint32_t> ClassificationEncoder::encode(std::string_view text, bool* truncated) const {
  std::vector<uint32_t> ids = tokenizer_.encode(text);
  if (truncated) *truncated = ids.size() > content_max_;
  if (ids.size() > content_max_) ids.resize(content_max_);
  if (!wraps()) return ids;
  std::vector<uint32_t> out;
  out.reserve(ids.size() + 2);
  out.push_back(*cls_);
  out.insert(out.end(), ids.begin(), ids.end());
  out.push_back(*sep_);
  return out;
}

namespace {

void run_classification(Context& ctx) {
  PrepareReport& report = ctx.report;
  const PrepareOptions& o = ctx.options;
  const ClassificationEncoder encoder(ctx.tokenizer, o.max_length);
  const bool wrap = encoder.wraps();  // BERT-style examples: [CLS] text [SEP]
  const std::optional<uint32_t> cls = encoder.cls_id(), sep = encoder.sep_id();

  std::unordered_map<std::string, int32_t> given_ids;  // --labels; read by the workers
  for (size_t i = 0; i < o.labels.size(); ++i) given_ids.emplace(o.labels[i], static_cast<int32_t>(i));
  std::unordered_map<std::string, int32_t> seen_ids;  // without --labels: provisional ids, first-seen order
  std::vector<std::string> seen_labels;
  const std::string given_labels = join(o.labels);

  auto work = [&](Batch& batch) {
    batch.outputs.resize(batch.records.size());
    for (size_t i = 0; i < batch.records.size(); ++i) {
      Record& r = batch.records[i];
      Output& out = batch.outputs[i];
      out.replacements = repair_utf8(r.text) + repair_utf8(r.label);
      if (!r.problem.empty()) {
        skip(out, r.problem, r.problem_detail);
        continue;
      }
      if (r.label.empty()) {
        skip(out, "empty label", fmt::format("the '{}' column is empty", o.label_column));
        continue;
      }
      if (!o.labels.empty() && !given_ids.count(r.label)) {
        skip(out, "label not in --labels",
             fmt::format("label '{}' is not one of --labels ({})", r.label, given_labels));
        continue;
      }
      out.ids = encoder.encode(r.text, &out.truncated);
    }
  };

  const fs::path dir(o.output_dir);
  report.train.path = (dir / "train.cls").string();
  report.val.path = (dir / "val.cls").string();
  ClassificationShardWriter train(report.train.path, ctx.tokenizer.vocab_size(), o.max_length);
  ClassificationShardWriter val(report.val.path, ctx.tokenizer.vocab_size(), o.max_length);

  CsvRowReader reader(ctx.files, o);
  OrderedPipeline pipeline(
      ctx.threads, [&](Batch& b) { return reader.fill(b); }, work);
  uint64_t example_index = 0;
  for_each_kept_record(
      ctx, pipeline,
      [&](const Record& r, const Output& out) {
        int32_t label;
        if (!o.labels.empty()) {
          label = given_ids.at(r.label);
        } else if (const auto it = seen_ids.find(r.label); it != seen_ids.end()) {
          label = it->second;
        } else {  // renumbered in sorted name order at the end
          label = static_cast<int32_t>(seen_labels.size());
          seen_labels.push_back(r.label);
          seen_ids.emplace(r.label, label);
        }
        const bool to_val = assign_to_validation(o.seed, example_index++, o.val_fraction);
        (to_val ? val : train).append(out.ids, label);
        SplitReport& s = to_val ? report.val : report.train;
        ++s.documents;
        s.tokens += out.ids.size();
        ++s.label_counts[r.label];
        report.truncated += out.truncated;
      },
      [&] { ctx.progress.update(report.bytes, example_index, report.train.tokens + report.val.tokens); });
  ctx.progress.finish(report.bytes, example_index, report.train.tokens + report.val.tokens);
  report.documents = example_index;

  ANVIL_REQUIRE(example_index > 0, "{}", empty_corpus_message(ctx));
  if (o.val_fraction > 0) {
    ANVIL_REQUIRE(
        report.train.documents >= 1 && report.val.documents >= 1,
        "prepare: val_fraction {} assigns {} examples to train and {} to validation; each side needs at "
        "least 1 (use more data, another val_fraction or seed, or val_fraction 0)",
        o.val_fraction, report.train.documents, report.val.documents);
  }
  if (o.labels.empty()) {
    report.labels = seen_labels;
    std::sort(report.labels.begin(), report.labels.end());
    std::vector<int32_t> mapping(seen_labels.size());
    for (size_t i = 0; i < seen_labels.size(); ++i)
      mapping[i] =
          static_cast<int32_t>(std::lower_bound(report.labels.begin(), report.labels.end(), seen_labels[i]) -
                               report.labels.begin());
    train.remap_labels(mapping);
    val.remap_labels(mapping);
  } else {
    report.labels = o.labels;
  }
  report.seconds = seconds_since(ctx.start);

  ojson summary = base_summary(ctx);
  summary["text_column"] = o.text_column;
  summary["label_column"] = o.label_column;
  summary["labels"] = report.labels;
  summary["labels_given"] = !o.labels.empty();
  summary["max_length"] = o.max_length;
  summary["cls_sep"] = wrap ? ojson{{"cls_id", *cls}, {"sep_id", *sep}} : ojson(nullptr);
  summary["examples"] = report.documents;
  summary["truncated"] = report.truncated;
  summary["train"] = split_json(report.train, "examples");
  summary["val"] = split_json(report.val, "examples");
  ctx.out.committed(report.summary_path + ".tmp");
  write_text_file(report.summary_path + ".tmp", summary_text(summary));
  train.commit(report.labels);
  ctx.out.committed(report.train.path);
  val.commit(report.labels);
  ctx.out.committed(report.val.path);
}

}  // namespace

bool assign_to_validation(uint64_t seed, uint64_t index, double val_fraction) {
  const uint64_t h = Rng(Rng(seed).next_u64() ^ index).next_u64();
  return static_cast<double>(h >> 11) * 0x1.0p-53 < val_fraction;
}

PrepareReport prepare_data(const PrepareOptions& options) {
  // Checked here too so that a bad option is reported before a tokenizer file is loaded.
  ANVIL_REQUIRE(!options.inputs.empty(), "prepare: no inputs given");
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(options.tokenizer);
  return prepare_data(options, *tokenizer);
}

PrepareReport prepare_data(const PrepareOptions& options, const Tokenizer& tokenizer) {
  const Clock::time_point start = Clock::now();
  const PrepareOptions& o = options;
  // Written so that NaN fails too.
  ANVIL_REQUIRE(o.val_fraction >= 0.0 && o.val_fraction <= 0.5,
                "prepare: val_fraction {} is outside [0, 0.5]", o.val_fraction);
  ANVIL_REQUIRE(!o.inputs.empty(), "prepare: no inputs given");
  ANVIL_REQUIRE(!o.output_dir.empty(), "prepare: no output directory given");
  ANVIL_REQUIRE(tokenizer.vocab_size() >= 1 && tokenizer.vocab_size() <= (uint64_t{1} << 32),
                "prepare: tokenizer '{}' has vocab_size {}, outside [1, 2^32]", o.tokenizer,
                tokenizer.vocab_size());
  for (size_t i = 0; i < o.labels.size(); ++i) {
    ANVIL_REQUIRE(!o.labels[i].empty(), "prepare: --labels has an empty label (position {})", i);
    ANVIL_REQUIRE(std::find(o.labels.begin(), o.labels.begin() + i, o.labels[i]) == o.labels.begin() + i,
                  "prepare: --labels lists '{}' twice", o.labels[i]);
  }

  const std::vector<SourceFile> files = collect_sources(o.inputs, o.format);
  const auto csv_files = std::count_if(files.begin(), files.end(),
                                       [](const SourceFile& f) { return f.format == InputFormat::Csv; });
  if (csv_files > 0 && static_cast<size_t>(csv_files) < files.size()) {
    const auto csv = std::find_if(files.begin(), files.end(),
                                  [](const SourceFile& f) { return f.format == InputFormat::Csv; });
    const auto other = std::find_if(files.begin(), files.end(),
                                    [](const SourceFile& f) { return f.format != InputFormat::Csv; });
    ANVIL_THROW(
        "prepare: the inputs mix CSV (classification, e.g. '{}') with {} (language-model data, e.g. '{}'); "
        "prepare them separately or set --format",
        csv->path, input_format_name(other->format), other->path);
  }
  ANVIL_REQUIRE(csv_files > 0 || o.labels.empty(), "prepare: --labels applies to CSV inputs only");

  PrepareReport report;
  report.task = csv_files > 0 ? "classification" : "lm";
  report.files = files.size();
  uint64_t total_bytes = 0;
  for (const SourceFile& f : files) {
    total_bytes += f.bytes;
    report.empty_files += f.bytes == 0;
  }
  ANVIL_REQUIRE(total_bytes > 0, "prepare: empty corpus: the inputs '{}' contain no bytes",
                join(o.inputs, "', '"));
  report.threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  report.summary_path = (fs::path(o.output_dir) / "prepare_summary.json").string();

  OutputDir out(o.output_dir);
  try {
    Context ctx{o,     tokenizer, files,  report.threads,
                start, out,       report, ProgressBar(o.progress, total_bytes)};
    if (report.task == "lm") {
      run_lm(ctx);
    } else {
      run_classification(ctx);
    }
    std::error_code ec;
    fs::rename(report.summary_path + ".tmp", report.summary_path, ec);
    if (ec) ANVIL_THROW("prepare: cannot write '{}': {}", report.summary_path, ec.message());
  } catch (...) {
    out.discard();
    throw;
  }
  return report;
}

}  // namespace anvil::data
