// Memory history: the trace writer and reader (format, peak, validation of every line), the HTML
// report's content, and `anvil memory-report` from the command line.
#include "memory/memory_trace.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "memory/memory_report.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

namespace fs = std::filesystem;
using M = MemoryCategory;
constexpr size_t MiB = size_t{1} << 20;

// A training step's history as the trainer records it: `layers` blocks, the odd ones checkpointed
// (forward keeps only the block input; recompute rebuilds the rest just before backward).
void write_step(MemoryTrace& t, int layers) {
  t.buffer("params", M::Weights, 48 * MiB);
  t.buffer("grads", M::Gradients, 48 * MiB);
  t.buffer("adamw.exp_avg", M::OptimizerState, 48 * MiB);
  t.buffer("adamw.exp_avg_sq", M::OptimizerState, 48 * MiB);
  t.buffer("backward_scratch", M::Workspace, 12 * MiB);
  t.buffer("tokens[0]", M::Data, MiB / 4);
  t.buffer("activations", M::Activations, size_t(layers) * 24 * MiB + 16 * MiB);
  t.buffer("recompute", M::Recompute, 20 * MiB);
  std::vector<std::vector<int>> saved(static_cast<size_t>(layers));
  t.phase("forward", -1);
  const int emb = t.alloc("embedding.out", M::Activations, 2 * MiB, -1, "forward");
  for (int l = 0; l < layers; ++l) {
    t.phase("forward", l);
    saved[size_t(l)].push_back(t.alloc(fmt::format("h.{}.input", l), M::Activations, 2 * MiB, l, "forward"));
    if (l % 2 == 0)
      for (const char* part : {"ln_1", "attn.qkv", "attn.probs", "mlp.fc"})
        saved[size_t(l)].push_back(
            t.alloc(fmt::format("h.{}.{}", l, part), M::Activations, 5 * MiB, l, "forward"));
  }
  t.phase("loss", -1);
  const int logits = t.alloc("logits", M::Activations, 12 * MiB, -1, "loss");
  t.free(logits, "loss");
  for (int l = layers - 1; l >= 0; --l) {
    std::vector<int> rec;
    if (l % 2 == 1) {
      t.phase("recompute", l);
      for (const char* part : {"ln_1", "attn.qkv", "attn.probs", "mlp.fc"})
        rec.push_back(
            t.alloc(fmt::format("h.{}.{} (recomputed)", l, part), M::Recompute, 5 * MiB, l, "recompute"));
    }
    t.phase("backward", l);
    for (int id : rec) t.free(id, "backward");
    for (auto it = saved[size_t(l)].rbegin(); it != saved[size_t(l)].rend(); ++it) t.free(*it, "backward");
  }
  t.phase("backward", -1);
  t.free(emb, "backward");
  t.phase("optimizer", -1);
}

std::string header(size_t plan = 1000) {
  return fmt::format(
      "{{\"type\":\"header\",\"version\":1,\"device\":\"cpu\",\"plan_bytes\":{},\"context_overhead_bytes\":0,"
      "\"step\":3}}\n",
      plan);
}

