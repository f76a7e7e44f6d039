#include "memory/memory_report.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <map>
#include <system_error>
#include <vector>

#include "anvil/error.hpp"
#include "io/atomic_dir.hpp"

namespace anvil {
namespace {

// The SVG's coordinate system (it scales to the page width): the plot, a column of labels on its right,
// the x ticks and two rows of phase markers under it.
constexpr double kWidth = 1200, kHeight = 540;
constexpr double kPlotLeft = 84, kPlotRight = 1000, kPlotTop = 28, kPlotBottom = 424;
constexpr double kLabelX = 1016;      // the right-hand label column
constexpr double kLabelSpacing = 14;  // px between right-hand labels
constexpr double kPhaseRow1 = 448;    // phase names (runs of markers with one name)
constexpr double kPhaseRow2 = 468;    // one cell per marker, labelled with its layer
constexpr double kPhaseRowHeight = 18;

}  // namespace

// Tableau 10: distinct at a glance and readable by most colour-blind people.
const char* memory_category_color(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::Weights:
      return "#4e79a7";
    case MemoryCategory::MasterWeights:
      return "#76b7b2";
    case MemoryCategory::Gradients:
      return "#f28e2b";
    case MemoryCategory::OptimizerState:
      return "#e15759";
    case MemoryCategory::Activations:
      return "#59a14f";
    case MemoryCategory::Recompute:
      return "#edc948";
    case MemoryCategory::Workspace:
      return "#b07aa1";
    case MemoryCategory::Communication:
      return "#ff9da7";
    case MemoryCategory::Data:
      return "#9c755f";
  }
  return "#888888";
}

