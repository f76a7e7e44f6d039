// The memory report rendered by a real browser (headless Chromium): the page's own check of what was
// laid out (--dump-dom) and the pixels of a screenshot (the categories' colours fill the plot).
// Chromium comes from `bash scripts/setup.sh --tests`; without it these tests fail rather than skip.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "memory/memory_report.hpp"
#include "memory/memory_trace.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

using M = MemoryCategory;
constexpr size_t MiB = size_t{1} << 20;

// $ANVIL_CHROMIUM, else the first of the usual names on PATH; empty if none.
std::string find_chromium() {
  if (const char* env = std::getenv("ANVIL_CHROMIUM"); env && *env) return env;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin");
  std::vector<std::string> list;
  for (std::string d; std::getline(dirs, d, ':');) list.push_back(d);
  for (const char* name : {"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"})
    for (const std::string& d : list) {
      const std::string p = d + "/" + name;
      if (::access(p.c_str(), X_OK) == 0) return p;
    }
  return "";
}

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  pclose(p);
  return out;
}

// An RGB(A) 8-bit PNG, decoded just enough to count colours.
struct Image {
  uint32_t width = 0, height = 0;
  std::vector<std::array<uint8_t, 3>> pixels;
};

uint32_t be32(const std::string& s, size_t at) {
  return uint32_t(uint8_t(s[at])) << 24 | uint32_t(uint8_t(s[at + 1])) << 16 |
         uint32_t(uint8_t(s[at + 2])) << 8 | uint32_t(uint8_t(s[at + 3]));
}

Image decode_png(const std::string& file) {
  Image img;
  if (file.size() < 8 || file.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) {
    ADD_FAILURE() << "not a PNG";
    return img;
  }
  std::string idat;
  int color_type = -1, depth = 0, interlace = 0;
  for (size_t at = 8; at + 8 <= file.size();) {
    const uint32_t len = be32(file, at);
    const std::string type = file.substr(at + 4, 4);
    if (at + 12 + len > file.size()) break;
    if (type == "IHDR") {
      img.width = be32(file, at + 8);
      img.height = be32(file, at + 12);
      depth = uint8_t(file[at + 16]);
      color_type = uint8_t(file[at + 17]);
      interlace = uint8_t(file[at + 20]);
    } else if (type == "IDAT") {
      idat += file.substr(at + 8, len);
    }
    at += 12 + len;
  }
  if (depth != 8 || (color_type != 2 && color_type != 6) || interlace != 0) {
    ADD_FAILURE() << "unexpected PNG layout: depth " << depth << ", colour type " << color_type
                  << ", interlace " << interlace;
    return img;
  }
  const size_t bpp = color_type == 6 ? 4 : 3, stride = img.width * bpp;
  std::vector<uint8_t> raw(img.height * (stride + 1));
  uLongf raw_len = raw.size();
  if (uncompress(raw.data(), &raw_len, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) != Z_OK ||
      raw_len != raw.size()) {
    ADD_FAILURE() << "cannot inflate the PNG's image data";
    return img;
  }
  // Undo the per-row filters (PNG spec, section 9).
  std::vector<uint8_t> prev(stride, 0), row(stride);
  img.pixels.reserve(size_t(img.width) * img.height);
  for (uint32_t y = 0; y < img.height; ++y) {
    const uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* in = &raw[y * (stride + 1) + 1];
    for (size_t i = 0; i < stride; ++i) {
      const int a = i >= bpp ? row[i - bpp] : 0, b = prev[i], c = i >= bpp ? prev[i - bpp] : 0;
      int pred = 0;
      switch (filter) {
        case 1:
          pred = a;
          break;
        case 2:
          pred = b;
          break;
        case 3:
          pred = (a + b) / 2;
          break;
        case 4: {
          const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
          pred = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
          break;
        }
      }
      row[i] = uint8_t(in[i] + pred);
    }
    for (uint32_t x = 0; x < img.width; ++x)
      img.pixels.push_back({row[x * bpp], row[x * bpp + 1], row[x * bpp + 2]});
    prev = row;
  }
  return img;
}

std::array<uint8_t, 3> rgb(const char* hex) {
  unsigned r, g, b;
  std::sscanf(hex + 1, "%2x%2x%2x", &r, &g, &b);
  return {uint8_t(r), uint8_t(g), uint8_t(b)};
}

// Whether `p` is `base` or a tint of it (base mixed with up to ~half white, as neighbouring shapes of one
// category are drawn): the same mixing factor in every channel.
bool tint_of(const std::array<uint8_t, 3>& p, const std::array<uint8_t, 3>& base) {
  double lo = 1, hi = -1;
  for (int i = 0; i < 3; ++i) {
    if (base[size_t(i)] > 235) {
      if (p[size_t(i)] < base[size_t(i)] - 2) return false;
      continue;
    }
    const double m = double(p[size_t(i)] - base[size_t(i)]) / double(255 - base[size_t(i)]);
    lo = std::min(lo, m);
    hi = std::max(hi, m);
  }
  return lo >= -0.02 && hi <= 0.5 && hi - lo <= 0.03;
}

// The value of attribute `name` of the element with id `id` in serialized HTML ("" if absent).
std::string attribute(const std::string& dom, const std::string& id, const std::string& name) {
  const size_t at = dom.find("id=\"" + id + "\"");
  if (at == std::string::npos) return "";
  const size_t open = dom.rfind('<', at), close = dom.find('>', at);
  const std::string tag = dom.substr(open, close - open);
  const size_t v = tag.find(" " + name + "=\"");
  if (v == std::string::npos) return "";
  const size_t start = v + name.size() + 3;
  return tag.substr(start, tag.find('"', start) - start);
}

