#include "train/metrics_log.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>
#include <utility>

#include "anvil/error.hpp"
#include "io/atomic_dir.hpp"

namespace anvil {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string errno_text(int err) {
  return std::generic_category().message(err);
}

int open_for_append(const std::string& path, bool truncate) {
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0), 0644);
  ANVIL_REQUIRE(fd >= 0, "{}: cannot open for writing ({})", path, errno_text(errno));
  return fd;
}

// Whether a line of an existing metrics file belongs to a run resumed at `step`: a complete JSON object
// whose step (if any) is not after it.
bool keep_line(std::string_view line, int64_t step) {
  const json j = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  const auto it = j.find("step");
  return it == j.end() || (it->is_number() && it->get<double>() <= double(step));
}

}  // namespace

MetricsLog MetricsLog::create(const std::string& path) {
  return MetricsLog(path, open_for_append(path, true), 0);
}

MetricsLog MetricsLog::resume(const std::string& path, int64_t step) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) return create(path);
  // Only a regular file has records to keep (a device such as /dev/null is appended to as it is).
  if (!fs::is_regular_file(st)) return MetricsLog(path, open_for_append(path, false), 0);
  const std::string text = io::read_text_file(path);
  std::string kept;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = text.find('\n', begin);
    if (end == std::string::npos) break;  // an incomplete last record: dropped
    const std::string_view line = std::string_view(text).substr(begin, end - begin);
    if (keep_line(line, step)) kept.append(line).push_back('\n');
    begin = end + 1;
  }
  if (kept.size() != text.size()) {
    // Rewritten beside and renamed over: a crash now leaves either the old file or the new one.
    const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
    io::write_text_file_synced(tmp, kept);
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      ANVIL_THROW("{}: cannot replace it with its records up to step {} ({})", path, step, errno_text(err));
    }
  }
  return MetricsLog(path, open_for_append(path, false), kept.size());
}

MetricsLog::MetricsLog(MetricsLog&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}

MetricsLog& MetricsLog::operator=(MetricsLog&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
  }
  return *this;
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::write(const json& record) {
  ANVIL_ASSERT(fd_ >= 0, "{}: write after close()", path_);
  const std::string line = record.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;  // no progress: the device takes no more
      // Half a record must not stay behind (a later reader would choke on it). Best effort: the file may be
      // a device, or the cut may fail too; the error below is what matters.
      [[maybe_unused]] const int cut = ::ftruncate(fd_, off_t(size_));
      ANVIL_THROW(
          "{}: cannot write a metrics record ({}); the file keeps the complete records before it (free space "
          "on the device, then resume from the last checkpoint)",
          path_, errno_text(err));
    }
    p += n;
    left -= size_t(n);
  }
  size_ += line.size();
}

void MetricsLog::close() {
  if (fd_ < 0) return;
  struct stat st {};
  const bool regular = ::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode);
  const int sync_rc = ::fsync(fd_);
  const int sync_err = errno;
  const int close_rc = ::close(fd_);
  const int close_err = errno;
  fd_ = -1;
  ANVIL_REQUIRE(sync_rc == 0 || !regular, "{}: fsync failed ({})", path_, errno_text(sync_err));
  ANVIL_REQUIRE(close_rc == 0, "{}: close failed ({})", path_, errno_text(close_err));
}

}  // namespace anvil