TEST(MemoryTrace, RoundTrip) {
  test::TempDir dir;
  const std::string path = dir / "trace.jsonl";
  {
    MemoryTrace t(path, "cuda (NVIDIA H100 \"80GB\")", 4096, 512, 7);
    t.buffer("w", M::Weights, 1000);
    t.buffer("opt", M::OptimizerState, 300);
    t.buffer("act", M::Activations, 2000);
    t.buffer("scratch", M::Workspace, 64, false);  // overridden: step data
    t.phase("forward", 0);
    const int a = t.alloc("h.0.x", M::Activations, 400, 0, "forward");
    const int b = t.alloc("h.0.y", M::Recompute, 100, 0, "recompute");
    t.free(a, "backward");
    t.phase("optimizer");
    EXPECT_EQ(b, 1);
    EXPECT_EQ(t.persistent_bytes(), 1300u);
    EXPECT_EQ(t.live_bytes(), 100u);
    t.finish();
    EXPECT_FALSE(fs::exists(path + ".tmp-" + std::to_string(::getpid())));
  }
  const MemoryTraceData d = read_memory_trace(path);
  EXPECT_EQ(d.source, path);
  EXPECT_EQ(d.device, "cuda (NVIDIA H100 \"80GB\")");
  EXPECT_EQ(d.plan_bytes, 4096u);
  EXPECT_EQ(d.context_overhead_bytes, 512u);
  EXPECT_EQ(d.step, 7);
  ASSERT_EQ(d.buffers.size(), 4u);
  EXPECT_EQ(d.buffers[1].name, "opt");
  EXPECT_EQ(d.buffers[1].category, M::OptimizerState);
  EXPECT_EQ(d.buffers[1].bytes, 300u);
  EXPECT_TRUE(d.buffers[1].persistent);
  EXPECT_FALSE(d.buffers[2].persistent);  // activations: by category
  EXPECT_FALSE(d.buffers[3].persistent);  // workspace: overridden
  ASSERT_EQ(d.allocs.size(), 2u);
  EXPECT_EQ(d.allocs[0].name, "h.0.x");
  EXPECT_EQ(d.allocs[0].layer, 0);
  EXPECT_EQ(d.allocs[0].phase, "forward");
  EXPECT_EQ(d.allocs[0].t_alloc, 1);
  EXPECT_EQ(d.allocs[0].t_free, 3);
  EXPECT_EQ(d.allocs[0].free_phase, "backward");
  EXPECT_EQ(d.allocs[1].category, M::Recompute);
  EXPECT_EQ(d.allocs[1].t_free, -1);  // never freed: live to the end
  EXPECT_EQ(d.alloc_end(d.allocs[1]), 5);
  ASSERT_EQ(d.phases.size(), 2u);
  EXPECT_EQ(d.phases[0].name, "forward");
  EXPECT_EQ(d.phases[0].layer, 0);
  EXPECT_EQ(d.phases[1].name, "optimizer");
  EXPECT_EQ(d.phases[1].layer, -1);
  EXPECT_EQ(d.phases[1].t, 4);
  EXPECT_EQ(d.end_t, 5);
  EXPECT_EQ(d.persistent_bytes, 1300u);
  EXPECT_EQ(d.peak_live_bytes, 1800u);
  EXPECT_EQ(d.peak_t, 2);
}

TEST(MemoryTrace, LinesAreTheDocumentedFormat) {
  test::TempDir dir;
  const std::string path = dir / "trace.jsonl";
  MemoryTrace t(path, "cpu", 1 << 20, 0, 2);
  t.buffer("m", M::MasterWeights, 10);
  t.phase("forward", 3);
  t.free(t.alloc("x", M::Activations, 5, 3, "forward"), "backward");
  t.finish();
  std::istringstream in(test::read_file(path));
  std::vector<nlohmann::json> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(lines[0],
            nlohmann::json::parse(R"({"type":"header","version":1,"device":"cpu","plan_bytes":1048576,
    "context_overhead_bytes":0,"step":2})"));
  EXPECT_EQ(lines[1],
            nlohmann::json::parse(
                R"({"type":"buffer","name":"m","category":"master_weights","bytes":10,"persistent":true})"));
  EXPECT_EQ(lines[2], nlohmann::json::parse(R"({"type":"phase","t":0,"name":"forward","layer":3})"));
  EXPECT_EQ(lines[3],
            nlohmann::json::parse(R"({"type":"alloc","t":1,"id":0,"name":"x","category":"activations",
    "bytes":5,"layer":3,"phase":"forward"})"));
  EXPECT_EQ(lines[4], nlohmann::json::parse(R"({"type":"free","t":2,"id":0,"phase":"backward"})"));
  EXPECT_EQ(lines[5], nlohmann::json::parse(
                          R"({"type":"summary","peak_live_bytes":15,"peak_t":1,"persistent_bytes":10})"));
}

TEST(MemoryTrace, CategoryKeysRoundTrip) {
  for (int i = 0; i < kMemoryCategories; ++i) {
    const auto c = static_cast<M>(i);
    EXPECT_EQ(memory_category_from_key(memory_category_key(c)), c) << memory_category_key(c);
  }
  EXPECT_STREQ(memory_category_key(M::OptimizerState), "optimizer_states");  // as anvil estimate --json
  EXPECT_FALSE(memory_category_from_key("optimizer state").has_value());
}

