#include "anvil/memory_plan.hpp"

#include <fmt/format.h>

namespace anvil {

const char* memory_category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::Weights:
      return "weights";
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

size_t MemoryPlan::add(std::string name, MemoryCategory category, size_t bytes) {
  const size_t offset = (total_ + kAlignment - 1) / kAlignment * kAlignment;
  buffers_.push_back({std::move(name), category, bytes, offset});
  total_ = offset + bytes;
  return buffers_.size() - 1;
}

size_t MemoryPlan::bytes(MemoryCategory c) const {
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
  out += fmt::format("  {:<16} {:>12}\n", "total (arena)", format_bytes(total_));
  return out;
}

}  // namespace anvil
