// Where a parameter store's weight shard lives when neither the device nor host memory holds it whole:
// parameter offload to NVMe (offload_param nvme; offload::PagedWeights, docs/memory.md). The store then
// reaches its weights unit by unit (ParamStore::bind_weight_pages): ZeRO-3's gathers read each unit's piece
// from host memory paged in from the file, and the offloaded optimizer writes the updated shard back.
#pragma once
#include <cstddef>

namespace anvil {

class WeightPages {
 public:
  virtual ~WeightPages() = default;

  // Pinned host memory holding this rank's piece of `unit` in the compute type (its elements from
  // max(unit begin, shard begin) on), read in first where it is not there already. The pointer is valid
  // until the next call of piece() or of the writers below. Call queued(unit) once the device's copy from
  // it is queued: the memory is refilled only after that copy has run.
  virtual const void* piece(int unit) = 0;
  virtual void queued(int unit) = 0;

  // The whole shard (its numel() elements), from fp32 values rounded to nearest into the compute type, or
  // into fp32 values. Between steps: the caller's device work that reads pieces has been queued before.
  virtual void write(const float* values) = 0;
  virtual void read(float* values) = 0;
  virtual size_t numel() const = 0;
};

}  // namespace anvil