TEST(MemoryTrace, PeakIsPersistentPlusTheMostStepDataLiveAtOnce) {
  test::TempDir dir;
  const std::string path = dir / "t.jsonl";
  MemoryTrace t(path, "cpu", 10000, 0, 0);
  t.buffer("w", M::Weights, 1000);
  const int a = t.alloc("a", M::Activations, 100, 0, "forward");  // t0: 100
  t.alloc("b", M::Activations, 50, 1, "forward");                 // t1: 150
  t.free(a, "backward");                                          // t2: 50
  t.alloc("c", M::Activations, 120, 1, "forward");                // t3: 170, the peak
  t.phase("backward", 1);                                         // t4
  t.alloc("d", M::Activations, 0, 1, "backward");                 // t5: 170 again: the first time counts
  EXPECT_EQ(t.peak_live_bytes(), 1170u);
  t.finish();
  const MemoryTraceData d = read_memory_trace(path);
  EXPECT_EQ(d.persistent_bytes, 1000u);
  EXPECT_EQ(d.peak_live_bytes, 1170u);
  EXPECT_EQ(d.peak_t, 3);
}

TEST(MemoryTrace, StepWithoutAllocationsPeaksAtThePersistentBuffers) {
  test::TempDir dir;
  MemoryTrace t(dir / "t.jsonl", "cpu", 100, 0, 0);
  t.buffer("w", M::Weights, 60);
  t.phase("optimizer");
  t.finish();
  const MemoryTraceData d = read_memory_trace(dir / "t.jsonl");
  EXPECT_EQ(d.peak_live_bytes, 60u);
  EXPECT_EQ(d.peak_t, -1);
  EXPECT_EQ(d.end_t, 1);
  EXPECT_NE(render_memory_report(d).find("<svg"), std::string::npos);
}

TEST(MemoryTrace, RealisticStepPeaksInTheLastBlocksRecompute) {
  test::TempDir dir;
  MemoryTrace t(dir / "t.jsonl", "cpu", 1 << 30, 0, 0);
  write_step(t, 4);
  t.finish();
  const MemoryTraceData d = read_memory_trace(dir / "t.jsonl");
  // Saved after forward: embedding 2 + 4 block inputs x 2 + blocks 0 and 2 x 20 = 50 MiB; the logits
  // (12 MiB) come and go; recomputing block 3 adds 20 MiB on top of the 50.
  EXPECT_EQ(d.persistent_bytes, 4 * 48 * MiB + 12 * MiB + MiB / 4);
  EXPECT_EQ(d.peak_live_bytes - d.persistent_bytes, 70 * MiB);
  bool found = false;
  for (const auto& a : d.allocs)
    found = found || (a.t_alloc == d.peak_t && a.name == "h.3.mlp.fc (recomputed)");
  EXPECT_TRUE(found) << "peak at t " << d.peak_t;
  for (const auto& a : d.allocs) EXPECT_GE(a.t_free, 0) << a.name << " never freed";
}

TEST(MemoryTrace, UnfinishedTraceLeavesNoFile) {
  test::TempDir dir;
  const std::string path = dir / "t.jsonl";
  {
    MemoryTrace t(path, "cpu", 100, 0, 0);
    t.buffer("w", M::Weights, 10);
    t.alloc("x", M::Activations, 5, 0, "forward");
  }  // destroyed without finish(), as when the step throws
  EXPECT_TRUE(fs::is_empty(dir.path())) << "left behind: " << fs::directory_iterator(dir.path())->path();
}

TEST(MemoryTrace, WriterErrorsNameThePath) {
  test::TempDir dir;
  test::expect_error([&] { MemoryTrace t(dir / "no/such/dir/t.jsonl", "cpu", 1, 0, 0); },
                     {"no/such/dir/t.jsonl", "cannot open"});
  MemoryTrace t(dir / "t.jsonl", "cpu", 100, 0, 0);
  test::expect_error([&] { t.free(42, "backward"); }, {"t.jsonl", "free of id 42"});
  const int id = t.alloc("x", M::Activations, 5, 0, "forward");
  t.free(id, "backward");
  test::expect_error([&] { t.free(id, "backward"); }, {"t.jsonl", "not live"});
  test::expect_error([&] { t.alloc("y", M::Activations, 5, -2, "forward"); }, {"layer -2"});
  test::expect_error([&] { t.alloc("", M::Activations, 5, 0, "forward"); }, {"name"});
  t.buffer("w", M::Weights, 60);
  test::expect_error([&] { t.buffer("g", M::Gradients, 41); },
                     {"t.jsonl", "'g'", "past the plan's 100 bytes"});
  t.finish();
  test::expect_error([&] { t.phase("forward"); }, {"t.jsonl", "after finish"});
  test::expect_error([&] { t.finish(); }, {"after finish"});
}

