// Parameter offload to NVMe (offload_param nvme, ZeRO-Infinity's parameter part; docs/memory.md): this rank's
// ZeRO-3 shard of the compute-type weights lives in a swap file, one page-aligned region per unit's piece,
// and is paged into a few pinned host buffers (DeepSpeed's offload_param.buffer_count) as the gathers need
// the units (dist::ZeroSync copies each piece to the device from there). The units after the one asked for
// are read ahead in the order the gathers came last time: a step gathers the same units in the same order
// every time, so after the first step each gather finds its piece read already. A buffer is refilled only
// after the device's copy from it has run (a Device::Fence recorded after the copy).
//
// The offloaded optimizer writes the updated shard back after each update (write), unit by unit, the last
// unit first: the first units of the next forward are then in the buffers already. Host memory holds the
// buffers (each the size of the largest unit's piece), not the shard.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "anvil/dtype.hpp"
#include "model/param_layout.hpp"
#include "model/weight_pages.hpp"
#include "offload/paged_state.hpp"
#include "offload/swap_file.hpp"
#include "runtime/device.hpp"

namespace anvil::offload {

class PagedWeights final : public WeightPages {
 public:
  // DeepSpeed's offload_param.buffer_count default.
  static constexpr int kDefaultBuffers = 5;

  // The sizes a run with these settings takes, without creating anything (`anvil estimate`).
  struct Sizes {
    size_t buffer_bytes = 0;  // one buffer: the largest unit's piece, page-aligned
    size_t buffers = 0;       // at most one per unit the shard touches
    size_t file_bytes = 0;    // every piece, each page-aligned
  };
  static Sizes sizes(const ParamLayout& layout, ParamRange shard, DType type, int buffers);

  // The pieces of `shard` (of `layout`'s units) in `type`; `buffers` (>= 2) pinned buffers on `dev`; the
  // swap file in opts.path (its block size and I/O threads too). The file's contents are undefined until
  // write().
  PagedWeights(Device& dev, const ParamLayout& layout, ParamRange shard, DType type, const NvmeOptions& opts,
               int buffers);
  ~PagedWeights() override;

  const void* piece(int unit) override;
  void queued(int unit) override;
  void write(const float* values) override;
  void read(float* values) override;
  size_t numel() const override { return shard_.numel(); }

  const Sizes& size() const { return sizes_; }
  const SwapFile& file() const { return *file_; }
  // Pieces served, and how many of them the read-ahead had not read in (the gather waited for the whole
  // read): the first step's, and any after a change of order.
  struct Counts {
    uint64_t served = 0, read_on_demand = 0;
  };
  const Counts& counts() const { return counts_; }

 private:
  struct Piece {
    size_t first = 0, numel = 0;   // elements, from the shard's beginning
    size_t offset = 0, bytes = 0;  // the region in the file (bytes: page-aligned)
  };
  struct Buffer {
    std::optional<PinnedBuffer> memory;
    char* data = nullptr;  // page-aligned inside memory
    int unit = -1;         // the piece it holds or is reading; -1: none
    uint64_t ticket = 0;   // its last read or write
    std::unique_ptr<Device::Fence> fence;
    bool fenced = false;  // a device copy from it is queued (wait before refilling)
    uint64_t used = 0;    // when last served (least recently used goes first)
  };
  static std::vector<Piece> make_pieces(const ParamLayout& layout, ParamRange shard, DType type,
                                        Sizes& sizes);

  Buffer* holding(int unit);
  // The least recently used buffer holding none of `keep`, or null.
  Buffer* victim(const std::vector<int>& keep);
  void fill(Buffer& b, int unit);
  // The units expected after `unit`, up to the buffers but one: learned from the previous gathers.
  std::vector<int> expected_after(int unit) const;
  void learn(int unit);
  // Waits until the device has run every copy queued from the buffers; forgets what they hold.
  void drain();

  const ParamRange shard_;
  const DType type_;
  Sizes sizes_;
  std::vector<Piece> pieces_;
  std::vector<Buffer> buffers_;
  std::unique_ptr<SwapFile> file_;  // after the buffers: its threads stop before they are freed
  // The unit gathered after each (previous, current) pair last time.
  std::unordered_map<uint64_t, int> next_;
  int prev2_ = -1, prev1_ = -1;
  uint64_t clock_ = 0;
  Counts counts_;
};

}  // namespace anvil::offload
