#include "io/atomic_dir.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "anvil/error.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using anvil::io::AtomicDirectory;
using anvil::io::read_text_file;
using anvil::io::write_text_file_synced;

namespace {

// A fresh directory per test, removed afterwards.
class AtomicDirTest : public ::testing::Test {
 protected:
  std::string under_root(const std::string& name) const { return root_ / name; }
  // Names in root_, to check that no temporary or old directories are left next to the checkpoint.
  std::vector<std::string> root_entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(root_.path())) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  anvil::test::TempDir root_;
};

template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const anvil::Error& e) {
    return e.what();
  }
  return "<no anvil::Error thrown>";
}

}  // namespace

TEST_F(AtomicDirTest, CommitProducesFinalDirectoryWithFiles) {
  const std::string final_path = under_root("ckpt");
  AtomicDirectory dir(final_path);
  EXPECT_NE(dir.path(), final_path);
  EXPECT_TRUE(fs::is_directory(dir.path()));
  EXPECT_FALSE(fs::exists(final_path));
  EXPECT_EQ(dir.file("a.txt"), dir.path() + "/a.txt");

  write_text_file_synced(dir.file("a.txt"), "alpha");
  fs::create_directory(dir.file("sub"));
  write_text_file_synced(dir.file("sub/b.json"), "{\"b\": 1}\n");
  dir.commit();

  EXPECT_TRUE(fs::is_directory(final_path));
  EXPECT_EQ(read_text_file(final_path + "/a.txt"), "alpha");
  EXPECT_EQ(read_text_file(final_path + "/sub/b.json"), "{\"b\": 1}\n");
  EXPECT_FALSE(fs::exists(dir.path()));
  EXPECT_EQ(root_entries(), std::vector<std::string>{"ckpt"});
}

