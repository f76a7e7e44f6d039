#include "offload/swap_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "anvil/error.hpp"

namespace anvil::offload {
namespace {

std::string gib(size_t bytes) {
  return fmt::format("{:.2f} GiB", double(bytes) / double(size_t(1) << 30));
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

AlignedBuffer::AlignedBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  p_ = std::aligned_alloc(kSwapAlign, swap_aligned(bytes));
  ANVIL_REQUIRE(p_, "cannot allocate {} of host memory for the NVMe swap buffers", gib(bytes));
}

AlignedBuffer::~AlignedBuffer() {
  std::free(p_);
}

SwapFile::SwapFile(const std::string& dir, const std::string& name, size_t bytes, size_t block_bytes,
                   int threads, bool try_direct, const std::string& what)
    : dir_(dir), bytes_(swap_aligned(bytes)), block_(swap_aligned(std::max<size_t>(block_bytes, 1))) {
  namespace fs = std::filesystem;
  ANVIL_REQUIRE(threads >= 1, "NVMe swap file: {} I/O threads", threads);
  std::error_code ec;
  ANVIL_REQUIRE(fs::is_directory(dir, ec),
                "offload_nvme_path '{}' is not a directory: create it (on the NVMe drive {} should live "
                "on) or set offload_nvme_path to one",
                dir, what);
  const std::string path = (fs::path(dir) / name).string();
  const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  fd_ = try_direct ? ::open(path.c_str(), flags | O_DIRECT, 0600) : -1;
  direct_ = fd_ >= 0;
  if (fd_ < 0 && (!try_direct || errno == EINVAL))  // the filesystem refuses O_DIRECT: buffered I/O
    fd_ = ::open(path.c_str(), flags, 0600);
  ANVIL_REQUIRE(fd_ >= 0,
                "offload_nvme_path '{}': cannot create the swap file {} ({}); check that the directory "
                "is writable",
                dir, path, std::strerror(errno));
  ::unlink(path.c_str());  // the file lives while it is open, and goes with the process
  if (bytes_ > 0) {
    int rc = ::posix_fallocate(fd_, 0, off_t(bytes_));
    if (rc == EOPNOTSUPP || rc == EINVAL) rc = ::ftruncate(fd_, off_t(bytes_)) == 0 ? 0 : errno;
    if (rc != 0) {
      struct statvfs s {};
      const size_t free_bytes = ::statvfs(dir.c_str(), &s) == 0 ? size_t(s.f_bavail) * s.f_frsize : 0;
      ::close(fd_);
      ANVIL_THROW(
          "offload_nvme_path '{}': cannot reserve {} for the swap file of {} ({}; {} free there): free "
          "space, choose another offload_nvme_path, or lower what it holds (e.g. --optim adamw_8bit for "
          "the optimizer state)",
          dir, gib(bytes_), what, std::strerror(rc), gib(free_bytes));
    }
  }
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { worker(); });
}

SwapFile::~SwapFile() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  if (fd_ >= 0) ::close(fd_);
}

uint64_t SwapFile::read_async(void* buffer, size_t n, size_t offset) {
  return queue(false, static_cast<char*>(buffer), n, offset);
}

uint64_t SwapFile::write_async(const void* buffer, size_t n, size_t offset) {
  return queue(true, static_cast<char*>(const_cast<void*>(buffer)), n, offset);
}

uint64_t SwapFile::queue(bool write, char* buffer, size_t n, size_t offset) {
  ANVIL_ASSERT(n % kSwapAlign == 0 && offset % kSwapAlign == 0 &&
                   reinterpret_cast<uintptr_t>(buffer) % kSwapAlign == 0 && offset + n <= bytes_,
               "swap file request of {} bytes at {} (file {} bytes) is not aligned to {} or out of range", n,
               offset, bytes_, kSwapAlign);
  Request r;
  r.write = write, r.buffer = buffer, r.n = n, r.offset = offset;
  r.blocks = (n + block_ - 1) / block_;
  uint64_t ticket = 0;
  {
    std::lock_guard lock(mu_);
    ticket = r.ticket = next_ticket_++;
    if (r.blocks == 0) {  // nothing to move: done once every request before it is
      if (requests_.empty())
        done_ticket_ = ticket;
      else
        requests_.push_back(r);
      return ticket;
    }
    requests_.push_back(r);
  }
  work_cv_.notify_all();
  return ticket;
}