namespace {

const char* category_color(MemoryCategory c) {
  return memory_category_color(c);
}

// Neighbouring allocations of one category would merge into one blob: alternate three shades of the
// category's colour (the first is the colour itself, as in the legend).
std::string shade(MemoryCategory c, size_t index) {
  const char* hex = category_color(c);
  const double mix = std::array<double, 3>{0.0, 0.22, 0.4}[index % 3];
  unsigned rgb[3];
  std::sscanf(hex + 1, "%2x%2x%2x", &rgb[0], &rgb[1], &rgb[2]);
  for (unsigned& v : rgb) v = unsigned(std::lround(v + (255 - v) * mix));
  return fmt::format("#{:02x}{:02x}{:02x}", rgb[0], rgb[1], rgb[2]);
}

// Pale tones for the phase strip, so that it never reads as a memory category.
const char* phase_color(const std::string& name) {
  if (name == "forward") return "#cfe0f3";
  if (name == "backward") return "#fbd9bd";
  if (name == "recompute") return "#fbeeb0";
  if (name == "optimizer") return "#e4d4ee";
  if (name == "loss") return "#d7ecd2";
  return "#e3e3e3";
}

std::string esc(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

std::string with_commas(size_t n) {
  const std::string digits = std::to_string(n);
  std::string s;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

// "474.8 MiB (497,903,616 bytes)"
std::string bytes_long(size_t n) {
  return fmt::format("{} ({} bytes)", format_bytes(n), with_commas(n));
}

std::string percent(size_t part, size_t whole) {
  return whole == 0 ? "–" : fmt::format("{:.1f}%", 100.0 * double(part) / double(whole));
}

// y ticks are powers of two, so every label is a whole number of its unit: "0", "512 MiB", "4 GiB".
std::string tick_bytes(double v) {
  static const std::pair<double, const char*> units[] = {
      {0x1p40, "TiB"}, {0x1p30, "GiB"}, {0x1p20, "MiB"}, {0x1p10, "KiB"}};
  if (v == 0) return "0";
  for (const auto& [scale, name] : units)
    if (v >= scale) return fmt::format("{:g} {}", v / scale, name);
  return fmt::format("{:g} B", v);
}

std::string phase_label(const std::string& name, int layer) {
  return layer >= 0 ? fmt::format("{}, layer {}", name, layer) : name;
}

// The phase the step was in at time t: the last marker at or before t.
const MemoryTraceData::Phase* phase_at(const MemoryTraceData& d, int64_t t) {
  const MemoryTraceData::Phase* p = nullptr;
  for (const auto& ph : d.phases)
    if (ph.t <= t) p = &ph;
  return p;
}

class Chart {
 public:
  explicit Chart(const MemoryTraceData& d) {
    t_max_ = double(std::max<int64_t>(d.end_t, 1));
    const double top = double(std::max({d.plan_bytes, d.peak_live_bytes, size_t{1}}));
    // The smallest power of two giving at most 6 intervals; the axis ends on a tick above the data.
    step_ = std::exp2(std::ceil(std::log2(top / 6)));
    y_max_ = std::ceil(top * 1.03 / step_) * step_;
  }

  double x(double t) const { return kPlotLeft + t / t_max_ * (kPlotRight - kPlotLeft); }
  double y(double bytes) const { return kPlotBottom - bytes / y_max_ * (kPlotBottom - kPlotTop); }
  double y_step() const { return step_; }
  double y_max() const { return y_max_; }
  double t_max() const { return t_max_; }

 private:
  double t_max_ = 1, step_ = 1, y_max_ = 1;
};

struct SideLabel {
  double anchor;  // y of the thing it names
  std::string text, color;
  double y = 0;  // where it is drawn, after spreading
};

// Spreads labels so that none overlap, keeping each as near its anchor as possible.
void spread(std::vector<SideLabel>& labels) {
  std::sort(labels.begin(), labels.end(),
            [](const SideLabel& a, const SideLabel& b) { return a.anchor < b.anchor; });
  for (size_t i = 0; i < labels.size(); ++i)
    labels[i].y = i == 0 ? std::max(labels[i].anchor, kPlotTop)
                         : std::max(labels[i].anchor, labels[i - 1].y + kLabelSpacing);
  for (size_t i = labels.size(); i-- > 0;) {
    const double limit = i + 1 == labels.size() ? kPlotBottom : labels[i + 1].y - kLabelSpacing;
    labels[i].y = std::min(labels[i].y, limit);
  }
}

// Where each live allocation sits in the stack over time. An allocation goes on top of the data live
// when it is made; when one below it is freed, it drops by that one's size (as in memory_viz), so the
// stack's top edge is the live total at every moment.
struct Vertex {
  int64_t t;
  size_t base;  // step bytes below it
};

std::vector<std::vector<Vertex>> stack_allocations(const MemoryTraceData& d) {
  struct Event {
    int64_t t;
    size_t index;
    bool alloc;
  };
  std::vector<Event> events;
  for (size_t i = 0; i < d.allocs.size(); ++i) {
    events.push_back({d.allocs[i].t_alloc, i, true});
    if (d.allocs[i].t_free >= 0) events.push_back({d.allocs[i].t_free, i, false});
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) { return a.t < b.t; });
  std::vector<std::vector<Vertex>> verts(d.allocs.size());
  std::vector<size_t> stack, base(d.allocs.size(), 0);
  size_t live = 0;
  for (const Event& e : events) {
    const size_t bytes = d.allocs[e.index].bytes;
    if (e.alloc) {
      base[e.index] = live;
      live += bytes;
      stack.push_back(e.index);
      verts[e.index].push_back({e.t, live - bytes});
      continue;
    }
    const auto it = std::find(stack.begin(), stack.end(), e.index);
    for (auto above = it + 1; above != stack.end(); ++above) {
      base[*above] -= bytes;
      verts[*above].push_back({e.t, base[*above]});
    }
    stack.erase(it);
    live -= bytes;
  }
  return verts;
}

std::string alloc_path(const Chart& c, const std::vector<Vertex>& v, int64_t end, size_t offset,
                       size_t bytes) {
  // The bottom edge left to right as steps, then the top edge back.
  std::vector<std::pair<double, double>> bottom;
  bottom.emplace_back(double(v[0].t), double(v[0].base));
  for (size_t i = 1; i < v.size(); ++i) {
    bottom.emplace_back(double(v[i].t), double(v[i - 1].base));
    bottom.emplace_back(double(v[i].t), double(v[i].base));
  }
  bottom.emplace_back(double(end), double(v.back().base));
  std::string p;
  auto point = [&](char cmd, double t, double b) {
    p += fmt::format("{}{:.2f},{:.2f}", cmd, c.x(t), c.y(double(offset) + b));
  };
  for (size_t i = 0; i < bottom.size(); ++i) point(i == 0 ? 'M' : 'L', bottom[i].first, bottom[i].second);
  for (size_t i = bottom.size(); i-- > 0;) point('L', bottom[i].first, bottom[i].second + double(bytes));
  return p + "Z";
}

std::string svg_timeline(const MemoryTraceData& d) {
  const Chart c(d);
  std::string s;
  s += fmt::format(
      "<svg id=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {} {}\" role=\"img\" "
      "aria-label=\"memory timeline of step {}\">\n",
      kWidth, kHeight, d.step);

  // Grid and y axis.
  s += "<g class=\"axis\">\n";
  for (double v = 0; v <= c.y_max() + 0.5; v += c.y_step()) {
    s += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.2f}\" y2=\"{:.2f}\" class=\"grid\"/>", kPlotLeft,
                     kPlotRight, c.y(v), c.y(v));
    s += fmt::format("<text x=\"{}\" y=\"{:.2f}\" text-anchor=\"end\">{}</text>\n", kPlotLeft - 8, c.y(v) + 4,
                     tick_bytes(v));
  }
  s += fmt::format(
      "<text transform=\"translate(18 {:.1f}) rotate(-90)\" text-anchor=\"middle\" class=\"title\">memory "
      "(arena)</text>\n",
      (kPlotTop + kPlotBottom) / 2);
  // x ticks: 1, 2 or 5 times a power of ten, about ten of them.
  const double raw = c.t_max() / 10;
  const double mag = std::pow(10, std::floor(std::log10(std::max(raw, 1.0))));
  double t_step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      t_step = m * mag;
      break;
    }
  t_step = std::max(1.0, t_step);
  for (double t = 0; t <= c.t_max() + 1e-9; t += t_step)
    s += fmt::format(
        "<line x1=\"{0:.2f}\" x2=\"{0:.2f}\" y1=\"{1}\" y2=\"{2}\" class=\"tick\"/><text x=\"{0:.2f}\" "
        "y=\"{3}\" "
        "text-anchor=\"middle\">{4:g}</text>\n",
        c.x(t), kPlotBottom, kPlotBottom + 4, kPlotBottom + 14, t);
  s += fmt::format(
      "<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" class=\"title\">event t within step {} (each "
      "alloc, "
      "free and phase marker is one tick)</text>\n",
      (kPlotLeft + kPlotRight) / 2, kPhaseRow2 + kPhaseRowHeight + 22, d.step);
  s += "</g>\n<g id=\"plot\">\n";

  // Persistent buffers: one flat band per category, stacked from the bottom in category order.
  std::vector<SideLabel> side;
  size_t below = 0;
  for (int ci = 0; ci < kMemoryCategories; ++ci) {
    const auto cat = static_cast<MemoryCategory>(ci);
    std::vector<const MemoryTraceData::Buffer*> bufs;
    size_t total = 0;
    for (const auto& b : d.buffers)
      if (b.persistent && b.category == cat) {
        bufs.push_back(&b);
        total += b.bytes;
      }
    if (bufs.empty()) continue;
    std::stable_sort(bufs.begin(), bufs.end(), [](auto* a, auto* b) { return a->bytes > b->bytes; });
    std::string tip = fmt::format("{} (persistent): {} in {} buffer{}", memory_category_name(cat),
                                  bytes_long(total), bufs.size(), bufs.size() == 1 ? "" : "s");
    for (size_t i = 0; i < bufs.size() && i < 8; ++i)
      tip += fmt::format("\n  {}  {}", bufs[i]->name, format_bytes(bufs[i]->bytes));
    if (bufs.size() > 8) tip += fmt::format("\n  ... and {} more", bufs.size() - 8);
    const double y0 = c.y(double(below)), y1 = c.y(double(below + total));
    s += fmt::format(
        "<rect class=\"band\" data-category=\"{}\" x=\"{}\" y=\"{:.2f}\" width=\"{}\" height=\"{:.2f}\" "
        "fill=\"{}\"><title>{}</title></rect>\n",
        memory_category_key(cat), kPlotLeft, y1, kPlotRight - kPlotLeft, y0 - y1, category_color(cat),
        esc(tip));
    side.push_back({(y0 + y1) / 2, fmt::format("{} {}", memory_category_name(cat), format_bytes(total)),
                    category_color(cat)});
    below += total;
  }

  // Step data above the persistent buffers.
  const auto verts = stack_allocations(d);
  std::array<size_t, kMemoryCategories> nth{};  // shades cycle within a category, starting at its colour
  for (size_t i = 0; i < d.allocs.size(); ++i) {
    const auto& a = d.allocs[i];
    const int64_t end = d.alloc_end(a);
    const std::string freed = a.t_free >= 0 ? fmt::format("freed at t {} ({})", a.t_free, a.free_phase)
                                            : "live to the end of the step";
    const std::string tip =
        fmt::format("{}\n{}{}\n{}\nmade at t {} ({}), {}", a.name, memory_category_name(a.category),
                    a.layer >= 0 ? fmt::format(", layer {}", a.layer) : "", bytes_long(a.bytes), a.t_alloc,
                    a.phase, freed);
    s += fmt::format(
        "<path class=\"alloc\" data-id=\"{}\" data-category=\"{}\" fill=\"{}\" "
        "d=\"{}\"><title>{}</title></path>\n",
        a.id, memory_category_key(a.category), shade(a.category, nth[size_t(a.category)]++),
        alloc_path(c, verts[i], end, d.persistent_bytes, a.bytes), esc(tip));
  }
  s += "</g>\n";

  // Phase boundaries (where the phase name changes) as faint lines across the plot, and the two rows
  // of markers under it.
  s += "<g class=\"phases\">\n";
  for (size_t i = 0; i < d.phases.size();) {
    size_t j = i;
    while (j < d.phases.size() && d.phases[j].name == d.phases[i].name) ++j;
    const double x0 = c.x(double(d.phases[i].t));
    const double x1 = c.x(double(j < d.phases.size() ? d.phases[j].t : d.end_t));
    const std::string& name = d.phases[i].name;
    s += fmt::format("<line class=\"boundary\" x1=\"{0:.2f}\" x2=\"{0:.2f}\" y1=\"{1}\" y2=\"{2}\"/>\n", x0,
                     kPlotTop, kPlotBottom);
    s += fmt::format(
        "<rect class=\"phase-run\" x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" height=\"{}\" "
        "fill=\"{}\"><title>{} (t "
        "{} to {})</title></rect>\n",
        x0, kPhaseRow1, x1 - x0, kPhaseRowHeight, phase_color(name), esc(name), d.phases[i].t,
        j < d.phases.size() ? d.phases[j].t : d.end_t);
    if (x1 - x0 >= 7.0 * double(name.size()) + 6)
      s += fmt::format("<text x=\"{:.2f}\" y=\"{}\" text-anchor=\"middle\" class=\"phase-name\">{}</text>\n",
                       (x0 + x1) / 2, kPhaseRow1 + 13, esc(name));
    i = j;
  }
  for (size_t i = 0; i < d.phases.size(); ++i) {
    const auto& p = d.phases[i];
    const int64_t t1 = i + 1 < d.phases.size() ? d.phases[i + 1].t : d.end_t;
    const double x0 = c.x(double(p.t)), x1 = c.x(double(t1));
    s += fmt::format(
        "<rect class=\"phase\" x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\"><title>{} (t "
        "{} to "
        "{})</title></rect>\n",
        x0, kPhaseRow2, x1 - x0, kPhaseRowHeight, phase_color(p.name), esc(phase_label(p.name, p.layer)), p.t,
        t1);
    const std::string label = p.layer >= 0 ? std::to_string(p.layer) : "";
    if (!label.empty() && x1 - x0 >= 7.0 * double(label.size()) + 4)
      s += fmt::format("<text x=\"{:.2f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", (x0 + x1) / 2,
                       kPhaseRow2 + 13, label);
  }
  if (!d.phases.empty()) {
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\" class=\"title\">phase</text>\n",
                     kPlotLeft - 8, kPhaseRow1 + 13);
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\" class=\"title\">layer</text>\n",
                     kPlotLeft - 8, kPhaseRow2 + 13);
  }
  s += "</g>\n";

  // The plan (the arena's size) and the peak.
  s += "<g class=\"marks\">\n";
  const double y_plan = c.y(double(d.plan_bytes)), y_peak = c.y(double(d.peak_live_bytes));
  s += fmt::format("<line class=\"plan\" x1=\"{}\" x2=\"{}\" y1=\"{:.2f}\" y2=\"{:.2f}\"/>\n", kPlotLeft,
                   kPlotRight, y_plan, y_plan);
  side.push_back({y_plan, fmt::format("plan (arena) {}", format_bytes(d.plan_bytes)), "#333333"});
  s += fmt::format("<line class=\"peak\" x1=\"{}\" x2=\"{}\" y1=\"{:.2f}\" y2=\"{:.2f}\"/>\n", kPlotLeft,
                   kPlotRight, y_peak, y_peak);
  side.push_back({y_peak, fmt::format("peak {}", format_bytes(d.peak_live_bytes)), "#c0392b"});
  if (d.peak_t >= 0) {
    const double xp = c.x(double(d.peak_t));
    const auto* ph = phase_at(d, d.peak_t);
    const std::string where = ph ? ", " + phase_label(ph->name, ph->layer) : "";
    s += fmt::format("<line class=\"peak\" x1=\"{0:.2f}\" x2=\"{0:.2f}\" y1=\"{1:.2f}\" y2=\"{2}\"/>\n", xp,
                     y_peak, kPlotBottom);
    s += fmt::format("<circle class=\"peak-dot\" cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"4\"/>\n", xp, y_peak);
    const char* anchor = xp > kPlotRight - 150 ? "end" : xp < kPlotLeft + 150 ? "start" : "middle";
    s += fmt::format(
        "<text class=\"peak-label\" x=\"{:.2f}\" y=\"{:.2f}\" text-anchor=\"{}\">peak {} at t {}{}</text>\n",
        xp, std::max(y_peak - 9, kPlotTop - 10), anchor, format_bytes(d.peak_live_bytes), d.peak_t,
        esc(where));
  }
  spread(side);
  for (const SideLabel& l : side) {
    s += fmt::format("<polyline class=\"leader\" points=\"{},{:.2f} {},{:.2f} {},{:.2f}\" stroke=\"{}\"/>",
                     kPlotRight, l.anchor, kPlotRight + 6, l.anchor, kLabelX - 3, l.y, l.color);
    s += fmt::format("<text x=\"{}\" y=\"{:.2f}\" fill=\"{}\">{}</text>\n", kLabelX, l.y + 4, l.color,
                     esc(l.text));
  }
  s += fmt::format("<rect class=\"frame\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>\n", kPlotLeft,
                   kPlotTop, kPlotRight - kPlotLeft, kPlotBottom - kPlotTop);
  s += "</g>\n</svg>\n";
  return s;
}

