#include "io/safetensors.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "anvil/error.hpp"
#include "io/atomic_dir.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using anvil::DType;
using anvil::io::SafeTensorInfo;
using anvil::io::SafeTensorsReader;
using anvil::io::SafeTensorsWriter;

namespace {

using anvil::test::write_file;

class SafeTensorsTest : public ::testing::Test {
 protected:
  std::string file(const std::string& name) const { return root_ / name; }

  anvil::test::TempDir root_;
};

std::string le64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// A file built by hand: length prefix (the real one unless overridden), header text, data buffer.
void write_raw(const std::string& path, const std::string& header, size_t buffer_size,
               int64_t header_len_override = -1) {
  std::string bytes =
      le64(header_len_override >= 0 ? static_cast<uint64_t>(header_len_override) : header.size());
  bytes += header;
  bytes.append(buffer_size, '\x5a');
  write_file(path, bytes);
}

std::string read_error(const std::string& path) {
  try {
    SafeTensorsReader reader(path);
  } catch (const anvil::Error& e) {
    return e.what();
  }
  return "<no anvil::Error thrown>";
}

void expect_read_error(const std::string& path, const std::string& expected) {
  std::string msg = read_error(path);
  EXPECT_NE(msg.find(path), std::string::npos) << "message does not name the file: " << msg;
  EXPECT_NE(msg.find(expected), std::string::npos) << "expected '" << expected << "' in: " << msg;
}

template <class T>
std::vector<T> copy_out(const SafeTensorsReader& reader, const SafeTensorInfo& t) {
  std::vector<T> values(t.nbytes / sizeof(T));
  std::memcpy(values.data(), reader.data(t), t.nbytes);
  return values;
}

bool python_safetensors_available() {
  return std::system("python3 -c 'import numpy, safetensors.numpy' >/dev/null 2>&1") == 0;
}

}  // namespace

TEST_F(SafeTensorsTest, RoundTripSeveralDtypesAndShapes) {
  struct Case {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<unsigned char> bytes;
  };
  auto bytes_of = [](const auto& values) {
    std::vector<unsigned char> out(values.size() * sizeof(values[0]));
    std::memcpy(out.data(), values.data(), out.size());
    return out;
  };
  std::vector<Case> cases = {
      {"model.w", DType::F32, {2, 3}, bytes_of(std::vector<float>{0, 1, 2, 3, 4, 5.5f})},
      {"half", DType::F16, {4}, bytes_of(std::vector<uint16_t>{0x3C00, 0xC000, 0x3800, 0x7BFF})},
      {"brain", DType::BF16, {2, 1, 2}, bytes_of(std::vector<uint16_t>{0x3F80, 0xBF80, 0x4000, 0x0000})},
      {"i8", DType::I8, {5}, bytes_of(std::vector<int8_t>{-128, -1, 0, 1, 127})},
      {"i32", DType::I32, {3, 1}, bytes_of(std::vector<int32_t>{-7, 0, 123456789})},
      {"u16", DType::U16, {2}, bytes_of(std::vector<uint16_t>{0, 65535})},
      {"scalar", DType::F32, {}, bytes_of(std::vector<float>{3.5f})},
      {"empty", DType::F32, {0, 4}, {}},
  };
  SafeTensorsWriter writer;
  for (const Case& c : cases) {
    std::vector<unsigned char> temporary = c.bytes;  // the writer must copy, not keep the pointer
    writer.add(c.name, c.dtype, c.shape, temporary.data());
    std::fill(temporary.begin(), temporary.end(), 0xEE);
  }
  const std::string path = file("round_trip.safetensors");
  writer.write(path);

  SafeTensorsReader reader(path);
  EXPECT_EQ(reader.path(), path);
  EXPECT_TRUE(reader.metadata().empty());
  ASSERT_EQ(reader.tensors().size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.name);
    const SafeTensorInfo& t = reader.tensors()[i];  // file order == order added
    EXPECT_EQ(t.name, c.name);
    EXPECT_EQ(t.dtype, c.dtype);
    EXPECT_EQ(t.shape, c.shape);
    EXPECT_EQ(t.nbytes, c.bytes.size());
    EXPECT_EQ(&reader.at(c.name), &t);
    EXPECT_EQ(reader.find(c.name), &t);
    EXPECT_EQ(std::memcmp(reader.data(t), c.bytes.data(), c.bytes.size()), 0);
  }
  EXPECT_EQ(reader.at("scalar").numel(), 1);
  EXPECT_EQ(reader.at("empty").numel(), 0);
  EXPECT_EQ(reader.at("model.w").numel(), 6);
  EXPECT_EQ(reader.find("missing"), nullptr);

  // Header padded with spaces to a multiple of 8, so the data buffer starts 8-byte aligned.
  std::string raw = anvil::io::read_text_file(path);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(raw[i]);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(raw[8], '{');
  EXPECT_EQ(raw.size(), 8 + header_len + 24 + 8 + 8 + 5 + 12 + 4 + 4);
}