// One malformed trace: its text, the line the error must name, and what the message must say.
struct Malformed {
  const char* what;
  std::string text;
  int line;
  std::string needle;
};

TEST(MemoryTrace, MalformedTracesNameFileAndLine) {
  const std::string h = header();
  const std::string w = R"({"type":"buffer","name":"w","category":"weights","bytes":100,"persistent":true})"
                        "\n";
  const std::string a0 =
      R"({"type":"alloc","t":0,"id":0,"name":"x","category":"activations","bytes":10,"layer":0,"phase":"forward"})"
      "\n";
  const std::string f1 = R"({"type":"free","t":1,"id":0,"phase":"backward"})"
                         "\n";
  const std::string end = R"({"type":"summary","peak_live_bytes":110,"peak_t":0,"persistent_bytes":100})"
                          "\n";
  const std::vector<Malformed> cases = {
      {"not JSON", h + "{oops\n", 2, "not a JSON object"},
      {"not an object", h + "[1, 2]\n", 2, "not a JSON object"},
      {"no type", h + "{\"name\":\"w\"}\n", 2, "no \"type\""},
      {"no header first", w + h, 1, "first line must be the header"},
      {"future version",
       R"({"type":"header","version":2,"device":"cpu","plan_bytes":1,"context_overhead_bytes":0,"step":0})"
       "\n",
       1, "version 2"},
      {"second header", h + h, 2, "second header"},
      {"unknown type",
       h + R"({"type":"malloc","t":0})"
           "\n",
       2, "unknown line type 'malloc'"},
      {"unknown key",
       h + R"({"type":"buffer","name":"w","category":"weights","bytes":1,"persistent":true,"sise":1})"
           "\n",
       2, "unknown key \"sise\""},
      {"unknown category",
       h + R"({"type":"buffer","name":"w","category":"weight","bytes":1,"persistent":true})"
           "\n",
       2, "unknown category 'weight'"},
      {"negative bytes",
       h + R"({"type":"buffer","name":"w","category":"weights","bytes":-5,"persistent":true})"
           "\n",
       2, "must not be negative"},
      {"fractional bytes",
       h + R"({"type":"buffer","name":"w","category":"weights","bytes":1.5,"persistent":true})"
           "\n",
       2, "must be an integer"},
      {"bytes as a string",
       h + R"({"type":"buffer","name":"w","category":"weights","bytes":"1","persistent":true})"
           "\n",
       2, "must be an integer"},
      {"missing field",
       h + R"({"type":"alloc","t":0,"id":0,"name":"x","category":"activations","layer":0,"phase":"f"})"
           "\n",
       2, "without \"bytes\""},
      {"empty name",
       h + R"({"type":"buffer","name":"","category":"weights","bytes":1,"persistent":true})"
           "\n",
       2, "must not be empty"},
      {"layer below -1",
       h + R"({"type":"phase","t":0,"name":"forward","layer":-2})"
           "\n",
       2, "\"layer\" is -2"},
      {"persistent not a bool",
       h + R"({"type":"buffer","name":"w","category":"weights","bytes":1,"persistent":1})"
           "\n",
       2, "true or false"},
      {"buffers over the plan", header(150) + w + w, 3, "more than the header's plan_bytes 150"},
      {"free of an unknown id",
       h + w + a0 +
           R"({"type":"free","t":1,"id":7,"phase":"backward"})"
           "\n",
       4, "free of id 7"},
      {"double free",
       h + w + a0 + f1 +
           R"({"type":"free","t":2,"id":0,"phase":"backward"})"
           "\n",
       5, "already freed at t 1"},
      {"id used twice",
       h + w + a0 + f1 +
           R"({"type":"alloc","t":2,"id":0,"name":"y","category":"activations","bytes":1,"layer":0,"phase":"f"})"
           "\n",
       5, "alloc id 0 was already used on line 3"},
      {"time going back",
       h + w + a0 +
           R"({"type":"free","t":0,"id":0,"phase":"backward"})"
           "\n",
       4, "does not follow"},
      {"wrong peak",
       h + w + a0 + f1 +
           R"({"type":"summary","peak_live_bytes":999,"peak_t":0,"persistent_bytes":100})"
           "\n",
       5, "the events give 110 at t 0"},
      {"wrong persistent",
       h + w + a0 + f1 +
           R"({"type":"summary","peak_live_bytes":110,"peak_t":0,"persistent_bytes":1})"
           "\n",
       5, "add up to 100"},
      {"line after the summary", h + w + a0 + f1 + end + f1, 6, "after the summary"},
      {"no summary (truncated)", h + w + a0 + f1, 4, "no summary line"},
  };
  test::TempDir dir;
  for (const Malformed& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string path = dir / "bad.jsonl";
    test::write_file(path, c.text);
    test::expect_error([&] { read_memory_trace(path); }, {fmt::format("{}:{}: ", path, c.line), c.needle});
  }
  // The well-formed version of the same lines parses.
  test::write_file(dir / "good.jsonl", h + w + a0 + f1 + end);
  EXPECT_EQ(read_memory_trace(dir / "good.jsonl").peak_live_bytes, 110u);
}

