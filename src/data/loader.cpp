#include "data/loader.hpp"

#include <numeric>
#include <utility>

#include "anvil/error.hpp"
#include "anvil/rng.hpp"

namespace anvil::data {
namespace {

// splitmix64's finaliser: a bijection that spreads every input bit over the output.
uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Each epoch's shuffle gets its own stream. Mixing the epoch before adding keeps the streams of
// (seed, e) and (seed + 1, e - 1) or similar neighbours unrelated.
uint64_t epoch_seed(uint64_t seed, uint64_t epoch) {
  return mix64(seed + mix64(epoch + 0x5DA7A10ADE5ull));
}

}  // namespace

uint64_t shuffle_seed(uint64_t seed, uint64_t epoch) {
  return epoch_seed(seed, epoch);
}

namespace {

uint64_t count_windows(const TokenShard& shard, int seq_len) {
  return shard.size() < 2 ? 0 : (shard.size() - 1) / static_cast<uint64_t>(seq_len);
}

// Checked before any member that depends on the config is built.
LoaderConfig validated(const std::shared_ptr<const TokenShard>& shard, const LoaderConfig& cfg) {
  ANVIL_REQUIRE(shard != nullptr, "data loader: no token shard given");
  ANVIL_REQUIRE(cfg.batch_size >= 1, "data loader for '{}': batch_size {} must be >= 1", shard->path(),
                cfg.batch_size);
  ANVIL_REQUIRE(cfg.seq_len >= 1, "data loader for '{}': seq_len {} must be >= 1", shard->path(),
                cfg.seq_len);
  ANVIL_REQUIRE(cfg.prefetch >= 1, "data loader for '{}': prefetch {} must be >= 1", shard->path(),
                cfg.prefetch);
  ANVIL_REQUIRE(cfg.num_workers >= 1 && cfg.num_workers <= 256,
                "data loader for '{}': num_workers {} must be between 1 and 256", shard->path(),
                cfg.num_workers);
  ANVIL_REQUIRE(cfg.ranks >= 1 && cfg.rank >= 0 && cfg.rank < cfg.ranks,
                "data loader for '{}': rank {} of {} ranks is out of range", shard->path(), cfg.rank,
                cfg.ranks);
  const uint64_t windows = count_windows(*shard, cfg.seq_len);
  const uint64_t global_rows = uint64_t(cfg.batch_size) * uint64_t(cfg.ranks);
  ANVIL_REQUIRE(
      windows >= global_rows,
      "data loader: token shard '{}' has {} tokens, which make {} windows of seq_len + 1 = {} tokens; "
      "one batch needs batch_size{} = {} windows ({} tokens at least)",
      shard->path(), shard->size(), windows, cfg.seq_len + 1, cfg.ranks > 1 ? " x ranks" : "", global_rows,
      global_rows * static_cast<uint64_t>(cfg.seq_len) + 1);
  return cfg;
}

size_t tokens_per_batch(const LoaderConfig& cfg) {
  return static_cast<size_t>(cfg.batch_size) * static_cast<size_t>(cfg.seq_len);
}

size_t ring_slots(const LoaderConfig& cfg) {
  return PrefetchRing::slots(cfg.prefetch);
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const TokenShard> shard, LoaderConfig cfg, Device& dev)
    : shard_(std::move(shard)),
      cfg_(validated(shard_, cfg)),
      num_windows_(count_windows(*shard_, cfg_.seq_len)),
      batches_per_epoch_(num_windows_ / (static_cast<uint64_t>(cfg_.batch_size) * uint64_t(cfg_.ranks))),
      pinned_staging_(cfg_.pin_memory
                          ? PinnedBuffer(dev, ring_slots(cfg_) * 2 * tokens_per_batch(cfg_) * sizeof(int32_t))
                          : PinnedBuffer()),
      pageable_staging_(cfg_.pin_memory ? 0 : ring_slots(cfg_) * 2 * tokens_per_batch(cfg_)),
      slots_(make_slots()),
      permutation_(cfg_.shuffle ? num_windows_ : 0),
      ring_(
          cfg_.prefetch, cfg_.num_workers, batches_per_epoch_,
          [this](size_t slot, LoaderPosition pos) { return prepare(slots_[slot], pos); },
          [this](size_t slot, LoaderPosition pos, uint64_t row_begin, uint64_t row_end) {
            fill_rows(slots_[slot], pos, row_begin, row_end);
          }) {}

std::vector<DataLoader::Slot> DataLoader::make_slots() {
  const size_t batch_tokens = tokens_per_batch(cfg_);
  auto* base = cfg_.pin_memory ? static_cast<int32_t*>(pinned_staging_.get()) : pageable_staging_.data();
  std::vector<Slot> slots(ring_slots(cfg_));
  for (size_t i = 0; i < slots.size(); ++i) {
    Slot& slot = slots[i];
    slot.inputs = base + (2 * i) * batch_tokens;
    slot.targets = base + (2 * i + 1) * batch_tokens;
    slot.batch = HostBatch{slot.inputs, slot.targets, cfg_.batch_size, cfg_.seq_len, LoaderPosition{}};
  }
  return slots;
}

void DataLoader::ensure_permutation(uint64_t epoch) {
  if (permutation_epoch_ == epoch) return;
  // Always start from the identity so the order depends on the epoch alone, not on history.
  std::iota(permutation_.begin(), permutation_.end(), uint64_t{0});
  Rng rng(epoch_seed(cfg_.seed, epoch));
  for (uint64_t i = num_windows_; i > 1; --i) std::swap(permutation_[i - 1], permutation_[rng.below(i)]);
  permutation_epoch_ = epoch;
}

void DataLoader::fill_rows(Slot& slot, LoaderPosition pos, uint64_t row_begin, uint64_t row_end) const {
  const auto seq_len = static_cast<uint64_t>(cfg_.seq_len);
  const auto batch_size = static_cast<uint64_t>(cfg_.batch_size);
  for (uint64_t row = row_begin; row < row_end; ++row) {
    const uint64_t index = (pos.batch * uint64_t(cfg_.ranks) + uint64_t(cfg_.rank)) * batch_size + row;
    const uint64_t window = cfg_.shuffle ? permutation_[index] : index;
    shard_->read(window * seq_len, seq_len, slot.inputs + row * seq_len);
    shard_->read(window * seq_len + 1, seq_len, slot.targets + row * seq_len);
  }
}

uint64_t DataLoader::prepare(Slot& slot, LoaderPosition pos) {
  if (cfg_.shuffle) ensure_permutation(pos.epoch);
  slot.batch.pos = pos;
  return static_cast<uint64_t>(cfg_.batch_size);
}

void DataLoader::seek(LoaderPosition p) {
  ANVIL_REQUIRE(p.batch < batches_per_epoch_,
                "data loader for '{}': cannot seek to epoch {} batch {}: an epoch has {} batches",
                shard_->path(), p.epoch, p.batch, batches_per_epoch_);
  ring_.seek(p);
}

}  // namespace anvil::data