// add_view keeps the caller's pointer (a memory-mapped input) and writes the same file as add.
TEST_F(SafeTensorsTest, ViewsWriteWhatCopiesWrite) {
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f};
  const std::vector<uint16_t> b = {1, 2, 3};
  SafeTensorsWriter copies, views;
  copies.add("a", DType::F32, {2, 3}, a.data());
  copies.add("b", DType::BF16, {3}, b.data());
  copies.add("empty", DType::F32, {0}, nullptr);
  views.add_view("a", DType::F32, {2, 3}, a.data());
  views.add_view("b", DType::BF16, {3}, b.data());
  views.add_view("empty", DType::F32, {0}, nullptr);
  EXPECT_THROW(views.add_view("a", DType::F32, {1}, a.data()), anvil::Error);  // a name twice
  copies.write(file("copies.safetensors"));
  views.write(file("views.safetensors"));
  EXPECT_EQ(anvil::io::read_text_file(file("copies.safetensors")),
            anvil::io::read_text_file(file("views.safetensors")));
}

TEST_F(SafeTensorsTest, MetadataRoundTrip) {
  SafeTensorsWriter writer;
  writer.set_metadata("format", "anvil");
  writer.set_metadata("step", "42");
  writer.set_metadata("note", "quotes \" and \\ and unicode \u00e9 survive");
  writer.set_metadata("step", "43");  // last value wins
  float x = 1.0f;
  writer.add("x", DType::F32, {1}, &x);
  const std::string path = file("meta.safetensors");
  writer.write(path);

  SafeTensorsReader reader(path);
  std::map<std::string, std::string> expected = {
      {"format", "anvil"}, {"step", "43"}, {"note", "quotes \" and \\ and unicode \u00e9 survive"}};
  EXPECT_EQ(reader.metadata(), expected);
  ASSERT_EQ(reader.tensors().size(), 1u);  // __metadata__ is not a tensor
}

TEST_F(SafeTensorsTest, EmptyFileWithNoTensors) {
  const std::string path = file("none.safetensors");
  SafeTensorsWriter().write(path);
  SafeTensorsReader reader(path);
  EXPECT_TRUE(reader.tensors().empty());
}

TEST_F(SafeTensorsTest, ReadsUnpaddedHeaderAndUnalignedTensorsFromOtherWriters) {
  // Header length 97 (odd) and a 1-byte tensor first, so "f" is unaligned; "e" is an empty tensor whose
  // offset falls inside "f", which occupies no bytes and so is not an overlap.
  const std::string header =
      R"({"b":{"dtype":"I8","shape":[1],"data_offsets":[0,1]},"f":{"dtype":"F32","shape":[2],"data_offsets":[1,9]},)"
      R"("e":{"dtype":"F32","shape":[0],"data_offsets":[3,3]}})";
  std::string bytes = le64(header.size()) + header;
  bytes += '\x07';
  float f[2] = {1.25f, -2.5f};
  bytes.append(reinterpret_cast<const char*>(f), sizeof(f));
  const std::string path = file("unaligned.safetensors");
  write_file(path, bytes);

  SafeTensorsReader reader(path);
  ASSERT_EQ(reader.tensors().size(), 3u);
  EXPECT_EQ(reader.tensors()[0].name, "b");
  EXPECT_EQ(reader.tensors()[1].name, "f");
  EXPECT_EQ(reader.tensors()[2].name, "e");
  EXPECT_EQ(copy_out<int8_t>(reader, reader.at("b")), std::vector<int8_t>{7});
  EXPECT_EQ(copy_out<float>(reader, reader.at("f")), (std::vector<float>{1.25f, -2.5f}));
}

