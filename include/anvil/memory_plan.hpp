// Memory is planned, not discovered (DESIGN principle 1): every buffer a training step needs is
// listed here with its size before the first step, the device gets one arena of exactly the plan's
// total, and `anvil estimate` prints the same plan.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace anvil {

// Saved activations are what backward reads; recompute buffers hold one checkpointed block's
// activations while it is re-run before its backward. Master weights are the fp32 copy of 16-bit weights;
// communication buffers hold the gradients in the type they are reduced in across processes, when it is
// not theirs (communication_data_type).
enum class MemoryCategory {
  Weights,
  MasterWeights,
  Gradients,
  OptimizerState,
  Activations,
  Recompute,
  Workspace,
  Communication,
  Data
};
constexpr int kMemoryCategories = 9;
const char* memory_category_name(MemoryCategory c);

struct PlannedBuffer {
  std::string name;
  MemoryCategory category;
  size_t bytes = 0;
  size_t offset = 0;  // from the arena's base, aligned to kAlignment
  // Bytes of this buffer that lie over buffers planned before it (MemoryPlan::add_shared): memory it
  // reuses once their data is dead. 0 for a buffer of its own.
  size_t shared_bytes = 0;
};

class MemoryPlan {
 public:
  static constexpr size_t kAlignment = 256;
  // Adds a buffer after everything planned so far; returns its index (for Arena::get). Every buffer
  // occupies a whole number of kAlignment blocks.
  size_t add(std::string name, MemoryCategory category, size_t bytes);
  // Adds a buffer at `offset` (a multiple of kAlignment), over the buffers planned before it where it
  // reaches them: the caller guarantees that no data of theirs is live while this buffer's is (e.g.
  // gradients written into the memory of activations that backward has finished with). The arena grows
  // only by the part past the current end. Buffers added later go after it.
  size_t add_shared(std::string name, MemoryCategory category, size_t bytes, size_t offset);
  // The arena's size: the sum of bytes(c) over all categories, less shared_bytes().
  size_t total_bytes() const { return total_; }
  // The bytes that shared buffers reuse (the sum of their PlannedBuffer::shared_bytes).
  size_t shared_bytes() const;
  // Bytes the category occupies in the arena: its buffers, each rounded up to kAlignment.
  size_t bytes(MemoryCategory c) const;
  // Bytes the category's buffers ask for (without the alignment padding).
  size_t requested_bytes(MemoryCategory c) const;
  const std::vector<PlannedBuffer>& buffers() const { return buffers_; }
  // A human-readable breakdown by category (and, if `detail`, by buffer).
  std::string report(bool detail = false) const;

  static constexpr size_t aligned(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

 private:
  std::vector<PlannedBuffer> buffers_;
  size_t total_ = 0;
};

std::string format_bytes(size_t bytes);
// "80GiB", "81559MiB", "79.6 GiB", "24G" (binary), "80GB" (decimal), "1000000" (bytes). Throws anvil::Error
// naming `what` (e.g. "--gpu_memory") for anything else.
size_t parse_bytes(const std::string& text, const std::string& what);

}  // namespace anvil
