// The keys and values a Decoder caches for generation (DESIGN principle 1: planned, not discovered): per
// layer K and V, each [B, max_len, NKV, HS] in the compute type, plus the scratch of the attention over the
// cache, added to the MemoryPlan before the first token. The cache holds no lengths: the caller knows each
// sequence's position and passes it to the decode ops (kernels/ops.hpp, "generation (KV cache)").
#pragma once
#include <cstddef>

#include "anvil/memory_plan.hpp"
#include "kernels/ops.hpp"
#include "model/arch_spec.hpp"
#include "runtime/arena.hpp"

namespace anvil {

class KvCache {
 public:
  // Room for `max_batch` sequences of `max_len` (<= the model's block_size) positions each.
  KvCache(const ArchSpec& spec, int max_batch, int max_len, DType compute);

  // Adds "kv cache keys", "kv cache values" (all layers) and the cached attention's scratch for `backend`.
  void plan_memory(MemoryPlan& plan, DeviceKind backend);
  void bind(const Arena& arena);

  int max_batch() const { return B_; }
  int max_len() const { return S_; }
  int layers() const { return L_; }
  // Layer l's K and V views (bound caches only).
  KvCacheLayer layer(int l) const;
  void* attention_scratch() const { return scratch_; }
  size_t attention_scratch_bytes() const { return scratch_bytes_; }
  // Bytes of K and V of all layers, and per cached position of one sequence.
  size_t bytes() const { return 2 * layer_bytes_ * size_t(L_); }
  static size_t bytes_per_position(const ArchSpec& spec, DType compute);

 private:
  int L_, B_, S_, NKV_, HS_, NH_;
  size_t elem_, layer_bytes_;
  size_t i_k_ = SIZE_MAX, i_v_ = SIZE_MAX, i_scratch_ = SIZE_MAX;
  char *k_ = nullptr, *v_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

}  // namespace anvil