TEST_F(SafeTensorsTest, TensorsAreListedInBufferOrder) {
  const std::string header =
      R"({"second":{"dtype":"I8","shape":[2],"data_offsets":[2,4]},"first":{"dtype":"I8","shape":[2],"data_offsets":[0,2]}})";
  const std::string path = file("order.safetensors");
  write_raw(path, header, 4);
  SafeTensorsReader reader(path);
  ASSERT_EQ(reader.tensors().size(), 2u);
  EXPECT_EQ(reader.tensors()[0].name, "first");
  EXPECT_EQ(reader.tensors()[1].name, "second");
  EXPECT_EQ(reader.at("second").offset, 2u);
}

TEST_F(SafeTensorsTest, AtNamesPathAndTensor) {
  const std::string path = file("at.safetensors");
  SafeTensorsWriter().write(path);
  SafeTensorsReader reader(path);
  try {
    reader.at("nope");
    FAIL() << "expected anvil::Error";
  } catch (const anvil::Error& e) {
    EXPECT_EQ(std::string(e.what()), path + ": tensor 'nope' not found");
  }
}

TEST_F(SafeTensorsTest, FileLevelErrorsNameThePath) {
  expect_read_error(file("does_not_exist.safetensors"), "cannot open");
  expect_read_error(root_.str(), "not a regular file");

  const std::string empty = file("empty.safetensors");
  write_file(empty, "");
  expect_read_error(empty, "too short");

  const std::string short_file = file("short.safetensors");
  write_file(short_file, std::string("\x10\0\0\0\0\0\0", 7));
  expect_read_error(short_file, "too short");

  const std::string long_header = file("long_header.safetensors");
  write_raw(long_header, "{}", 0, /*header_len_override=*/1000);
  expect_read_error(long_header, "header length 1000 is larger than the 2 bytes");

  const std::string huge_header = file("huge_header.safetensors");
  write_raw(huge_header, "{}", 0, /*header_len_override=*/INT64_MAX);  // must not overflow
  expect_read_error(huge_header, "is larger than");
}

