// A training run's output directory (docs/formats.md, "Run directory"): one run writes it at a time, a new
// run never mixes with an old one's files, interrupted saves are cleaned up, old checkpoints are rotated,
// and a run that fails after start-up leaves its error beside its metrics and last good checkpoint.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "anvil/train_config.hpp"

namespace anvil {

// An exclusive lock on a directory: flock(2) on <dir>/.anvil.lock, which holds the owner's pid. Released
// (and the file removed) when the object goes away; the kernel releases it if the process dies.
class OutputDirLock {
 public:
  static constexpr const char* kFileName = ".anvil.lock";
  // `dir` must exist. Throws "output_dir <dir> is in use by another anvil run (pid N); wait for it or
  // choose another --output_dir" when another process (or another OutputDirLock of this one) holds it.
  explicit OutputDirLock(const std::string& dir);
  OutputDirLock(const OutputDirLock&) = delete;
  OutputDirLock& operator=(const OutputDirLock&) = delete;
  ~OutputDirLock();

 private:
  std::string path_;
  int fd_ = -1;
};

class RunDirectory {
 public:
  static constexpr const char* kErrorFile = "error.txt";

  // Start-up: creates cfg.output_dir if needed and locks it; cleans the leftovers of interrupted saves
  // (io::clean_interrupted_saves); and refuses a fresh run (no resume_from_checkpoint) in a directory
  // holding an earlier run's outputs (checkpoint-N, metrics.jsonl, summary.json, train_config.json,
  // error.txt, profile traces) unless cfg.overwrite_output_dir, which in turn refuses when the run reads
  // its init_from or tokenizer from one of them. Throws anvil::Error saying what to do.
  explicit RunDirectory(const TrainConfig& cfg);
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;
  // Releases the lock. Before begin(), a directory this object created is removed again (it holds nothing
  // but the lock file): a run that fails at start-up leaves nothing behind.
  ~RunDirectory();

  // Training starts: with overwrite_output_dir on a fresh run, the earlier run's outputs are deleted; the
  // error file of an earlier failed attempt (a resume) is removed. From here on the directory is kept.
  void begin();
  // After checkpoint `saved` (a checkpoint-N directory in this one) was written: with save_total_limit > 0,
  // deletes the oldest checkpoint-N directories beyond the limit, never `saved`. Returns the deleted paths.
  std::vector<std::string> rotate_checkpoints(const std::string& saved);
  // After begin(): writes `message` into error.txt (best effort: the failure being recorded may be a full
  // disk). Before begin() it does nothing (start-up errors leave the directory as it was).
  void record_error(std::string_view message) noexcept;

  const std::string& path() const { return dir_; }
  std::string file(std::string_view name) const;
  bool begun() const { return begun_; }

 private:
  // The entries of an earlier run's outputs, sorted.
  std::vector<std::string> earlier_outputs() const;
  void remove_created() noexcept;

  std::string dir_;
  bool fresh_ = true, overwrite_ = false;
  int64_t save_total_limit_ = 0;
  std::vector<std::string> created_;  // directories created here, innermost first
  std::optional<OutputDirLock> lock_;
  bool begun_ = false;
};

}  // namespace anvil
