// One allocation per device, carved by a MemoryPlan. After construction nothing is allocated: the
// step loop only ever uses pointers handed out here.
#pragma once
#include "anvil/memory_plan.hpp"
#include "runtime/device.hpp"

namespace anvil {

class Arena {
 public:
  Arena(Device& dev, MemoryPlan plan) : plan_(std::move(plan)), buffer_(dev, plan_.total_bytes()) {}
  template <class T = float>
  T* get(size_t index) const {
    return reinterpret_cast<T*>(static_cast<char*>(buffer_.get()) + plan_.buffers()[index].offset);
  }
  const MemoryPlan& plan() const { return plan_; }
  size_t bytes() const { return plan_.total_bytes(); }

 private:
  MemoryPlan plan_;
  DeviceBuffer buffer_;
};

}  // namespace anvil