TEST_F(SafeTensorsTest, MalformedHeadersGiveClearErrors) {
  struct Case {
    const char* label;
    std::string header;
    size_t buffer_size;
    std::string expected;
  };
  const std::string ok_w = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  std::vector<Case> cases = {
      {"truncated json", R"({"w": {"dtype": )", 0, "header is not valid JSON"},
      {"not json at all", "hello world", 0, "header is not valid JSON"},
      {"invalid utf-8", "{\"w\xff\": 1}", 0, "header is not valid JSON"},
      {"array header", "[1, 2]", 0, "header must be a JSON object, found array"},
      {"string header", "\"x\"", 0, "header must be a JSON object, found string"},
      {"entry not object", R"({"w": 5})", 0, "tensor 'w': entry must be an object"},
      {"missing dtype", R"({"w":{"shape":[2],"data_offsets":[0,8]}})", 8, "tensor 'w': missing 'dtype'"},
      {"missing shape", R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", 8, "tensor 'w': missing 'shape'"},
      {"missing offsets", R"({"w":{"dtype":"F32","shape":[2]}})", 8, "tensor 'w': missing 'data_offsets'"},
      {"dtype not string", R"({"w":{"dtype":32,"shape":[2],"data_offsets":[0,8]}})", 8,
       "tensor 'w': 'dtype' must be a string"},
      {"I64 of the wrong size", R"({"w":{"dtype":"I64","shape":[2],"data_offsets":[0,8]}})", 8,
       "tensor 'w': 'data_offsets' [0, 8] span 8 bytes but I64 [2] needs 16"},
      {"overlap with an I64 tensor",
       "{" + ok_w + R"(,"ids":{"dtype":"I64","shape":[1],"data_offsets":[4,12]}})", 12,
       "tensors 'w' [0, 8] and 'ids' [4, 12] overlap"},
      {"unknown dtype", R"({"w":{"dtype":"Q4_K","shape":[1],"data_offsets":[0,8]}})", 8,
       "tensor 'w': dtype 'Q4_K' is not supported"},
      {"shape not array", R"({"w":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", 8,
       "tensor 'w': 'shape' must be an array"},
      {"shape of strings", R"({"w":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", 8,
       "tensor 'w': 'shape' [\"2\"] must hold integers"},
      {"shape of floats", R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8,
       "tensor 'w': 'shape' [2.0] must hold integers"},
      {"negative dim", R"({"w":{"dtype":"F32","shape":[-1,2],"data_offsets":[0,8]}})", 8,
       "tensor 'w': 'shape' [-1,2] has a negative dim"},
      {"offsets not array", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":"0,8"}})", 8,
       "tensor 'w': 'data_offsets' must be [begin, end]"},
      {"one offset", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8,
       "tensor 'w': 'data_offsets' must be [begin, end]"},
      {"three offsets", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8,16]}})", 16,
       "tensor 'w': 'data_offsets' must be [begin, end]"},
      {"negative offset", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[-4,0]}})", 8,
       "tensor 'w': 'data_offsets' must be [begin, end]"},
      {"float offsets", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0.0,8.0]}})", 8,
       "tensor 'w': 'data_offsets' must be [begin, end]"},
      {"end before begin", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 8,
       "tensor 'w': 'data_offsets' [8, 4] end before begin"},
      {"nbytes mismatch", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8,
       "tensor 'w': 'data_offsets' [0, 4] span 4 bytes but F32 [2] needs 8"},
      {"nbytes overflow", R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8,
       "tensor 'w': shape [4294967296, 4294967296] has too many elements"},
      {"beyond buffer (truncated)", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8,
       "tensor 'w': 'data_offsets' [0, 16] reach past the end of the 8-byte data buffer"},
      {"overlap", "{" + ok_w + R"(,"v":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12,
       "tensors 'w' [0, 8] and 'v' [4, 12] overlap"},
      {"contained overlap",
       R"({"big":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"small":{"dtype":"I8","shape":[1],"data_offsets":[15,16]},)"
       R"("x":{"dtype":"I8","shape":[1],"data_offsets":[4,5]}})",
       16, "overlap"},
      {"duplicate names", "{" + ok_w + "," + ok_w + "}", 8, "'w' appears more than once"},
      {"metadata not object", R"({"__metadata__": ["a"]})", 0, "'__metadata__' must be an object of strings"},
      {"metadata value not string", R"({"__metadata__": {"step": 5}})", 0,
       "'__metadata__' value for 'step' must be a string"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.label);
    const std::string path = file(fmt::format("bad_{}.safetensors", i));
    write_raw(path, c.header, c.buffer_size);
    expect_read_error(path, c.expected);
  }
}

// Dtypes of the format that Anvil cannot hold (Hugging Face BERT checkpoints carry an int64 position_ids
// buffer): the file opens, they are validated but not listed, and at() names their dtype.
TEST_F(SafeTensorsTest, OtherFormatDtypesAreValidatedButNotListed) {
  const std::string path = file("other_dtypes.safetensors");
  write_raw(path,
            R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("embeddings.position_ids":{"dtype":"I64","shape":[1,3],"data_offsets":[8,32]},)"
            R"("d":{"dtype":"F64","shape":[1],"data_offsets":[32,40]},)"
            R"("mask":{"dtype":"BOOL","shape":[3],"data_offsets":[40,43]}})",
            43);
  SafeTensorsReader reader(path);
  ASSERT_EQ(reader.tensors().size(), 1u);
  EXPECT_EQ(reader.tensors()[0].name, "w");
  EXPECT_EQ(reader.at("w").nbytes, 8u);
  EXPECT_EQ(reader.unsupported(), (std::map<std::string, std::string, std::less<>>{
                                      {"d", "F64"}, {"embeddings.position_ids", "I64"}, {"mask", "BOOL"}}));
  EXPECT_EQ(reader.find("embeddings.position_ids"), nullptr);
  try {
    reader.at("embeddings.position_ids");
    FAIL() << "expected anvil::Error";
  } catch (const anvil::Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("tensor 'embeddings.position_ids' has dtype I64, which cannot be loaded"),
        std::string::npos)
        << e.what();
  }
}

