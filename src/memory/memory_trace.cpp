#include "memory/memory_trace.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>
#include <utility>

#include "anvil/error.hpp"

namespace anvil {

using json = nlohmann::json;

const char* memory_category_key(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::Weights:
      return "weights";
    case MemoryCategory::MasterWeights:
      return "master_weights";
    case MemoryCategory::Gradients:
      return "gradients";
    case MemoryCategory::OptimizerState:
      return "optimizer_states";
    case MemoryCategory::Activations:
      return "activations";
    case MemoryCategory::Recompute:
      return "recompute";
    case MemoryCategory::Workspace:
      return "workspace";
    case MemoryCategory::Communication:
      return "communication";
    case MemoryCategory::Data:
      return "data";
  }
  return "?";
}

std::optional<MemoryCategory> memory_category_from_key(std::string_view key) {
  for (int i = 0; i < kMemoryCategories; ++i) {
    const auto c = static_cast<MemoryCategory>(i);
    if (key == memory_category_key(c)) return c;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------------
// Writer

MemoryTrace::MemoryTrace(std::string path, std::string_view device_name, size_t plan_bytes,
                         size_t context_overhead_bytes, int64_t traced_step)
    : path_(std::move(path)),
      temp_path_(fmt::format("{}.tmp-{}", path_, ::getpid())),
      plan_bytes_(plan_bytes) {
  ANVIL_REQUIRE(plan_bytes <= kMemoryTraceMaxBytes && context_overhead_bytes <= kMemoryTraceMaxBytes &&
                    traced_step >= 0,
                "memory trace {}: plan {} / overhead {} bytes / step {} out of range", path_, plan_bytes,
                context_overhead_bytes, traced_step);
  try {
    out_.emplace(temp_path_);
  } catch (const Error& e) {
    ANVIL_THROW("memory trace {}: {}", path_, e.what());
  }
  line(json{{"type", "header"},
            {"version", kMemoryTraceVersion},
            {"device", device_name},
            {"plan_bytes", plan_bytes},
            {"context_overhead_bytes", context_overhead_bytes},
            {"step", traced_step}}
           .dump());
}

// Without finish(), out_'s destructor removes the temporary file: no partial trace is left.
MemoryTrace::~MemoryTrace() = default;

void MemoryTrace::require_open(const char* what) const {
  ANVIL_REQUIRE(!finished_, "memory trace {}: {}() after finish()", path_, what);
}

void MemoryTrace::line(const std::string& text) {
  pending_ += text;
  pending_ += '\n';
  if (pending_.size() >= (size_t{1} << 20)) flush();
}

void MemoryTrace::flush() {
  try {
    out_->write(pending_);
  } catch (const Error& e) {
    ANVIL_THROW("memory trace {}: {}", path_, e.what());
  }
  pending_.clear();
}

void MemoryTrace::buffer(std::string_view name, MemoryCategory category, size_t bytes) {
  buffer(name, category, bytes, memory_category_is_persistent(category));
}

void MemoryTrace::buffer(std::string_view name, MemoryCategory category, size_t bytes, bool persistent) {
  require_open("buffer");
  ANVIL_REQUIRE(!name.empty(), "memory trace {}: a buffer needs a name", path_);
  // What the reader checks, checked here too: a trace that is written can be read.
  ANVIL_REQUIRE(bytes <= plan_bytes_ - buffer_bytes_,
                "memory trace {}: buffer '{}' ({} bytes) takes the buffers past the plan's {} bytes", path_,
                name, bytes, plan_bytes_);
  buffer_bytes_ += bytes;
  if (persistent) persistent_bytes_ += bytes;
  line(json{{"type", "buffer"},
            {"name", name},
            {"category", memory_category_key(category)},
            {"bytes", bytes},
            {"persistent", persistent}}
           .dump());
}

int MemoryTrace::alloc(std::string_view name, MemoryCategory category, size_t bytes, int layer,
                       std::string_view phase) {
  require_open("alloc");
  ANVIL_REQUIRE(!name.empty() && !phase.empty(), "memory trace {}: alloc needs a name and a phase", path_);
  ANVIL_REQUIRE(layer >= -1, "memory trace {}: alloc '{}': layer {} (use -1 for none)", path_, name, layer);
  ANVIL_REQUIRE(bytes <= kMemoryTraceMaxBytes && live_bytes_ + bytes <= kMemoryTraceMaxBytes,
                "memory trace {}: alloc '{}' of {} bytes: more than any device holds", path_, name, bytes);
  const int id = next_id_++;
  const int64_t t = t_++;
  live_.emplace(id, bytes);
  live_bytes_ += bytes;
  if (live_bytes_ > max_live_bytes_ || peak_t_ < 0) {
    max_live_bytes_ = std::max(max_live_bytes_, live_bytes_);
    peak_t_ = t;
  }
  line(json{{"type", "alloc"},
            {"t", t},
            {"id", id},
            {"name", name},
            {"category", memory_category_key(category)},
            {"bytes", bytes},
            {"layer", layer},
            {"phase", phase}}
           .dump());
  return id;
}

void MemoryTrace::free(int id, std::string_view phase) {
  require_open("free");
  ANVIL_REQUIRE(!phase.empty(), "memory trace {}: free needs a phase", path_);
  const auto it = live_.find(id);
  ANVIL_REQUIRE(it != live_.end(), "memory trace {}: free of id {}, which is not live", path_, id);
  live_bytes_ -= it->second;
  live_.erase(it);
  line(json{{"type", "free"}, {"t", t_++}, {"id", id}, {"phase", phase}}.dump());
}

void MemoryTrace::phase(std::string_view name, int layer) {
  require_open("phase");
  ANVIL_REQUIRE(!name.empty(), "memory trace {}: a phase needs a name", path_);
  ANVIL_REQUIRE(layer >= -1, "memory trace {}: phase '{}': layer {} (use -1 for none)", path_, name, layer);
  line(json{{"type", "phase"}, {"t", t_++}, {"name", name}, {"layer", layer}}.dump());
}

void MemoryTrace::finish() {
  require_open("finish");
  finished_ = true;  // whatever happens below, the trace takes no more events
  line(json{{"type", "summary"},
            {"peak_live_bytes", peak_live_bytes()},
            {"peak_t", peak_t_},
            {"persistent_bytes", persistent_bytes_}}
           .dump());
  flush();
  try {
    out_->finish();
  } catch (const Error& e) {
    ANVIL_THROW("memory trace {}: {}", path_, e.what());
  }
  out_.reset();
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp_path_.c_str());
    ANVIL_THROW("memory trace {}: cannot rename '{}' into place ({})", path_, temp_path_,
                std::generic_category().message(err));
  }
}