const char* kStyle = R"(
:root { --ink: #1f2328; --muted: #656d76; --line: #d8dee4; }
* { box-sizing: border-box; }
body { margin: 0; padding: 20px 28px 40px; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto,
       "DejaVu Sans", sans-serif; color: var(--ink); background: #fff; }
h1 { font-size: 21px; margin: 0 0 2px; }
h2 { font-size: 16px; margin: 28px 0 8px; }
.sub { color: var(--muted); margin-bottom: 14px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin-bottom: 14px; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 8px 14px; min-width: 150px; }
.card .k { color: var(--muted); font-size: 12px; }
.card .v { font-size: 20px; font-weight: 600; }
.card .n { color: var(--muted); font-size: 12px; }
.card.peak .v { color: #c0392b; }
.card.warn { border-color: #c0392b; background: #fdf0ee; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 18px; margin: 4px 0 6px; }
.legend-item { display: flex; align-items: center; gap: 6px; cursor: default; }
.swatch { display: inline-block; width: 13px; height: 13px; border-radius: 3px; vertical-align: -2px; }
.legend .n { color: var(--muted); font-size: 12px; }
svg { width: 100%; max-width: 1200px; height: auto; display: block; font-size: 11px; fill: var(--ink); }
svg text { fill: #444; }
svg .title { fill: var(--muted); font-size: 12px; }
svg .grid { stroke: #eceff2; }
svg .tick { stroke: #999; }
svg .frame { fill: none; stroke: #9aa4ad; }
svg .alloc { stroke: #fff; stroke-width: 0.5; }
svg .alloc:hover, svg .band:hover { stroke: #111; stroke-width: 1.5; }
svg .band { stroke: #fff; stroke-width: 0.5; }
svg .boundary { stroke: #444; stroke-opacity: 0.3; stroke-dasharray: 2 3; }
svg .phase, svg .phase-run { stroke: #fff; stroke-width: 0.5; }
svg .phase-name { font-weight: 600; fill: #333; }
svg .plan { stroke: #333; stroke-width: 1.5; stroke-dasharray: 7 4; }
svg .peak { stroke: #c0392b; stroke-width: 1.5; stroke-dasharray: 3 3; }
svg .peak-dot { fill: #c0392b; }
svg .peak-label { fill: #c0392b; font-weight: 600; }
svg .leader { fill: none; stroke-width: 0.8; }
svg[data-focus] .alloc, svg[data-focus] .band { opacity: 0.18; }
.how { color: var(--muted); max-width: 1200px; }
table { border-collapse: collapse; min-width: 640px; }
th, td { padding: 4px 12px 4px 0; border-bottom: 1px solid var(--line); text-align: left; }
th { font-size: 12px; color: var(--muted); font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.name { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 13px; }
.more { color: var(--muted); font-size: 12px; }
#render-check { display: none; }
)";

// Fills #render-check with what the browser actually laid out, so a headless browser's --dump-dom shows
// whether the picture rendered (and hovering the legend highlights a category).
const char* kScript = R"(
(function () {
  var svg = document.getElementById('timeline');
  var out = document.getElementById('render-check');
  var allocs = svg.querySelectorAll('.alloc');
  var scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
  var drawn = 0, visible = 0;
  for (var i = 0; i < allocs.length; i++) {
    var b = allocs[i].getBBox();
    if (b.width > 0) drawn++;
    if (b.width * scale >= 1 && b.height * scale >= 1) visible++;
  }
  var plot = document.getElementById('plot').getBBox();
  var ok = drawn === allocs.length && plot.width > 0 && plot.height > 0 && scale > 0;
  out.setAttribute('data-allocs', allocs.length);
  out.setAttribute('data-drawn', drawn);
  out.setAttribute('data-visible', visible);
  out.setAttribute('data-bands', svg.querySelectorAll('.band').length);
  out.setAttribute('data-legend', document.querySelectorAll('.legend-item').length);
  out.setAttribute('data-plot', Math.round(plot.width) + 'x' + Math.round(plot.height));
  out.setAttribute('data-status', ok ? 'ok' : 'incomplete');
  out.textContent = 'rendered ' + drawn + ' of ' + allocs.length + ' allocations';
  document.querySelectorAll('.legend-item').forEach(function (item) {
    item.addEventListener('mouseenter', function () { svg.setAttribute('data-focus', item.dataset.category); });
    item.addEventListener('mouseleave', function () { svg.removeAttribute('data-focus'); });
  });
})();
)";

std::string category_cell(MemoryCategory c) {
  return fmt::format("<span class=\"swatch\" style=\"background:{}\"></span> {}", category_color(c),
                     esc(memory_category_name(c)));
}

}  // namespace

std::string render_memory_report(const MemoryTraceData& d, const MemoryReportOptions& options) {
  std::string h;
  const std::string file = esc(d.source);
  h += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  h += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  h += fmt::format("<title>Memory history, step {} ({})</title>\n<style>{}", d.step, file, kStyle);
  for (int ci = 0; ci < kMemoryCategories; ++ci) {  // hovering a legend entry keeps its category opaque
    const char* key = memory_category_key(static_cast<MemoryCategory>(ci));
    h += fmt::format("svg[data-focus=\"{0}\"] [data-category=\"{0}\"] {{ opacity: 1; }}\n", key);
  }
  h += "</style>\n</head>\n<body>\n";
  h += fmt::format(
      "<h1>Memory history, step {}</h1>\n<div class=\"sub\">{} &middot; {} &middot; anvil "
      "memory-report</div>\n",
      d.step, d.device.empty() ? "device not named" : esc(d.device), file);

  // Headline numbers.
  size_t live_at_peak = d.peak_live_bytes - d.persistent_bytes;
  const bool over = d.peak_live_bytes > d.plan_bytes;
  h += "<div class=\"cards\">\n";
  auto card = [&](const char* cls, const std::string& key, const std::string& value,
                  const std::string& note) {
    h += fmt::format(
        "<div class=\"card {}\"><div class=\"k\">{}</div><div class=\"v\">{}</div><div "
        "class=\"n\">{}</div></div>\n",
        cls, key, value, note);
  };
  card(over ? "peak warn" : "peak", "peak", format_bytes(d.peak_live_bytes),
       over ? fmt::format("{} over the plan!", format_bytes(d.peak_live_bytes - d.plan_bytes))
            : fmt::format("{} of the plan", percent(d.peak_live_bytes, d.plan_bytes)));
  card("", "plan (arena)", format_bytes(d.plan_bytes), with_commas(d.plan_bytes) + " bytes");
  card("", "persistent buffers", format_bytes(d.persistent_bytes),
       fmt::format("{} buffers",
                   std::count_if(d.buffers.begin(), d.buffers.end(), [](auto& b) { return b.persistent; })));
  card("", "step data at the peak", format_bytes(live_at_peak),
       fmt::format("{} allocations in the step", d.allocs.size()));
  card("", "context overhead", format_bytes(d.context_overhead_bytes), "outside the arena");
  card("", "on the device", format_bytes(d.plan_bytes + d.context_overhead_bytes), "plan + overhead");
  h += "</div>\n";

  // Legend: each category with what it holds.
  std::array<size_t, kMemoryCategories> persistent{}, at_peak{}, count{};
  std::array<bool, kMemoryCategories> present{};
  for (const auto& b : d.buffers) {
    present[size_t(b.category)] = true;
    if (b.persistent) persistent[size_t(b.category)] += b.bytes;
  }
  for (const auto& a : d.allocs) {
    present[size_t(a.category)] = true;
    ++count[size_t(a.category)];
    if (d.peak_t >= 0 && a.t_alloc <= d.peak_t && d.alloc_end(a) > d.peak_t)
      at_peak[size_t(a.category)] += a.bytes;
  }
  h += "<div class=\"legend\">\n";
  for (int ci = 0; ci < kMemoryCategories; ++ci) {
    if (!present[size_t(ci)]) continue;
    const auto cat = static_cast<MemoryCategory>(ci);
    std::string note;
    if (persistent[size_t(ci)]) note = format_bytes(persistent[size_t(ci)]) + " persistent";
    if (count[size_t(ci)])
      note += fmt::format("{}{} allocations, {} at the peak", note.empty() ? "" : "; ", count[size_t(ci)],
                          format_bytes(at_peak[size_t(ci)]));
    h += fmt::format("<div class=\"legend-item\" data-category=\"{}\">{} <span class=\"n\">{}</span></div>\n",
                     memory_category_key(cat), category_cell(cat), note);
  }
  h += "</div>\n";

  h += svg_timeline(d);
  h += "<p class=\"how\">Bottom bands: the arena's buffers that live for the whole run (weights, gradients, "
       "optimizer states, workspaces, token buffers). Above them: the step's data in the activation and "
       "recompute "
       "buffers, one shape per allocation, from the event that wrote it to the event that freed it; when "
       "data below "
       "is freed, what sits above drops. The top edge is the memory in use; the dashed lines are the plan "
       "(the "
       "arena) and the peak. Hover a shape for its name, layer and size, or a legend entry to pick out a "
       "category.</p>\n";
  h += "<output id=\"render-check\" data-status=\"not-run\"></output>\n";

  // The largest buffers.
  std::vector<const MemoryTraceData::Buffer*> bufs;
  for (const auto& b : d.buffers) bufs.push_back(&b);
  std::stable_sort(bufs.begin(), bufs.end(), [](auto* a, auto* b) { return a->bytes > b->bytes; });
  h += fmt::format("<h2>Largest buffers ({} in the arena)</h2>\n<table id=\"top-buffers\">\n", bufs.size());
  h += "<tr><th>buffer</th><th>category</th><th>size</th><th>bytes</th><th>of "
       "plan</th><th>lifetime</th></tr>\n";
  size_t rest = 0;
  for (size_t i = 0; i < bufs.size(); ++i) {
    if (i >= options.top_buffers) {
      rest += bufs[i]->bytes;
      continue;
    }
    const auto& b = *bufs[i];
    h += fmt::format(
        "<tr><td class=\"name\">{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td "
        "class=\"num\">{}</td><td>{}</td></tr>\n",
        esc(b.name), category_cell(b.category), format_bytes(b.bytes), with_commas(b.bytes),
        percent(b.bytes, d.plan_bytes), b.persistent ? "run" : "step data");
  }
  h += "</table>\n";
  if (bufs.size() > options.top_buffers)
    h += fmt::format("<div class=\"more\">... and {} more buffers, {}</div>\n",
                     bufs.size() - options.top_buffers, format_bytes(rest));

  // What is live at the peak.
  if (d.peak_t >= 0) {
    std::vector<const MemoryTraceData::Alloc*> live;
    for (const auto& a : d.allocs)
      if (a.t_alloc <= d.peak_t && d.alloc_end(a) > d.peak_t) live.push_back(&a);
    std::stable_sort(live.begin(), live.end(), [](auto* a, auto* b) { return a->bytes > b->bytes; });
    h += fmt::format(
        "<h2>Step data live at the peak (t {}: {} allocations, {})</h2>\n<table id=\"live-at-peak\">\n",
        d.peak_t, live.size(), format_bytes(live_at_peak));
    h += "<tr><th>allocation</th><th>category</th><th>layer</th><th>size</th><th>made</th><th>freed</th></"
         "tr>\n";
    for (size_t i = 0; i < live.size() && i < options.top_buffers; ++i) {
      const auto& a = *live[i];
      h += fmt::format(
          "<tr><td class=\"name\">{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>t "
          "{} "
          "({})</td><td>{}</td></tr>\n",
          esc(a.name), category_cell(a.category), a.layer >= 0 ? std::to_string(a.layer) : "–",
          format_bytes(a.bytes), a.t_alloc, esc(a.phase),
          a.t_free >= 0 ? fmt::format("t {} ({})", a.t_free, esc(a.free_phase)) : "end of step");
    }
    h += "</table>\n";
    if (live.size() > options.top_buffers)
      h += fmt::format("<div class=\"more\">... and {} more</div>\n", live.size() - options.top_buffers);
  }

  h += fmt::format("<script>{}</script>\n</body>\n</html>\n", kScript);
  return h;
}

void write_memory_report(const MemoryTraceData& trace, const std::string& out_path,
                         const MemoryReportOptions& options) {
  const std::string html = render_memory_report(trace, options);
  const std::string temp = fmt::format("{}.tmp-{}", out_path, ::getpid());
  io::write_text_file_synced(temp, html);  // removes its file itself if it fails part way
  if (::rename(temp.c_str(), out_path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    ANVIL_THROW("{}: cannot rename '{}' into place ({})", out_path, temp,
                std::generic_category().message(err));
  }
}

}  // namespace anvil