TEST_F(AtomicDirTest, ExceptionBeforeCommitLeavesNothing) {
  const std::string final_path = under_root("ckpt");
  std::string temp_path;
  try {
    AtomicDirectory dir(final_path);
    temp_path = dir.path();
    write_text_file_synced(dir.file("weights.bin"), "partial");
    throw std::runtime_error("simulated failure during save");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(temp_path.empty());
  EXPECT_FALSE(fs::exists(temp_path));
  EXPECT_FALSE(fs::exists(final_path));
  EXPECT_TRUE(root_entries().empty());
}

TEST_F(AtomicDirTest, FailedSaveKeepsPreviousCheckpoint) {
  const std::string final_path = under_root("ckpt");
  {
    AtomicDirectory dir(final_path);
    write_text_file_synced(dir.file("step.txt"), "100");
    dir.commit();
  }
  {
    AtomicDirectory dir(final_path);
    write_text_file_synced(dir.file("step.txt"), "200");
    // destroyed without commit
  }
  EXPECT_EQ(read_text_file(final_path + "/step.txt"), "100");
  EXPECT_EQ(root_entries(), std::vector<std::string>{"ckpt"});
}

TEST_F(AtomicDirTest, CommitReplacesExistingCheckpoint) {
  const std::string final_path = under_root("ckpt");
  {
    AtomicDirectory dir(final_path);
    write_text_file_synced(dir.file("only_in_old.txt"), "old");
    write_text_file_synced(dir.file("step.txt"), "100");
    dir.commit();
  }
  {
    AtomicDirectory dir(final_path);
    write_text_file_synced(dir.file("only_in_new.txt"), "new");
    write_text_file_synced(dir.file("step.txt"), "200");
    dir.commit();
  }
  EXPECT_EQ(read_text_file(final_path + "/step.txt"), "200");
  EXPECT_EQ(read_text_file(final_path + "/only_in_new.txt"), "new");
  EXPECT_FALSE(fs::exists(final_path + "/only_in_old.txt"));
  EXPECT_EQ(root_entries(), std::vector<std::string>{"ckpt"});  // no .old-<pid> or .tmp-<pid> left
}

TEST_F(AtomicDirTest, CreatesParentsAndIgnoresTrailingSlash) {
  const std::string final_path = under_root("runs/exp1/step-10");
  AtomicDirectory dir(final_path + "/");
  EXPECT_EQ(dir.final_path(), final_path);
  EXPECT_EQ(dir.path(), fmt::format("{}.tmp-{}", final_path, ::getpid()));
  write_text_file_synced(dir.file("x"), "1");
  dir.commit();
  EXPECT_EQ(read_text_file(final_path + "/x"), "1");
}

TEST_F(AtomicDirTest, StaleTemporaryDirectoryIsCleared) {
  const std::string final_path = under_root("ckpt");
  const std::string stale = fmt::format("{}.tmp-{}", final_path, ::getpid());
  fs::create_directories(stale);
  write_text_file_synced(stale + "/junk.txt", "from a crashed run");
  AtomicDirectory dir(final_path);
  write_text_file_synced(dir.file("a.txt"), "a");
  dir.commit();
  EXPECT_FALSE(fs::exists(final_path + "/junk.txt"));
  EXPECT_TRUE(fs::exists(final_path + "/a.txt"));
}

TEST_F(AtomicDirTest, RefusesToReplaceAPlainFile) {
  const std::string final_path = under_root("not_a_dir");
  write_text_file_synced(final_path, "precious");
  std::string msg = error_message([&] { AtomicDirectory dir(final_path); });
  EXPECT_NE(msg.find(final_path), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a directory"), std::string::npos) << msg;
  EXPECT_EQ(read_text_file(final_path), "precious");
}

TEST_F(AtomicDirTest, UncreatableParentNamesPath) {
  const std::string blocker = under_root("file");
  write_text_file_synced(blocker, "x");
  const std::string final_path = blocker + "/ckpt";  // parent is a file, so it cannot be created
  std::string msg = error_message([&] { AtomicDirectory dir(final_path); });
  EXPECT_NE(msg.find(final_path), std::string::npos) << msg;
}

TEST_F(AtomicDirTest, TextFileRoundTripAndErrors) {
  const std::string path = under_root("note.txt");
  write_text_file_synced(path, std::string("line1\nline2\0binary", 18));
  EXPECT_EQ(read_text_file(path), std::string("line1\nline2\0binary", 18));
  write_text_file_synced(path, "short");  // truncates
  EXPECT_EQ(read_text_file(path), "short");

  const std::string missing = under_root("missing.txt");
  std::string msg = error_message([&] { read_text_file(missing); });
  EXPECT_NE(msg.find(missing + ": cannot read ("), std::string::npos) << msg;

  const std::string unwritable = under_root("no/such/dir/file.txt");
  msg = error_message([&] { write_text_file_synced(unwritable, "x"); });
  EXPECT_NE(msg.find(unwritable), std::string::npos) << msg;

  msg = error_message([&] { read_text_file(root_.str()); });  // a directory
  EXPECT_NE(msg.find(root_.str() + ": cannot read ("), std::string::npos) << msg;
}

// A write that fails on a device (/dev/full is always full) throws naming it, and the clean-up of the partial
// file never unlinks the device node itself (it once did: unlink("/dev/full") as root).
TEST_F(AtomicDirTest, FailedWriteToADeviceThrowsAndLeavesTheDevice) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  std::string msg = error_message([&] { write_text_file_synced("/dev/full", "summary"); });
  EXPECT_NE(msg.find("/dev/full: write failed (No space left on device)"), std::string::npos) << msg;
  EXPECT_TRUE(fs::is_character_file("/dev/full"));
}

TEST(InterruptedSave, TemporaryNamesAreRecognised) {
  using anvil::io::interrupted_save_target;
  EXPECT_EQ(interrupted_save_target("runs/x/checkpoint-20.tmp-4242"), "runs/x/checkpoint-20");
  EXPECT_EQ(interrupted_save_target("runs/x/checkpoint-20.tmp-4242/"), "runs/x/checkpoint-20");
  EXPECT_EQ(interrupted_save_target("runs/x/checkpoint-20.old-7/."), "runs/x/checkpoint-20");
  EXPECT_EQ(interrupted_save_target("checkpoint-3.old-1"), "checkpoint-3");
  for (const char* fine : {"runs/x/checkpoint-20", "runs/x/checkpoint-20/", "a.tmp-", "a.tmp-12b", ".tmp-12",
                           "gpt2", "a.tmp-1/b", ""})
    EXPECT_EQ(interrupted_save_target(fine), "") << fine;
  const std::string msg =
      error_message([] { anvil::io::require_not_interrupted_save("r/checkpoint-5.tmp-99"); });
  EXPECT_NE(msg.find("'r/checkpoint-5.tmp-99' is an incomplete checkpoint left by an interrupted save"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("use 'r/checkpoint-5' instead"), std::string::npos) << msg;
}

// Under the output_dir lock every leftover is stale: temporaries go, a checkpoint moved aside by a save that
// died before its second rename comes back, one whose replacement landed goes.
TEST_F(AtomicDirTest, InterruptedSavesAreCleanedUp) {
  for (const char* d : {"checkpoint-1.tmp-5", "checkpoint-2", "checkpoint-2.old-6", "checkpoint-3.old-7",
                        "checkpoint-4", "keep.tmp-x"})
    fs::create_directories(under_root(d));
  write_text_file_synced(under_root("checkpoint-1.tmp-5/model.safetensors"), "partial");
  write_text_file_synced(under_root("checkpoint-3.old-7/model.safetensors"), "complete");
  write_text_file_synced(under_root("notes.txt"), "mine");
  const std::vector<std::string> notes = anvil::io::clean_interrupted_saves(root_.str());
  EXPECT_EQ(notes.size(), 3u);
  EXPECT_EQ(root_entries(), (std::vector<std::string>{"checkpoint-2", "checkpoint-3", "checkpoint-4",
                                                      "keep.tmp-x", "notes.txt"}));
  EXPECT_EQ(read_text_file(under_root("checkpoint-3/model.safetensors")), "complete");
  EXPECT_TRUE(anvil::io::clean_interrupted_saves(root_.str()).empty());
}