// ---------------------------------------------------------------------------------------------------
// Reader

namespace {

// One line's object, with typed field access whose errors carry "<source>:<line>:".
class Line {
 public:
  Line(const json& j, const std::string& where, std::string_view type) : j_(j), where_(where), type_(type) {}

  const json& field(const char* key) const {
    const auto it = j_.find(key);
    ANVIL_REQUIRE(it != j_.end(), "{}: {} line without \"{}\"", where_, type_, key);
    return *it;
  }
  std::string str(const char* key, bool allow_empty = false) const {
    const json& v = field(key);
    ANVIL_REQUIRE(v.is_string(), "{}: \"{}\" must be a string, not {}", where_, key, v.dump());
    std::string s = v.get<std::string>();
    ANVIL_REQUIRE(allow_empty || !s.empty(), "{}: \"{}\" must not be empty", where_, key);
    return s;
  }
  // A non-negative integer (bytes, t, ids, versions).
  uint64_t count(const char* key) const {
    const json& v = field(key);
    ANVIL_REQUIRE(v.is_number_integer(), "{}: \"{}\" must be an integer, not {}", where_, key, v.dump());
    ANVIL_REQUIRE(v.is_number_unsigned() || v.get<int64_t>() >= 0, "{}: \"{}\" must not be negative ({})",
                  where_, key, v.dump());
    return v.get<uint64_t>();
  }
  // Sizes are capped (kMemoryTraceMaxBytes) so that sums of them cannot wrap around.
  size_t bytes(const char* key) const {
    const uint64_t n = count(key);
    ANVIL_REQUIRE(n <= kMaxBytes, "{}: \"{}\" is {}, more than any device holds", where_, key, n);
    return size_t(n);
  }
  static constexpr uint64_t kMaxBytes = kMemoryTraceMaxBytes;

