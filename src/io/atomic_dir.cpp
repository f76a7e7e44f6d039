#include "io/atomic_dir.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>

#include "anvil/error.hpp"

namespace anvil::io {
namespace {

namespace fs = std::filesystem;

std::string errno_text(int err) {
  return std::generic_category().message(err);
}

// Directories must be fsynced too: that is what makes a created or renamed entry durable.
void fsync_path(const std::string& path, bool is_directory) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (is_directory ? O_DIRECTORY : 0));
  ANVIL_REQUIRE(fd >= 0, "{}: cannot open to fsync ({})", path, errno_text(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  ANVIL_REQUIRE(rc == 0, "{}: fsync failed ({})", path, errno_text(err));
}

// Every file and directory under `root`, then `root` itself.
void fsync_tree(const std::string& root) {
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    fs::file_status status = it->symlink_status(ec);
    if (ec) break;
    if (fs::is_regular_file(status)) fsync_path(it->path().string(), false);
    if (fs::is_directory(status)) fsync_path(it->path().string(), true);
  }
  ANVIL_REQUIRE(!ec, "{}: cannot list directory to fsync it ({})", root, ec.message());
  fsync_path(root, true);
}

std::string parent_dir_of(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

}  // namespace

AtomicDirectory::AtomicDirectory(std::string final_path) : final_path_(std::move(final_path)) {
  // "ckpt/" must mean the directory "ckpt", not a temporary directory inside it.
  while (final_path_.size() > 1 && final_path_.back() == '/') final_path_.pop_back();
  fs::path name = fs::path(final_path_).filename();
  ANVIL_REQUIRE(!name.empty() && name != "." && name != "..",
                "'{}': not usable as a checkpoint directory path (it must end in a directory name)",
                final_path_);

  std::error_code ec;
  fs::path parent = fs::path(final_path_).parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    ANVIL_REQUIRE(!ec, "{}: cannot create parent directory '{}' ({})", final_path_, parent.string(),
                  ec.message());
  }
  fs::file_status existing = fs::status(final_path_, ec);
  ANVIL_REQUIRE(!fs::exists(existing) || fs::is_directory(existing),
                "{}: exists and is not a directory; refusing to replace it with a checkpoint", final_path_);

  temp_path_ = fmt::format("{}.tmp-{}", final_path_, ::getpid());
  // A leftover from a crashed run that had the same pid (common in containers) is stale by definition.
  fs::remove_all(temp_path_, ec);
  ANVIL_REQUIRE(!ec, "{}: cannot remove stale temporary directory ({})", temp_path_, ec.message());
  fs::create_directory(temp_path_, ec);
  ANVIL_REQUIRE(!ec, "{}: cannot create temporary directory ({})", temp_path_, ec.message());
}

AtomicDirectory::~AtomicDirectory() {
  if (committed_) return;
  std::error_code ec;  // best effort: a destructor must not throw, and the save already failed
  fs::remove_all(temp_path_, ec);
}

std::string AtomicDirectory::file(std::string_view name) const {
  std::string out = temp_path_;
  out += '/';
  out += name;
  return out;
}

void AtomicDirectory::commit() {
  ANVIL_ASSERT(!committed_, "{}: commit() called twice", final_path_);
  fsync_tree(temp_path_);

  std::error_code ec;
  fs::file_status existing = fs::symlink_status(final_path_, ec);
  const bool replacing = fs::exists(existing);
  const std::string old_path = fmt::format("{}.old-{}", final_path_, ::getpid());
  if (replacing) {
    ANVIL_REQUIRE(fs::is_directory(fs::status(final_path_, ec)),
                  "{}: exists and is not a directory; refusing to replace it with a checkpoint", final_path_);
    fs::remove_all(old_path, ec);
    ANVIL_REQUIRE(!ec, "{}: cannot remove stale directory ({})", old_path, ec.message());
    ANVIL_REQUIRE(::rename(final_path_.c_str(), old_path.c_str()) == 0, "{}: cannot rename to '{}' ({})",
                  final_path_, old_path, errno_text(errno));
  }
  if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    int err = errno;
    if (replacing) ::rename(old_path.c_str(), final_path_.c_str());  // put the previous checkpoint back
    ANVIL_THROW("{}: cannot rename '{}' into place ({})", final_path_, temp_path_, errno_text(err));
  }
  committed_ = true;
  fsync_path(parent_dir_of(final_path_), true);
  // The new checkpoint is durable; failing to delete the old one only costs disk space, so it is not an
  // error.
  if (replacing) fs::remove_all(old_path, ec);
}

SyncedFileWriter::SyncedFileWriter(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ANVIL_REQUIRE(fd_ >= 0, "{}: cannot open for writing ({})", path_, errno_text(errno));
  // Only a regular file may be unlinked after a failure: the path may name a device (/dev/full, /dev/null).
  struct stat st {};
  regular_file_ = ::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode);
}

SyncedFileWriter::~SyncedFileWriter() {
  if (fd_ < 0) return;
  ::close(fd_);
  if (regular_file_) ::unlink(path_.c_str());
}