// Inputs found by fuzzing (tests/fuzz/): clean errors instead of undefined behaviour or a stack overflow.
TEST_F(SafeTensorsTest, FuzzFindingsGiveClearErrors) {
  // numel() overflowed int64 (UB) for a shape whose zero dim made the byte count 0.
  const std::string zero_dim = file("zero_dim.safetensors");
  write_raw(zero_dim, R"({"w":{"dtype":"F32","shape":[4611686018427387904,2,0],"data_offsets":[0,0]}})", 0);
  expect_read_error(zero_dim, "tensor 'w': shape [4611686018427387904, 2, 0] has too many elements");
  SafeTensorsWriter writer;
  EXPECT_THROW(writer.add("w", DType::F32, {int64_t{1} << 62, 2, 0}, nullptr), anvil::Error);

  // Error messages dump() the offending value, which recursed once per nesting level.
  const std::string nested = "[" + std::string(100000, '[') + std::string(100000, ']') + "]";
  const std::string deep = file("deep.safetensors");
  write_raw(deep, R"({"w":)" + nested + "}", 0);
  expect_read_error(deep, "header nests JSON deeper than 128 levels");
  const std::string deep_meta = file("deep_meta.safetensors");
  write_raw(deep_meta, R"({"__metadata__":{"k":)" + nested + "}}", 0);
  expect_read_error(deep_meta, "header nests JSON deeper than 128 levels");
}

TEST_F(SafeTensorsTest, WriterRejectsBadInput) {
  SafeTensorsWriter writer;
  float values[4] = {};
  writer.add("w", DType::F32, {4}, values);
  EXPECT_THROW(writer.add("w", DType::F32, {4}, values), anvil::Error);
  EXPECT_THROW(writer.add("", DType::F32, {4}, values), anvil::Error);
  EXPECT_THROW(writer.add("__metadata__", DType::F32, {4}, values), anvil::Error);
  EXPECT_THROW(writer.add("q", DType::NF4, {4}, values), anvil::Error);
  EXPECT_THROW(writer.add("neg", DType::F32, {-1, 4}, values), anvil::Error);
  EXPECT_THROW(writer.add("null", DType::F32, {4}, nullptr), anvil::Error);
  writer.add("empty_null_ok", DType::F32, {0}, nullptr);

  const std::string bad_path = file("no/such/dir/out.safetensors");
  try {
    writer.write(bad_path);
    FAIL() << "expected anvil::Error";
  } catch (const anvil::Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad_path), std::string::npos) << e.what();
  }

  SafeTensorsWriter bad_utf8;
  bad_utf8.add("w\xff", DType::F32, {1}, values);
  const std::string path = file("bad_utf8.safetensors");
  try {
    bad_utf8.write(path);
    FAIL() << "expected anvil::Error";
  } catch (const anvil::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(path));
}