  int64_t integer(const char* key, int64_t lo, int64_t hi) const {
    const json& v = field(key);
    ANVIL_REQUIRE(v.is_number_integer(), "{}: \"{}\" must be an integer, not {}", where_, key, v.dump());
    const bool in_range = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(hi)
                                                 : v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
    ANVIL_REQUIRE(in_range, "{}: \"{}\" is {}, outside [{}, {}]", where_, key, v.dump(), lo, hi);
    return v.get<int64_t>();
  }
  bool boolean(const char* key) const {
    const json& v = field(key);
    ANVIL_REQUIRE(v.is_boolean(), "{}: \"{}\" must be true or false, not {}", where_, key, v.dump());
    return v.get<bool>();
  }
  MemoryCategory category() const {
    const std::string key = str("category");
    const auto c = memory_category_from_key(key);
    if (!c) {
      std::string known;
      for (int i = 0; i < kMemoryCategories; ++i)
        known += fmt::format("{}{}", i ? ", " : "", memory_category_key(static_cast<MemoryCategory>(i)));
      ANVIL_THROW("{}: unknown category '{}' (known: {})", where_, key, known);
    }
    return *c;
  }
  // Every key must be one this version knows: a misspelt key is an error, not silently dropped.
  void only(std::initializer_list<const char*> keys) const {
    for (const auto& [k, v] : j_.items()) {
      bool known = false;
      for (const char* allowed : keys) known = known || k == allowed;
      ANVIL_REQUIRE(known, "{}: unknown key \"{}\" in a {} line", where_, k, type_);
    }
  }

 private:
  const json& j_;
  const std::string& where_;
  std::string_view type_;
};

}  // namespace

