#include "data/classification_loader.hpp"

#include <algorithm>
#include <numeric>
#include <utility>

#include "anvil/error.hpp"
#include "anvil/rng.hpp"

namespace anvil::data {
namespace {

// Checked before any member that depends on the config is built.
ClassificationLoaderConfig validated(const std::shared_ptr<const ClassificationShard>& shard,
                                     const ClassificationLoaderConfig& cfg) {
  ANVIL_REQUIRE(shard != nullptr, "classification loader: no shard given");
  const std::string& path = shard->path();
  ANVIL_REQUIRE(cfg.batch_size >= 1, "classification loader for '{}': batch_size {} must be >= 1", path,
                cfg.batch_size);
  ANVIL_REQUIRE(cfg.max_length >= 1, "classification loader for '{}': max_length {} must be >= 1", path,
                cfg.max_length);
  ANVIL_REQUIRE(cfg.pad_multiple >= 1, "classification loader for '{}': pad_multiple must be >= 1", path);
  ANVIL_REQUIRE(cfg.pad_id >= 0, "classification loader for '{}': pad id {} must be >= 0", path, cfg.pad_id);
  ANVIL_REQUIRE(cfg.prefetch >= 1, "classification loader for '{}': prefetch {} must be >= 1", path,
                cfg.prefetch);
  ANVIL_REQUIRE(cfg.num_workers >= 1 && cfg.num_workers <= 256,
                "classification loader for '{}': num_workers {} must be between 1 and 256", path,
                cfg.num_workers);
  ANVIL_REQUIRE(shard->size() > 0, "classification shard '{}' has no examples", path);
  ANVIL_REQUIRE(cfg.ranks >= 1 && cfg.rank >= 0 && cfg.rank < cfg.ranks && (cfg.ranks == 1 || cfg.drop_last),
                "classification loader for '{}': rank {} of {} ranks (drop_last {}) is not a valid split",
                path, cfg.rank, cfg.ranks, cfg.drop_last);
  ANVIL_REQUIRE(!cfg.drop_last || shard->size() >= uint64_t(cfg.batch_size) * uint64_t(cfg.ranks),
                "classification shard '{}' has {} examples; one batch needs batch_size{} = {}", path,
                shard->size(), cfg.ranks > 1 ? " x ranks" : "",
                uint64_t(cfg.batch_size) * uint64_t(cfg.ranks));
  // Cutting an example would silently change what the model is trained or evaluated on (and, for [CLS] text
  // [SEP] examples, drop the [SEP]); the data must be prepared for the length instead.
  for (uint64_t i = 0; i < shard->size(); ++i)
    ANVIL_REQUIRE(
        shard->length(i) <= uint32_t(cfg.max_length),
        "classification shard '{}': example {} has {} tokens, more than the sequence length {} (prepare "
        "the data with `anvil prepare-data --max_length {}`, or raise max_seq_length up to the model's "
        "block_size)",
        path, i, shard->length(i), cfg.max_length, cfg.max_length);
  return cfg;
}

size_t slot_ints(const ClassificationLoaderConfig& cfg) {
  return size_t(cfg.batch_size) * size_t(cfg.max_length) + 2 * size_t(cfg.batch_size);
}

size_t ring_slots(const ClassificationLoaderConfig& cfg) {
  return PrefetchRing::slots(cfg.prefetch);
}

}  // namespace

uint32_t ClassificationLoader::longest_example(const ClassificationShard& shard) {
  uint32_t longest = 0;
  for (uint64_t i = 0; i < shard.size(); ++i) longest = std::max(longest, shard.length(i));
  return longest;
}

ClassificationLoader::ClassificationLoader(std::shared_ptr<const ClassificationShard> shard,
                                           ClassificationLoaderConfig cfg, Device& dev)
    : shard_(std::move(shard)),
      cfg_(validated(shard_, cfg)),
      batches_per_epoch_(cfg_.drop_last
                             ? shard_->size() / (uint64_t(cfg_.batch_size) * uint64_t(cfg_.ranks))
                             : (shard_->size() + uint64_t(cfg_.batch_size) - 1) / uint64_t(cfg_.batch_size)),
      pinned_staging_(cfg_.pin_memory
                          ? PinnedBuffer(dev, ring_slots(cfg_) * slot_ints(cfg_) * sizeof(int32_t))
                          : PinnedBuffer()),
      pageable_staging_(cfg_.pin_memory ? 0 : ring_slots(cfg_) * slot_ints(cfg_)),
      slots_(make_slots()),
      permutation_(cfg_.shuffle ? shard_->size() : 0),
      ring_(
          cfg_.prefetch, cfg_.num_workers, batches_per_epoch_,
          [this](size_t slot, LoaderPosition pos) { return prepare(slots_[slot], pos); },
          [this](size_t slot, LoaderPosition pos, uint64_t row_begin, uint64_t row_end) {
            fill_rows(slots_[slot], pos, row_begin, row_end);
          }) {}

std::vector<ClassificationLoader::Slot> ClassificationLoader::make_slots() {
  auto* base = cfg_.pin_memory ? static_cast<int32_t*>(pinned_staging_.get()) : pageable_staging_.data();
  const size_t B = size_t(cfg_.batch_size);
  std::vector<Slot> slots(ring_slots(cfg_));
  for (size_t i = 0; i < slots.size(); ++i) {
    Slot& s = slots[i];
    s.ids = base + i * slot_ints(cfg_);
    s.lengths = s.ids + B * size_t(cfg_.max_length);
    s.labels = s.lengths + B;
    s.batch = ClassificationHostBatch{s.ids, s.lengths, s.labels, 0, 0, LoaderPosition{}};
  }
  return slots;
}

void ClassificationLoader::ensure_permutation(uint64_t epoch) {
  if (permutation_epoch_ == epoch) return;
  // From the identity each time, so the order depends on the epoch alone, not on history.
  std::iota(permutation_.begin(), permutation_.end(), uint64_t{0});
  Rng rng(shuffle_seed(cfg_.seed, epoch));
  for (uint64_t i = permutation_.size(); i > 1; --i)
    std::swap(permutation_[i - 1], permutation_[rng.below(i)]);
  permutation_epoch_ = epoch;
}

void ClassificationLoader::fill_rows(Slot& slot, LoaderPosition pos, uint64_t row_begin,
                                     uint64_t row_end) const {
  const uint64_t first = first_row(pos);  // permutation index of the batch's first row
  const uint64_t L = uint64_t(slot.batch.length);
  for (uint64_t row = row_begin; row < row_end; ++row) {
    const uint64_t example = example_at(first + row);
    const uint32_t n = shard_->length(example);
    int32_t* ids = slot.ids + row * L;
    shard_->read(example, ids);
    std::fill(ids + n, ids + L, cfg_.pad_id);
    slot.lengths[row] = int32_t(n);
    slot.labels[row] = shard_->label(example);
  }
}

uint64_t ClassificationLoader::prepare(Slot& slot, LoaderPosition pos) {
  if (cfg_.shuffle) ensure_permutation(pos.epoch);
  const uint64_t B = uint64_t(cfg_.batch_size);
  const uint64_t first = first_row(pos);
  const uint64_t rows = std::min(B, shard_->size() - first);
  // The batch's length: its longest example (at least 1 token), rounded up to the pad multiple, capped at
  // max_length (which no example exceeds). Decided before the rows are split among the workers.
  uint64_t longest = 1;
  for (uint64_t r = 0; r < rows; ++r)
    longest = std::max<uint64_t>(longest, shard_->length(example_at(first + r)));
  const uint64_t m = cfg_.pad_multiple;
  slot.batch.length = int(std::min<uint64_t>((longest + m - 1) / m * m, uint64_t(cfg_.max_length)));
  slot.batch.batch_size = int(rows);
  slot.batch.pos = pos;
  return rows;
}

void ClassificationLoader::seek(LoaderPosition p) {
  ANVIL_REQUIRE(p.batch < batches_per_epoch_,
                "classification loader for '{}': cannot seek to epoch {} batch {}: an epoch has {} batches",
                shard_->path(), p.epoch, p.batch, batches_per_epoch_);
  ring_.seek(p);
}

}  // namespace anvil::data
