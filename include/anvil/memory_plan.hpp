// Memory is planned, not discovered (DESIGN principle 1): every buffer a training step needs is
// listed here with its size before the first step, the device gets one arena of exactly the plan's
// total, and `anvil estimate` prints the same plan.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace anvil {

// Saved activations are what backward reads; recompute buffers hold one checkpointed block's
// activations while it is re-run before its backward.
enum class MemoryCategory { Weights, Gradients, OptimizerState, Activations, Recompute, Workspace, Data };
constexpr int kMemoryCategories = 7;
const char* memory_category_name(MemoryCategory c);

struct PlannedBuffer {
  std::string name;
  MemoryCategory category;
  size_t bytes = 0;
  size_t offset = 0;  // from the arena's base, aligned to kAlignment
};

class MemoryPlan {
 public:
  static constexpr size_t kAlignment = 256;
  // Adds a buffer; returns its index (for Arena::get).
  size_t add(std::string name, MemoryCategory category, size_t bytes);
  size_t total_bytes() const { return total_; }
  size_t bytes(MemoryCategory c) const;
  const std::vector<PlannedBuffer>& buffers() const { return buffers_; }
  // A human-readable breakdown by category (and, if `detail`, by buffer).
  std::string report(bool detail = false) const;

 private:
  std::vector<PlannedBuffer> buffers_;
  size_t total_ = 0;
};

std::string format_bytes(size_t bytes);

}  // namespace anvil