MemoryTraceData parse_memory_trace(std::string_view text, const std::string& source) {
  MemoryTraceData d;
  d.source = source;
  std::unordered_map<int, size_t> index;        // alloc id -> index in d.allocs
  std::unordered_map<int, size_t> alloc_lines;  // alloc id -> its line, for messages
  std::set<int> live;
  int64_t last_t = -1;
  size_t live_bytes = 0, max_live = 0, buffer_bytes = 0;
  bool have_header = false, have_summary = false;
  size_t line_no = 0, pos = 0;
  std::string where;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view raw = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
    where = fmt::format("{}:{}", source, line_no);
    if (raw.find_first_not_of(" \t") == std::string_view::npos) continue;  // blank lines are harmless
    ANVIL_REQUIRE(!have_summary, "{}: a line after the summary (the summary must be the last line)", where);

    json j;
    try {
      j = json::parse(raw);
    } catch (const json::parse_error& e) {
      ANVIL_THROW("{}: not a JSON object ({})", where, e.what());
    }
    ANVIL_REQUIRE(j.is_object(), "{}: not a JSON object", where);
    const auto type_it = j.find("type");
    ANVIL_REQUIRE(type_it != j.end() && type_it->is_string(), "{}: no \"type\" string", where);
    const std::string type = type_it->get<std::string>();
    const Line l(j, where, type);

    if (!have_header) {
      ANVIL_REQUIRE(type == "header", "{}: the first line must be the header, not a {} line", where, type);
      l.only({"type", "version", "device", "plan_bytes", "context_overhead_bytes", "step"});
      const uint64_t version = l.count("version");
      ANVIL_REQUIRE(version == uint64_t(kMemoryTraceVersion),
                    "{}: trace version {} (this anvil reads version {})", where, version,
                    kMemoryTraceVersion);
      d.device = l.str("device", true);
      d.plan_bytes = l.bytes("plan_bytes");
      d.context_overhead_bytes = l.bytes("context_overhead_bytes");
      d.step = int64_t(l.count("step"));
      have_header = true;
      continue;
    }

    // The events share one clock: t must grow from line to line.
    auto event_t = [&]() {
      const int64_t t = l.integer("t", 0, INT64_MAX - 1);
      ANVIL_REQUIRE(t > last_t, "{}: t {} does not follow the previous event's t {}", where, t, last_t);
      last_t = t;
      return t;
    };

    if (type == "header") {
      ANVIL_THROW("{}: a second header", where);
    } else if (type == "buffer") {
      l.only({"type", "name", "category", "bytes", "persistent"});
      MemoryTraceData::Buffer b{l.str("name"), l.category(), l.bytes("bytes"), l.boolean("persistent")};
      if (b.persistent) d.persistent_bytes += b.bytes;
      buffer_bytes += b.bytes;
      ANVIL_REQUIRE(buffer_bytes <= d.plan_bytes,
                    "{}: the buffers so far add up to {} bytes, more than the header's plan_bytes {}", where,
                    buffer_bytes, d.plan_bytes);
      d.buffers.push_back(std::move(b));
    } else if (type == "alloc") {
      l.only({"type", "t", "id", "name", "category", "bytes", "layer", "phase"});
      MemoryTraceData::Alloc a;
      a.t_alloc = event_t();
      a.id = int(l.integer("id", 0, INT32_MAX));
      a.name = l.str("name");
      a.category = l.category();
      a.bytes = l.bytes("bytes");
      a.layer = int(l.integer("layer", -1, INT32_MAX));
      a.phase = l.str("phase");
      ANVIL_REQUIRE(!index.count(a.id), "{}: alloc id {} was already used on line {}", where, a.id,
                    alloc_lines[a.id]);
      index.emplace(a.id, d.allocs.size());
      alloc_lines[a.id] = line_no;
      live.insert(a.id);
      live_bytes += a.bytes;
      ANVIL_REQUIRE(live_bytes <= Line::kMaxBytes, "{}: {} bytes live at once, more than any device holds",
                    where, live_bytes);
      if (live_bytes > max_live || d.peak_t < 0) {
        max_live = std::max(max_live, live_bytes);
        d.peak_t = a.t_alloc;
      }
      d.allocs.push_back(std::move(a));
    } else if (type == "free") {
      l.only({"type", "t", "id", "phase"});
      const int64_t t = event_t();
      const int64_t id = l.integer("id", 0, INT32_MAX);
      const std::string phase = l.str("phase");
      const auto it = index.find(int(id));
      ANVIL_REQUIRE(it != index.end(), "{}: free of id {}, which no alloc line made", where, id);
      MemoryTraceData::Alloc& a = d.allocs[it->second];
      ANVIL_REQUIRE(live.count(int(id)), "{}: free of id {} ('{}'), already freed at t {}", where, id, a.name,
                    a.t_free);
      live.erase(int(id));
      live_bytes -= a.bytes;
      a.t_free = t;
      a.free_phase = phase;
    } else if (type == "phase") {
      l.only({"type", "t", "name", "layer"});
      MemoryTraceData::Phase p;
      p.t = event_t();
      p.name = l.str("name");
      p.layer = int(l.integer("layer", -1, INT32_MAX));
      d.phases.push_back(std::move(p));
    } else if (type == "summary") {
      l.only({"type", "peak_live_bytes", "peak_t", "persistent_bytes"});
      const uint64_t peak = l.count("peak_live_bytes");
      const int64_t peak_t = l.integer("peak_t", -1, INT64_MAX);
      const uint64_t persistent = l.count("persistent_bytes");
      d.peak_live_bytes = d.persistent_bytes + max_live;
      ANVIL_REQUIRE(persistent == d.persistent_bytes,
                    "{}: summary says persistent_bytes {} but the persistent buffers add up to {}", where,
                    persistent, d.persistent_bytes);
      ANVIL_REQUIRE(peak == d.peak_live_bytes && peak_t == d.peak_t,
                    "{}: summary says peak_live_bytes {} at t {} but the events give {} at t {}", where, peak,
                    peak_t, d.peak_live_bytes, d.peak_t);
      have_summary = true;
    } else {
      ANVIL_THROW("{}: unknown line type '{}' (header, buffer, alloc, free, phase, summary)", where, type);
    }
  }
  ANVIL_REQUIRE(have_header, "{}: empty trace (no header line)", source);
  ANVIL_REQUIRE(have_summary, "{}:{}: no summary line at the end (the trace was not finished)", source,
                line_no);
  d.end_t = last_t + 1;
  return d;
}

MemoryTraceData read_memory_trace(const std::string& path) {
  return parse_memory_trace(io::read_text_file(path), path);
}

}  // namespace anvil
