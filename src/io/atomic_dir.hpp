// Durable file output: checkpoint directories that appear all at once or not at all, and files that
// are on disk (fsynced) before anything refers to them.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

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
// before finish() (an error part way), the partial file is removed so no truncated file is left behind
// (only when it is a regular file: a path naming a device, e.g. /dev/full, is never unlinked).
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
  bool regular_file_ = false;
};

// Write + fsync; throws naming the path. On failure a regular file it created or truncated is removed (a
// device such as /dev/full is left alone).
void write_text_file_synced(const std::string& path, std::string_view text);
// The whole file; throws "<path>: cannot read (<reason>)".
std::string read_text_file(const std::string& path);

// Interrupted saves. A save killed before its commit leaves "<final>.tmp-<pid>" (incomplete); one killed
// between commit()'s two renames leaves "<final>.old-<pid>" (the previous, complete version) and no
// <final>. Neither is a checkpoint to load.
//
// For a directory path whose last component is "<name>.tmp-<digits>" or "<name>.old-<digits>": the path
// of <name> (the directory the save was writing); otherwise "".
std::string interrupted_save_target(const std::string& dir);
// Throws "'<dir>' is an incomplete checkpoint left by an interrupted save; use '<final>' instead" when
// interrupted_save_target(dir) is not empty. Every reader of model and checkpoint directories calls it.
void require_not_interrupted_save(const std::string& dir);
// Cleans the leftovers of interrupted saves directly inside `parent` (a training output_dir), which no
// other process may be writing (the caller holds its lock): removes every "<name>.tmp-<digits>" and
// every "<name>.old-<digits>" whose <name> exists, and renames an "<name>.old-<digits>" whose <name> is
// missing back to <name> (the save died after moving the complete previous version aside). Returns one
// line per action, for the log. Throws naming the path when a removal or rename fails.
std::vector<std::string> clean_interrupted_saves(const std::string& parent);

}  // namespace anvil::io
