// Internal helpers shared by the token and classification shard readers.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>

namespace anvil::data {

// Reads a T from possibly unaligned bytes.
template <class T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// The position of the first id >= limit, or nullopt if there is none. Blocks are checked with a
// branch-free max (which the compiler vectorises) so the scan on open runs at memory bandwidth; only a
// bad block is searched.
template <class T>
std::optional<uint64_t> first_id_at_least(const T* ids, uint64_t n, uint64_t limit) {
  if (limit > std::numeric_limits<T>::max()) return std::nullopt;  // every representable id is below it
  constexpr uint64_t kBlock = 8192;
  for (uint64_t start = 0; start < n; start += kBlock) {
    const uint64_t end = std::min(n, start + kBlock);
    T block_max = 0;
    for (uint64_t i = start; i < end; ++i) block_max = std::max(block_max, ids[i]);
    if (block_max < limit) continue;
    for (uint64_t i = start; i < end; ++i)
      if (ids[i] >= limit) return i;
  }
  return std::nullopt;
}

}  // namespace anvil::data
