// metrics.jsonl: one JSON object per line, every write checked. A write that fails (a full disk, an I/O
// error) throws naming the file, after cutting the file back to its last complete record, so the file is
// never left with half a line and the run never goes on without its metrics.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace anvil {

class MetricsLog {
 public:
  // A fresh file (an existing one is truncated). Throws "<path>: cannot open for writing (<reason>)".
  static MetricsLog create(const std::string& path);
  // Continues the file of a run resumed at global step `step`: the records of later steps (written by the
  // run after the checkpoint, before it was interrupted) and any incomplete last line are dropped (the file
  // is rewritten atomically when anything is dropped), then records are appended. A missing file is
  // created; a path naming a device is appended to as it is.
  static MetricsLog resume(const std::string& path, int64_t step);

  MetricsLog(MetricsLog&& other) noexcept;
  MetricsLog& operator=(MetricsLog&& other) noexcept;
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  ~MetricsLog();

  // Writes `record` as one line and hands it to the kernel (the file then holds it even if the process
  // dies). Throws "<path>: cannot write a metrics record (<reason>); ..." on any failure.
  void write(const nlohmann::json& record);
  // fsync + close; throws naming the file. Destruction without close() closes without the fsync.
  void close();
  const std::string& path() const { return path_; }

 private:
  MetricsLog(std::string path, int fd, uint64_t size) : path_(std::move(path)), fd_(fd), size_(size) {}
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;  // bytes of complete records in the file
};

}  // namespace anvil
