// Durable file output: checkpoint directories that appear all at once or not at all, and files that
// are on disk (fsynced) before anything refers to them.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace anvil::io {

// Files are written into a temporary sibling directory "<final>.tmp-<pid>"; commit() fsyncs every
// file and the directory, then renames it to <final> (an existing <final> is first renamed to
// "<final>.old-<pid>" and removed after the rename succeeds), and fsyncs the parent directory.
// If commit() is never called (an exception during the save), the destructor removes the temporary
// directory. One process must not have two AtomicDirectory objects for the same final path at once.
class AtomicDirectory {
 public:
  // Creates the parents as needed; throws naming the path on failure, or if <final> exists and is
  // not a directory (we never replace a plain file with a checkpoint).
  explicit AtomicDirectory(std::string final_path);
  AtomicDirectory(const AtomicDirectory&) = delete;
  AtomicDirectory& operator=(const AtomicDirectory&) = delete;
  ~AtomicDirectory();

  // The temporary directory to write into.
  const std::string& path() const { return temp_path_; }
  const std::string& final_path() const { return final_path_; }
  // path() + "/" + name
  std::string file(std::string_view name) const;

  void commit();

 private:
  std::string final_path_;
  std::string temp_path_;
  bool committed_ = false;
};

// Writes a file from scratch (truncating any old one) and fsyncs it before close. If it is destroyed
// before finish() (an error part way), the partial file is removed so no truncated file is left behind.
class SyncedFileWriter {
 public:
  explicit SyncedFileWriter(std::string path);  // throws "<path>: cannot open for writing (...)"
  SyncedFileWriter(const SyncedFileWriter&) = delete;
  SyncedFileWriter& operator=(const SyncedFileWriter&) = delete;
  ~SyncedFileWriter();

  void write(const void* data, size_t nbytes);  // throws naming the path
  void write(std::string_view text) { write(text.data(), text.size()); }
  void finish();  // fsync + close; throws naming the path

 private:
  std::string path_;
  int fd_ = -1;
};

// Write + fsync; throws naming the path.
void write_text_file_synced(const std::string& path, std::string_view text);
// The whole file; throws "<path>: cannot read (<reason>)".
std::string read_text_file(const std::string& path);

}  // namespace anvil::io
