// The on-disk cache of tuned GEMM algorithms (`gemm_tuning: true`): one line per distinct GEMM, keyed by
// the device, the cuBLASLt version and the GEMM's shape, layout, types and epilogue, naming the cuBLASLt
// algorithm configuration that measured fastest. Timing every candidate takes ~0.1 s per GEMM, so it is
// done once per machine and the choice reused by every later run.
//
// File format (text, UTF-8):
//   line 1:  anvil-gemm-tuning 1
//   then:    <key> TAB <config> TAB <heuristic us> TAB <tuned us> TAB <candidates timed>
// where <config> is the nine cuBLASLt algorithm attributes as comma-separated integers: algorithm id, tile,
// stages, split-K, reduction scheme, CTA swizzling, custom option, inner shape, cluster shape. Keys hold
// no tab or newline; a later line with the same key replaces an earlier one.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <string>

namespace anvil {

// Whether CUDA GEMMs run tuned algorithms (TrainConfig::gemm_tuning), and the cache file to keep them in.
struct GemmTuningOptions {
  bool enabled = false;
  std::string cache_path;  // empty: GemmTuningCache::default_path()
};

struct GemmTuningEntry {
  std::array<int64_t, 9> config{};  // the cuBLASLt algorithm attributes, in the file's order
  double heuristic_us = 0;          // cuBLASLt's heuristic choice, per call, when tuned
  double tuned_us = 0;              // the chosen configuration, per call
  int candidates = 0;               // configurations timed
};

class GemmTuningCache {
 public:
  // Reads `path` if it exists (a missing file is an empty cache); throws naming the file and line when it
  // is not a well-formed cache.
  explicit GemmTuningCache(std::string path);

  const std::string& path() const { return path_; }
  size_t size() const { return entries_.size(); }
  const GemmTuningEntry* find(const std::string& key) const;

  // Adds (or replaces) `key` and rewrites the file: the entries on disk now (another process may have
  // added some) plus this one, written to a sibling temporary file and renamed over the old one, so a
  // reader never sees a partial file. Creates the parent directories. Throws naming the path on failure.
  void put(const std::string& key, const GemmTuningEntry& entry);

  // $ANVIL_CACHE_DIR, else $XDG_CACHE_HOME/anvil, else $HOME/.cache/anvil; plus "/gemm_tuning.txt".
  static std::string default_path();

  // The file's text for `entries`, and its entries parsed from `text` (`source` names it in errors).
  static std::string format(const std::map<std::string, GemmTuningEntry>& entries);
  static std::map<std::string, GemmTuningEntry> parse(const std::string& text, const std::string& source);

 private:
  std::string path_;
  std::map<std::string, GemmTuningEntry> entries_;
};

}  // namespace anvil
