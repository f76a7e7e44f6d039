// A whole file memory-mapped read-only, unmapped when the object goes.
#pragma once
#include <cstddef>
#include <functional>
#include <string>

namespace anvil::io {

// Opens `path` read-only, fstats it and maps the whole file (PROT_READ, MAP_PRIVATE); the descriptor
// is closed once mapped (the mapping keeps the file alive). A zero-length file maps nothing: data() is
// nullptr and size() is 0. Movable, not copyable; a moved-from or default-constructed object is empty.
class MappedFile {
 public:
  // Which step failed. NotRegular: fstat succeeded but the path is not a regular file (errnum is 0).
  enum class Step { Open, Stat, NotRegular, Map };
  // Called on failure, before anything is mapped, with the step, its errno and the file size (0 until
  // fstat succeeds). It should throw the caller's own message; if it returns, a generic error is thrown.
  using OnError = std::function<void(Step step, int errnum, size_t file_bytes)>;

  MappedFile() = default;
  MappedFile(const std::string& path, const OnError& on_error);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void reset() noexcept;

  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace anvil::io
