// The uneven collectives' defaults, in terms of each backend's even ones.
#include "dist/communicator.hpp"

#include <algorithm>
#include <numeric>

#include "anvil/error.hpp"

namespace anvil::dist {

bool Communicator::even_pieces(const std::vector<size_t>& counts, const char* what) const {
  ANVIL_REQUIRE(counts.size() == size_t(world_size()), "{}: {} counts for a world of {} ranks", what,
                counts.size(), world_size());
  return std::all_of(counts.begin(), counts.end(), [&](size_t n) { return n == counts[0]; });
}

void Communicator::reduce_scatter_v(void* data, const std::vector<size_t>& counts, DType dtype, ReduceOp op) {
  const bool even = even_pieces(counts, "reduce_scatter_v");
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t(0));
  if (total == 0) return;
  if (even) {
    char* base = static_cast<char*>(data);
    reduce_scatter(base, base + dtype_bytes(dtype, counts[0] * size_t(rank())), counts[0], dtype, op);
    return;
  }
  all_reduce(data, total, dtype, op);  // every piece reduced: more traffic, the same result where it counts
}

void Communicator::all_gather_v(void* data, const std::vector<size_t>& counts, DType dtype) {
  const bool even = even_pieces(counts, "all_gather_v");
  if (std::accumulate(counts.begin(), counts.end(), size_t(0)) == 0) return;
  char* base = static_cast<char*>(data);
  if (even) {
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
