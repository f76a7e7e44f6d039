// anvil tokenize: text on stdin -> token ids on stdout, one line of space-separated ids per input line
// (the '\n' itself is not encoded); --decode turns lines of ids back into text.
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <functional>
#include <memory>

#include "anvil/error.hpp"
#include "cli/command.hpp"
#include "data/tokenizer.hpp"
#include "data/unicode.hpp"

namespace anvil::cli {
namespace {

struct TokenizeArgs {
  std::string tokenizer;
  bool decode = false, skip_special = false;
};

// Reads stdin in chunks as they arrive (so a pipe can be used interactively) and calls on_line for each
// complete line without its '\n'; a last line without '\n' counts too.
template <class F>
void for_each_stdin_line(F&& on_line, const std::function<void()>& after_chunk) {
  std::string pending;
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(STDIN_FILENO, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    ANVIL_REQUIRE(n >= 0, "tokenize: cannot read standard input");
    if (n == 0) break;
    pending.append(buf.data(), size_t(n));
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1)
      on_line(std::string_view(pending).substr(start, nl - start));
    pending.erase(0, start);
    after_chunk();
  }
  if (!pending.empty()) on_line(std::string_view(pending));
}

int run_tokenize(const TokenizeArgs& a) {
  const std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer(a.tokenizer);
  std::string out;
  const auto flush = [&] {
    if (!out.empty()) std::fwrite(out.data(), 1, out.size(), stdout);
    out.clear();
    std::fflush(stdout);
  };
  uint64_t line_no = 0;
  if (!a.decode) {
    uint64_t replaced = 0, bad_lines = 0;
    std::string valid;
    for_each_stdin_line(
        [&](std::string_view line) {
          ++line_no;
          if (!data::unicode::is_valid_utf8(line)) {
            replaced += data::unicode::to_valid_utf8(line, valid);
            ++bad_lines;
            line = valid;
          }
          const std::vector<uint32_t> ids = tok->encode(line);
          for (size_t i = 0; i < ids.size(); ++i) {
            if (i) out += ' ';
            const fmt::format_int s(ids[i]);
            out.append(s.data(), s.size());
          }
          out += '\n';
          if (out.size() > (1 << 20)) flush();
        },
        flush);
    flush();
    if (replaced)
      fmt::print(stderr, "tokenize: replaced {} invalid UTF-8 sequence{} with U+FFFD (in {} line{})\n",
                 replaced, replaced == 1 ? "" : "s", bad_lines, bad_lines == 1 ? "" : "s");
    return 0;
  }
  std::vector<uint32_t> ids;
  for_each_stdin_line(
      [&](std::string_view line) {
        ++line_no;
        ids.clear();
        for (size_t i = 0; i < line.size();) {
          if (line[i] == ' ' || line[i] == '\t' || line[i] == '\r') {
            ++i;
            continue;
          }
          size_t j = i;
          while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r') ++j;
          const std::string_view word = line.substr(i, j - i);
          uint64_t v = 0;
          const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), v);
          if (ec != std::errc() || end != word.data() + word.size() || v >= tok->vocab_size()) {
            flush();
            if (ec == std::errc() && end == word.data() + word.size())
              ANVIL_THROW("tokenize --decode: line {}: id {} is out of range (vocabulary size {})", line_no,
                          word, tok->vocab_size());
            ANVIL_THROW("tokenize --decode: line {}: '{}' is not a token id", line_no, word);
          }
          ids.push_back(uint32_t(v));
          i = j;
        }
        try {
          out += tok->decode(ids, a.skip_special);
        } catch (const Error& e) {
          flush();
          ANVIL_THROW("tokenize --decode: line {}: {}", line_no, e.what());
        }
        out += '\n';
        if (out.size() > (1 << 20)) flush();
      },
      flush);
  flush();
  return 0;
}

Command make_tokenize(CLI::App& parent) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* app = parent.add_subcommand(
      "tokenize", "text on stdin -> token ids, one line of ids per line (--decode: ids -> text)");
  app->add_option("--tokenizer", a->tokenizer,
                  "tokenizer.json, vocab.txt, a directory with one, or \"bytes\"")
      ->required();
  app->add_flag("--decode", a->decode, "read lines of space-separated ids and print their text");
  app->add_flag("--skip_special", a->skip_special, "with --decode: leave special tokens out of the text");
  return {app, [a] { return run_tokenize(*a); }};
}

}  // namespace

ANVIL_REGISTER_COMMAND(37, make_tokenize);

}  // namespace anvil::cli
