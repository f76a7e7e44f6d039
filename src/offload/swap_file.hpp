// A swap file for state kept out of host memory (NVMe offload, DeepSpeed's `offload_optimizer.device nvme`;
// docs/memory.md). The file is created in the given directory and unlinked at once, so nothing is left
// behind, even after a crash; its space is reserved up front (a full disk fails at start, not mid-run).
// Reads and writes run on `threads` I/O threads in requests of `block_bytes` (DeepSpeed's aio thread_count
// and block_size), with O_DIRECT where the filesystem allows it: the data bypasses the page cache, as
// DeepSpeed's libaio does, so the file's pages never occupy host memory. Where O_DIRECT is refused (tmpfs,
// some network filesystems) the I/O is buffered and direct() says so.
//
// Requests run in the order queued, one at a time (its blocks in parallel): a read queued after a write of
// the same buffer sees that buffer fully written out first.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace anvil::offload {

// Buffers, offsets and sizes of direct I/O are multiples of this.
constexpr size_t kSwapAlign = 4096;
constexpr size_t swap_aligned(size_t bytes) {
  return (bytes + kSwapAlign - 1) / kSwapAlign * kSwapAlign;
}

// Host memory aligned for direct I/O (freed with the object).
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t bytes);
  ~AlignedBuffer();
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  void* get() const { return p_; }
  size_t size() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

class SwapFile {
 public:
  // A file of `bytes` (rounded up to kSwapAlign) in directory `dir`, named after `name` while it is being
  // created. Throws, naming the directory, when it does not exist, is not writable or lacks the space.
  // `try_direct` false: buffered I/O even where direct I/O would work (tests of that path). `what` names
  // the contents in those errors.
  SwapFile(const std::string& dir, const std::string& name, size_t bytes, size_t block_bytes, int threads,
           bool try_direct = true, const std::string& what = "the optimizer state");
  ~SwapFile();
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  size_t bytes() const { return bytes_; }
  bool direct() const { return direct_; }
  const std::string& dir() const { return dir_; }

  // Queue a transfer of `n` bytes between `buffer` and the file at `offset` (all multiples of kSwapAlign;
  // `buffer` from AlignedBuffer) and return its ticket; `buffer` must stay untouched until it is waited for.
  uint64_t read_async(void* buffer, size_t n, size_t offset);
  uint64_t write_async(const void* buffer, size_t n, size_t offset);
  // Waits for request `ticket` and every one before it. Throws the first I/O error met (naming the
  // directory, the offset and the system's message); a file that failed stays failed.
  void wait(uint64_t ticket);
  void wait_all();

  // The whole file mapped into memory, for checkpoints (waits for the queued requests first). A writable
  // mapping is synced to the file when it goes; either way the file's pages are then dropped from the
  // page cache.
  class Mapping {
   public:
    ~Mapping();
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    char* data() const { return data_; }
    // Writes a writable mapping's changes to the file; throws on an I/O error (the destructor syncs too,
    // reporting a failure on stderr only).
    void sync();

   private:
    friend class SwapFile;
    Mapping(SwapFile& f, bool writable);
    SwapFile& file_;
    char* data_ = nullptr;
    bool writable_ = false;
  };
  std::unique_ptr<Mapping> map(bool writable);

  // Seconds the I/O threads spent in reads and writes (wall clock of the requests), and bytes moved.
  struct Totals {
    double read_seconds = 0, write_seconds = 0;
    uint64_t read_bytes = 0, write_bytes = 0;
  };
  Totals totals() const;

 private:
  struct Request {
    bool write = false;
    char* buffer = nullptr;
    size_t n = 0, offset = 0;
    uint64_t ticket = 0;
    size_t next_block = 0, blocks = 0, done_blocks = 0;
    double started = 0;
  };
  uint64_t queue(bool write, char* buffer, size_t n, size_t offset);
  void worker();
  void transfer(const Request& r, size_t block);
  void rethrow_failure();

  std::string dir_;
  int fd_ = -1;
  size_t bytes_ = 0, block_ = 0;
  bool direct_ = false;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Request> requests_;
  uint64_t next_ticket_ = 1, done_ticket_ = 0;
  bool stop_ = false;
  std::exception_ptr failure_;
  Totals totals_;
  std::vector<std::thread> threads_;
};

}  // namespace anvil::offload
