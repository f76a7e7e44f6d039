// The uneven collectives' defaults, in terms of each backend's even ones.
#include "dist/communicator.hpp"

#include <algorithm>
#include <numeric>

#include "anvil/error.hpp"

namespace anvil::dist {
namespace {

void check_counts(const Communicator& c, const std::vector<size_t>& counts, const char* what) {
  ANVIL_REQUIRE(counts.size() == size_t(c.world_size()), "{}: {} counts for a world of {} ranks", what,
                counts.size(), c.world_size());
}

bool all_equal(const std::vector<size_t>& counts) {
  return std::all_of(counts.begin(), counts.end(), [&](size_t n) { return n == counts[0]; });
}

}  // namespace

void Communicator::reduce_scatter_v(void* data, const std::vector<size_t>& counts, DType dtype, ReduceOp op) {
  check_counts(*this, counts, "reduce_scatter_v");
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t(0));
  if (total == 0) return;
  if (all_equal(counts)) {
    char* base = static_cast<char*>(data);
    reduce_scatter(base, base + dtype_bytes(dtype, counts[0] * size_t(rank())), counts[0], dtype, op);
    return;
  }
  all_reduce(data, total, dtype, op);  // every piece reduced: more traffic, the same result where it counts
}

void Communicator::all_gather_v(void* data, const std::vector<size_t>& counts, DType dtype) {
  check_counts(*this, counts, "all_gather_v");
  if (std::accumulate(counts.begin(), counts.end(), size_t(0)) == 0) return;
  char* base = static_cast<char*>(data);
  if (all_equal(counts)) {
    all_gather(base + dtype_bytes(dtype, counts[0] * size_t(rank())), base, counts[0], dtype);
    return;
  }
  size_t at = 0;
  for (int r = 0; r < world_size(); ++r) {
    if (counts[size_t(r)]) broadcast(base + dtype_bytes(dtype, at), counts[size_t(r)], dtype, r);
    at += counts[size_t(r)];
  }
}

}  // namespace anvil::dist
