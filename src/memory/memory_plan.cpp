#include "anvil/memory_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>
#include <utility>

#include "anvil/error.hpp"

namespace anvil {

const char* memory_category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::Weights:
      return "weights";
    case MemoryCategory::MasterWeights:
      return "master weights";
    case MemoryCategory::Gradients:
      return "gradients";
    case MemoryCategory::OptimizerState:
      return "optimizer state";
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

std::string format_bytes(size_t bytes) {
  const double b = double(bytes);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

size_t parse_bytes(const std::string& text, const std::string& what) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  std::string unit;
  for (size_t i = pos; i < text.size(); ++i)
    if (text[i] != ' ') unit += char(std::tolower(static_cast<unsigned char>(text[i])));
  static const std::pair<const char*, double> units[] = {
      {"", 1},       {"b", 1},        {"k", 0x1p10},   {"kib", 0x1p10}, {"kb", 1e3},
      {"m", 0x1p20}, {"mib", 0x1p20}, {"mb", 1e6},     {"g", 0x1p30},   {"gib", 0x1p30},
      {"gb", 1e9},   {"t", 0x1p40},   {"tib", 0x1p40}, {"tb", 1e12}};
  if (pos > 0 && value >= 0 && std::isfinite(value))
    for (const auto& [name, scale] : units)
      if (unit == name && value * scale < 0x1p63) return size_t(std::llround(value * scale));
  ANVIL_THROW("{}: '{}' is not a size (examples: 80GiB, 81559MiB, 80GB, 24G, 1000000)", what, text);
}

size_t MemoryPlan::add(std::string name, MemoryCategory category, size_t bytes) {
  const size_t offset = total_;  // a multiple of kAlignment
  buffers_.push_back({std::move(name), category, bytes, offset});
  total_ = offset + aligned(bytes);
  return buffers_.size() - 1;
}

size_t MemoryPlan::add_shared(std::string name, MemoryCategory category, size_t bytes, size_t offset) {
  ANVIL_ASSERT(offset % kAlignment == 0, "buffer {}: offset {} is not a multiple of {}", name, offset,
               kAlignment);
  const size_t end = offset + aligned(bytes);
  // Everything below total_ belongs to earlier buffers (add() packs them), so the overlap is the part of
  // [offset, end) below it.
  const size_t shared = std::min(end, total_) - std::min(offset, total_);
  buffers_.push_back({std::move(name), category, bytes, offset, shared});
  total_ = std::max(total_, end);
  return buffers_.size() - 1;
}

size_t MemoryPlan::shared_bytes() const {
  size_t s = 0;
  for (const auto& b : buffers_) s += b.shared_bytes;
  return s;
}

size_t MemoryPlan::bytes(MemoryCategory c) const {
  size_t s = 0;
  for (const auto& b : buffers_)
    if (b.category == c) s += aligned(b.bytes);
  return s;
}

size_t MemoryPlan::requested_bytes(MemoryCategory c) const {
  size_t s = 0;
  for (const auto& b : buffers_)
    if (b.category == c) s += b.bytes;
  return s;
}

std::string MemoryPlan::report(bool detail) const {
  std::string out;
  for (int i = 0; i < kMemoryCategories; ++i) {
    const auto c = MemoryCategory(i);
    out += fmt::format("  {:<16} {:>12}\n", memory_category_name(c), format_bytes(bytes(c)));
    if (!detail) continue;
    for (const auto& b : buffers_)
      if (b.category == c) out += fmt::format("      {:<28} {:>12}\n", b.name, format_bytes(b.bytes));
  }
  if (const size_t shared = shared_bytes())
    out += fmt::format("  {:<16} {:>12}  (memory counted twice above: shared buffers reuse it)\n", "shared",
                       fmt::format("-{}", format_bytes(shared)));
  out += fmt::format("  {:<16} {:>12}\n", "total (arena)", format_bytes(total_));
  return out;
}

}  // namespace anvil