class MemoryReportBrowser : public ::testing::Test {
 protected:
  void SetUp() override {
    chromium = find_chromium();
    ASSERT_FALSE(chromium.empty())
        << "Chromium is not installed (looked for chromium, chromium-browser, google-chrome on PATH and "
           "$ANVIL_CHROMIUM): run `bash scripts/setup.sh --tests`";
    // Big buffers and allocations in every category the step uses, so each colour covers many pixels.
    MemoryTrace t(dir / "trace.jsonl", "cpu", 2048 * MiB, 0, 4);
    t.buffer("params", M::Weights, 300 * MiB);
    t.buffer("grads", M::Gradients, 300 * MiB);
    t.buffer("adamw.state", M::OptimizerState, 600 * MiB);
    t.buffer("scratch", M::Workspace, 100 * MiB);
    t.buffer("activations", M::Activations, 500 * MiB);
    t.buffer("recompute", M::Recompute, 200 * MiB);
    std::vector<int> saved;
    for (int l = 0; l < 3; ++l) {
      t.phase("forward", l);
      for (int k = 0; k < 3; ++k)
        saved.push_back(t.alloc(fmt::format("h.{}.act{}", l, k), M::Activations, 50 * MiB, l, "forward"));
    }
    for (int l = 2; l >= 0; --l) {
      t.phase("recompute", l);
      const int r = t.alloc(fmt::format("h.{}.recomputed", l), M::Recompute, 200 * MiB, l, "recompute");
      t.phase("backward", l);
      t.free(r, "backward");
      for (int k = 0; k < 3; ++k) {
        t.free(saved.back(), "backward");
        saved.pop_back();
      }
    }
    t.phase("optimizer");
    t.finish();
    trace = read_memory_trace(dir / "trace.jsonl");
    page = dir / "report.html";
    write_memory_report(trace, page);
  }

  // Headless Chromium with a throwaway profile; stderr (D-Bus chatter) dropped.
  std::string chrome(const std::string& args) {
    return run(
        fmt::format("timeout 120 '{}' --headless --no-sandbox --disable-gpu --no-first-run "
                    "--user-data-dir='{}' --hide-scrollbars {} 'file://{}' 2>/dev/null",
                    chromium, dir / "profile", args, page));
  }

  test::TempDir dir;
  std::string chromium, page;
  MemoryTraceData trace;
};

TEST_F(MemoryReportBrowser, PageReportsEveryShapeLaidOut) {
  const std::string dom = chrome("--window-size=1280,1000 --dump-dom");
  ASSERT_NE(dom.find("<svg"), std::string::npos) << "no DOM came back from " << chromium << ":\n" << dom;
  EXPECT_EQ(attribute(dom, "render-check", "data-status"), "ok") << dom.substr(0, 2000);
  EXPECT_EQ(attribute(dom, "render-check", "data-allocs"), std::to_string(trace.allocs.size()));
  EXPECT_EQ(attribute(dom, "render-check", "data-drawn"), std::to_string(trace.allocs.size()));
  EXPECT_EQ(attribute(dom, "render-check", "data-visible"), std::to_string(trace.allocs.size()));
  EXPECT_EQ(attribute(dom, "render-check", "data-bands"), "4");   // weights, gradients, optimizer, workspace
  EXPECT_EQ(attribute(dom, "render-check", "data-legend"), "6");  // and activations, recompute
  // The plot spans the frame's width (916 of the 1200 SVG units) and a good part of its height.
  const std::string plot = attribute(dom, "render-check", "data-plot");
  ASSERT_NE(plot.find('x'), std::string::npos) << plot;
  EXPECT_EQ(plot.substr(0, plot.find('x')), "916") << plot;
  EXPECT_GT(std::stoi(plot.substr(plot.find('x') + 1)), 200) << plot;
}

TEST_F(MemoryReportBrowser, ScreenshotShowsTheCategoriesColours) {
  const std::string png = dir / "shot.png";
  chrome(fmt::format("--window-size=1280,900 --screenshot='{}'", png));
  const std::string bytes = test::read_file(png);
  ASSERT_FALSE(bytes.empty()) << "Chromium wrote no screenshot";
  const Image img = decode_png(bytes);
  ASSERT_EQ(img.width, 1280u);
  ASSERT_EQ(img.height, 900u);
  std::map<std::array<uint8_t, 3>, size_t> histogram;
  for (const auto& p : img.pixels) ++histogram[p];
  const size_t white = histogram[{255, 255, 255}];
  EXPECT_LT(white, img.pixels.size() * 8 / 10) << "the page is (nearly) blank";
  EXPECT_GT(histogram.size(), 50u) << "too few colours for text, plot and legend";
  // The plot is ~1000 x 400 px on this window and each category fills a band or shapes of at least
  // ~5% of its height: over 2000 pixels of its colour (or its tints), far more than the legend's
  // 13 x 13 swatch.
  for (M c : {M::Weights, M::Gradients, M::OptimizerState, M::Workspace, M::Activations, M::Recompute}) {
    const auto want = rgb(memory_category_color(c));
    size_t n = 0;
    for (const auto& [colour, count] : histogram)
      if (tint_of(colour, want)) n += count;
    EXPECT_GT(n, 2000u) << memory_category_key(c) << " (" << memory_category_color(c) << ") covers " << n
                        << " pixels (set ANVIL_KEEP_SCREENSHOT=FILE.png to look at the screenshot)";
  }
  if (const char* keep = std::getenv("ANVIL_KEEP_SCREENSHOT"); keep && *keep) test::write_file(keep, bytes);
}

}  // namespace
}  // namespace anvil
