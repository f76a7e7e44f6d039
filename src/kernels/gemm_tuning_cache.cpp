#include "kernels/gemm_tuning_cache.hpp"

#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

#include "anvil/error.hpp"
#include "io/atomic_dir.hpp"

namespace anvil {
namespace {

namespace fs = std::filesystem;

constexpr const char* kHeader = "anvil-gemm-tuning 1";

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t end = s.find(sep, start);
    parts.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return parts;
    start = end + 1;
  }
}

int64_t parse_integer(const std::string& text, const std::string& where, const char* what) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  ANVIL_REQUIRE(ec == std::errc() && end == text.data() + text.size(), "{}: {} '{}' is not an integer", where,
                what, text);
  return v;
}

double parse_time(const std::string& text, const std::string& where, const char* what) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  ANVIL_REQUIRE(!text.empty() && end == text.c_str() + text.size() && std::isfinite(v) && v >= 0,
                "{}: {} '{}' is not a time in microseconds (a finite number >= 0)", where, what, text);
  return v;
}

}  // namespace

GemmTuningCache::GemmTuningCache(std::string path) : path_(std::move(path)) {
  std::error_code ec;
  if (fs::exists(path_, ec)) entries_ = parse(io::read_text_file(path_), path_);
}

const GemmTuningEntry* GemmTuningCache::find(const std::string& key) const {
  const auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second;
}

void GemmTuningCache::put(const std::string& key, const GemmTuningEntry& entry) {
  ANVIL_ASSERT(!key.empty() && key.find_first_of("\t\n\r") == std::string::npos,
               "GEMM tuning key '{}' is empty or holds a tab or newline", key);
  // Merge with what is on disk now: another run on this machine may have tuned other GEMMs meanwhile.
  std::error_code ec;
  if (fs::exists(path_, ec))
    for (auto& [k, e] : parse(io::read_text_file(path_), path_)) entries_.emplace(k, e);
  entries_[key] = entry;
  const fs::path parent = fs::path(path_).parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    ANVIL_REQUIRE(!ec, "{}: cannot create the directory for the GEMM tuning cache ({})", parent.string(),
                  ec.message());
  }
  const std::string temp = path_ + ".tmp-" + std::to_string(::getpid());
  io::write_text_file_synced(temp, format(entries_));
  fs::rename(temp, path_, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(temp, ignored);
    ANVIL_THROW("{}: cannot replace the GEMM tuning cache ({})", path_, ec.message());
  }
}

std::string GemmTuningCache::default_path() {
  std::string dir;
  if (const char* v = std::getenv("ANVIL_CACHE_DIR"); v && *v)
    dir = v;
  else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    dir = std::string(x) + "/anvil";
  else if (const char* h = std::getenv("HOME"); h && *h)
    dir = std::string(h) + "/.cache/anvil";
  else
    dir = ".anvil-cache";
  return dir + "/gemm_tuning.txt";
}

std::string GemmTuningCache::format(const std::map<std::string, GemmTuningEntry>& entries) {
  std::string text = std::string(kHeader) + "\n";
  for (const auto& [key, e] : entries) {
    text += key + "\t";
    for (size_t i = 0; i < e.config.size(); ++i) {
      if (i) text += ',';
      text += std::to_string(e.config[i]);
    }
    text += fmt::format("\t{:.2f}\t{:.2f}\t{}\n", e.heuristic_us, e.tuned_us, e.candidates);
  }
  return text;
}

std::map<std::string, GemmTuningEntry> GemmTuningCache::parse(const std::string& text,
                                                              const std::string& source) {
  std::map<std::string, GemmTuningEntry> entries;
  const std::vector<std::string> lines = split(text, '\n');
  ANVIL_REQUIRE(
      !lines.empty() && lines[0] == kHeader,
      "{}: line 1: not an Anvil GEMM tuning cache (expected '{}'); delete the file to start a new one",
      source, kHeader);
  for (size_t n = 1; n < lines.size(); ++n) {
    const std::string& line = lines[n];
    if (line.empty()) continue;
    const std::string where = fmt::format("{}: line {}", source, n + 1);
    const std::vector<std::string> fields = split(line, '\t');
    ANVIL_REQUIRE(
        fields.size() == 5,
        "{}: expected 5 tab-separated fields (key, config, heuristic us, tuned us, candidates), got "
        "{}; delete the file to start a new one",
        where, fields.size());
    ANVIL_REQUIRE(!fields[0].empty(), "{}: empty key", where);
    GemmTuningEntry e;
    const std::vector<std::string> config = split(fields[1], ',');
    ANVIL_REQUIRE(config.size() == e.config.size(), "{}: the algorithm config has {} values, expected {}",
                  where, config.size(), e.config.size());
    for (size_t i = 0; i < config.size(); ++i) e.config[i] = parse_integer(config[i], where, "config value");
    e.heuristic_us = parse_time(fields[2], where, "heuristic time");
    e.tuned_us = parse_time(fields[3], where, "tuned time");
    const int64_t candidates = parse_integer(fields[4], where, "candidate count");
    ANVIL_REQUIRE(candidates >= 0 && candidates <= 1000000, "{}: candidate count {} is out of range", where,
                  candidates);
    e.candidates = int(candidates);
    entries[fields[0]] = e;
  }
  return entries;
}

}  // namespace anvil
