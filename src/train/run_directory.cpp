#include "train/run_directory.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <thread>

#include "anvil/error.hpp"
#include "io/atomic_dir.hpp"

namespace anvil {
namespace {

namespace fs = std::filesystem;

std::string errno_text(int err) {
  return std::generic_category().message(err);
}

// The step of a "checkpoint-<digits>" name, or -1.
int64_t checkpoint_step(const std::string& name) {
  constexpr std::string_view prefix = "checkpoint-";
  if (!name.starts_with(prefix) || name.size() == prefix.size() || name.size() > prefix.size() + 18)
    return -1;
  int64_t step = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// Files and directories a training run writes into its output_dir.
bool is_run_output(const fs::directory_entry& e) {
  const std::string name = e.path().filename().string();
  std::error_code ec;
  if (checkpoint_step(name) >= 0) return e.is_directory(ec);
  return name == "metrics.jsonl" || name == "summary.json" || name == "train_config.json" ||
         name == RunDirectory::kErrorFile || (name.starts_with("profile_steps_") && name.ends_with(".json"));
}

// Whether `inner` is `outer` or lies inside it (both made absolute, symlinks resolved where they exist).
bool inside(const std::string& inner, const fs::path& outer) {
  std::error_code ec;
  const fs::path a = fs::weakly_canonical(inner, ec);
  if (ec) return false;
  const fs::path b = fs::weakly_canonical(outer, ec);
  if (ec) return false;
  const auto [end, _] = std::mismatch(b.begin(), b.end(), a.begin(), a.end());
  return end == b.end();
}

// The pid written into a lock file by its holder ("" while it has not written it yet).
std::string read_holder(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return "";
  std::string s(buf, size_t(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  const bool digits =
      !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  return digits ? s : "";
}

}  // namespace

OutputDirLock::OutputDirLock(const std::string& dir) : path_((fs::path(dir) / kFileName).string()) {
  // The holder removes the file when it is done, so the file locked here may have been unlinked (or replaced
  // by a newer holder's) in between: the lock counts only when the path still names the locked file.
  for (int attempt = 0;; ++attempt) {
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    ANVIL_REQUIRE(fd >= 0, "output_dir {}: cannot create the lock file {} ({})", dir, path_,
                  errno_text(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EINTR) {
        ::close(fd);
        continue;
      }
      if (err != EWOULDBLOCK) {
        ::close(fd);
        ANVIL_THROW("output_dir {}: cannot lock {} ({}); is the directory on a file system without locks?",
                    dir, path_, errno_text(err));
      }
      // The holder writes its pid right after locking: give it a moment if it has not yet.
      std::string holder = read_holder(fd);
      for (int i = 0; i < 20 && holder.empty(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        holder = read_holder(fd);
      }
      ::close(fd);
      ANVIL_THROW(
          "output_dir {} is in use by another anvil run (pid {}); wait for it or choose another --output_dir",
          dir, holder.empty() ? "unknown" : holder);
    }
    struct stat locked {
    }, named{};
    if (::fstat(fd, &locked) == 0 && ::stat(path_.c_str(), &named) == 0 && locked.st_dev == named.st_dev &&
        locked.st_ino == named.st_ino) {
      fd_ = fd;
      break;
    }
    ::close(fd);
    ANVIL_REQUIRE(attempt < 100,
                  "output_dir {}: the lock file {} keeps being replaced; is another run starting?", dir,
                  path_);
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != ssize_t(pid.size())) {
    const int err = errno;
    ::unlink(path_.c_str());
    ::close(fd_);
    ANVIL_THROW("{}: cannot write the lock file ({})", path_, errno_text(err));
  }
}

OutputDirLock::~OutputDirLock() {
  // Unlinked while still locked: a process that opened it meanwhile sees the file is gone and retries.
  ::unlink(path_.c_str());
  ::close(fd_);
}

RunDirectory::RunDirectory(const TrainConfig& cfg)
    : dir_(cfg.output_dir),
      fresh_(cfg.resume_from_checkpoint.empty()),
      overwrite_(cfg.overwrite_output_dir),
      save_total_limit_(cfg.save_total_limit) {
  std::error_code ec;
  for (fs::path p = fs::path(dir_).lexically_normal(); !p.empty() && !fs::exists(fs::symlink_status(p, ec));
       p = p.parent_path()) {
    if (p.filename().empty()) continue;  // "a/b/" -> "a/b"
    created_.push_back(p.string());
    if (!p.has_parent_path()) break;
  }
  try {
    fs::create_directories(dir_, ec);
    ANVIL_REQUIRE(!ec, "output_dir '{}': cannot create it ({})", dir_, ec.message());
    ANVIL_REQUIRE(fs::is_directory(dir_, ec), "output_dir '{}' exists and is not a directory", dir_);
    lock_.emplace(dir_);
    for (const std::string& note : io::clean_interrupted_saves(dir_)) fmt::print("{}\n", note);
    if (!fresh_) return;
    const std::vector<std::string> earlier = earlier_outputs();
    if (earlier.empty()) return;
    std::string names;
    for (const std::string& p : earlier)
      names += (names.empty() ? "" : ", ") + fs::path(p).filename().string();
    ANVIL_REQUIRE(
        overwrite_,
        "output_dir '{}' holds the outputs of an earlier run ({}); a new run there would mix with "
        "them: resume it with --resume_from_checkpoint {}/checkpoint-N, choose another --output_dir, "
        "or pass --overwrite_output_dir to delete them first",
        dir_, names, dir_);
    for (const auto& [key, input] : {std::pair<const char*, std::string>{"init_from", cfg.init_from},
                                     {"tokenizer", cfg.tokenizer == "bytes" ? "" : cfg.tokenizer}}) {
      if (input.empty()) continue;
      for (const std::string& p : earlier)
        ANVIL_REQUIRE(!inside(input, p),
                      "{} '{}' is part of the earlier run in output_dir '{}', which --overwrite_output_dir "
                      "would delete; copy it elsewhere first, or choose another --output_dir",
                      key, input, dir_);
    }
  } catch (...) {
    lock_.reset();
    remove_created();
    throw;
  }
}

RunDirectory::~RunDirectory() {
  lock_.reset();
  if (!begun_) remove_created();
}

void RunDirectory::remove_created() noexcept {
  // rmdir removes only empty directories: anything another process put there meanwhile stays.
  for (const std::string& d : created_) ::rmdir(d.c_str());
  created_.clear();
}

std::vector<std::string> RunDirectory::earlier_outputs() const {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec))
    if (is_run_output(*it)) out.push_back(it->path().string());
  ANVIL_REQUIRE(!ec, "output_dir '{}': cannot list it ({})", dir_, ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

void RunDirectory::begin() {
  ANVIL_ASSERT(lock_ && !begun_, "{}: begin() without the lock, or twice", dir_);
  std::error_code ec;
  if (fresh_ && overwrite_) {
    const std::vector<std::string> earlier = earlier_outputs();
    for (const std::string& p : earlier) {
      fs::remove_all(p, ec);
      ANVIL_REQUIRE(!ec, "{}: cannot delete it (overwrite_output_dir) ({})", p, ec.message());
    }
    if (!earlier.empty())
      fmt::print("overwrite_output_dir: deleted the earlier run's outputs in {} ({} entries)\n", dir_,
                 earlier.size());
  }
  // A resume after a failure: the error was the earlier attempt's.
  fs::remove(file(kErrorFile), ec);
  ANVIL_REQUIRE(!ec, "{}: cannot remove the earlier run's error file ({})", file(kErrorFile), ec.message());
  begun_ = true;
  created_.clear();
}

std::vector<std::string> RunDirectory::rotate_checkpoints(const std::string& saved) {
  std::vector<std::string> deleted;
  if (save_total_limit_ <= 0) return deleted;
  std::vector<std::pair<int64_t, fs::path>> checkpoints;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t step = checkpoint_step(it->path().filename().string());
    std::error_code dir_ec;
    if (step >= 0 && it->is_directory(dir_ec)) checkpoints.emplace_back(step, it->path());
  }
  ANVIL_REQUIRE(!ec, "output_dir '{}': cannot list it ({})", dir_, ec.message());
  std::sort(checkpoints.begin(), checkpoints.end());
  const fs::path keep = fs::path(saved).lexically_normal();
  size_t count = checkpoints.size();
  for (const auto& [step, path] : checkpoints) {
    if (count <= size_t(save_total_limit_)) break;
    if (path.lexically_normal() == keep || fs::equivalent(path, saved, ec)) continue;
    // Renamed to a temporary name first, so a kill during the removal leaves something that is never loaded
    // and is cleaned at the next start, never a checkpoint-N with files missing.
    const fs::path doomed = fs::path(fmt::format("{}.tmp-{}", path.string(), ::getpid()));
    fs::remove_all(doomed, ec);
    if (::rename(path.c_str(), doomed.c_str()) != 0) {
      // Only disk space is at stake: say so and carry on.
      fmt::print(stderr, "warning: save_total_limit: cannot delete {} ({})\n", path.string(),
                 errno_text(errno));
      continue;
    }
    fs::remove_all(doomed, ec);
    if (ec)
      fmt::print(stderr, "warning: save_total_limit: cannot delete {} ({})\n", doomed.string(), ec.message());
    deleted.push_back(path.string());
    --count;
  }
  return deleted;
}

void RunDirectory::record_error(std::string_view message) noexcept {
  if (!begun_) return;
  try {
    io::write_text_file_synced(file(kErrorFile), std::string(message) + "\n");
  } catch (...) {
    // The failure being recorded may be the disk itself; the error still reaches the caller.
  }
}

std::string RunDirectory::file(std::string_view name) const {
  return (fs::path(dir_) / name).string();
}

}  // namespace anvil
