#include "dist/memory_store.hpp"

#include <algorithm>
#include <charconv>

#include "anvil/error.hpp"

namespace anvil::dist {
namespace {

// wait_for adds the timeout to the clock's now(): clamp it so that "forever" (milliseconds::max()) does not
// overflow into the past.
std::chrono::milliseconds clamped(std::chrono::milliseconds timeout) {
  return std::min(timeout, std::chrono::milliseconds(std::chrono::hours(24 * 365 * 10)));
}

}  // namespace

void MemoryStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard lock(mutex_);
    values_[key] = value;
  }
  changed_.notify_all();
}

std::string MemoryStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  const bool found = changed_.wait_for(lock, clamped(timeout), [&] { return values_.count(key) != 0; });
  ANVIL_REQUIRE(found,
                "store: key '{}' was not set within {} ms: the rank that should set it has not reached that "
                "point (it may have failed or be slower than the timeout allows)",
                key, timeout.count());
  return values_.at(key);
}

std::optional<std::string> MemoryStore::try_get(const std::string& key) {
  std::lock_guard lock(mutex_);
  const auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  {
    std::lock_guard lock(mutex_);
    auto& text = values_[key];  // a missing key starts at 0
    if (!text.empty()) {
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      ANVIL_REQUIRE(ec == std::errc() && end == text.data() + text.size(),
                    "store: add() on key '{}', which holds '{}', not an integer counter: use another key",
                    key, text);
    }
    value += delta;
    text = std::to_string(value);
  }
  changed_.notify_all();
  return value;
}

void MemoryStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  const auto all_set = [&] {
    for (const auto& k : keys)
      if (!values_.count(k)) return false;
    return true;
  };
  if (changed_.wait_for(lock, clamped(timeout), all_set)) return;
  std::string missing;
  int n_missing = 0;
  for (const auto& k : keys)
    if (!values_.count(k)) missing += (n_missing++ ? ", '" : "'") + k + "'";
  ANVIL_THROW(
      "store: {} {} not set within {} ms: the ranks that should set {} have not reached that point (they may "
      "have failed or be slower than the timeout allows)",
      n_missing == 1 ? "key" : "keys", missing + (n_missing == 1 ? " was" : " were"), timeout.count(),
      n_missing == 1 ? "it" : "them");
}

}  // namespace anvil::dist
