// Shared helpers for the unit tests: temporary directories, running the CLI, small corpora.
#pragma once
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "anvil/error.hpp"
#include "data/byte_corpus.hpp"

namespace anvil::test {

// A fresh directory under the system temp dir, removed when the object goes away.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name =
        std::string("anvil_") + (info ? std::string(info->test_suite_name()) + "_" + info->name() : "t");
    path_ = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& rel) const { return (path_ / rel).string(); }

 private:
  std::filesystem::path path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command line; its stdout and stderr together.
inline CommandResult run_shell(const std::string& command) {
  const std::string cmd = command + " 2>&1";
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Runs the `anvil` binary built alongside the tests with the given arguments.
inline CommandResult run_anvil(const std::string& args) {
  return run_shell(std::string(ANVIL_BINARY) + " " + args);
}

// `anvil launch` of `ranks` CPU processes (a free port) training `config`, with more flags.
inline CommandResult launch_anvil(int ranks, const std::string& config, const std::string& flags = "") {
  return run_anvil("launch --nproc_per_node " + std::to_string(ranks) + " --master_port 0 train --config " +
                   config + (flags.empty() ? "" : " " + flags));
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The "loss" of every record of a run's metrics.jsonl, in order.
inline std::vector<double> metrics_losses(const std::string& metrics_path) {
  std::vector<double> out;
  std::istringstream in(read_file(metrics_path));
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

// Runs `fn`, which must throw anvil::Error with every one of `needles` in its message.
inline void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "expected anvil::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& needle : needles) EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

// A small, learnable text: a few verses repeated with variations.
inline std::string small_corpus(size_t approx_bytes) {
  const char* lines[] = {
      "To be, or not to be, that is the question:\n", "Whether 'tis nobler in the mind to suffer\n",
      "The slings and arrows of outrageous fortune,\n", "Or to take arms against a sea of troubles\n",
      "And by opposing end them. To die: to sleep;\n"};
  std::string s;
  std::mt19937 rng(7);
  while (s.size() < approx_bytes) s += lines[rng() % 5];
  return s;
}

// small_corpus prepared as byte-level token shards: dir/data/train.bin and dir/data/val.bin (10%).
struct ByteCorpus {
  TempDir dir;
  explicit ByteCorpus(size_t approx_bytes = 60000) {
    write_file(dir / "corpus.txt", small_corpus(approx_bytes));
    data::prepare_byte_corpus({dir / "corpus.txt"}, dir / "data", 0.1);
  }
};

// Runs `f` with its standard output (a training run's progress lines, say) kept out of the test log; returns
// what `f` returns and passes on what it throws.
template <class F>
auto quietly(F&& f) {
  ::testing::internal::CaptureStdout();
  try {
    auto result = f();
    ::testing::internal::GetCapturedStdout();
    return result;
  } catch (...) {
    ::testing::internal::GetCapturedStdout();
    throw;
  }
}

}  // namespace anvil::test