// Interop with the reference implementation, both directions.
TEST_F(SafeTensorsTest, PythonSafetensorsLoadsWriterOutput) {
  if (!python_safetensors_available()) GTEST_SKIP() << "python3 with numpy and safetensors not available";
  SafeTensorsWriter writer;
  std::vector<float> w = {0, 1, 2, 3, 4, 5};
  std::vector<uint16_t> h = {0x3C00, 0xC000, 0x3800, 0x7BFF};  // 1, -2, 0.5, 65504
  std::vector<int8_t> i8 = {-128, -1, 0, 1, 127};              // 5 bytes: what follows is unaligned
  std::vector<int32_t> i32 = {-7, 0, 123456789};
  std::vector<uint16_t> u16 = {0, 65535};
  float scalar = 3.5f;
  writer.add("w", DType::F32, {2, 3}, w.data());
  writer.add("h", DType::F16, {4}, h.data());
  writer.add("i8", DType::I8, {5}, i8.data());
  writer.add("i32", DType::I32, {3, 1}, i32.data());
  writer.add("u16", DType::U16, {2}, u16.data());
  writer.add("scalar", DType::F32, {}, &scalar);
  writer.add("empty", DType::F32, {0, 4}, nullptr);
  writer.set_metadata("format", "anvil");
  writer.set_metadata("step", "42");
  const std::string path = file("for_python.safetensors");
  writer.write(path);

  const std::string script = file("check.py");
  anvil::io::write_text_file_synced(script, R"(import sys
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file
t = load_file(sys.argv[1])
assert sorted(t) == ["empty", "h", "i32", "i8", "scalar", "u16", "w"], sorted(t)
assert t["w"].dtype == np.float32 and (t["w"] == np.arange(6, dtype=np.float32).reshape(2, 3)).all()
assert t["h"].dtype == np.float16 and t["h"].tolist() == [1.0, -2.0, 0.5, 65504.0]
assert t["i8"].dtype == np.int8 and t["i8"].tolist() == [-128, -1, 0, 1, 127]
assert t["i32"].dtype == np.int32 and t["i32"].tolist() == [[-7], [0], [123456789]]
assert t["u16"].dtype == np.uint16 and t["u16"].tolist() == [0, 65535]
assert t["scalar"].shape == () and t["scalar"] == 3.5
assert t["empty"].shape == (0, 4) and t["empty"].dtype == np.float32
with safe_open(sys.argv[1], framework="np") as f:
    assert f.metadata() == {"format": "anvil", "step": "42"}, f.metadata()
)");
  EXPECT_EQ(std::system(fmt::format("python3 '{}' '{}'", script, path).c_str()), 0);
}

TEST_F(SafeTensorsTest, ReadsPythonSafetensorsOutput) {
  if (!python_safetensors_available()) GTEST_SKIP() << "python3 with numpy and safetensors not available";
  const std::string path = file("from_python.safetensors");
  const std::string script = file("make.py");
  anvil::io::write_text_file_synced(script, R"(import sys
import numpy as np
from safetensors.numpy import save_file
save_file({
    "a": np.arange(6, dtype=np.float32).reshape(2, 3),
    "b": np.array([1, -2, 3], dtype=np.int8),
    "c": np.array([7, 65535], dtype=np.uint16),
    "s": np.array(2.5, dtype=np.float32),
    "z": np.zeros((0, 3), dtype=np.float16),
}, sys.argv[1], metadata={"k": "v"})
)");
  ASSERT_EQ(std::system(fmt::format("python3 '{}' '{}'", script, path).c_str()), 0);

  SafeTensorsReader reader(path);
  EXPECT_EQ(reader.metadata(), (std::map<std::string, std::string>{{"k", "v"}}));
  EXPECT_EQ(reader.tensors().size(), 5u);
  const SafeTensorInfo& a = reader.at("a");
  EXPECT_EQ(a.dtype, DType::F32);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(copy_out<float>(reader, a), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(copy_out<int8_t>(reader, reader.at("b")), (std::vector<int8_t>{1, -2, 3}));
  EXPECT_EQ(copy_out<uint16_t>(reader, reader.at("c")), (std::vector<uint16_t>{7, 65535}));
  EXPECT_TRUE(reader.at("s").shape.empty());
  EXPECT_EQ(copy_out<float>(reader, reader.at("s")), std::vector<float>{2.5f});
  EXPECT_EQ(reader.at("z").dtype, DType::F16);
  EXPECT_EQ(reader.at("z").numel(), 0);
}
