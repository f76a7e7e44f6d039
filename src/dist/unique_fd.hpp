// A file descriptor owned by one object (pipes, sockets: the launcher's and the TCP store's), and errno as
// text.
#pragma once
#include <unistd.h>

#include <string>
#include <system_error>
#include <utility>

namespace anvil::dist {

inline std::string errno_text(int err) {
  return std::generic_category().message(err);
}

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(), fd_ = std::exchange(o.fd_, -1);
    return *this;
  }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);  // a pipe or socket we are done with: nothing to do about a failing close
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

}  // namespace anvil::dist