TEST(MemoryTrace, MissingOrEmptyFile) {
  test::TempDir dir;
  test::expect_error([&] { read_memory_trace(dir / "none.jsonl"); }, {"none.jsonl", "cannot read"});
  test::write_file(dir / "empty.jsonl", "");
  test::expect_error([&] { read_memory_trace(dir / "empty.jsonl"); }, {"empty.jsonl", "no header"});
}

size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t p = haystack.find(needle); p != std::string::npos; p = haystack.find(needle, p + 1)) ++n;
  return n;
}

TEST(MemoryReport, OneShapePerAllocationBandsLegendAndTables) {
  test::TempDir dir;
  MemoryTrace t(dir / "t.jsonl", "cpu", 1 << 30, 600 * MiB, 5);
  write_step(t, 4);
  t.alloc("odd <name> & \"quotes\"", M::Activations, MiB, 2, "backward");  // escaped, never freed
  t.finish();
  const MemoryTraceData d = read_memory_trace(dir / "t.jsonl");
  const std::string html = render_memory_report(d);

  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(count(html, "<svg"), 1u);
  EXPECT_EQ(count(html, "class=\"alloc\""), d.allocs.size());
  for (const auto& a : d.allocs)
    EXPECT_EQ(count(html, fmt::format("class=\"alloc\" data-id=\"{}\"", a.id)), 1u);
  // Persistent bands: weights, gradients, optimizer states, workspace, data.
  EXPECT_EQ(count(html, "class=\"band\""), 5u);
  // The legend names every category in the trace, with its colour.
  for (M c :
       {M::Weights, M::Gradients, M::OptimizerState, M::Activations, M::Recompute, M::Workspace, M::Data}) {
    EXPECT_NE(html.find(fmt::format("class=\"legend-item\" data-category=\"{}\"", memory_category_key(c))),
              std::string::npos)
        << memory_category_key(c);
    EXPECT_NE(html.find(memory_category_color(c)), std::string::npos);
  }
  EXPECT_EQ(count(html, "class=\"legend-item\""), 7u);
  // Tooltips name the allocation, its layer and size; phase markers and the plan/peak lines are there.
  EXPECT_NE(html.find("<title>h.2.attn.probs\nactivations, layer 2\n5.0 MiB (5,242,880 bytes)"),
            std::string::npos);
  EXPECT_NE(html.find("<title>backward, layer 3"), std::string::npos);
  EXPECT_NE(html.find("class=\"plan\""), std::string::npos);
  EXPECT_NE(html.find("plan (arena) 1.00 GiB"), std::string::npos);
  EXPECT_NE(html.find(fmt::format("peak {}", format_bytes(d.peak_live_bytes))), std::string::npos);
  EXPECT_NE(html.find("id=\"top-buffers\""), std::string::npos);
  EXPECT_NE(html.find("id=\"live-at-peak\""), std::string::npos);
  EXPECT_NE(html.find("600.0 MiB"), std::string::npos);  // the context overhead
  // Names are escaped; nothing is fetched from elsewhere.
  EXPECT_NE(html.find("odd &lt;name&gt; &amp; &quot;quotes&quot;"), std::string::npos);
  EXPECT_EQ(html.find("odd <name>"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href="), std::string::npos);
  EXPECT_EQ(count(html, "http"), 1u);  // the SVG namespace, nothing to load
}

TEST(MemoryReport, ShapesStackWithoutOverlapping) {
  // Three allocations; freeing the bottom one drops the two above it by its size.
  test::TempDir dir;
  MemoryTrace t(dir / "t.jsonl", "cpu", 1000, 0, 0);
  const int a = t.alloc("a", M::Activations, 400, 0, "forward");
  t.alloc("b", M::Activations, 300, 0, "forward");
  t.alloc("c", M::Activations, 200, 0, "forward");
  t.free(a, "backward");
  t.finish();
  const std::string html = render_memory_report(read_memory_trace(dir / "t.jsonl"));
  std::smatch m;
  std::string rest = html;
  std::vector<std::string> paths;
  const std::regex re("class=\"alloc\"[^>]* d=\"([^\"]*)\"");
  while (std::regex_search(rest, m, re)) {
    paths.push_back(m[1]);
    rest = m.suffix();
  }
  ASSERT_EQ(paths.size(), 3u);
  // 'a' is a plain rectangle (4 corners); 'b' and 'c' each have one step down where 'a' is freed.
  EXPECT_EQ(count(paths[0], "L"), 3u) << paths[0];
  EXPECT_EQ(count(paths[1], "L"), 7u) << paths[1];
  EXPECT_EQ(count(paths[2], "L"), 7u) << paths[2];
}

TEST(MemoryReport, WriteLeavesNoTemporaryFile) {
  test::TempDir dir;
  MemoryTrace t(dir / "t.jsonl", "cpu", 100, 0, 0);
  t.finish();
  write_memory_report(read_memory_trace(dir / "t.jsonl"), dir / "r.html");
  EXPECT_NE(test::read_file(dir / "r.html").find("</html>"), std::string::npos);
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++files;
  EXPECT_EQ(files, 2u);
  test::expect_error([&] { write_memory_report(read_memory_trace(dir / "t.jsonl"), dir / "no/dir/r.html"); },
                     {"no/dir/r.html"});
}

class MemoryReportCli : public ::testing::Test {
 protected:
  void SetUp() override {
    MemoryTrace t(dir / "trace.jsonl", "cpu", 1 << 30, 0, 1);
    write_step(t, 2);
    t.finish();
  }
  test::TempDir dir;
};

TEST_F(MemoryReportCli, WritesThePageBesideTheTrace) {
  const test::CommandResult r = test::run_anvil("memory-report " + (dir / "trace.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(dir / "trace.html"), std::string::npos) << r.output;
  EXPECT_NE(test::read_file(dir / "trace.html").find("<svg"), std::string::npos);
  const test::CommandResult o =
      test::run_anvil("memory-report " + (dir / "trace.jsonl") + " -o " + (dir / "x.html"));
  ASSERT_EQ(o.exit_code, 0) << o.output;
  EXPECT_TRUE(fs::exists(dir / "x.html"));
}

TEST_F(MemoryReportCli, MissingTrace) {
  const test::CommandResult r = test::run_anvil("memory-report " + (dir / "none.jsonl"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("none.jsonl"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "none.html"));
}

TEST_F(MemoryReportCli, MalformedTraceNamesTheLineAndWritesNothing) {
  std::string text = test::read_file(dir / "trace.jsonl");
  const size_t third = text.find('\n', text.find('\n') + 1) + 1;
  text.insert(third, "{\"type\":\"free\",\"t\":0,\"id\":99,\"phase\":\"backward\"}\n");
  test::write_file(dir / "bad.jsonl", text);
  const test::CommandResult r =
      test::run_anvil("memory-report " + (dir / "bad.jsonl") + " -o " + (dir / "bad.html"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("error: " + (dir / "bad.jsonl") + ":3: free of id 99"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir / "bad.html"));
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++files;
  EXPECT_EQ(files, 2u) << "partial output left behind";
}

TEST_F(MemoryReportCli, RefusesToOverwriteTheTrace) {
  const std::string before = test::read_file(dir / "trace.jsonl");
  const test::CommandResult r =
      test::run_anvil("memory-report " + (dir / "trace.jsonl") + " -o " + (dir / "trace.jsonl"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("overwrite the trace"), std::string::npos) << r.output;
  EXPECT_EQ(test::read_file(dir / "trace.jsonl"), before);
}

}  // namespace
}  // namespace anvil
