// Shared helpers of the libFuzzer targets: a per-process scratch directory for the parsers that take a
// path, the error contract check, and an invariant check that crashes loudly (libFuzzer then saves the
// reproducer).
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <typeinfo>

#include "anvil/error.hpp"

namespace anvil::fuzz {

// A failed invariant is a finding: print it and abort so libFuzzer records the input.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "\nFUZZ INVARIANT FAILED: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

inline void check(bool ok, const std::string& what) {
  if (!ok) fail(what);
}

// A directory of its own for this process (several fuzzers may run side by side), under $TMPDIR, removed
// at exit. Files are rewritten for every input; on tmpfs (scripts/fuzz.sh uses /dev/shm) that is cheap.
class ScratchDir {
 public:
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/anvil_fuzz_XXXXXX";
    if (!::mkdtemp(pattern.data())) fail("cannot create a scratch directory under " + pattern);
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  std::string path(const std::string& name) const { return path_ + "/" + name; }
  // Writes `data` to <dir>/<name> and returns that path.
  std::string write(const std::string& name, const void* data, size_t size) const {
    const std::string p = path(name);
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
    f.close();
    if (!f) fail("cannot write " + p);
    return p;
  }

 private:
  std::string path_;
};

// The parsers' contract: malformed input fails with anvil::Error naming the file (`path`), never with
// another exception type. Returns whether `f` succeeded.
template <class F>
bool parses(const std::string& path, F&& f) {
  try {
    f();
    return true;
  } catch (const anvil::Error& e) {
    const std::string what = e.what();
    check(what.find(path) != std::string::npos,
          "the error message does not name the file '" + path + "': " + what);
    return false;
  } catch (const std::exception& e) {
    fail(std::string("escaped as ") + typeid(e).name() + " instead of anvil::Error: " + e.what());
  }
}

// For calls on a successfully opened object that may reject their arguments with anvil::Error (e.g.
// decoding an id outside the vocabulary); any other exception type is a finding.
template <class F>
bool succeeds(F&& f) {
  try {
    f();
    return true;
  } catch (const anvil::Error&) {
    return false;
  } catch (const std::exception& e) {
    fail(std::string("escaped as ") + typeid(e).name() + " instead of anvil::Error: " + e.what());
  }
}

}  // namespace anvil::fuzz
