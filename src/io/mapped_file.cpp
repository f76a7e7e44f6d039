#include "io/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "anvil/error.hpp"

namespace anvil::io {
namespace {

class FdGuard {
 public:
  explicit FdGuard(int fd) : fd_(fd) {}
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  ~FdGuard() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

MappedFile::MappedFile(const std::string& path, const OnError& on_error) {
  auto fail = [&](Step step, int errnum, size_t file_bytes) {
    on_error(step, errnum, file_bytes);
    ANVIL_THROW("{}: cannot map file: {}", path, errnum ? std::strerror(errnum) : "not a regular file");
  };
  FdGuard fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) fail(Step::Open, errno, 0);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail(Step::Stat, errno, 0);
  const auto file_bytes = static_cast<size_t>(st.st_size);
  if (!S_ISREG(st.st_mode)) fail(Step::NotRegular, 0, file_bytes);
  if (file_bytes == 0) return;  // mmap refuses a zero length; there is nothing to map
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (map == MAP_FAILED) fail(Step::Map, errno, file_bytes);
  data_ = static_cast<const std::byte*>(map);
  size_ = file_bytes;
}

MappedFile::~MappedFile() {
  reset();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::reset() noexcept {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace anvil::io