void SwapFile::transfer(const Request& r, size_t block) {
  const size_t begin = block * block_, end = std::min(r.n, begin + block_);
  size_t at = begin;
  while (at < end) {
    const ssize_t got = r.write ? ::pwrite(fd_, r.buffer + at, end - at, off_t(r.offset + at))
                                : ::pread(fd_, r.buffer + at, end - at, off_t(r.offset + at));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      ANVIL_THROW("offload_nvme_path '{}': {} of {} bytes at offset {} of the swap file failed ({})", dir_,
                  r.write ? "write" : "read", end - at, r.offset + at,
                  got < 0 ? std::strerror(errno) : "unexpected end of file");
    at += size_t(got);
  }
}

void SwapFile::worker() {
  std::unique_lock lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] {
      return stop_ || (!requests_.empty() && requests_.front().next_block < requests_.front().blocks);
    });
    if (stop_) return;
    Request& r = requests_.front();
    const size_t block = r.next_block++;
    if (block == 0) r.started = now_seconds();
    const Request copy = r;
    const bool failed = failure_ != nullptr;
    lock.unlock();
    std::exception_ptr error;
    if (!failed) {  // a failed file moves nothing more
      try {
        transfer(copy, block);
      } catch (...) {
        error = std::current_exception();
      }
    }
    lock.lock();
    if (error && !failure_) failure_ = error;
    Request& front = requests_.front();  // still this request: it leaves the queue only when done
    if (++front.done_blocks < front.blocks) continue;
    const double seconds = now_seconds() - front.started;
    (front.write ? totals_.write_seconds : totals_.read_seconds) += seconds;
    (front.write ? totals_.write_bytes : totals_.read_bytes) += front.n;
    done_ticket_ = front.ticket;
    requests_.pop_front();
    while (!requests_.empty() && requests_.front().blocks == 0) {  // empty requests queued behind it
      done_ticket_ = requests_.front().ticket;
      requests_.pop_front();
    }
    done_cv_.notify_all();
    work_cv_.notify_all();
  }
}

void SwapFile::rethrow_failure() {
  if (failure_) std::rethrow_exception(failure_);
}

void SwapFile::wait(uint64_t ticket) {
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [&] { return done_ticket_ >= ticket; });
  rethrow_failure();
}

void SwapFile::wait_all() {
  uint64_t last = 0;
  {
    std::lock_guard lock(mu_);
    last = next_ticket_ - 1;
  }
  wait(last);
}

SwapFile::Totals SwapFile::totals() const {
  std::lock_guard lock(mu_);
  return totals_;
}

std::unique_ptr<SwapFile::Mapping> SwapFile::map(bool writable) {
  wait_all();
  return std::unique_ptr<Mapping>(new Mapping(*this, writable));
}

SwapFile::Mapping::Mapping(SwapFile& f, bool writable) : file_(f), writable_(writable) {
  if (f.bytes_ == 0) return;
  void* p = ::mmap(nullptr, f.bytes_, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, f.fd_, 0);
  ANVIL_REQUIRE(p != MAP_FAILED, "offload_nvme_path '{}': cannot map the {} swap file ({})", f.dir_,
                gib(f.bytes_), std::strerror(errno));
  data_ = static_cast<char*>(p);
  ::madvise(p, f.bytes_, MADV_SEQUENTIAL);
}

void SwapFile::Mapping::sync() {
  if (!data_ || !writable_) return;
  ANVIL_REQUIRE(::msync(data_, file_.bytes_, MS_SYNC) == 0,
                "offload_nvme_path '{}': writing the mapped swap file back failed ({})", file_.dir_,
                std::strerror(errno));
}

SwapFile::Mapping::~Mapping() {
  if (!data_) return;
  // Before direct reads go past the page cache.
  if (writable_ && ::msync(data_, file_.bytes_, MS_SYNC) != 0)
    fmt::print(stderr, "error: offload_nvme_path '{}': writing the mapped swap file back failed ({})\n",
               file_.dir_, std::strerror(errno));
  ::munmap(data_, file_.bytes_);
  ::posix_fadvise(file_.fd_, 0, 0, POSIX_FADV_DONTNEED);
}

}  // namespace anvil::offload
