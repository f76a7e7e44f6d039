#include "model/kv_cache.hpp"

#include "anvil/error.hpp"

namespace anvil {

KvCache::KvCache(const ArchSpec& spec, int max_batch, int max_len, DType compute)
    : L_(spec.n_layer),
      B_(max_batch),
      S_(max_len),
      NKV_(spec.NKV),
      HS_(spec.HS),
      NH_(spec.NH),
      elem_(dtype_bytes(compute, 1)),
      layer_bytes_(size_t(max_batch) * size_t(max_len) * size_t(spec.NKV) * size_t(spec.HS) *
                   dtype_bytes(compute, 1)) {
  ANVIL_REQUIRE(max_batch >= 1, "KV cache: the batch must hold at least 1 sequence, got {}", max_batch);
  ANVIL_REQUIRE(max_len >= 1 && max_len <= spec.max_positions,
                "KV cache: {} positions per sequence must be between 1 and the model's block_size {}",
                max_len, spec.max_positions);
}

size_t KvCache::bytes_per_position(const ArchSpec& spec, DType compute) {
  return 2 * size_t(spec.n_layer) * size_t(spec.NKV) * size_t(spec.HS) * dtype_bytes(compute, 1);
}

void KvCache::plan_memory(MemoryPlan& plan, DeviceKind backend) {
  const std::string shape = fmt::format("{} layers x [{}, {}, {}, {}]", L_, B_, S_, NKV_, HS_);
  i_k_ = plan.add("kv cache keys (" + shape + ")", MemoryCategory::Activations, layer_bytes_ * L_);
  i_v_ = plan.add("kv cache values (" + shape + ")", MemoryCategory::Activations, layer_bytes_ * L_);
  scratch_bytes_ = cached_attention_scratch_bytes(backend, AttentionShape{B_, 1, NH_, NKV_, HS_});
  if (scratch_bytes_ > 0)
    i_scratch_ = plan.add("cached attention scratch", MemoryCategory::Workspace, scratch_bytes_);
}

void KvCache::bind(const Arena& arena) {
  k_ = arena.get<char>(i_k_);
  v_ = arena.get<char>(i_v_);
  scratch_ = i_scratch_ == SIZE_MAX ? nullptr : arena.get<void>(i_scratch_);
}

KvCacheLayer KvCache::layer(int l) const {
  ANVIL_ASSERT(k_ && l >= 0 && l < L_, "KV cache layer {} of {} (bound: {})", l, L_, k_ != nullptr);
  return {k_ + size_t(l) * layer_bytes_, v_ + size_t(l) * layer_bytes_, S_};
}

}  // namespace anvil