void SyncedFileWriter::write(const void* data, size_t nbytes) {
  ANVIL_ASSERT(fd_ >= 0, "{}: write after finish()", path_);
  const char* p = static_cast<const char*>(data);
  while (nbytes > 0) {
    // Linux writes at most ~2 GiB per call; larger requests come back as short writes anyway.
    ssize_t n = ::write(fd_, p, std::min<size_t>(nbytes, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    ANVIL_REQUIRE(n > 0, "{}: write failed ({})", path_, n < 0 ? errno_text(errno) : "no progress");
    p += n;
    nbytes -= static_cast<size_t>(n);
  }
}

void SyncedFileWriter::finish() {
  ANVIL_ASSERT(fd_ >= 0, "{}: finish() called twice", path_);
  // fsync of a character device (a terminal, /dev/null) is EINVAL: there is nothing to make durable.
  ANVIL_REQUIRE(::fsync(fd_) == 0 || (!regular_file_ && errno == EINVAL), "{}: fsync failed ({})", path_,
                errno_text(errno));
  int rc = ::close(fd_);
  int err = errno;
  fd_ = -1;
  if (rc != 0) {
    if (regular_file_) ::unlink(path_.c_str());
    ANVIL_THROW("{}: close failed ({})", path_, errno_text(err));
  }
}

void write_text_file_synced(const std::string& path, std::string_view text) {
  SyncedFileWriter out(path);
  out.write(text);
  out.finish();
}

std::string read_text_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ANVIL_REQUIRE(fd >= 0, "{}: cannot read ({})", path, errno_text(errno));
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      ANVIL_THROW("{}: cannot read ({})", path, errno_text(err));
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

namespace {

// The parts of "<name>.tmp-<digits>" / "<name>.old-<digits>": <name> and whether it is a ".tmp-" one.
struct InterruptedSaveName {
  std::string base;  // "" when the name is not of either form
  bool temporary = false;
};

InterruptedSaveName parse_interrupted_save_name(const std::string& name) {
  for (const char* tag : {".tmp-", ".old-"}) {
    const size_t at = name.rfind(tag);
    if (at == std::string::npos || at == 0) continue;
    const std::string_view digits = std::string_view(name).substr(at + 5);
    if (!digits.empty() &&
        std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return {name.substr(0, at), tag[1] == 't'};
  }
  return {};
}

}  // namespace

std::string interrupted_save_target(const std::string& dir) {
  if (dir.empty()) return "";
  // The last component however the path is spelled: "a/b/", "a/b/.", "." (the current directory's name).
  fs::path p = fs::path(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  if (p.empty() || p.filename() == "." || p.filename() == "..") {
    std::error_code ec;
    p = fs::absolute(dir, ec).lexically_normal();
    if (ec) return "";
    if (!p.has_filename()) p = p.parent_path();
  }
  const std::string base = parse_interrupted_save_name(p.filename().string()).base;
  return base.empty() ? "" : (p.parent_path() / base).string();
}

void require_not_interrupted_save(const std::string& dir) {
  const std::string target = interrupted_save_target(dir);
  ANVIL_REQUIRE(target.empty(),
                "'{}' is an incomplete checkpoint left by an interrupted save (a temporary directory of the "
                "atomic save); use '{}' instead, or another checkpoint-N (the next training run in its "
                "output_dir removes such leftovers)",
                dir, target);
}

std::vector<std::string> clean_interrupted_saves(const std::string& parent) {
  std::vector<std::string> notes;
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) return notes;
  std::vector<fs::path> temporaries, replaced;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const InterruptedSaveName n = parse_interrupted_save_name(it->path().filename().string());
    if (!n.base.empty()) (n.temporary ? temporaries : replaced).push_back(it->path());
  }
  ANVIL_REQUIRE(!ec, "{}: cannot list the directory ({})", parent, ec.message());
  for (const fs::path& p : temporaries) {
    fs::remove_all(p, ec);
    ANVIL_REQUIRE(!ec, "{}: cannot remove this leftover of an interrupted save ({})", p.string(),
                  ec.message());
    notes.push_back(fmt::format("removed '{}', left incomplete by an interrupted save", p.string()));
  }
  for (const fs::path& p : replaced) {
    const fs::path target = p.parent_path() / parse_interrupted_save_name(p.filename().string()).base;
    if (fs::exists(fs::symlink_status(target, ec))) {
      fs::remove_all(p, ec);
      ANVIL_REQUIRE(!ec, "{}: cannot remove the replaced checkpoint of an interrupted save ({})", p.string(),
                    ec.message());
      notes.push_back(
          fmt::format("removed '{}', a replaced checkpoint left by an interrupted save", p.string()));
    } else {
      ANVIL_REQUIRE(::rename(p.c_str(), target.c_str()) == 0, "{}: cannot rename back to '{}' ({})",
                    p.string(), target.string(), errno_text(errno));
      notes.push_back(fmt::format("restored '{}' from '{}' (a save interrupted while replacing it)",
                                  target.string(), p.string()));
    }
  }
  if (!notes.empty()) fsync_path(parent, true);
  return notes;
}

}  // namespace anvil::io
